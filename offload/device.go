package offload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// Config holds a device's iWARP defaults and limits.
type Config struct {
	// Name is the device name (siwtun0).
	Name string
	// MPARev is the MPA revision requested: 1 (RFC 5044) or 2 (RFC 6581).
	MPARev uint8
	// CRC requests MPA CRC32c (it is used when either side asks).
	CRC bool
	// Markers asks the peer to insert MPA markers towards us.
	Markers bool
	// MarkersPrefer (with Markers) makes markers a preference rather than a
	// demand, for peers without markers such as Linux siw: an initiator
	// whose Request the peer rejects for its M flag (a Reply with R set and
	// M clear) connects again without asking for markers, and a responder
	// asks for them only when the initiator asked for markers too.
	MarkersPrefer bool
	// P2P is the set of RTR types offered as initiator and accepted as
	// responder (0: no peer-to-peer mode as initiator; as responder any
	// type a peer offers is accepted).
	P2P mpa.RTR
	// IRD and ORD are the default inbound and outbound RDMA Read depths
	// when a connection does not set them.
	IRD, ORD uint16
	// MaxFPDU caps the FPDU size below the effective MSS: large FPDUs on
	// jumbo links risk window-edge splits (netstack-probe.md §1e).
	MaxFPDU int
	// FPDUsPerWrite caps how many whole FPDUs one TCP write carries (see
	// QP.sendMessage); 0 means as many as fit in 64 KiB, 1 is one FPDU per
	// write. Either way each segment starts with an FPDU.
	FPDUsPerWrite int
	// MaxQP and MaxMR bound the device's objects.
	MaxQP, MaxMR int
	// FirstFPDUDelay is how long an initiator waits after the MPA Reply
	// before it lets its first FPDU (or RTR) go. Linux siw sends its
	// Reply before it hands the socket to its receive path (or, in
	// peer-to-peer mode, to its RTR handler); an FPDU arriving in that gap
	// sits unread in siw's socket until more data comes, which a
	// request/response protocol (rping) never sends: the connection
	// stalls. 0 sends at once.
	FirstFPDUDelay time.Duration
	// ConnectTimeout bounds the wait for the MPA Reply (siw: 10 s);
	// AcceptTimeout the wait for the MPA Request after TCP accept (5 s).
	ConnectTimeout, AcceptTimeout time.Duration
	// Logger receives the engine's log lines (nil: discarded).
	Logger *slog.Logger
}

// DefaultFirstFPDUDelay is the default Config.FirstFPDUDelay.
const DefaultFirstFPDUDelay = 20 * time.Millisecond

// DefaultConfig returns the defaults of a siwtun device: MPA rev 2, CRC on,
// markers off, no P2P, IRD = ORD = 16, FPDUs ≤ 16 KiB, the first FPDU of
// an initiator DefaultFirstFPDUDelay after the MPA Reply.
func DefaultConfig(name string) Config {
	return Config{
		Name: name, MPARev: 2, CRC: true, IRD: 16, ORD: 16,
		MaxFPDU: 16384, FPDUsPerWrite: 1, MaxQP: 4096, MaxMR: 65536,
		FirstFPDUDelay: DefaultFirstFPDUDelay,
		ConnectTimeout: 10 * time.Second, AcceptTimeout: 5 * time.Second,
	}
}

func (c *Config) validate() error {
	if c.MPARev != 1 && c.MPARev != 2 {
		return fmt.Errorf("MPA revision %d: want 1 or 2", c.MPARev)
	}
	if c.IRD > ibv.MaxIRDORD || c.ORD > ibv.MaxIRDORD {
		return fmt.Errorf("IRD %d / ORD %d: at most %d", c.IRD, c.ORD, ibv.MaxIRDORD)
	}
	if c.MaxFPDU < 128 {
		return fmt.Errorf("MaxFPDU %d: at least 128", c.MaxFPDU)
	}
	if c.FirstFPDUDelay < 0 {
		return fmt.Errorf("FirstFPDUDelay %v: must not be negative", c.FirstFPDUDelay)
	}
	if c.MaxQP <= 0 || c.MaxMR <= 0 {
		return fmt.Errorf("MaxQP %d / MaxMR %d must be positive", c.MaxQP, c.MaxMR)
	}
	return nil
}

// Device is one software RNIC: a private TCP/IP stack, the memory regions
// and queue pairs on it, and its iWARP defaults.
type Device struct {
	cfg     Config
	stack   *netstack.Stack
	regions *Regions
	log     *slog.Logger

	mu        sync.Mutex
	qps       map[uint32]*QP
	nextQPN   uint32
	listeners map[*Listener]struct{}
	retired   QPStats // counters of destroyed QPs
	closed    bool

	tap tap // segment tap and event fan-out (tap.go)

	badRevLogged atomic.Bool // the first unsupported MPA revision was logged
}

// NewDevice creates a device on stack with configuration cfg.
func NewDevice(stack *netstack.Stack, cfg Config) (*Device, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("device %s: %w", cfg.Name, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Device{
		cfg: cfg, stack: stack, regions: NewRegions(cfg.MaxMR), log: log,
		qps: make(map[uint32]*QP), nextQPN: 1, listeners: make(map[*Listener]struct{}),
	}, nil
}

// Config returns the device's configuration.
func (d *Device) Config() Config { return d.cfg }

// Stack returns the device's TCP/IP stack.
func (d *Device) Stack() *netstack.Stack { return d.stack }

// Regions returns the device's memory-region table.
func (d *Device) Regions() *Regions { return d.regions }

func (d *Device) logf(format string, args ...any) {
	d.log.Debug(fmt.Sprintf(format, args...), "dev", d.cfg.Name)
}

// ErrDeviceClosed is returned by calls on a closed device.
var ErrDeviceClosed = errors.New("offload: device closed")

// CreateQP creates a queue pair in RESET in protection domain pd, completing
// into sendCQ and recvCQ.
func (d *Device) CreateQP(pd uint32, sendCQ, recvCQ ibv.CompletionQueue, attr QPAttr) (*QP, error) {
	if sendCQ == nil || recvCQ == nil {
		return nil, fmt.Errorf("create QP: %w: nil completion queue", ibv.ErrInvalidWR)
	}
	if attr.MaxSendWR <= 0 || attr.MaxSendWR > ibv.MaxQPWR || attr.MaxRecvWR <= 0 || attr.MaxRecvWR > ibv.MaxQPWR {
		return nil, fmt.Errorf("create QP: queue depths %d/%d: want 1..%d", attr.MaxSendWR, attr.MaxRecvWR, ibv.MaxQPWR)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrDeviceClosed
	}
	if len(d.qps) >= d.cfg.MaxQP {
		return nil, fmt.Errorf("create QP: device %s has its maximum of %d QPs", d.cfg.Name, d.cfg.MaxQP)
	}
	num := d.nextQPN
	for d.qps[num] != nil || num == 0 {
		num++
	}
	d.nextQPN = num + 1
	qp := &QP{
		dev: d, num: num, pd: pd, sendCQ: sendCQ, recvCQ: recvCQ, sigAll: attr.SignalAll,
		state: ibv.QPReset, sq: make([]sendWQE, attr.MaxSendWR), rq: make([]recvWQE, attr.MaxRecvWR),
		events: make(chan ibv.Event, 32),
	}
	qp.txCond = sync.NewCond(&qp.mu)
	d.qps[num] = qp
	return qp, nil
}

func (d *Device) removeQP(qp *QP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.qps[qp.num] == qp {
		delete(d.qps, qp.num)
		d.retired.add(&qp.stats)
	}
}

// QP returns the queue pair numbered num.
func (d *Device) QP(num uint32) (*QP, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	qp, ok := d.qps[num]
	return qp, ok
}

// QPs returns snapshots of every queue pair, by number.
func (d *Device) QPs() []ibv.Info {
	d.mu.Lock()
	list := slices.Collect(maps.Values(d.qps))
	d.mu.Unlock()
	out := make([]ibv.Info, 0, len(list))
	for _, qp := range list {
		out = append(out, qp.Info())
	}
	slices.SortFunc(out, func(a, b ibv.Info) int { return cmp.Compare(a.Num, b.Num) })
	return out
}

// Stats returns a snapshot of the device's counters: every live queue
// pair's plus those of destroyed ones.
func (d *Device) Stats() *QPStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := new(QPStats)
	s.add(&d.retired)
	for _, qp := range d.qps {
		s.add(&qp.stats)
	}
	return s
}

// Close disconnects every queue pair and closes every listener.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	qps := slices.Collect(maps.Values(d.qps))
	ls := slices.Collect(maps.Keys(d.listeners))
	d.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, qp := range qps {
		qp.Disconnect()
	}
	return nil
}

// mpaConfig merges the device defaults with one connection's parameters.
func (d *Device) mpaConfig(p ibv.ConnParam) mpa.Config {
	c := mpa.Config{
		Rev: d.cfg.MPARev, CRC: d.cfg.CRC, Markers: d.cfg.Markers, P2P: d.cfg.P2P,
		IRD: d.cfg.IRD, ORD: d.cfg.ORD, PrivateData: p.PrivateData,
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
	if d.cfg.FirstFPDUDelay > 0 {
		// Give the peer time to hand its socket to its receive path
		// (see Config.FirstFPDUDelay); its own FPDUs wait in TCP meanwhile.
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
	qp.start(conn, params, true, replyPD)
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

// start puts a negotiated connection under the QP and starts its engine.
// replyPD is the MPA Reply's private data (the initiator's), given with
// EventEstablished.
func (qp *QP) start(conn *netstack.Conn, p mpa.Params, initiator bool, replyPD []byte) {
	qp.mu.Lock()
	qp.conn = conn
	var pl *oooPlacer
	if tx, rx, ok := conn.StreamSeqs(); ok {
		qp.alignTx.SetStart(tx)
		qp.alignRx.SetStart(rx)
		qp.alignTx.Configure(p.MarkersTx)
		qp.alignRx.Configure(p.MarkersRx)
		pl = newPlacer(qp, conn, rx, p.CRC, p.MarkersRx)
	}
	qp.rx.place = pl
	conn.SetSegmentHook(netstack.HeaderHookFunc(func(s *netstack.Segment) { qp.observeSegment(s, pl) }))
	// With Markers, one FPDU per segment exactly (Wireshark follows Markers
	// only so).
	conn.SetOneWritePerSegment(p.MarkersTx)
	qp.params = p
	qp.local, qp.remote = conn.LocalAddr(), conn.RemoteAddr()
	qp.ird, qp.ord = int(p.IRD), int(p.ORD)
	qp.orq = make([]orqEntry, 0, max(qp.ord, 1))
	qp.irq = make([]irqEntry, 0, max(qp.ird, 1))
	qp.sendMSN, qp.readMSN = 1, 1
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
	qp.tx.buf = make([]byte, 0, max(emss, maxBatch))
	var await mpa.RTR
	established := true
	switch {
	case p.P2P && initiator:
		qp.p2pRTR = p.RTR
		if p.RTR == mpa.RTRRead {
			qp.orq = append(qp.orq, orqEntry{sq: rtrSlot, sinkSTag: rtrSTag})
		}
		qp.state = ibv.QPRTS
	case p.P2P:
		await = p.RTR
		qp.state = ibv.QPRTR
		established = false
	default:
		qp.state = ibv.QPRTS
	}
	qp.rx.init(qp, p.CRC, p.MarkersRx, await, pl)
	qp.done = make(chan struct{})
	qp.running.Add(2)
	qp.mu.Unlock()
	if established {
		qp.emit(ibv.Event{Type: ibv.EventEstablished, PrivateData: replyPD})
	}
	go qp.rxLoop()
	go qp.txLoop()
	go qp.supervise()
}

// supervise waits for both engine goroutines, then closes the connection.
func (qp *QP) supervise() {
	qp.running.Wait()
	qp.conn.Close()
	qp.mu.Lock()
	qp.errorLocked(ibv.WCSuccess)
	qp.connected = false
	done := qp.done
	qp.mu.Unlock()
	qp.emit(ibv.Event{Type: ibv.EventDisconnected})
	close(done)
}

// drainTimeout bounds the orderly close after a Terminate: reading (and
// discarding) until the peer closes its side too.
const drainTimeout = 3 * time.Second

// rxLoop is the QP's receive goroutine: it runs the TCP endpoint's Read with
// the MPA receiver as the writer, so every in-order segment's payload is
// parsed and placed as it is handed over.
func (qp *QP) rxLoop() {
	defer qp.running.Done()
	if pl := qp.rx.place; pl != nil {
		defer pl.stop() // before running.Done: no placement once the QP stopped
	}
	qp.mu.Lock()
	idle := qp.rxIdle
	qp.mu.Unlock()
	for {
		_, err := qp.conn.ReadTo(&qp.rx.mpa)
		if err == nil {
			if idle != nil {
				idle()
			}
			continue
		}
		var te *terminateError
		var me *mpa.Error
		switch {
		case errors.As(err, &te):
			qp.drain()
		case errors.Is(err, errTerminated):
		case errors.As(err, &me):
			// A framing error found by the MPA layer (bad marker).
			_ = qp.rx.fail(rdmapCodeForMPA(me.Code), ibv.WCLocQPOpErr, err)
			qp.drain()
		case err == io.EOF:
			qp.mu.Lock()
			if qp.state != ibv.QPErr {
				qp.dev.logf("QP %d: peer closed the connection", qp.num)
			}
			qp.errorLocked(ibv.WCSuccess)
			qp.mu.Unlock()
		default:
			qp.mu.Lock()
			if qp.state != ibv.QPErr && !qp.closing {
				qp.dev.logf("QP %d: receive: %v", qp.num, err)
			}
			qp.errorLocked(ibv.WCSuccess)
			qp.mu.Unlock()
		}
		return
	}
}

// drain discards incoming bytes until the peer closes or drainTimeout.
func (qp *QP) drain() {
	qp.conn.SetReadDeadline(time.Now().Add(drainTimeout))
	for {
		if _, err := qp.conn.ReadTo(io.Discard); err != nil {
			return
		}
	}
}

// aborted reports whether the QP entered ERR (checked between FPDUs).
func (qp *QP) aborted() bool { return qp.inErr.Load() }

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
			return
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
	if cfg.P2P == 0 {
		// A responder takes whichever RTR the initiator offers.
		cfg.P2P = mpa.RTRWrite | mpa.RTRRead | mpa.RTRSend
	}
	rep, params, nerr := mpa.Respond(&cfg, r.req)
	b, err := rep.Append(nil)
	if err == nil {
		_, err = r.conn.WriteAligned(b)
	}
	if nerr != nil || err != nil {
		qp.unclaim()
		r.conn.Close()
		if nerr != nil {
			return fmt.Errorf("accept %v: %w", r.Remote, nerr)
		}
		return fmt.Errorf("accept %v: send MPA Reply: %w", r.Remote, err)
	}
	d.logf("QP %d: accepted %v: %+v", qp.num, r.Remote, params)
	qp.start(r.conn, params, false, nil)
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
