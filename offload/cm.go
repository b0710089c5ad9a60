package offload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// mpaConfig merges the device defaults with one connection's parameters.
func (d *Device) mpaConfig(p ibv.ConnParam) mpa.Config {
	// Ready (mpa.ExtReady, to siwtun initiators): a responder's QP owns
	// the connection before its Reply leaves (Accept writes the Reply,
	// then starts the QP; FPDUs arriving in between wait in TCP's receive
	// queue for the receive loop).
	c := mpa.Config{
		Rev: d.cfg.MPARev, CRC: d.cfg.CRC, Markers: d.cfg.Markers, P2P: d.cfg.P2P,
		IRD: d.cfg.IRD, ORD: d.cfg.ORD, PrivateData: p.PrivateData, Ready: true,
		// What the device advertises (max_qp_rd_atom): a peer asking
		// for that many Reads gets them, as from Linux siw.
		MaxIRD: ibv.MaxIRDORD,
	}
	if c.Rev < 2 {
		c.P2P = 0 // RFC 6581's block, which offers it, is revision 2's
	}
	if d.cfg.RDMAPExt {
		c.Ext = mpa.ExtAll
	}
	if p.ResponderResources != 0 {
		c.IRD = min(p.ResponderResources, ibv.MaxIRDORD)
	}
	if p.InitiatorDepth != 0 {
		c.ORD = min(p.InitiatorDepth, ibv.MaxIRDORD)
	}
	return c
}

// claim moves a QP from RESET or INIT to connecting.
func (qp *QP) claim() error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.connected || (qp.state != ibv.QPReset && qp.state != ibv.QPInit) {
		return fmt.Errorf("%w: QP %d is %v", ibv.ErrQPState, qp.num, qp.state)
	}
	qp.state = ibv.QPInit
	qp.connected = true
	return nil
}

func (qp *QP) unclaim() {
	qp.mu.Lock()
	qp.connected = false
	qp.mu.Unlock()
}

// Connect connects the queue pair to a listening RNIC at remote: TCP, then
// the MPA Request/Reply exchange, then (peer-to-peer mode) the RTR. On
// return the QP is in RTS.
func (qp *QP) Connect(ctx context.Context, remote netip.AddrPort, p ibv.ConnParam) (err error) {
	d := qp.dev
	if err := qp.claim(); err != nil {
		return fmt.Errorf("connect to %v: %w", remote, err)
	}
	defer func() {
		if err != nil {
			qp.unclaim()
		}
	}()
	cfg := d.mpaConfig(p)
	err = qp.connect(ctx, remote, cfg)
	if errors.Is(err, ibv.ErrMarkersRejected) && cfg.Markers && d.cfg.MarkersPrefer {
		d.log.Info("peer rejected markers; connecting again without them", "dev", d.cfg.Name, "qp", qp.num, "remote", remote)
		cfg.Markers = false
		err = qp.connect(ctx, remote, cfg)
	}
	return err
}

// connect is one connection attempt of Connect with MPA configuration cfg.
func (qp *QP) connect(ctx context.Context, remote netip.AddrPort, cfg mpa.Config) error {
	d := qp.dev
	req, err := cfg.Request()
	if err != nil {
		return fmt.Errorf("connect to %v: %w", remote, err)
	}
	conn, err := d.stack.Dial(ctx, netip.Addr{}, remote)
	if err != nil {
		return fmt.Errorf("connect to %v: %w", remote, err)
	}
	fail := func(e error) error {
		conn.Close()
		return fmt.Errorf("connect to %v: %w", remote, e)
	}
	b, err := req.Append(nil)
	if err != nil {
		return fail(err)
	}
	if _, err := conn.WriteAligned(b); err != nil {
		return fail(fmt.Errorf("send MPA Request: %w", err))
	}
	deadline := time.Now().Add(d.cfg.ConnectTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	rep, err := readFrame(conn, deadline)
	if err != nil {
		return fail(fmt.Errorf("MPA Reply: %w", err))
	}
	if !rep.Reply {
		return fail(errors.New("MPA Reply: peer sent a Request frame"))
	}
	params, err := mpa.Complete(&cfg, req, rep)
	if err != nil {
		var rej *mpa.RejectedError
		if errors.As(err, &rej) {
			reason := error(nil)
			if req.Markers && rep.Reject && !rep.Markers {
				reason = ibv.ErrMarkersRejected
			}
			return fail(&ibv.RejectedError{PrivateData: append([]byte(nil), rej.PrivateData...), Err: reason})
		}
		var me *mpa.Error
		if errors.As(err, &me) {
			// The Reply is unacceptable (no matching RTR, insufficient
			// IRD, bad frame): tell the peer with an LLP Terminate, as
			// RFC 6581 and siw do, then close.
			sendSetupTerminate(conn, req.CRC || rep.CRC, rep.Markers, rdmapCodeForMPA(me.Code))
		}
		return fail(err)
	}
	if d.cfg.FirstFPDUDelay > 0 && !params.PeerReady {
		// Give the peer time to hand its socket to its receive path
		// (see Config.FirstFPDUDelay); its own FPDUs wait in TCP
		// meanwhile. A siwtun responder says it needs none (ExtReady).
		qp.stats.FirstFPDUDelays.Add(1)
		t := time.NewTimer(d.cfg.FirstFPDUDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fail(ctx.Err())
		}
	}
	d.logf("QP %d: connected to %v: %+v", qp.num, remote, params)
	var replyPD []byte
	if len(rep.PrivateData) > 0 {
		replyPD = append([]byte(nil), rep.PrivateData...)
	}
	if err := qp.start(conn, params, true, replyPD); err != nil {
		return fmt.Errorf("connect to %v: %w", remote, err)
	}
	return nil
}

// sendSetupTerminate sends a Terminate on a stream whose set-up failed
// after the MPA Reply: the first and only FPDU of the stream.
func sendSetupTerminate(conn *netstack.Conn, crc, markers bool, code rdmap.Code) {
	var s mpa.Sender
	s.Init(crc, markers)
	t := rdmap.NewTerminate(code, 0, nil, nil)
	var body [rdmap.TerminateHeaderLen]byte
	n := t.Marshal(body[:])
	h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpTerminate), QN: ddp.QNTerminate, MSN: 1}
	var hdr [ddp.UntaggedHeaderLen]byte
	h.Marshal(hdr[:])
	s.Begin(make([]byte, 0, 64), len(hdr)+n)
	s.Write(hdr[:])
	s.Write(body[:n])
	conn.WriteAligned(s.Finish())
	conn.CloseWrite()
}

// readFrame reads exactly one MPA Request or Reply from conn, leaving any
// bytes after it in the TCP receive queue for the FPDU receiver.
func readFrame(conn *netstack.Conn, deadline time.Time) (mpa.Frame, error) {
	fw := &frameWriter{}
	if err := conn.SetReadDeadline(deadline); err != nil {
		return mpa.Frame{}, err
	}
	defer conn.SetReadDeadline(time.Time{})
	for {
		_, err := conn.ReadTo(fw)
		if errors.Is(err, errFrameDone) {
			break
		}
		if err == io.EOF {
			return mpa.Frame{}, errors.New("connection closed by the peer")
		}
		if err != nil {
			return mpa.Frame{}, err
		}
	}
	f, err := fw.r.Frame()
	if err != nil {
		return mpa.Frame{}, err
	}
	f.PrivateData = append([]byte(nil), f.PrivateData...)
	return f, nil
}

// errFrameDone stops the TCP read at the end of an MPA frame.
var errFrameDone = errors.New("offload: MPA frame complete")

type frameWriter struct{ r mpa.FrameReader }

func (w *frameWriter) Write(p []byte) (int, error) {
	n, done, err := w.r.Feed(p)
	if err != nil {
		return n, err
	}
	if done {
		return n, errFrameDone
	}
	return n, nil
}

// errClosedWhileConnecting is start's error for a QP that was destroyed,
// disconnected or moved to ERR while its connection was set up.
var errClosedWhileConnecting = fmt.Errorf("%w: QP closed while connecting", ibv.ErrQPState)

// observeLocked puts the QP's segment observer on conn, whose FPDU
// streams start after ahead more octets sent (a responder's Reply, not
// written yet) and at the next octet received. A responder does so
// before its Reply leaves, so that the segments of an initiator that
// answers at once (its RTR) are counted and classified too.
func (qp *QP) observeLocked(conn *netstack.Conn, p *mpa.Params, ahead int) {
	var pl *oooPlacer
	if tx, rx, ok := conn.StreamSeqs(); ok {
		qp.alignTx.SetStart(tx + uint32(ahead))
		qp.alignRx.SetStart(rx)
		qp.initHops(conn, tx+uint32(ahead), rx)
		qp.alignTx.Configure(p.MarkersTx)
		qp.alignRx.Configure(p.MarkersRx)
		// It places nothing before the QP is in RTS.
		pl = newPlacer(qp, conn, rx, p.CRC, p.MarkersRx)
	}
	qp.placer = pl
	conn.SetSegmentHook(&segmentObserver{qp: qp, pl: pl})
}

// start puts a negotiated connection under the QP and starts its engine;
// a responder has put the observer on it already (observeLocked).
// replyPD is the MPA Reply's private data (the initiator's), given with
// EventEstablished. It fails, closing conn, if the QP was closed
// (Disconnect, Destroy, Modify to ERR) while the connection was set up:
// its owner may have freed what the engine's goroutines would use (the
// verbs socket's daemon frees the QP's rings).
func (qp *QP) start(conn *netstack.Conn, p mpa.Params, initiator bool, replyPD []byte) error {
	qp.mu.Lock()
	if qp.closing {
		qp.mu.Unlock()
		conn.Close()
		return errClosedWhileConnecting
	}
	qp.conn = conn
	if initiator {
		qp.observeLocked(conn, &p, 0)
	}
	pl := qp.placer
	qp.placer = nil
	qp.rx.place = pl
	// With Markers, one FPDU per segment exactly (Wireshark follows Markers
	// only so).
	conn.SetOneWritePerSegment(p.MarkersTx)
	qp.params = p
	qp.local, qp.remote = conn.LocalAddr(), conn.RemoteAddr()
	qp.ird, qp.ord = int(p.IRD), int(p.ORD)
	// The queues of outstanding Reads grow with the Reads (up to ORD and
	// IRD): an idle QP holds none.
	qp.orq, qp.irq = qp.orq[:0], qp.irq[:0]
	qp.sendMSN, qp.readMSN, qp.atomicRespMSN = 1, 1, 1
	emss := conn.MSS()
	if emss > qp.dev.cfg.MaxFPDU {
		emss = qp.dev.cfg.MaxFPDU
	}
	qp.tx.emss = emss
	qp.tx.mpa.Init(p.CRC, p.MarkersTx)
	// Several FPDUs per write only where TCP's own cuts (every MSS) fall
	// between them: markers off (every full FPDU then has the same length),
	// FPDUs filling the MSS exactly (a multiple of 4) and not capped below it.
	qp.tx.perWrite = qp.dev.cfg.FPDUsPerWrite
	if p.MarkersTx || emss != conn.MSS() || emss%4 != 0 {
		qp.tx.perWrite = 1
	}
	qp.tx.bufs, qp.tx.hops = &qp.dev.writeBufs, qp.dev.hops
	await, established := qp.peerToPeer(&p, initiator)
	qp.rx.init(qp, &p, await, pl)
	qp.done = make(chan struct{})
	if !initiator && !p.P2P {
		qp.beginStartupHold(conn)
	}
	qp.live.Store(2)
	qp.mu.Unlock()
	if established {
		qp.emit(ibv.Event{Type: ibv.EventEstablished, PrivateData: replyPD})
	}
	go qp.rxLoop()
	go qp.txLoop()
	return nil
}

// loopDone is the last thing the RX and the TX goroutine do: the second
// to end finishes the connection (supervise).
func (qp *QP) loopDone() {
	if qp.live.Add(-1) == 0 {
		qp.supervise()
	}
}

// supervise runs once both engine goroutines have ended (on the last of
// them): it closes the connection.
func (qp *QP) supervise() {
	qp.conn.Close()
	qp.mu.Lock()
	qp.errorLocked(ibv.WCSuccess)
	qp.connected = false
	done := qp.done
	qp.mu.Unlock()
	qp.emit(ibv.Event{Type: ibv.EventDisconnected})
	close(done)
}

// Listener accepts iWARP connections on a TCP port of the device.
type Listener struct {
	dev  *Device
	nl   *netstack.Listener
	reqs chan *ConnRequest
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// Listen starts accepting connections on addr (port 0: ephemeral).
func (d *Device) Listen(addr netip.AddrPort, backlog int) (*Listener, error) {
	if backlog <= 0 {
		backlog = 16
	}
	nl, err := d.stack.Listen(addr)
	if err != nil {
		return nil, err // netstack's error names the address
	}
	ctx, stop := context.WithCancel(context.Background())
	l := &Listener{dev: d, nl: nl, reqs: make(chan *ConnRequest, backlog), ctx: ctx, stop: stop}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		nl.Close()
		stop()
		return nil, ErrDeviceClosed
	}
	d.listeners[l] = struct{}{}
	d.mu.Unlock()
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr is the listening address.
func (l *Listener) Addr() netip.AddrPort { return l.nl.Addr() }

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.nl.Accept(l.ctx)
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Anything else concerns one connection, not the listener:
			// it must go on accepting (a connection flood once stopped
			// this loop for good). The pause bounds a repeating error.
			l.dev.logf("listener %v: accept: %v", l.Addr(), err)
			select {
			case <-l.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		l.wg.Add(1)
		go l.handshake(c)
	}
}

// handshake reads the MPA Request of an accepted TCP connection. A peer that
// sends garbage, or nothing, or closes at once costs this goroutine only:
// the listener keeps serving.
func (l *Listener) handshake(c *netstack.Conn) {
	defer l.wg.Done()
	req, err := readFrame(c, time.Now().Add(l.dev.cfg.AcceptTimeout))
	if err == nil && req.Reply {
		err = errors.New("peer sent a Reply frame")
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			l.dev.retired.AcceptTimeouts.Add(1)
			err = fmt.Errorf("no whole MPA Request within the MPA accept timeout (%v): %w", l.dev.cfg.AcceptTimeout, err)
		} else {
			l.dev.retired.BadRequests.Add(1)
		}
		l.dev.logf("listener %v: MPA Request from %v: %v", l.Addr(), c.RemoteAddr(), err)
		c.Abort()
		return
	}
	if req.Rev > mpa.MaxRev {
		// RFC 5044 §7.1: a receiver that cannot interoperate with the
		// revision closes the connection (no Reply, as Linux siw does).
		l.dev.retired.BadRevisions.Add(1)
		if l.dev.badRevLogged.CompareAndSwap(false, true) {
			l.dev.log.Warn("MPA Request of an unsupported revision: connection closed without a Reply (RFC 5044 §7.1); further ones are only counted (mpaBadRevisions)",
				"listener", l.Addr(), "peer", c.RemoteAddr(), "rev", req.Rev, "max_rev", mpa.MaxRev)
		}
		c.Close()
		return
	}
	cr := &ConnRequest{l: l, conn: c, req: req, Remote: c.RemoteAddr(), PrivateData: req.PrivateData, IRD: req.IRD, ORD: req.ORD}
	select {
	case l.reqs <- cr:
	default:
		l.dev.logf("listener %v: backlog full, rejecting %v", l.Addr(), cr.Remote)
		cr.Reject(nil)
	}
}

// Accept returns the next connection request (rdma_get_request).
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.ctx.Done():
		return nil, fmt.Errorf("listener %v: %w", l.Addr(), ErrListenerClosed)
	}
}

// ErrListenerClosed is returned by Accept after Close.
var ErrListenerClosed = errors.New("offload: listener closed")

// Close stops listening; pending requests are rejected.
func (l *Listener) Close() error {
	l.stop()
	err := l.nl.Close()
	l.wg.Wait()
	for {
		select {
		case r := <-l.reqs:
			r.Reject(nil)
			continue
		default:
		}
		break
	}
	l.dev.mu.Lock()
	delete(l.dev.listeners, l)
	l.dev.mu.Unlock()
	return err
}

// ConnRequest is a peer's MPA Request waiting for Accept or Reject.
type ConnRequest struct {
	l    *Listener
	conn *netstack.Conn
	req  mpa.Frame
	once sync.Once
	// Remote is the peer's address.
	Remote netip.AddrPort
	// PrivateData is the peer's private data (without the IRD/ORD block).
	PrivateData []byte
	// IRD and ORD are the peer's (RFC 6581; zero with MPA rev 1).
	IRD, ORD uint16
}

// Frame is the peer's MPA Request.
func (r *ConnRequest) Frame() mpa.Frame { return r.req }

// Accept answers the request with an MPA Reply and connects qp (RESET or
// INIT). In peer-to-peer mode the QP stays in RTR until the peer's RTR
// arrives; the Established event says when.
func (r *ConnRequest) Accept(qp *QP, p ibv.ConnParam) error {
	used := true
	r.once.Do(func() { used = false })
	if used {
		return errors.New("accept: request already answered")
	}
	d := r.l.dev
	if err := qp.claim(); err != nil {
		r.reject(nil)
		return fmt.Errorf("accept %v: %w", r.Remote, err)
	}
	cfg := d.mpaConfig(p)
	if d.cfg.MarkersPrefer && !r.req.Markers {
		cfg.Markers = false
	}
	cfg.P2P = d.cfg.P2PAccept
	if cfg.P2P == 0 {
		// A responder takes whichever RTR the initiator offers.
		cfg.P2P = mpa.RTRWrite | mpa.RTRRead | mpa.RTRSend
	}
	rep, params, nerr := mpa.Respond(&cfg, r.req)
	b, err := rep.Append(nil)
	if err == nil && nerr == nil {
		qp.mu.Lock()
		qp.observeLocked(r.conn, &params, len(b))
		qp.mu.Unlock()
	}
	if err == nil {
		_, err = r.conn.WriteAligned(b)
	}
	if nerr != nil || err != nil {
		qp.mu.Lock()
		qp.placer = nil
		qp.mu.Unlock()
		qp.unclaim()
		r.conn.Close()
		if nerr != nil {
			return fmt.Errorf("accept %v: %w", r.Remote, nerr)
		}
		return fmt.Errorf("accept %v: send MPA Reply: %w", r.Remote, err)
	}
	d.logf("QP %d: accepted %v: %+v", qp.num, r.Remote, params)
	if err := qp.start(r.conn, params, false, nil); err != nil {
		qp.unclaim()
		return fmt.Errorf("accept %v: %w", r.Remote, err)
	}
	return nil
}

// Reject refuses the request with an MPA Reply carrying the R flag and
// private data, then closes the connection.
func (r *ConnRequest) Reject(privateData []byte) error {
	used := true
	r.once.Do(func() { used = false })
	if used {
		return errors.New("reject: request already answered")
	}
	return r.reject(privateData)
}

func (r *ConnRequest) reject(pd []byte) error {
	cfg := r.l.dev.mpaConfig(ibv.ConnParam{})
	rep := cfg.RejectReply(r.req, pd)
	b, err := rep.Append(nil)
	if err == nil {
		_, err = r.conn.WriteAligned(b)
	}
	r.conn.Close()
	if err != nil {
		return fmt.Errorf("reject %v: %w", r.Remote, err)
	}
	return nil
}
