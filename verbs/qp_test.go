package verbs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
)

// loneSide is an RNIC whose QP has no peer: for the state machine and for
// work-queue checks that need no network.
func loneSide(t testing.TB, depth int) *side {
	t.Helper()
	la, _ := netstack.Pipe(1500, netstack.Impairments{})
	return newSide(t, newStack(t, la, cliAddr, 1500), "siwtun0", nil, depth)
}

// unconnectedPair is newPair without the connection, so a test can replace
// either QP first.
func unconnectedPair(t testing.TB, o pairOpts) (cli, srv *side) {
	t.Helper()
	if o.mtu == 0 {
		o.mtu = 1500
	}
	if o.depth == 0 {
		o.depth = 64
	}
	la, lb := netstack.Pipe(o.mtu, o.imp)
	cli = newSide(t, newStack(t, la, cliAddr, o.mtu), "siwtun0", o.cli, o.depth)
	srv = newSide(t, newStack(t, lb, srvAddr, o.mtu), "siwtun1", o.srv, o.depth)
	return cli, srv
}

// connectOn is connect on a given server port (a port whose previous
// connection is still closing cannot be bound again).
func connectOn(t testing.TB, cli, srv *side, port uint16, cp, sp ConnParam) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	l, err := srv.dev.Listen(netipPort(port), 4)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			accepted <- err
			return
		}
		accepted <- req.Accept(srv.qp, sp)
	}()
	if err := cli.qp.Connect(ctx, netipPort(port), cp); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("Accept: %v", err)
	}
	cli.waitEvent(EventEstablished)
	srv.waitEvent(EventEstablished)
}

// newQP replaces s.qp with a fresh QP of attr (CQs default to the side's).
func (s *side) newQP(attr QPInitAttr) *QP {
	s.t.Helper()
	if attr.SendCQ == nil {
		attr.SendCQ = s.scq
	}
	if attr.RecvCQ == nil {
		attr.RecvCQ = s.rcq
	}
	qp, err := s.pd.CreateQP(attr)
	if err != nil {
		s.t.Fatalf("CreateQP: %v", err)
	}
	s.qp = qp
	s.events = nil
	return qp
}

// rawSide connects a hand-driven raw peer to a fresh server QP. The peer
// declares IRD ird, so the server's ORD is min(16, ird), and it answers no
// Read Request unless the test does: the server's Reads stay outstanding.
func rawSide(t testing.TB, depth int, ird uint16) (*side, *rawPeer) {
	t.Helper()
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cs := newStack(t, la, cliAddr, 1500)
	srv := newSide(t, newStack(t, lb, srvAddr, 1500), "siwtun1", nil, depth)
	p := dialRaw(t, cs, srv, mpa.Config{Rev: 2, CRC: true, IRD: ird, ORD: 1})
	return srv, p
}

// next returns the next ULPDU the raw peer received: its DDP header, RDMAP
// opcode and what follows the DDP header.
func (p *rawPeer) next() (ddp.Header, rdmap.Opcode, []byte) {
	p.t.Helper()
	timer := time.NewTimer(testTimeout)
	defer timer.Stop()
	select {
	case u, ok := <-p.got:
		if !ok {
			p.t.Fatal("raw peer: connection closed")
		}
		var h ddp.Header
		n, err := h.Unmarshal(u)
		if err != nil {
			p.t.Fatal(err)
		}
		_, op := rdmap.ParseCtrl(h.ULPCtrl)
		return h, op, u[n:]
	case <-timer.C:
		p.t.Fatal("raw peer: nothing received")
	}
	panic("unreachable")
}

// readRequest waits for the next Read Request and checks its MSN.
func (p *rawPeer) readRequest(msn uint32) rdmap.ReadRequest {
	p.t.Helper()
	h, op, body := p.next()
	if op != rdmap.OpReadRequest || h.MSN != msn {
		p.t.Fatalf("raw peer got %v MSN %d, want a Read Request MSN %d", op, h.MSN, msn)
	}
	var rr rdmap.ReadRequest
	if err := rr.Unmarshal(body); err != nil {
		p.t.Fatal(err)
	}
	return rr
}

// readResponse answers rr with data in one FPDU.
func (p *rawPeer) readResponse(rr rdmap.ReadRequest, data []byte) {
	p.t.Helper()
	h := ddp.Header{Tagged: true, Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpReadResponse), STag: rr.SinkSTag, TO: rr.SinkTO}
	b := make([]byte, h.Len()+len(data))
	h.Marshal(b)
	copy(b[h.Len():], data)
	p.send(b, false)
}

func stats(s *side) *offload.QPStats { return s.qp.eng.Stats() }

// wantFlushed checks that wcs are exactly ids, in order, all flushed.
func wantFlushed(t testing.TB, what string, wcs []WorkCompletion, ids []uint64, ops []WCOpcode) {
	t.Helper()
	if len(wcs) != len(ids) {
		t.Fatalf("%s: %d completions, want %d", what, len(wcs), len(ids))
	}
	for i, wc := range wcs {
		if wc.ID != ids[i] || wc.Status != WCFlushErr || wc.Opcode != ops[i] {
			t.Fatalf("%s: completion %d = {id %d %v %v}, want {id %d %v %v}", what, i, wc.ID, wc.Opcode, wc.Status, ids[i], ops[i], WCFlushErr)
		}
	}
}

func TestQPStateValues(t *testing.T) {
	// rdma-core libibverbs/verbs.h, enum ibv_qp_state.
	tests := []struct {
		name  string
		state QPState
		value uint32
	}{
		{"RESET", QPReset, 0},
		{"INIT", QPInit, 1},
		{"RTR", QPRTR, 2},
		{"RTS", QPRTS, 3},
		{"ERR", QPErr, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if uint32(tt.state) != tt.value || tt.state.String() != tt.name {
				t.Fatalf("%v = %d, want %s = %d", tt.state, uint32(tt.state), tt.name, tt.value)
			}
		})
	}
}

// TestQPModifyTransitions drives every hand-made transition from RESET,
// INIT and ERR: the legal ones land in the target state, the others fail
// with ErrQPState and leave the state alone.
func TestQPModifyTransitions(t *testing.T) {
	s := loneSide(t, 4)
	tests := []struct {
		name string
		path []QPState // Modify calls that reach the starting state
		to   QPState
		ok   bool
	}{
		{"RESET->INIT", nil, QPInit, true},
		{"RESET->RESET", nil, QPReset, true},
		{"RESET->RTR", nil, QPRTR, false},
		{"RESET->RTS", nil, QPRTS, false},
		{"RESET->ERR", nil, QPErr, true},
		{"RESET->SQD", nil, QPState(4), false},
		{"RESET->SQE", nil, QPState(5), false},
		{"RESET->unknown", nil, QPState(99), false},
		{"INIT->INIT", []QPState{QPInit}, QPInit, true},
		{"INIT->RESET", []QPState{QPInit}, QPReset, true},
		{"INIT->RTR", []QPState{QPInit}, QPRTR, false},
		{"INIT->RTS", []QPState{QPInit}, QPRTS, false},
		{"INIT->ERR", []QPState{QPInit}, QPErr, true},
		{"ERR->ERR", []QPState{QPErr}, QPErr, true},
		{"ERR->RESET", []QPState{QPErr}, QPReset, true},
		{"ERR->INIT", []QPState{QPErr}, QPInit, false},
		{"ERR->RTS", []QPState{QPErr}, QPRTS, false},
		{"ERR->RESET->INIT", []QPState{QPErr, QPReset}, QPInit, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			qp := s.newQP(QPInitAttr{MaxSendWR: 4, MaxRecvWR: 4})
			defer qp.Destroy()
			if st := qp.State(); st != QPReset {
				t.Fatalf("new QP in %v, want RESET", st)
			}
			for _, p := range tt.path {
				if err := qp.Modify(p); err != nil {
					t.Fatalf("Modify(%v): %v", p, err)
				}
			}
			from := qp.State()
			err := qp.Modify(tt.to)
			switch {
			case tt.ok && err != nil:
				t.Fatalf("Modify(%v) from %v: %v", tt.to, from, err)
			case tt.ok && qp.State() != tt.to:
				t.Fatalf("state %v after Modify(%v)", qp.State(), tt.to)
			case !tt.ok && !errors.Is(err, offload.ErrQPState):
				t.Fatalf("Modify(%v) from %v = %v, want ErrQPState", tt.to, from, err)
			case !tt.ok && qp.State() != from:
				t.Fatalf("failed Modify(%v) moved the QP from %v to %v", tt.to, from, qp.State())
			}
		})
	}
}

// TestQPPostByState checks which states take work requests: none in RESET,
// receives only in INIT, both in ERR (flushed at once).
func TestQPPostByState(t *testing.T) {
	s := loneSide(t, 4)
	buf := s.region(64, AccessLocalWrite)
	tests := []struct {
		name           string
		path           []QPState
		recvOK, sendOK bool
	}{
		{"RESET", nil, false, false},
		{"INIT", []QPState{QPInit}, true, false},
		{"ERR", []QPState{QPErr}, true, true},
		{"ERR->RESET", []QPState{QPErr, QPReset}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scq, _ := s.dev.CreateCQ(8)
			rcq, _ := s.dev.CreateCQ(8)
			qp := s.newQP(QPInitAttr{SendCQ: scq, RecvCQ: rcq, MaxSendWR: 4, MaxRecvWR: 4})
			for _, p := range tt.path {
				if err := qp.Modify(p); err != nil {
					t.Fatalf("Modify(%v): %v", p, err)
				}
			}
			n, err := qp.PostRecv([]RecvWR{{ID: 1, SGL: []SGE{buf.mr.SGE(0, 64)}}})
			if tt.recvOK != (err == nil && n == 1) || (!tt.recvOK && (n != 0 || !errors.Is(err, offload.ErrQPState))) {
				t.Fatalf("PostRecv in %v = %d, %v; want ok=%v (else 0, ErrQPState)", qp.State(), n, err, tt.recvOK)
			}
			n, err = qp.PostSend([]SendWR{{ID: 2, Opcode: WRSend, Flags: FlagSignaled | FlagInline, Inline: []byte("x")}})
			if tt.sendOK != (err == nil && n == 1) || (!tt.sendOK && (n != 0 || !errors.Is(err, offload.ErrQPState))) {
				t.Fatalf("PostSend in %v = %d, %v; want ok=%v (else 0, ErrQPState)", qp.State(), n, err, tt.sendOK)
			}
			if qp.State() == QPErr {
				wantFlushed(t, "send", poll(t, scq, 1), []uint64{2}, []WCOpcode{WCSend})
				wantFlushed(t, "recv", poll(t, rcq, 1), []uint64{1}, []WCOpcode{WCRecv})
			}
			noCompletion(t, scq)
			noCompletion(t, rcq)
		})
	}
}

// TestQPResetDiscardsReceives: INIT→RESET empties the receive queue without
// completions (IBV_QPS_RESET), and the queue is usable again after INIT.
func TestQPResetDiscardsReceives(t *testing.T) {
	s := loneSide(t, 4)
	buf := s.region(64, AccessLocalWrite)
	if err := s.qp.Modify(QPInit); err != nil {
		t.Fatal(err)
	}
	s.recv(RecvWR{ID: 1, SGL: []SGE{buf.mr.SGE(0, 64)}}, RecvWR{ID: 2, SGL: []SGE{buf.mr.SGE(0, 64)}})
	if use := s.qp.Info().RQUse; use != 2 {
		t.Fatalf("RQ use %d, want 2", use)
	}
	if err := s.qp.Modify(QPReset); err != nil {
		t.Fatal(err)
	}
	if use := s.qp.Info().RQUse; use != 0 {
		t.Fatalf("RQ use %d after RESET, want 0", use)
	}
	noCompletion(t, s.rcq)
	if err := s.qp.Modify(QPInit); err != nil {
		t.Fatal(err)
	}
	s.recv(RecvWR{ID: 3, SGL: []SGE{buf.mr.SGE(0, 64)}}, RecvWR{ID: 4, SGL: []SGE{buf.mr.SGE(0, 64)}},
		RecvWR{ID: 5, SGL: []SGE{buf.mr.SGE(0, 64)}}, RecvWR{ID: 6, SGL: []SGE{buf.mr.SGE(0, 64)}})
	// Modify(ERR) flushes what is posted, oldest first, exactly once.
	if err := s.qp.Modify(QPErr); err != nil {
		t.Fatal(err)
	}
	wantFlushed(t, "recv", poll(t, s.rcq, 4), []uint64{3, 4, 5, 6}, []WCOpcode{WCRecv, WCRecv, WCRecv, WCRecv})
	noCompletion(t, s.rcq)
	if e := stats(s).RQErrors.Load(); e != 4 {
		t.Fatalf("RQErrors %d, want 4", e)
	}
}

// TestQPConnectedState: Connect/Accept leave both QPs in RTS, where no hand
// transition but ERR is allowed and a second Connect fails.
func TestQPConnectedState(t *testing.T) {
	cli, srv := newPair(t, pairOpts{depth: 8})
	for _, s := range []*side{cli, srv} {
		if st, info := s.qp.State(), s.qp.Info(); st != QPRTS || info.State != QPRTS {
			t.Fatalf("%s: state %v (info %v) after connect, want RTS", s.dev.Name(), st, info.State)
		}
	}
	for _, to := range []QPState{QPReset, QPInit, QPRTR, QPRTS} {
		t.Run(fmt.Sprintf("RTS->%v", to), func(t *testing.T) {
			if err := cli.qp.Modify(to); !errors.Is(err, offload.ErrQPState) {
				t.Fatalf("Modify(%v) in RTS = %v, want ErrQPState", to, err)
			}
			if st := cli.qp.State(); st != QPRTS {
				t.Fatalf("state %v, want RTS", st)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := cli.qp.Connect(ctx, netipPort(srvPort), ConnParam{}); !errors.Is(err, offload.ErrQPState) {
		t.Fatalf("second Connect = %v, want ErrQPState", err)
	}
	// Still working.
	rb := srv.region(16, AccessLocalWrite)
	srv.recv(RecvWR{ID: 1, SGL: []SGE{rb.mr.SGE(0, 16)}})
	cli.post(SendWR{ID: 2, Opcode: WRSend, Flags: FlagSignaled | FlagInline, Inline: []byte("still up")})
	wantWC(t, poll(t, cli.scq, 1)[0], 2, WCSend, WCSuccess, 8)
	wantWC(t, poll(t, srv.rcq, 1)[0], 1, WCRecv, WCSuccess, 8)
}

// TestQPDisconnectFlushesBothSides: ending the connection from either side
// puts both QPs in ERR with a Disconnected event, flushes every posted
// receive exactly once, and flushes work posted afterwards at once.
func TestQPDisconnectFlushesBothSides(t *testing.T) {
	tests := []struct {
		name string
		stop func(t *testing.T, cli, srv *side)
		// destroyed is the side whose QP is gone (it takes no more work).
		destroyed func(cli, srv *side) *side
	}{
		{"client-disconnect", func(t *testing.T, cli, srv *side) { cli.qp.Disconnect() }, nil},
		{"server-disconnect", func(t *testing.T, cli, srv *side) { srv.qp.Disconnect() }, nil},
		{"client-modify-err", func(t *testing.T, cli, srv *side) {
			if err := cli.qp.Modify(QPErr); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"server-destroy", func(t *testing.T, cli, srv *side) {
			if err := srv.qp.Destroy(); err != nil {
				t.Fatal(err)
			}
		}, func(_, srv *side) *side { return srv }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{depth: 16})
			const nrecv = 3
			bufs := map[*side]*guarded{}
			for i, s := range []*side{cli, srv} {
				bufs[s] = s.region(256, AccessLocalWrite)
				for j := 0; j < nrecv; j++ {
					s.recv(RecvWR{ID: uint64(100*i + j), SGL: []SGE{bufs[s].mr.SGE(0, 256)}})
				}
			}
			tt.stop(t, cli, srv)
			for i, s := range []*side{cli, srv} {
				s.waitEvent(EventDisconnected)
				if st := s.qp.State(); st != QPErr {
					t.Fatalf("%s: state %v, want ERR", s.dev.Name(), st)
				}
				ids := []uint64{uint64(100 * i), uint64(100*i + 1), uint64(100*i + 2)}
				wantFlushed(t, s.dev.Name()+" receives", poll(t, s.rcq, nrecv), ids, []WCOpcode{WCRecv, WCRecv, WCRecv})
				if tt.destroyed != nil && tt.destroyed(cli, srv) == s {
					continue
				}
				// Posted after the end: flushed at once, signaled or not.
				s.post(SendWR{ID: 7, Opcode: WRSend, Flags: FlagInline, Inline: []byte("late")},
					SendWR{ID: 8, Opcode: WRWrite, Flags: FlagSignaled, SGL: []SGE{bufs[s].mr.SGE(0, 8)}, RKey: 1})
				s.recv(RecvWR{ID: 9, SGL: []SGE{bufs[s].mr.SGE(0, 8)}})
				wantFlushed(t, s.dev.Name()+" late sends", poll(t, s.scq, 2), []uint64{7, 8}, []WCOpcode{WCSend, WCWrite})
				wantFlushed(t, s.dev.Name()+" late receive", poll(t, s.rcq, 1), []uint64{9}, []WCOpcode{WCRecv})
				noCompletion(t, s.scq)
				noCompletion(t, s.rcq)
				st := stats(s)
				if st.RQErrors.Load() != nrecv+1 || st.SQErrors.Load() != 2 || st.TerminatesTx.Load() != 0 || st.TerminatesRx.Load() != 0 {
					t.Fatalf("%s: RQErrors %d SQErrors %d Terminates tx %d rx %d, want %d 2 0 0", s.dev.Name(),
						st.RQErrors.Load(), st.SQErrors.Load(), st.TerminatesTx.Load(), st.TerminatesRx.Load(), nrecv+1)
				}
			}
		})
	}
}

// TestQPFlushOutstandingSends holds send work in the queue (the peer never
// answers the first Read and the ORD is 1, so everything behind it waits)
// and ends the stream in each way: every send and receive request completes
// exactly once, flushed, in posting order.
func TestQPFlushOutstandingSends(t *testing.T) {
	tests := []struct {
		name string
		stop func(t *testing.T, srv *side, p *rawPeer)
	}{
		{"disconnect", func(t *testing.T, srv *side, p *rawPeer) { srv.qp.Disconnect() }},
		{"modify-err", func(t *testing.T, srv *side, p *rawPeer) {
			if err := srv.qp.Modify(QPErr); err != nil {
				t.Fatal(err)
			}
		}},
		{"peer-closes", func(t *testing.T, srv *side, p *rawPeer) { p.conn.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, p := rawSide(t, 16, 1)
			if ord := srv.qp.Info().ORD; ord != 1 {
				t.Fatalf("ORD %d, want 1", ord)
			}
			sink := srv.region(4096, AccessLocalWrite)
			src := srv.region(4096, AccessLocalWrite)
			for i := 0; i < 4; i++ {
				srv.recv(RecvWR{ID: uint64(100 + i), SGL: []SGE{sink.mr.SGE(0, 4096)}})
			}
			srv.post(
				SendWR{ID: 1, Opcode: WRRead, Flags: FlagSignaled, SGL: []SGE{sink.mr.SGE(0, 1024)}, RemoteAddr: 0x1000, RKey: 0x4200},
				SendWR{ID: 2, Opcode: WRRead, SGL: []SGE{sink.mr.SGE(1024, 1024)}, RemoteAddr: 0x1000, RKey: 0x4200},
				SendWR{ID: 3, Opcode: WRWrite, Flags: FlagInline, Inline: []byte("held"), RemoteAddr: 0x1000, RKey: 0x4200},
				SendWR{ID: 4, Opcode: WRSend, Flags: FlagSignaled, SGL: []SGE{src.mr.SGE(0, 4096)}},
				SendWR{ID: 5, Opcode: WRSendWithInv, Flags: FlagFence | FlagSolicited, SGL: []SGE{src.mr.SGE(0, 10)}, InvalidateRKey: 0x4200},
			)
			p.readRequest(1) // Read 1 is in flight; ORD 1 holds the rest
			if use := srv.qp.Info().SQUse; use != 5 {
				t.Fatalf("SQ use %d, want 5", use)
			}
			tt.stop(t, srv, p)
			srv.waitEvent(EventDisconnected)
			if st := srv.qp.State(); st != QPErr {
				t.Fatalf("state %v, want ERR", st)
			}
			wantFlushed(t, "sends", poll(t, srv.scq, 5), []uint64{1, 2, 3, 4, 5}, []WCOpcode{WCRead, WCRead, WCWrite, WCSend, WCSend})
			wantFlushed(t, "receives", poll(t, srv.rcq, 4), []uint64{100, 101, 102, 103}, []WCOpcode{WCRecv, WCRecv, WCRecv, WCRecv})
			srv.post(SendWR{ID: 6, Opcode: WRRead, SGL: []SGE{sink.mr.SGE(0, 8)}, RKey: 0x4200})
			srv.recv(RecvWR{ID: 104, SGL: []SGE{sink.mr.SGE(0, 8)}})
			wantFlushed(t, "late send", poll(t, srv.scq, 1), []uint64{6}, []WCOpcode{WCRead})
			wantFlushed(t, "late receive", poll(t, srv.rcq, 1), []uint64{104}, []WCOpcode{WCRecv})
			noCompletion(t, srv.scq)
			noCompletion(t, srv.rcq)
			st := stats(srv)
			if st.SQErrors.Load() != 6 || st.SQCompleted.Load() != 0 || st.RQErrors.Load() != 5 || st.ReadsTx.Load() != 1 {
				t.Fatalf("SQErrors %d SQCompleted %d RQErrors %d ReadsTx %d, want 6 0 5 1",
					st.SQErrors.Load(), st.SQCompleted.Load(), st.RQErrors.Load(), st.ReadsTx.Load())
			}
			if info := srv.qp.Info(); info.SQUse != 0 || info.RQUse != 0 {
				t.Fatalf("queues hold %d/%d after the flush", info.SQUse, info.RQUse)
			}
		})
	}
}

// TestQPReuseAfterPeerDisconnect: a QP whose peer disconnected goes
// ERR→RESET→INIT and connects again, with fresh MSNs in both directions.
func TestQPReuseAfterPeerDisconnect(t *testing.T) {
	cli, srv := newPair(t, pairOpts{depth: 8})
	cli.qp.Disconnect()
	srv.waitEvent(EventDisconnected)
	for _, to := range []QPState{QPReset, QPInit} {
		if err := srv.qp.Modify(to); err != nil {
			t.Fatalf("Modify(%v) after disconnect: %v", to, err)
		}
	}
	if info := srv.qp.Info(); info.SQUse != 0 || info.RQUse != 0 {
		t.Fatalf("queues hold %d/%d after RESET", info.SQUse, info.RQUse)
	}
	cli.newQP(QPInitAttr{MaxSendWR: 8, MaxRecvWR: 8})
	srv.events = nil
	num := srv.qp.Num()
	connectOn(t, cli, srv, srvPort+1, ConnParam{}, ConnParam{})
	if srv.qp.State() != QPRTS || srv.qp.Num() != num {
		t.Fatalf("reused QP %d in %v, want QP %d in RTS", srv.qp.Num(), srv.qp.State(), num)
	}
	exercise(t, cli, srv, 5000, 11)
	// And the reused QP as requester.
	mem := cli.region(64, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
	srv.post(SendWR{ID: 1, Opcode: WRWrite, Flags: FlagSignaled | FlagInline, Inline: []byte("from the reused QP"), RemoteAddr: mem.mr.Addr(), RKey: mem.mr.RKey()})
	wantWC(t, poll(t, srv.scq, 1)[0], 1, WCWrite, WCSuccess, 18)
	sink := srv.region(18, AccessLocalWrite)
	srv.post(SendWR{ID: 2, Opcode: WRRead, Flags: FlagSignaled, SGL: []SGE{sink.mr.SGE(0, 18)}, RemoteAddr: mem.mr.Addr(), RKey: mem.mr.RKey()})
	wantWC(t, poll(t, srv.scq, 1)[0], 2, WCRead, WCSuccess, 18)
	sameBytes(t, "read back", sink.buf(), []byte("from the reused QP"))
}

// validWrite is a signaled inline Write into dst.
func validWrite(id uint64, dst *guarded) SendWR {
	return SendWR{ID: id, Opcode: WRWrite, Flags: FlagSignaled | FlagInline, Inline: []byte("ok"), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}
}

// TestPostSendValidation posts batches with one malformed request: the call
// returns its index and ErrInvalidWR, the requests before it run, and none
// after it is posted. Requests at the limits are accepted.
func TestPostSendValidation(t *testing.T) {
	cli, srv := newPair(t, pairOpts{depth: 32})
	dst := srv.region(4096, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
	src := cli.region(4096, AccessLocalWrite)
	rbuf := srv.region(4096, AccessLocalWrite)
	sges := func(n int) []SGE {
		s := make([]SGE, n)
		for i := range s {
			s[i] = src.mr.SGE(i*8, 8)
		}
		return s
	}
	tests := []struct {
		name   string
		before int // valid requests before wr
		wr     SendWR
		ok     bool
	}{
		{"send-max-sge", 0, SendWR{Opcode: WRSend, SGL: sges(MaxSGE)}, true},
		{"send-too-many-sge", 2, SendWR{Opcode: WRSend, SGL: sges(MaxSGE + 1)}, false},
		{"write-max-sge", 1, SendWR{Opcode: WRWrite, SGL: sges(MaxSGE), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, true},
		{"write-too-many-sge", 1, SendWR{Opcode: WRWrite, SGL: sges(MaxSGE + 1), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, false},
		{"send-inv-too-many-sge", 0, SendWR{Opcode: WRSendWithInv, SGL: sges(MaxSGE + 1)}, false},
		{"read-one-sge", 1, SendWR{Opcode: WRRead, SGL: []SGE{src.mr.SGE(0, 64)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, true},
		{"read-two-sge", 3, SendWR{Opcode: WRRead, SGL: sges(2), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, false},
		{"read-inline", 1, SendWR{Opcode: WRRead, Flags: FlagInline, Inline: []byte("x"), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, false},
		{"inline-max", 1, SendWR{Opcode: WRSend, Flags: FlagInline, Inline: make([]byte, MaxInline)}, true},
		{"inline-send-too-long", 1, SendWR{Opcode: WRSend, Flags: FlagInline, Inline: make([]byte, MaxInline+1)}, false},
		{"inline-write-too-long", 2, SendWR{Opcode: WRWrite, Flags: FlagInline, Inline: make([]byte, MaxInline+1), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, false},
		{"opcode-write-with-imm", 1, SendWR{Opcode: WROpcode(1)}, false},
		{"opcode-send-with-imm", 0, SendWR{Opcode: WROpcode(3)}, false},
		{"opcode-atomic-cas", 2, SendWR{Opcode: WROpcode(5)}, false},
		{"opcode-local-inv", 1, SendWR{Opcode: WROpcode(7)}, false},
		{"opcode-garbage", 1, SendWR{Opcode: WROpcode(0xdead)}, false},
	}
	id := uint64(1000)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var batch []SendWR
			for i := 0; i < tt.before; i++ {
				id++
				batch = append(batch, validWrite(id, dst))
			}
			id++
			bad := tt.wr
			bad.ID, bad.Flags = id, bad.Flags|FlagSignaled
			batch = append(batch, bad)
			id++
			batch = append(batch, validWrite(id, dst)) // must not be posted after a bad one
			if tt.ok && tt.wr.Opcode == WRSend {
				srv.recv(RecvWR{ID: 1, SGL: []SGE{rbuf.mr.SGE(0, 4096)}})
			}
			posted := stats(cli).SQPosted.Load()
			n, err := cli.qp.PostSend(batch)
			want := len(batch)
			if !tt.ok {
				want = tt.before
				if !errors.Is(err, offload.ErrInvalidWR) {
					t.Fatalf("PostSend = %d, %v; want ErrInvalidWR", n, err)
				}
			} else if err != nil {
				t.Fatalf("PostSend: %v", err)
			}
			if n != want {
				t.Fatalf("PostSend returned %d, want %d", n, want)
			}
			if got := stats(cli).SQPosted.Load() - posted; got != uint64(want) {
				t.Fatalf("%d requests posted, want %d", got, want)
			}
			// A marker follows. Its completion comes right after those of
			// the requests before the bad one: nothing after it was posted.
			// (The marker's post also wakes the transmitter; see the
			// report: a PostSend that fails part-way does not.)
			id++
			marker := validWrite(id, dst)
			cli.post(marker)
			wcs := poll(t, cli.scq, want+1)
			for i, wc := range wcs {
				wantID := marker.ID
				if i < want {
					wantID = batch[i].ID
				}
				if wc.ID != wantID || wc.Status != WCSuccess {
					t.Fatalf("completion %d = {id %d %v}, want {id %d success}", i, wc.ID, wc.Status, wantID)
				}
			}
			noCompletion(t, cli.scq)
			if tt.ok && tt.wr.Opcode == WRSend {
				if wc := poll(t, srv.rcq, 1)[0]; wc.Status != WCSuccess {
					t.Fatalf("receive %v", wc.Status)
				}
			}
		})
	}
	if st := cli.qp.State(); st != QPRTS {
		t.Fatalf("state %v after rejected requests, want RTS", st)
	}
}

// TestPostRecvValidation: a receive with more than MaxSGE elements stops the
// batch at its index.
func TestPostRecvValidation(t *testing.T) {
	s := loneSide(t, 16)
	buf := s.region(4096, AccessLocalWrite)
	sges := func(n int) []SGE {
		out := make([]SGE, n)
		for i := range out {
			out[i] = buf.mr.SGE(i*16, 16)
		}
		return out
	}
	if err := s.qp.Modify(QPInit); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		before int
		sgl    []SGE
		ok     bool
	}{
		{"max-sge", 2, sges(MaxSGE), true},
		{"no-sge", 0, nil, true},
		{"too-many-sge-first", 0, sges(MaxSGE + 1), false},
		{"too-many-sge-third", 2, sges(MaxSGE + 1), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.qp.Modify(QPReset); err != nil {
				t.Fatal(err)
			}
			if err := s.qp.Modify(QPInit); err != nil {
				t.Fatal(err)
			}
			var batch []RecvWR
			for i := 0; i < tt.before; i++ {
				batch = append(batch, RecvWR{ID: uint64(i), SGL: sges(1)})
			}
			batch = append(batch, RecvWR{ID: 50, SGL: tt.sgl}, RecvWR{ID: 51, SGL: sges(1)})
			n, err := s.qp.PostRecv(batch)
			want := len(batch)
			if !tt.ok {
				want = tt.before
				if !errors.Is(err, offload.ErrInvalidWR) {
					t.Fatalf("PostRecv = %d, %v; want ErrInvalidWR", n, err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if n != want || s.qp.Info().RQUse != want {
				t.Fatalf("PostRecv returned %d with %d queued, want %d", n, s.qp.Info().RQUse, want)
			}
		})
	}
}

// TestQueueFull fills each work queue: the call returns how many fitted
// and ErrQueueFull.
func TestQueueFull(t *testing.T) {
	const depth = 4
	tests := []struct {
		name  string
		batch int
	}{
		{"exact", depth},
		{"one-over", depth + 1},
		{"double", 2 * depth},
		{"far-over", 5 * depth},
	}
	for _, tt := range tests {
		t.Run("recv/"+tt.name, func(t *testing.T) {
			s := loneSide(t, depth)
			buf := s.region(64, AccessLocalWrite)
			if err := s.qp.Modify(QPInit); err != nil {
				t.Fatal(err)
			}
			batch := make([]RecvWR, tt.batch)
			for i := range batch {
				batch[i] = RecvWR{ID: uint64(i), SGL: []SGE{buf.mr.SGE(0, 64)}}
			}
			n, err := s.qp.PostRecv(batch)
			if n != depth || (tt.batch > depth) != errors.Is(err, offload.ErrQueueFull) || (tt.batch == depth && err != nil) {
				t.Fatalf("PostRecv of %d = %d, %v; want %d (ErrQueueFull if over)", tt.batch, n, err, depth)
			}
			if n, err := s.qp.PostRecv(batch[:1]); n != 0 || !errors.Is(err, offload.ErrQueueFull) {
				t.Fatalf("PostRecv on a full queue = %d, %v", n, err)
			}
			if err := s.qp.Modify(QPErr); err != nil {
				t.Fatal(err)
			}
			ids := []uint64{0, 1, 2, 3}
			wantFlushed(t, "receives", poll(t, s.rcq, depth), ids, []WCOpcode{WCRecv, WCRecv, WCRecv, WCRecv})
			noCompletion(t, s.rcq)
		})
		t.Run("send/"+tt.name, func(t *testing.T) {
			srv, p := rawSide(t, depth, 1)
			sink := srv.region(64, AccessLocalWrite)
			// Read 0 stays outstanding and Read 1 waits for the ORD of 1:
			// nothing behind them leaves the queue.
			srv.post(SendWR{ID: 0, Opcode: WRRead, SGL: []SGE{sink.mr.SGE(0, 32)}, RKey: 0x4200},
				SendWR{ID: 1, Opcode: WRRead, SGL: []SGE{sink.mr.SGE(32, 32)}, RKey: 0x4200})
			p.readRequest(1)
			const free = depth - 2
			batch := make([]SendWR, tt.batch-2)
			for i := range batch {
				batch[i] = SendWR{ID: uint64(i + 2), Opcode: WRSend, Flags: FlagInline, Inline: []byte("q")}
			}
			n, err := srv.qp.PostSend(batch)
			if n != free || (len(batch) > free) != errors.Is(err, offload.ErrQueueFull) || (len(batch) == free && err != nil) {
				t.Fatalf("PostSend of %d into %d free = %d, %v; want %d (ErrQueueFull if over)", len(batch), free, n, err, free)
			}
			if n, err := srv.qp.PostSend(batch[:1]); n != 0 || !errors.Is(err, offload.ErrQueueFull) {
				t.Fatalf("PostSend on a full queue = %d, %v", n, err)
			}
			if use := srv.qp.Info().SQUse; use != depth {
				t.Fatalf("SQ use %d, want %d", use, depth)
			}
			srv.qp.Disconnect()
			wantFlushed(t, "sends", poll(t, srv.scq, depth), []uint64{0, 1, 2, 3}, []WCOpcode{WCRead, WCRead, WCSend, WCSend})
			noCompletion(t, srv.scq)
		})
	}
}

// TestSignaling: unsignaled requests complete silently on success unless
// the QP signals all; completions always keep posting order.
func TestSignaling(t *testing.T) {
	tests := []struct {
		name      string
		signalAll bool
		flags     []SendFlags // per request: Read, Write, Send, Write
		want      []uint64    // completion IDs, in order
	}{
		{"none-signaled-but-last", false, []SendFlags{0, 0, 0, FlagSignaled}, []uint64{4}},
		{"read-signaled", false, []SendFlags{FlagSignaled, 0, 0, FlagSignaled}, []uint64{1, 4}},
		{"send-signaled", false, []SendFlags{0, 0, FlagSignaled, FlagSignaled}, []uint64{3, 4}},
		{"all-signaled", false, []SendFlags{FlagSignaled, FlagSignaled, FlagSignaled, FlagSignaled}, []uint64{1, 2, 3, 4}},
		{"signal-all-qp", true, []SendFlags{0, 0, 0, 0}, []uint64{1, 2, 3, 4}},
		{"signal-all-qp-mixed", true, []SendFlags{FlagSignaled, 0, FlagSignaled, 0}, []uint64{1, 2, 3, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := unconnectedPair(t, pairOpts{depth: 16})
			cli.newQP(QPInitAttr{MaxSendWR: 16, MaxRecvWR: 16, SignalAll: tt.signalAll})
			connect(t, cli, srv, ConnParam{}, ConnParam{})
			const size = 256 << 10
			remote := srv.region(size, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
			fill(remote.buf(), 21)
			wdst := srv.region(size, AccessLocalWrite|AccessRemoteWrite)
			sink := cli.region(size, AccessLocalWrite)
			src := cli.region(size, AccessLocalWrite)
			fill(src.buf(), 22)
			rbuf := srv.region(size, AccessLocalWrite)
			srv.recv(RecvWR{ID: 50, SGL: []SGE{rbuf.mr.SGE(0, size)}})
			cli.post(
				SendWR{ID: 1, Opcode: WRRead, Flags: tt.flags[0], SGL: []SGE{sink.mr.SGE(0, size)}, RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()},
				SendWR{ID: 2, Opcode: WRWrite, Flags: tt.flags[1], SGL: []SGE{src.mr.SGE(0, 100)}, RemoteAddr: wdst.mr.Addr() + size - 100, RKey: wdst.mr.RKey()},
				SendWR{ID: 3, Opcode: WRSend, Flags: tt.flags[2], SGL: []SGE{src.mr.SGE(0, size)}},
				SendWR{ID: 4, Opcode: WRWrite, Flags: tt.flags[3] | FlagInline, Inline: []byte("last"), RemoteAddr: wdst.mr.Addr(), RKey: wdst.mr.RKey()},
			)
			ops := map[uint64]WCOpcode{1: WCRead, 2: WCWrite, 3: WCSend, 4: WCWrite}
			lens := map[uint64]uint32{1: size, 2: 100, 3: size, 4: 4}
			for i, wc := range poll(t, cli.scq, len(tt.want)) {
				wantWC(t, wc, tt.want[i], ops[tt.want[i]], WCSuccess, lens[tt.want[i]])
			}
			// The last request completed, so all before it did: nothing
			// else may be queued.
			noCompletion(t, cli.scq)
			wantWC(t, poll(t, srv.rcq, 1)[0], 50, WCRecv, WCSuccess, size)
			sameBytes(t, "send", rbuf.buf(), src.buf())
			sameBytes(t, "read", sink.buf(), remote.buf())
			if st := stats(cli); st.SQCompleted.Load() != 4 || st.SQErrors.Load() != 0 {
				t.Fatalf("SQCompleted %d SQErrors %d, want 4 0", st.SQCompleted.Load(), st.SQErrors.Load())
			}
		})
	}
}

// TestCompletionOrder: a Read posted before Writes and Sends completes
// first even though the later requests finish at TCP handoff long before
// the Read's response is placed.
func TestCompletionOrder(t *testing.T) {
	type op struct {
		code WROpcode
		size int
	}
	tests := []struct {
		name string
		ops  []op
	}{
		{"read-write-send", []op{{WRRead, 4 << 20}, {WRWrite, 64 << 10}, {WRSend, 16}}},
		{"read-read-write-send", []op{{WRRead, 2 << 20}, {WRRead, 8}, {WRWrite, 1}, {WRSend, 0}}},
		{"write-read-send-read-write", []op{{WRWrite, 1 << 20}, {WRRead, 1 << 20}, {WRSend, 100}, {WRRead, 4}, {WRWrite, 4}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{depth: 16})
			var wrs []SendWR
			var want []WCOpcode
			type check struct{ got, want *guarded }
			var checks []check
			nsend := 0
			for i, o := range tt.ops {
				n := max(o.size, 1)
				wr := SendWR{ID: uint64(i + 1), Opcode: o.code, Flags: FlagSignaled}
				switch o.code {
				case WRRead:
					remote := srv.region(n, AccessRemoteRead)
					fill(remote.buf(), uint64(i))
					sink := cli.region(n, AccessLocalWrite)
					wr.SGL, wr.RemoteAddr, wr.RKey = []SGE{sink.mr.SGE(0, o.size)}, remote.mr.Addr(), remote.mr.RKey()
					checks = append(checks, check{sink, remote})
					want = append(want, WCRead)
				case WRWrite:
					remote := srv.region(n, AccessLocalWrite|AccessRemoteWrite)
					src := cli.region(n, AccessLocalWrite)
					fill(src.buf(), uint64(i))
					wr.SGL, wr.RemoteAddr, wr.RKey = []SGE{src.mr.SGE(0, o.size)}, remote.mr.Addr(), remote.mr.RKey()
					checks = append(checks, check{remote, src})
					want = append(want, WCWrite)
				case WRSend:
					rb := srv.region(n, AccessLocalWrite)
					src := cli.region(n, AccessLocalWrite)
					fill(src.buf(), uint64(i))
					srv.recv(RecvWR{ID: uint64(100 + i), SGL: []SGE{rb.mr.SGE(0, n)}})
					wr.SGL = []SGE{src.mr.SGE(0, o.size)}
					checks = append(checks, check{rb, src})
					want = append(want, WCSend)
					nsend++
				}
				wrs = append(wrs, wr)
			}
			cli.post(wrs...)
			for i, wc := range poll(t, cli.scq, len(wrs)) {
				wantWC(t, wc, uint64(i+1), want[i], WCSuccess, uint32(tt.ops[i].size))
			}
			poll(t, srv.rcq, nsend)
			for i, c := range checks {
				if tt.ops[i].size > 0 {
					sameBytes(t, fmt.Sprintf("op %d", i), c.got.buf(), c.want.buf())
				}
			}
		})
	}
}

// TestORD: with an initiator depth of d, any number of Reads complete with
// their data while the responder never sees more than its IRD.
func TestORD(t *testing.T) {
	tests := []struct {
		name  string
		ord   uint16
		reads int
		size  int
	}{
		{"ord1-5reads", 1, 5, 64 << 10},
		{"ord1-20small", 1, 20, 8},
		{"ord2-9reads", 2, 9, 100 << 10},
		{"ord4-16reads", 4, 16, 3000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{depth: 32, cliParam: ConnParam{InitiatorDepth: tt.ord}})
			if got := cli.qp.Info().ORD; got != int(tt.ord) {
				t.Fatalf("negotiated ORD %d, want %d", got, tt.ord)
			}
			remote := srv.region(tt.reads*tt.size, AccessRemoteRead)
			fill(remote.buf(), 5)
			sink := cli.region(tt.reads*tt.size, AccessLocalWrite)
			wrs := make([]SendWR, tt.reads)
			for i := range wrs {
				off := i * tt.size
				wrs[i] = SendWR{ID: uint64(i), Opcode: WRRead, Flags: FlagSignaled, SGL: []SGE{sink.mr.SGE(off, tt.size)},
					RemoteAddr: remote.mr.Addr() + uint64(off), RKey: remote.mr.RKey()}
			}
			cli.post(wrs...)
			for i, wc := range poll(t, cli.scq, tt.reads) {
				wantWC(t, wc, uint64(i), WCRead, WCSuccess, uint32(tt.size))
			}
			sameBytes(t, "reads", sink.buf(), remote.buf())
			sink.checkGuards(t)
			cs, ss := stats(cli), stats(srv)
			if cs.ReadsTx.Load() != uint64(tt.reads) || cs.ReadsCompleted.Load() != uint64(tt.reads) ||
				ss.ReadsRx.Load() != uint64(tt.reads) || ss.IRDOverflows.Load() != 0 || ss.TerminatesTx.Load() != 0 {
				t.Fatalf("ReadsTx %d ReadsCompleted %d peer ReadsRx %d IRDOverflows %d Terminates %d",
					cs.ReadsTx.Load(), cs.ReadsCompleted.Load(), ss.ReadsRx.Load(), ss.IRDOverflows.Load(), ss.TerminatesTx.Load())
			}
		})
	}
}

// TestORDOutstanding answers the Reads by hand: with ORD 1 the engine sends
// Read Request k+1 only after the response to k, and places each response.
func TestORDOutstanding(t *testing.T) {
	const reads, size = 5, 100
	srv, p := rawSide(t, 16, 1)
	sink := srv.region(reads*size, AccessLocalWrite)
	wrs := make([]SendWR, reads)
	for i := range wrs {
		wrs[i] = SendWR{ID: uint64(i), Opcode: WRRead, Flags: FlagSignaled, SGL: []SGE{sink.mr.SGE(i*size, size)}, RemoteAddr: 0x10000, RKey: 0x4200}
	}
	srv.post(wrs...)
	want := make([]byte, reads*size)
	fill(want, 77)
	for i := 0; i < reads; i++ {
		rr := p.readRequest(uint32(i + 1))
		if rr.SinkSTag != sink.mr.LKey() || rr.SinkTO != sink.mr.Addr()+uint64(i*size) || rr.Size != size {
			t.Fatalf("Read Request %d: %+v", i+1, rr)
		}
		// The response to Read i has not been sent: no later Read left.
		if sent := stats(srv).ReadsTx.Load(); sent > uint64(i+1) {
			t.Fatalf("%d Read Requests sent with ORD 1 and %d answered", sent, i)
		}
		p.readResponse(rr, want[i*size:(i+1)*size])
		wantWC(t, poll(t, srv.scq, 1)[0], uint64(i), WCRead, WCSuccess, size)
	}
	sameBytes(t, "reads", sink.buf(), want)
	sink.checkGuards(t)
}

// TestFence: a fenced request waits for every earlier Read, so when the
// peer receives the Send the Read has completed locally.
func TestFence(t *testing.T) {
	tests := []struct {
		name string
		wrs  func(read SendWR, dst *guarded) []SendWR
	}{
		{"fenced-send", func(read SendWR, _ *guarded) []SendWR {
			return []SendWR{read, {ID: 2, Opcode: WRSend, Flags: FlagSignaled | FlagFence | FlagInline, Inline: []byte("after read")}}
		}},
		{"fenced-write-then-send", func(read SendWR, dst *guarded) []SendWR {
			return []SendWR{read,
				{ID: 2, Opcode: WRWrite, Flags: FlagSignaled | FlagFence | FlagInline, Inline: []byte("fenced"), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()},
				{ID: 3, Opcode: WRSend, Flags: FlagSignaled | FlagInline, Inline: []byte("after read")}}
		}},
		{"fenced-send-with-inv", func(read SendWR, dst *guarded) []SendWR {
			return []SendWR{read, {ID: 2, Opcode: WRSendWithInv, Flags: FlagSignaled | FlagFence | FlagInline, Inline: []byte("after read"), InvalidateRKey: dst.mr.RKey()}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{depth: 16})
			const size = 8 << 20
			remote := srv.region(size, AccessRemoteRead)
			fill(remote.buf(), 3)
			dst := srv.region(64, AccessLocalWrite|AccessRemoteWrite)
			rb := srv.region(64, AccessLocalWrite)
			srv.recv(RecvWR{ID: 9, SGL: []SGE{rb.mr.SGE(0, 64)}})
			sink := cli.region(size, AccessLocalWrite)
			read := SendWR{ID: 1, Opcode: WRRead, Flags: FlagSignaled, SGL: []SGE{sink.mr.SGE(0, size)}, RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()}
			wrs := tt.wrs(read, dst)
			cli.post(wrs...)
			wantWC(t, poll(t, srv.rcq, 1)[0], 9, WCRecv, WCSuccess, 10)
			// The Send left after the Read completed, and the Read's
			// completion was queued then: it is there without waiting.
			if got := stats(cli).ReadsCompleted.Load(); got != 1 {
				t.Fatalf("peer received the fenced Send with %d Reads completed, want 1", got)
			}
			var wc [1]WorkCompletion
			if n, err := cli.scq.Poll(wc[:]); n != 1 || err != nil {
				t.Fatalf("no Read completion when the fenced Send arrived (%d, %v)", n, err)
			}
			wantWC(t, wc[0], 1, WCRead, WCSuccess, size)
			for i, wc := range poll(t, cli.scq, len(wrs)-1) {
				if wc.ID != uint64(i+2) || wc.Status != WCSuccess {
					t.Fatalf("completion {id %d %v}, want {id %d success}", wc.ID, wc.Status, i+2)
				}
			}
			sameBytes(t, "read", sink.buf(), remote.buf())
			sameBytes(t, "send", rb.buf()[:10], []byte("after read"))
		})
	}
}

// TestPDDeallocBusy: a PD with regions or QPs cannot be freed.
func TestPDDeallocBusy(t *testing.T) {
	s := loneSide(t, 4)
	tests := []struct {
		name string
		mrs  int
		qps  int
	}{
		{"empty", 0, 0},
		{"one-mr", 1, 0},
		{"one-qp", 0, 1},
		{"mrs-and-qps", 3, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pd, err := s.dev.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			var mrs []*MR
			var qps []*QP
			for i := 0; i < tt.mrs; i++ {
				mr, err := pd.RegMR(make([]byte, 64), AccessLocalWrite)
				if err != nil {
					t.Fatal(err)
				}
				mrs = append(mrs, mr)
			}
			for i := 0; i < tt.qps; i++ {
				qp, err := pd.CreateQP(QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: 2, MaxRecvWR: 2})
				if err != nil {
					t.Fatal(err)
				}
				qps = append(qps, qp)
			}
			// Busy until the last object is gone.
			for i := 0; i < len(mrs)+len(qps); i++ {
				if err := pd.Dealloc(); !errors.Is(err, ErrBusy) {
					t.Fatalf("Dealloc with %d MRs %d QPs left = %v, want ErrBusy", len(mrs)-min(i, len(mrs)), len(qps)-max(0, i-len(mrs)), err)
				}
				if i < len(mrs) {
					err = mrs[i].Dereg()
				} else {
					err = qps[i-len(mrs)].Destroy()
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := pd.Dealloc(); err != nil {
				t.Fatalf("Dealloc of an empty PD: %v", err)
			}
		})
	}
}

// TestDeregInvalidates: a deregistered region is gone for the peer (its
// Write or Read is answered with a Terminate), for local requests, and for
// the region table; a second Dereg fails.
func TestDeregInvalidates(t *testing.T) {
	const n = 4096
	tests := []struct {
		name string
		op   WROpcode
		code rdmap.Code
		st   WCStatus
	}{
		{"peer-write", WRWrite, rdmap.TermDDPTaggedInvalidSTag, WCSuccess},
		{"peer-read", WRRead, rdmap.TermRDMAPInvalidSTag, WCRemAccessErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{depth: 8})
			dst := srv.region(n, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
			rkey := dst.mr.RKey()
			// It works before; the Send behind the Write says it is placed.
			rb := srv.region(8, AccessLocalWrite)
			srv.recv(RecvWR{ID: 7, SGL: []SGE{rb.mr.SGE(0, 8)}})
			cli.post(writeWR(cli, dst, 0, n, rkey), SendWR{ID: 2, Opcode: WRSend, Flags: FlagInline, Inline: []byte("placed")})
			wantWC(t, poll(t, cli.scq, 1)[0], 1, WCWrite, WCSuccess, n)
			wantWC(t, poll(t, srv.rcq, 1)[0], 7, WCRecv, WCSuccess, 6)
			if err := dst.mr.Dereg(); err != nil {
				t.Fatal(err)
			}
			if _, ok := srv.eng.Regions().Lookup(rkey); ok {
				t.Fatalf("STag 0x%08x still valid after Dereg", rkey)
			}
			if err := dst.mr.Dereg(); !errors.Is(err, offload.ErrInvalidSTag) {
				t.Fatalf("second Dereg = %v, want ErrInvalidSTag", err)
			}
			fill(dst.buf(), 99)
			before := bytes.Clone(dst.buf())
			if tt.op == WRWrite {
				cli.post(writeWR(cli, dst, 0, n, rkey))
			} else {
				cli.post(readWR(cli, dst, 0, n, rkey))
			}
			terminated(t, srv, cli, tt.code)
			wc := poll(t, cli.scq, 1)[0]
			if wc.ID != 1 || wc.Status != tt.st {
				t.Fatalf("completion {id %d %v}, want {id 1 %v}", wc.ID, wc.Status, tt.st)
			}
			sameBytes(t, "deregistered memory", dst.buf(), before)
			dst.checkGuards(t)
		})
	}
	t.Run("local-lkey", func(t *testing.T) {
		cli, srv := newPair(t, pairOpts{depth: 8})
		rb := srv.region(64, AccessLocalWrite)
		srv.recv(RecvWR{ID: 1, SGL: []SGE{rb.mr.SGE(0, 64)}})
		src := cli.region(64, AccessLocalWrite)
		sge := src.mr.SGE(0, 64)
		if err := src.mr.Dereg(); err != nil {
			t.Fatal(err)
		}
		cli.post(SendWR{ID: 2, Opcode: WRSend, Flags: FlagSignaled, SGL: []SGE{sge}})
		wc := poll(t, cli.scq, 1)[0]
		if wc.ID != 2 || wc.Status != WCLocProtErr {
			t.Fatalf("Send from a deregistered lkey: {id %d %v}, want {id 2 %v}", wc.ID, wc.Status, WCLocProtErr)
		}
		cli.waitEvent(EventDisconnected)
		if st := cli.qp.State(); st != QPErr {
			t.Fatalf("state %v after a local protection error, want ERR", st)
		}
	})
}

// TestRegMRRejects: RegMR refuses what ibv_reg_mr refuses.
func TestRegMRRejects(t *testing.T) {
	s := loneSide(t, 4)
	tests := []struct {
		name   string
		buf    []byte
		iova   uint64
		access Access
	}{
		{"empty", nil, 0x1000, AccessLocalWrite},
		{"remote-write-without-local-write", make([]byte, 8), 0x1000, AccessRemoteWrite},
		{"remote-write-and-read-without-local-write", make([]byte, 8), 0x1000, AccessRemoteWrite | AccessRemoteRead},
		{"unknown-access-bit", make([]byte, 8), 0x1000, Access(8)},
		{"wraps", make([]byte, 32), ^uint64(0) - 15, AccessLocalWrite},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			regions := s.eng.Regions().Len()
			var err error
			if tt.buf == nil {
				_, err = s.pd.RegMR(tt.buf, tt.access)
			} else {
				_, err = s.pd.RegMRAt(tt.buf, tt.iova, tt.access)
			}
			if err == nil {
				t.Fatal("registered")
			}
			if got := s.eng.Regions().Len(); got != regions {
				t.Fatalf("%d regions after a refused registration, want %d", got, regions)
			}
		})
	}
}
