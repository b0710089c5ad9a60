package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"reflect"
	"syscall"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// RunServer waits on port (all addresses) for one perftest client (siwtun
// perf, or ib_*_bw/lat -R), runs the test cfg describes with it and
// returns what was measured. The text report goes to out as it is
// produced (nothing with cfg.JSON: the caller prints the Report).
func RunServer(ctx context.Context, dev *verbs.Device, port uint16, cfg Config, out io.Writer) (*Report, error) {
	return run(ctx, dev, netip.AddrPortFrom(netip.Addr{}, port), false, cfg, out)
}

// RunClient connects to a perftest server at server and runs the test.
func RunClient(ctx context.Context, dev *verbs.Device, server netip.AddrPort, cfg Config, out io.Writer) (*Report, error) {
	if !server.Addr().IsValid() || server.Port() == 0 {
		return nil, fmt.Errorf("%w: server address %v", ErrConfig, server)
	}
	return run(ctx, dev, server, true, cfg, out)
}

// session is one side of a run.
type session struct {
	ctx    context.Context
	dev    *verbs.Device
	cfg    Config
	client bool
	// peerLingers: the control connection's peer is siwtun perf, whose
	// client lingers after the closing handshake (lingerForPeer).
	peerLingers bool
	out         io.Writer
	report      *Report
	rng         *rand.Rand

	pd       *verbs.PD
	ctl      *control
	listener *verbs.Listener

	remoteVersion float64
	cycleBuffer   int // bytes a small message's addresses cycle through
	mtuEnum       int

	cq       *verbs.CQ
	qps      []*verbs.QP
	mem      *region // send half, then receive half, one buffer per QP each
	credit   *region // send tests: receive credits
	buffSize int
	my, rem  []Dest
	remData  []Dest // write --imm bandwidth: the peer's data buffers (rem has its credit slots)
	qpErr    error  // a test connection ended (checkQPs)
	qpEvent  verbs.Event
}

func run(ctx context.Context, dev *verbs.Device, addr netip.AddrPort, client bool, cfg Config, out io.Writer) (*Report, error) {
	attr := dev.Query()
	cfg, err := cfg.Normalize(attr)
	if err != nil {
		return nil, err
	}
	if cfg.JSON || out == nil {
		out = io.Discard
	}
	s := &session{ctx: ctx, dev: dev, cfg: cfg, client: client, out: out,
		rng:         rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid()))),
		cycleBuffer: os.Getpagesize(), mtuEnum: verbs.MTUEnum(attr.MTU)}
	s.report = &Report{Info: TestInfo{
		Test: testName(&cfg), Role: map[bool]string{true: "client", false: "server"}[client],
		Device: dev.Name(), DualPort: "OFF", QPs: cfg.QPs, Transport: "IW", Connection: "RC", SRQ: "OFF",
		TxDepth: cfg.TxDepth, RxDepth: cfg.RxDepth, LinkType: "Ethernet", RDMACM: "ON", DataExchange: "rdma_cm",
		Version: Version, Units: cfg.units(), Duration: int(cfg.Duration / time.Second),
		Bidirectional: cfg.Bidirectional, PeakMeasured: !cfg.Latency && !cfg.noPeak(!client),
		latency: cfg.Latency,
	}}
	if !cfg.Latency {
		s.report.Info.CQMod = cfg.cqMod()
	}
	if cfg.readsOut() {
		s.report.Info.OutReads = cfg.OutReads
	} else {
		s.report.Info.Inline = cfg.Inline
	}
	defer s.close()
	if err := s.run(addr); err != nil {
		if hint := s.sizeHint(); hint != "" {
			err = fmt.Errorf("%s: %w", hint, err)
		}
		return s.report, err
	}
	return s.report, nil
}

// testName is perftest's JSON test name ("RDMA_Write_BW_Test").
func testName(c *Config) string {
	s := c.Verb.String() + "_"
	switch {
	case c.Latency:
		s += "Latency_"
	case c.Bidirectional:
		s += "Bidirectional_BW_"
	default:
		s += "BW_"
	}
	return s + "Test"
}

func (s *session) close() {
	s.lingerForPeer()
	for _, qp := range s.qps {
		if qp != nil {
			qp.Destroy()
		}
	}
	if s.ctl != nil {
		s.ctl.close()
	}
	if s.listener != nil {
		s.listener.Close()
	}
	for _, r := range []*region{s.mem, s.credit} {
		if r != nil {
			r.free()
		}
	}
	if s.cq != nil {
		s.cq.Destroy()
	}
	if s.pd != nil {
		s.pd.Dealloc()
	}
}

// closeLinger bounds how long a side waits, after the closing handshake,
// for the peer to disconnect first.
const closeLinger = 500 * time.Millisecond

// lingerTag is the private data siwtun perf's client sends with its
// control connection, so a siwtun perf server knows its peer lingers.
// perftest ignores the private data of its connections.
const lingerTag = "siwtun perf: lingers"

// lingerForPeer lets the peer end the connection first after the closing
// handshake. Linux siw moves a queue pair to ERROR as soon as the peer's
// FIN arrives, which can fail the completion of a Send it has put on the
// wire and that reached this side: perftest's ib_read_bw exited 1 after
// its report ("Bad wc status 2") in about 1 of 6 `make interop` runs, as
// server when this side's client tore its connections down within a
// millisecond of the server's last message, and as client when this
// side's server did so after the client's. The client always lingers; the
// server lingers unless its client is siwtun perf (lingerTag), so two
// siwtun perf processes do not wait for each other.
func (s *session) lingerForPeer() {
	if (!s.client && s.peerLingers) || s.ctl == nil || s.ctl.qp == nil || !s.ctl.lastExchange {
		return
	}
	timer := time.NewTimer(closeLinger)
	defer timer.Stop()
	for {
		select {
		case e := <-s.ctl.qp.Events():
			switch e.Type {
			case verbs.EventDisconnected, verbs.EventTerminateReceived, verbs.EventTerminateSent:
				return
			}
		case <-timer.C:
			return
		}
	}
}

// run is the test from the control connection to the last exchange, in
// the order perftest 6.06's ib_*_bw/lat main()s do it.
func (s *session) run(addr netip.AddrPort) error {
	c := &s.cfg
	if !s.client && c.noPeak(true) && !c.Latency {
		fmt.Fprint(s.out, noPeakWarning)
	}
	if s.client && c.Duration > 0 && !c.Latency {
		fmt.Fprint(s.out, noPeakWarning)
	}
	var err error
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return fmt.Errorf("alloc PD: %w", err)
	}
	if err := s.connectControl(addr); err != nil {
		return err
	}
	if err := s.exchangeSysData(); err != nil {
		return err
	}
	s.report.Info.MTU = verbs.MTUEnumBytes(s.mtuEnum)
	if err := s.createTestResources(); err != nil {
		return err
	}
	if err := s.connectTestQPs(addr); err != nil {
		return err
	}
	s.setUpDests()
	printBanner(s.out, c, &s.report.Info, !s.client)
	before, berr := processCPU()
	switch {
	case c.Latency:
		err = s.runLatency()
	case c.recvs():
		err = s.runSendBW()
	default:
		err = s.runRDMABW()
	}
	if after, aerr := processCPU(); err == nil && berr == nil && aerr == nil {
		s.report.CPU = &CPUUsage{User: after.User - before.User, System: after.System - before.System}
	}
	return err
}

// processCPU is this process's CPU time so far.
func processCPU() (CPUUsage, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return CPUUsage{}, fmt.Errorf("getrusage: %w", err)
	}
	return CPUUsage{User: time.Duration(ru.Utime.Nano()).Seconds(), System: time.Duration(ru.Stime.Nano()).Seconds()}, nil
}

// connectControl makes the control connection: the server accepts one
// client on the port (rdma_server_connect), the client connects
// (rdma_client_connect); IRD/ORD 0 (the control queue pair only sends),
// no private data but the client's lingerTag.
func (s *session) connectControl(addr netip.AddrPort) error {
	var err error
	if s.ctl, err = newControl(s.dev, s.pd, s.client); err != nil {
		return err
	}
	s.ctl.trace = s.cfg.trace
	if s.client {
		if err := s.connectRetry(s.ctl.qp, addr, verbs.ConnParam{PrivateData: []byte(lingerTag)}); err != nil {
			return fmt.Errorf("control connection to %v: %w", addr, err)
		}
		if s.cfg.SettleDelay > 0 {
			if err := sleep(s.ctx, s.cfg.SettleDelay); err != nil {
				return err
			}
		}
		return nil
	}
	// One listener serves the control connection and then the test
	// queue pairs, which come to the same port (perftest listens anew
	// there; a client that comes early then simply waits in the backlog).
	if s.listener, err = s.dev.Listen(addr, s.cfg.QPs+1); err != nil {
		return fmt.Errorf("listen on port %d: %w", addr.Port(), err)
	}
	fmt.Fprint(s.out, waitingBanner)
	req, err := s.listener.Accept(s.ctx)
	if err != nil {
		return fmt.Errorf("waiting for a client on port %d: %w", addr.Port(), err)
	}
	s.peerLingers = string(req.PrivateData) == lingerTag
	if err := req.Accept(s.ctl.qp, verbs.ConnParam{}); err != nil {
		return fmt.Errorf("accepting the control connection from %v: %w", req.Remote, err)
	}
	return nil
}

// exchangeSysData runs the exchanges after the control connection:
// exchange_versions, check_version_compatibility, check_sys_data and
// check_mtu.
func (s *session) exchangeSysData() error {
	b, err := s.ctl.exchange(s.ctx, marshalVersion(Version), versionLen, "versions")
	if err != nil {
		return err
	}
	rv, err := parseVersion(b)
	if err != nil {
		return err
	}
	s.report.Info.RemoteVersion = rv
	s.remoteVersion = versionNumber(rv)
	if s.remoteVersion < 5.70 {
		return fmt.Errorf("the peer runs perftest %q: not compatible with versions older than 5.70", rv)
	}
	// check_sys_data (from 5.32): page size, then cache-line size; each
	// side takes the larger.
	b, err = s.ctl.exchange(s.ctx, marshalInt32(s.cycleBuffer), sysDataLen, "page size")
	if err != nil {
		return err
	}
	rp, err := parseInt32(b)
	if err != nil {
		return err
	}
	s.cycleBuffer = max(s.cycleBuffer, rp)
	b, err = s.ctl.exchange(s.ctx, marshalInt32(cacheLine), sysDataLen, "cache line size")
	if err != nil {
		return err
	}
	if _, err := parseInt32(b); err != nil {
		return err
	}
	// check_mtu (2 bytes from 5.31): the smaller valid MTU.
	b, err = s.ctl.exchange(s.ctx, marshalMTU(s.mtuEnum), 1, "MTU")
	if err != nil {
		return err
	}
	if rm := parseMTU(b); rm != 0 && rm < s.mtuEnum {
		s.mtuEnum = rm
	}
	return nil
}

// createTestResources allocates the test buffer (like perftest's: per
// queue pair a send buffer, then per queue pair a receive buffer, each
// BUFF_SIZE = max(size, cycle buffer) bytes), the credit slots of send
// tests, one completion queue and the test queue pairs in INIT.
func (s *session) createTestResources() error {
	c := &s.cfg
	s.buffSize = max(c.Size, s.cycleBuffer)
	var err error
	if s.mem, err = newRegion(s.dev, s.pd, 2*c.QPs*s.buffSize); err != nil {
		return fmt.Errorf("test buffer: %w", err)
	}
	if c.recvs() && !c.Latency {
		if s.credit, err = newRegion(s.dev, s.pd, 2*c.QPs*creditLen); err != nil {
			return fmt.Errorf("credit buffer: %w", err)
		}
	}
	rx := 1
	if c.recvs() {
		rx = c.RxDepth
	}
	depth := c.QPs*(c.TxDepth+2+rx) + 16
	if s.cq, err = s.dev.CreateCQ(min(depth, verbs.MaxCQE)); err != nil {
		return fmt.Errorf("test CQ: %w", err)
	}
	s.qps = make([]*verbs.QP, c.QPs)
	for i := range s.qps {
		qp, err := s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, MaxSendWR: c.TxDepth + 2, MaxRecvWR: rx})
		if err != nil {
			return fmt.Errorf("test QP %d: %w", i, err)
		}
		s.qps[i] = qp
		if err := qp.Modify(verbs.QPInit); err != nil {
			return fmt.Errorf("test QP %d: %w", i, err)
		}
	}
	s.my = make([]Dest, c.QPs)
	s.rem = make([]Dest, c.QPs)
	return nil
}

// connectTestQPs is create_rdma_cm_connection: a handshake, the test
// connections (the client connects its queue pairs in order, retrying
// while the server is not listening yet; the server accepts them in
// order), another handshake. The handshakes carry zeroed pingpong_dests.
func (s *session) connectTestQPs(addr netip.AddrPort) error {
	var zero Dest
	if _, err := s.ctl.handshake(s.ctx, &zero); err != nil {
		return fmt.Errorf("before the test connections: %w", err)
	}
	c := &s.cfg
	var p verbs.ConnParam
	if c.readsOut() {
		p = verbs.ConnParam{ResponderResources: uint16(c.OutReads), InitiatorDepth: uint16(c.OutReads)}
	}
	for i, qp := range s.qps {
		if s.client {
			if err := s.connectRetry(qp, addr, p); err != nil {
				return fmt.Errorf("test QP %d: %w", i, err)
			}
			continue
		}
		req, err := s.listener.Accept(s.ctx)
		if err != nil {
			return fmt.Errorf("waiting for test connection %d: %w", i, err)
		}
		ap := p
		if c.readsOut() {
			// Clamped to what the initiator asked (rdma_cm_connection_request_handler).
			ap.ResponderResources = min(p.ResponderResources, max(req.ORD, 1))
			ap.InitiatorDepth = min(p.InitiatorDepth, max(req.IRD, 1))
		}
		if err := req.Accept(qp, ap); err != nil {
			return fmt.Errorf("accepting test connection %d from %v: %w", i, req.Remote, err)
		}
	}
	if s.listener != nil {
		s.listener.Close()
		s.listener = nil
	}
	if _, err := s.ctl.handshake(s.ctx, &zero); err != nil {
		return fmt.Errorf("after the test connections: %w", err)
	}
	return nil
}

func (s *session) connectRetry(qp *verbs.QP, addr netip.AddrPort, p verbs.ConnParam) error {
	var err error
	for try := 0; try < s.cfg.ConnectRetries; try++ {
		if try > 0 {
			if e := sleep(s.ctx, s.cfg.ConnectRetryDelay); e != nil {
				return e
			}
		}
		if err = qp.Connect(s.ctx, addr, p); err == nil {
			return nil
		}
		if s.ctx.Err() != nil {
			return err
		}
	}
	return fmt.Errorf("no connection after %d tries: %w", s.cfg.ConnectRetries, err)
}

// setUpDests fills this side's pingpong_dests (set_up_connection): per
// queue pair its number, a random PSN, the rkey and address of its receive
// buffer (for send tests, ctx_alloc_credit's credit slot instead), and the
// GID of the local address.
func (s *session) setUpDests() {
	c := &s.cfg
	gid := gidFor(s.ctl.qp.Info().Local.Addr())
	for i, qp := range s.qps {
		d := Dest{OutReads: uint32(c.OutReads), QPN: qp.Num(), PSN: s.rng.Uint32() & 0xffffff,
			RKey: s.mem.mr.RKey(), VAddr: s.mem.addr(s.recvOff(i)), GID: gid}
		if s.credit != nil {
			d.RKey = s.credit.mr.RKey()
			d.VAddr = s.credit.addr(creditSlot(c.QPs, i))
		}
		s.my[i] = d
	}
}

// sendOff and recvOff are the offsets of queue pair i's buffers.
func (s *session) sendOff(i int) int { return i * s.buffSize }
func (s *session) recvOff(i int) int { return (s.cfg.QPs + i) * s.buffSize }

// creditSlot is the offset of queue pair i's credit in the credit region
// (after one control slot per queue pair, as perftest lays it out).
func creditSlot(qps, i int) int { return (qps + i) * creditLen }

// exchangeDests runs one handshake per queue pair, keeping the peer's
// pingpong_dests; print prints each as perftest's remote address.
func (s *session) exchangeDests(print bool) error {
	for i := range s.my {
		d, err := s.ctl.handshake(s.ctx, &s.my[i])
		if err != nil {
			return err
		}
		s.rem[i] = d
		if print {
			printAddress(s.out, "remote", &d)
		}
	}
	return nil
}

// printLocal prints this side's addresses.
func (s *session) printLocal() {
	for i := range s.my {
		printAddress(s.out, "local", &s.my[i])
	}
}

// sync is a bare handshake: both sides reach this point.
func (s *session) sync(what string) error {
	if _, err := s.ctl.handshake(s.ctx, &s.my[0]); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// closeSync is ctx_close_connection: the last handshake. The peer may
// tear its connection down as soon as it has this side's message, which
// can flush the completion of a Send that did reach it; that is not a
// failure here.
func (s *session) closeSync() error {
	s.ctl.lastExchange = true
	return s.sync("closing")
}

// closeSyncServing is closeSync at the end of a timed Send run: while the
// handshake runs, serve keeps taking this side's test completions, for the
// peer may still be finishing its run (waiting for its last Sends to be
// received and credited, or for the answer to its last ping) and this
// side must not tear its queue pairs down while Sends are on their way to
// them. The peer's closing message says it has finished: it sends it only
// once its own Sends have all been received. A flushed completion while
// the handshake runs is the peer tearing down after it: not a failure if
// the handshake completes.
func (s *session) closeSyncServing(serve func(ctx context.Context) error) error {
	s.ctl.lastExchange = true
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.ctl.handshake(ctx, &s.my[0])
		done <- err
	}()
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("closing: %w", err)
			}
			return nil
		default:
		}
		err := serve(ctx)
		switch {
		case err == nil:
			continue
		case errors.Is(err, errServeFlushed):
			if herr := <-done; herr != nil {
				return fmt.Errorf("closing: %w (%w)", herr, err)
			}
			return nil
		default:
			cancel()
			<-done
			return fmt.Errorf("closing: %w", err)
		}
	}
}

// errServeFlushed: a test completion was flushed while closeSyncServing
// served.
var errServeFlushed = errors.New("a test request was flushed during the closing handshake")

// serveWait bounds one wait for a test completion while a closing
// handshake runs, so that its end is noticed.
const serveWait = time.Millisecond

// drainTimeout bounds how long a timed Send run waits after its end for
// the peer to receive its last Sends (a perftest peer stops taking them at
// the end of its own run).
const drainTimeout = 2 * time.Second

// xchgReports is xchg_bw_reports: size, iterations, peak, average and
// message rate, each its own 8-byte exchange.
func (s *session) xchgReports(mine BWResult) (BWResult, error) {
	var theirs [5][]byte
	for i, f := range reportFields(mine) {
		b, err := s.ctl.exchange(s.ctx, f, reportField, "bandwidth reports")
		if err != nil {
			return BWResult{}, err
		}
		theirs[i] = b
	}
	return parseReport(theirs)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errIncomplete reports a data-path failure (a completion with an error).
var errIncomplete = errors.New("test traffic failed")

// checkQPs reports a test queue pair whose connection has ended: a wait
// that no completion ends (credits, a peer's Write into memory) must not
// outlive its peer. The first such event is kept.
func (s *session) checkQPs() error {
	if s.qpErr != nil {
		return s.qpErr
	}
	for i, qp := range s.qps {
		for {
			select {
			case e := <-qp.Events():
				switch e.Type {
				case verbs.EventTerminateReceived, verbs.EventTerminateSent, verbs.EventDisconnected:
					s.qpErr = fmt.Errorf("test QP %d: %v: %w", i, e, errIncomplete)
					s.qpEvent = e
					return s.qpErr
				}
				continue
			default:
			}
			break
		}
	}
	return nil
}

// The Terminates a message larger than the peer's buffer brings (RFC 5040
// §7, layer, error type and code): an RDMA Write beyond the region (DDP
// tagged base or bounds), an RDMA Read beyond it (RDMAP base or bounds), a
// Send longer than the receive (DDP message too long).
const (
	termDDPTaggedBaseBounds = 0x1101
	termRDMAPBaseBounds     = 0x0101
	termDDPTooLong          = 0x1205
)

// sizeHintWait bounds how long sizeHint waits for the Terminate behind a
// failed run: the control connection may report the failure first, and
// on a loaded machine the event can trail the failed completion by far
// more than a round trip (only a failed run waits).
const sizeHintWait = 2 * time.Second

// sizeHint explains a run that failed because the two sides run with
// different -s (perftest does not exchange the size: each side registers
// its own buffer of its own -s): a test queue pair that sent or received a
// Terminate for an access beyond a buffer. It returns "" otherwise.
func (s *session) sizeHint() string {
	ev, ok := s.qpEvent, isSizeTerminate(s.qpEvent)
	deadline := time.NewTimer(sizeHintWait)
	defer deadline.Stop()
	for !ok && len(s.qps) > 0 {
		cases := make([]reflect.SelectCase, 0, len(s.qps)+1)
		for _, qp := range s.qps {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(qp.Events())})
		}
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline.C)})
		i, v, recvOK := reflect.Select(cases)
		if i == len(s.qps) || !recvOK {
			break
		}
		if e := v.Interface().(verbs.Event); isSizeTerminate(e) {
			ev, ok = e, true
		}
	}
	if !ok {
		return ""
	}
	me, peer := "client", "server"
	if !s.client {
		me, peer = peer, me
	}
	if ev.Type == verbs.EventTerminateReceived {
		return fmt.Sprintf("the %s's buffer is smaller than this %s's messages (-s %d; the %s sent Terminate %v): run %s and %s with the same -s",
			peer, me, s.cfg.Size, peer, ev.Code, peer, me)
	}
	return fmt.Sprintf("the %s's messages are larger than this %s's buffer (-s %d; Terminate %v sent): run %s and %s with the same -s",
		peer, me, s.cfg.Size, ev.Code, peer, me)
}

func isSizeTerminate(e verbs.Event) bool {
	if e.Type != verbs.EventTerminateReceived && e.Type != verbs.EventTerminateSent {
		return false
	}
	switch uint16(e.Code) {
	case termDDPTaggedBaseBounds, termRDMAPBaseBounds, termDDPTooLong:
		return true
	}
	return false
}
