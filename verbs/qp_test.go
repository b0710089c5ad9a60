package verbs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/verbs"
)

// loneSide is an RNIC whose QP has no peer: for the state machine and for
// work-queue checks that need no network.
func loneSide(t testing.TB, depth int) *side {
	t.Helper()
	la, _ := netstack.Pipe(1500, netstack.Impairments{})
	return newSide(t, on(la, cliAddr, 1500), "siwtun0", nil, depth)
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
	cli = newSide(t, on(la, cliAddr, o.mtu), "siwtun0", o.cli, o.depth)
	srv = newSide(t, on(lb, srvAddr, o.mtu), "siwtun1", o.srv, o.depth)
	return cli, srv
}

// connectOn is connect on a given server port (a port whose previous
// connection is still closing cannot be bound again).
func connectOn(t testing.TB, cli, srv *side, port uint16, cp, sp verbs.ConnParam) {
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
	cli.waitEvent(verbs.EventEstablished)
	srv.waitEvent(verbs.EventEstablished)
}

// newQP replaces s.qp with a fresh QP of attr (CQs default to the side's).
func (s *side) newQP(attr verbs.QPInitAttr) *verbs.QP {
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
	srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", nil, depth)
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

func stats(s *side) *offload.QPStats { return rnic.EngineQP(s.qp).Stats() }

// wantFlushed checks that wcs are exactly ids, in order, all flushed.
func wantFlushed(t testing.TB, what string, wcs []verbs.WorkCompletion, ids []uint64, ops []verbs.WCOpcode) {
	t.Helper()
	if len(wcs) != len(ids) {
		t.Fatalf("%s: %d completions, want %d", what, len(wcs), len(ids))
	}
	for i, wc := range wcs {
		if wc.ID != ids[i] || wc.Status != verbs.WCFlushErr || wc.Opcode != ops[i] {
			t.Fatalf("%s: completion %d = {id %d %v %v}, want {id %d %v %v}", what, i, wc.ID, wc.Opcode, wc.Status, ids[i], ops[i], verbs.WCFlushErr)
		}
	}
}

func TestQPStateValues(t *testing.T) {
	// rdma-core libibverbs/verbs.h, enum ibv_qp_state.
	tests := []struct {
		name  string
		state verbs.QPState
		value uint32
	}{
		{"RESET", verbs.QPReset, 0},
		{"INIT", verbs.QPInit, 1},
		{"RTR", verbs.QPRTR, 2},
		{"RTS", verbs.QPRTS, 3},
		{"ERR", verbs.QPErr, 6},
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
		path []verbs.QPState // Modify calls that reach the starting state
		to   verbs.QPState
		ok   bool
	}{
		{"RESET->INIT", nil, verbs.QPInit, true},
		{"RESET->RESET", nil, verbs.QPReset, true},
		{"RESET->RTR", nil, verbs.QPRTR, false},
		{"RESET->RTS", nil, verbs.QPRTS, false},
		{"RESET->ERR", nil, verbs.QPErr, true},
		{"RESET->SQD", nil, verbs.QPState(4), false},
		{"RESET->SQE", nil, verbs.QPState(5), false},
		{"RESET->unknown", nil, verbs.QPState(99), false},
		{"INIT->INIT", []verbs.QPState{verbs.QPInit}, verbs.QPInit, true},
		{"INIT->RESET", []verbs.QPState{verbs.QPInit}, verbs.QPReset, true},
		{"INIT->RTR", []verbs.QPState{verbs.QPInit}, verbs.QPRTR, false},
		{"INIT->RTS", []verbs.QPState{verbs.QPInit}, verbs.QPRTS, false},
		{"INIT->ERR", []verbs.QPState{verbs.QPInit}, verbs.QPErr, true},
		{"ERR->ERR", []verbs.QPState{verbs.QPErr}, verbs.QPErr, true},
		{"ERR->RESET", []verbs.QPState{verbs.QPErr}, verbs.QPReset, true},
		{"ERR->INIT", []verbs.QPState{verbs.QPErr}, verbs.QPInit, false},
		{"ERR->RTS", []verbs.QPState{verbs.QPErr}, verbs.QPRTS, false},
		{"ERR->RESET->INIT", []verbs.QPState{verbs.QPErr, verbs.QPReset}, verbs.QPInit, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			qp := s.newQP(verbs.QPInitAttr{MaxSendWR: 4, MaxRecvWR: 4})
			defer qp.Destroy()
			if st := qp.State(); st != verbs.QPReset {
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
			case !tt.ok && !errors.Is(err, verbs.ErrQPState):
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
	buf := s.region(64, verbs.AccessLocalWrite)
	tests := []struct {
		name           string
		path           []verbs.QPState
		recvOK, sendOK bool
	}{
		{"RESET", nil, false, false},
		{"INIT", []verbs.QPState{verbs.QPInit}, true, false},
		{"ERR", []verbs.QPState{verbs.QPErr}, true, true},
		{"ERR->RESET", []verbs.QPState{verbs.QPErr, verbs.QPReset}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scq, _ := s.dev.CreateCQ(8)
			rcq, _ := s.dev.CreateCQ(8)
			qp := s.newQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, MaxSendWR: 4, MaxRecvWR: 4})
			for _, p := range tt.path {
				if err := qp.Modify(p); err != nil {
					t.Fatalf("Modify(%v): %v", p, err)
				}
			}
			n, err := qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{buf.mr.SGE(0, 64)}}})
			if tt.recvOK != (err == nil && n == 1) || (!tt.recvOK && (n != 0 || !errors.Is(err, verbs.ErrQPState))) {
				t.Fatalf("PostRecv in %v = %d, %v; want ok=%v (else 0, ErrQPState)", qp.State(), n, err, tt.recvOK)
			}
			n, err = qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("x")}})
			if tt.sendOK != (err == nil && n == 1) || (!tt.sendOK && (n != 0 || !errors.Is(err, verbs.ErrQPState))) {
				t.Fatalf("PostSend in %v = %d, %v; want ok=%v (else 0, ErrQPState)", qp.State(), n, err, tt.sendOK)
			}
			if qp.State() == verbs.QPErr {
				wantFlushed(t, "send", poll(t, scq, 1), []uint64{2}, []verbs.WCOpcode{verbs.WCSend})
				wantFlushed(t, "recv", poll(t, rcq, 1), []uint64{1}, []verbs.WCOpcode{verbs.WCRecv})
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
	buf := s.region(64, verbs.AccessLocalWrite)
	if err := s.qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	s.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{buf.mr.SGE(0, 64)}}, verbs.RecvWR{ID: 2, SGL: []verbs.SGE{buf.mr.SGE(0, 64)}})
	if use := s.qp.Info().RQUse; use != 2 {
		t.Fatalf("RQ use %d, want 2", use)
	}
	if err := s.qp.Modify(verbs.QPReset); err != nil {
		t.Fatal(err)
	}
	if use := s.qp.Info().RQUse; use != 0 {
		t.Fatalf("RQ use %d after RESET, want 0", use)
	}
	noCompletion(t, s.rcq)
	if err := s.qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	s.recv(verbs.RecvWR{ID: 3, SGL: []verbs.SGE{buf.mr.SGE(0, 64)}}, verbs.RecvWR{ID: 4, SGL: []verbs.SGE{buf.mr.SGE(0, 64)}},
		verbs.RecvWR{ID: 5, SGL: []verbs.SGE{buf.mr.SGE(0, 64)}}, verbs.RecvWR{ID: 6, SGL: []verbs.SGE{buf.mr.SGE(0, 64)}})
	// Modify(ERR) flushes what is posted, oldest first, exactly once.
	if err := s.qp.Modify(verbs.QPErr); err != nil {
		t.Fatal(err)
	}
	wantFlushed(t, "recv", poll(t, s.rcq, 4), []uint64{3, 4, 5, 6}, []verbs.WCOpcode{verbs.WCRecv, verbs.WCRecv, verbs.WCRecv, verbs.WCRecv})
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
		if st, info := s.qp.State(), s.qp.Info(); st != verbs.QPRTS || info.State != verbs.QPRTS {
			t.Fatalf("%s: state %v (info %v) after connect, want RTS", s.dev.Name(), st, info.State)
		}
	}
	for _, to := range []verbs.QPState{verbs.QPReset, verbs.QPInit, verbs.QPRTR, verbs.QPRTS} {
		t.Run(fmt.Sprintf("RTS->%v", to), func(t *testing.T) {
			if err := cli.qp.Modify(to); !errors.Is(err, verbs.ErrQPState) {
				t.Fatalf("Modify(%v) in RTS = %v, want ErrQPState", to, err)
			}
			if st := cli.qp.State(); st != verbs.QPRTS {
				t.Fatalf("state %v, want RTS", st)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := cli.qp.Connect(ctx, netipPort(srvPort), verbs.ConnParam{}); !errors.Is(err, verbs.ErrQPState) {
		t.Fatalf("second Connect = %v, want ErrQPState", err)
	}
	// Still working.
	rb := srv.region(16, verbs.AccessLocalWrite)
	srv.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{rb.mr.SGE(0, 16)}})
	cli.post(verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("still up")})
	wantWC(t, poll(t, cli.scq, 1)[0], 2, verbs.WCSend, verbs.WCSuccess, 8)
	wantWC(t, poll(t, srv.rcq, 1)[0], 1, verbs.WCRecv, verbs.WCSuccess, 8)
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
			if err := cli.qp.Modify(verbs.QPErr); err != nil {
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
				bufs[s] = s.region(256, verbs.AccessLocalWrite)
				for j := 0; j < nrecv; j++ {
					s.recv(verbs.RecvWR{ID: uint64(100*i + j), SGL: []verbs.SGE{bufs[s].mr.SGE(0, 256)}})
				}
			}
			tt.stop(t, cli, srv)
			for i, s := range []*side{cli, srv} {
				s.waitEvent(verbs.EventDisconnected)
				if st := s.qp.State(); st != verbs.QPErr {
					t.Fatalf("%s: state %v, want ERR", s.dev.Name(), st)
				}
				ids := []uint64{uint64(100 * i), uint64(100*i + 1), uint64(100*i + 2)}
				wantFlushed(t, s.dev.Name()+" receives", poll(t, s.rcq, nrecv), ids, []verbs.WCOpcode{verbs.WCRecv, verbs.WCRecv, verbs.WCRecv})
				if tt.destroyed != nil && tt.destroyed(cli, srv) == s {
					continue
				}
				// Posted after the end: flushed at once, signaled or not.
				s.post(verbs.SendWR{ID: 7, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("late")},
					verbs.SendWR{ID: 8, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{bufs[s].mr.SGE(0, 8)}, RKey: 1})
				s.recv(verbs.RecvWR{ID: 9, SGL: []verbs.SGE{bufs[s].mr.SGE(0, 8)}})
				wantFlushed(t, s.dev.Name()+" late sends", poll(t, s.scq, 2), []uint64{7, 8}, []verbs.WCOpcode{verbs.WCSend, verbs.WCWrite})
				wantFlushed(t, s.dev.Name()+" late receive", poll(t, s.rcq, 1), []uint64{9}, []verbs.WCOpcode{verbs.WCRecv})
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
			if err := srv.qp.Modify(verbs.QPErr); err != nil {
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
			sink := srv.region(4096, verbs.AccessLocalWrite)
			src := srv.region(4096, verbs.AccessLocalWrite)
			for i := 0; i < 4; i++ {
				srv.recv(verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{sink.mr.SGE(0, 4096)}})
			}
			srv.post(
				verbs.SendWR{ID: 1, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(0, 1024)}, RemoteAddr: 0x1000, RKey: 0x4200},
				verbs.SendWR{ID: 2, Opcode: verbs.WRRead, SGL: []verbs.SGE{sink.mr.SGE(1024, 1024)}, RemoteAddr: 0x1000, RKey: 0x4200},
				verbs.SendWR{ID: 3, Opcode: verbs.WRWrite, Flags: verbs.FlagInline, Inline: []byte("held"), RemoteAddr: 0x1000, RKey: 0x4200},
				verbs.SendWR{ID: 4, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, 4096)}},
				verbs.SendWR{ID: 5, Opcode: verbs.WRSendWithInv, Flags: verbs.FlagFence | verbs.FlagSolicited, SGL: []verbs.SGE{src.mr.SGE(0, 10)}, InvalidateRKey: 0x4200},
			)
			p.readRequest(1) // Read 1 is in flight; ORD 1 holds the rest
			if use := srv.qp.Info().SQUse; use != 5 {
				t.Fatalf("SQ use %d, want 5", use)
			}
			tt.stop(t, srv, p)
			srv.waitEvent(verbs.EventDisconnected)
			if st := srv.qp.State(); st != verbs.QPErr {
				t.Fatalf("state %v, want ERR", st)
			}
			wantFlushed(t, "sends", poll(t, srv.scq, 5), []uint64{1, 2, 3, 4, 5}, []verbs.WCOpcode{verbs.WCRead, verbs.WCRead, verbs.WCWrite, verbs.WCSend, verbs.WCSend})
			wantFlushed(t, "receives", poll(t, srv.rcq, 4), []uint64{100, 101, 102, 103}, []verbs.WCOpcode{verbs.WCRecv, verbs.WCRecv, verbs.WCRecv, verbs.WCRecv})
			srv.post(verbs.SendWR{ID: 6, Opcode: verbs.WRRead, SGL: []verbs.SGE{sink.mr.SGE(0, 8)}, RKey: 0x4200})
			srv.recv(verbs.RecvWR{ID: 104, SGL: []verbs.SGE{sink.mr.SGE(0, 8)}})
			wantFlushed(t, "late send", poll(t, srv.scq, 1), []uint64{6}, []verbs.WCOpcode{verbs.WCRead})
			wantFlushed(t, "late receive", poll(t, srv.rcq, 1), []uint64{104}, []verbs.WCOpcode{verbs.WCRecv})
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
	srv.waitEvent(verbs.EventDisconnected)
	for _, to := range []verbs.QPState{verbs.QPReset, verbs.QPInit} {
		if err := srv.qp.Modify(to); err != nil {
			t.Fatalf("Modify(%v) after disconnect: %v", to, err)
		}
	}
	if info := srv.qp.Info(); info.SQUse != 0 || info.RQUse != 0 {
		t.Fatalf("queues hold %d/%d after RESET", info.SQUse, info.RQUse)
	}
	cli.newQP(verbs.QPInitAttr{MaxSendWR: 8, MaxRecvWR: 8})
	srv.events = nil
	num := srv.qp.Num()
	connectOn(t, cli, srv, srvPort+1, verbs.ConnParam{}, verbs.ConnParam{})
	if srv.qp.State() != verbs.QPRTS || srv.qp.Num() != num {
		t.Fatalf("reused QP %d in %v, want QP %d in RTS", srv.qp.Num(), srv.qp.State(), num)
	}
	exercise(t, cli, srv, 5000, 11)
	// And the reused QP as requester.
	mem := cli.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	srv.post(verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("from the reused QP"), RemoteAddr: mem.mr.Addr(), RKey: mem.mr.RKey()})
	wantWC(t, poll(t, srv.scq, 1)[0], 1, verbs.WCWrite, verbs.WCSuccess, 18)
	sink := srv.region(18, verbs.AccessLocalWrite)
	srv.post(verbs.SendWR{ID: 2, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(0, 18)}, RemoteAddr: mem.mr.Addr(), RKey: mem.mr.RKey()})
	wantWC(t, poll(t, srv.scq, 1)[0], 2, verbs.WCRead, verbs.WCSuccess, 18)
	sameBytes(t, "read back", sink.buf(), []byte("from the reused QP"))
}

// validWrite is a signaled inline Write into dst.
func validWrite(id uint64, dst *guarded) verbs.SendWR {
	return verbs.SendWR{ID: id, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("ok"), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}
}

// TestPostSendValidation posts batches with one malformed request: the call
// returns its index and ErrInvalidWR, the requests before it run, and none
// after it is posted. Requests at the limits are accepted.
func TestPostSendValidation(t *testing.T) {
	cli, srv := newPair(t, pairOpts{depth: 32})
	dst := srv.region(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	src := cli.region(4096, verbs.AccessLocalWrite)
	rbuf := srv.region(4096, verbs.AccessLocalWrite)
	sges := func(n int) []verbs.SGE {
		s := make([]verbs.SGE, n)
		for i := range s {
			s[i] = src.mr.SGE(i*8, 8)
		}
		return s
	}
	tests := []struct {
		name   string
		before int // valid requests before wr
		wr     verbs.SendWR
		ok     bool
	}{
		{"send-max-sge", 0, verbs.SendWR{Opcode: verbs.WRSend, SGL: sges(verbs.MaxSGE)}, true},
		{"send-too-many-sge", 2, verbs.SendWR{Opcode: verbs.WRSend, SGL: sges(verbs.MaxSGE + 1)}, false},
		{"write-max-sge", 1, verbs.SendWR{Opcode: verbs.WRWrite, SGL: sges(verbs.MaxSGE), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, true},
		{"write-too-many-sge", 1, verbs.SendWR{Opcode: verbs.WRWrite, SGL: sges(verbs.MaxSGE + 1), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, false},
		{"send-inv-too-many-sge", 0, verbs.SendWR{Opcode: verbs.WRSendWithInv, SGL: sges(verbs.MaxSGE + 1)}, false},
		{"read-one-sge", 1, verbs.SendWR{Opcode: verbs.WRRead, SGL: []verbs.SGE{src.mr.SGE(0, 64)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, true},
		{"read-two-sge", 3, verbs.SendWR{Opcode: verbs.WRRead, SGL: sges(2), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, false},
		{"read-inline", 1, verbs.SendWR{Opcode: verbs.WRRead, Flags: verbs.FlagInline, Inline: []byte("x"), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, false},
		{"inline-max", 1, verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: make([]byte, verbs.MaxInline)}, true},
		{"inline-send-too-long", 1, verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: make([]byte, verbs.MaxInline+1)}, false},
		{"inline-write-too-long", 2, verbs.SendWR{Opcode: verbs.WRWrite, Flags: verbs.FlagInline, Inline: make([]byte, verbs.MaxInline+1), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, false},
		{"opcode-atomic-fetch-add", 1, verbs.SendWR{Opcode: verbs.WROpcode(6)}, false},
		{"bind-mw-naming-no-window", 0, verbs.SendWR{Opcode: verbs.WROpcode(8)}, false},
		{"opcode-atomic-cas", 2, verbs.SendWR{Opcode: verbs.WROpcode(5)}, false},
		{"local-inv-naming-no-stag", 1, verbs.SendWR{Opcode: verbs.WROpcode(7)}, false},
		{"opcode-garbage", 1, verbs.SendWR{Opcode: verbs.WROpcode(0xdead)}, false},
	}
	id := uint64(1000)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var batch []verbs.SendWR
			for i := 0; i < tt.before; i++ {
				id++
				batch = append(batch, validWrite(id, dst))
			}
			id++
			bad := tt.wr
			bad.ID, bad.Flags = id, bad.Flags|verbs.FlagSignaled
			batch = append(batch, bad)
			id++
			batch = append(batch, validWrite(id, dst)) // must not be posted after a bad one
			if tt.ok && tt.wr.Opcode == verbs.WRSend {
				srv.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{rbuf.mr.SGE(0, 4096)}})
			}
			posted := stats(cli).SQPosted.Load()
			n, err := cli.qp.PostSend(batch)
			want := len(batch)
			if !tt.ok {
				want = tt.before
				if !errors.Is(err, verbs.ErrInvalidWR) {
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
				if wc.ID != wantID || wc.Status != verbs.WCSuccess {
					t.Fatalf("completion %d = {id %d %v}, want {id %d success}", i, wc.ID, wc.Status, wantID)
				}
			}
			noCompletion(t, cli.scq)
			if tt.ok && tt.wr.Opcode == verbs.WRSend {
				if wc := poll(t, srv.rcq, 1)[0]; wc.Status != verbs.WCSuccess {
					t.Fatalf("receive %v", wc.Status)
				}
			}
		})
	}
	if st := cli.qp.State(); st != verbs.QPRTS {
		t.Fatalf("state %v after rejected requests, want RTS", st)
	}
}

// TestPostRecvValidation: a receive with more than MaxSGE elements stops the
// batch at its index.
func TestPostRecvValidation(t *testing.T) {
	s := loneSide(t, 16)
	buf := s.region(4096, verbs.AccessLocalWrite)
	sges := func(n int) []verbs.SGE {
		out := make([]verbs.SGE, n)
		for i := range out {
			out[i] = buf.mr.SGE(i*16, 16)
		}
		return out
	}
	if err := s.qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		before int
		sgl    []verbs.SGE
		ok     bool
	}{
		{"max-sge", 2, sges(verbs.MaxSGE), true},
		{"no-sge", 0, nil, true},
		{"too-many-sge-first", 0, sges(verbs.MaxSGE + 1), false},
		{"too-many-sge-third", 2, sges(verbs.MaxSGE + 1), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.qp.Modify(verbs.QPReset); err != nil {
				t.Fatal(err)
			}
			if err := s.qp.Modify(verbs.QPInit); err != nil {
				t.Fatal(err)
			}
			var batch []verbs.RecvWR
			for i := 0; i < tt.before; i++ {
				batch = append(batch, verbs.RecvWR{ID: uint64(i), SGL: sges(1)})
			}
			batch = append(batch, verbs.RecvWR{ID: 50, SGL: tt.sgl}, verbs.RecvWR{ID: 51, SGL: sges(1)})
			n, err := s.qp.PostRecv(batch)
			want := len(batch)
			if !tt.ok {
				want = tt.before
				if !errors.Is(err, verbs.ErrInvalidWR) {
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
			buf := s.region(64, verbs.AccessLocalWrite)
			if err := s.qp.Modify(verbs.QPInit); err != nil {
				t.Fatal(err)
			}
			batch := make([]verbs.RecvWR, tt.batch)
			for i := range batch {
				batch[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{buf.mr.SGE(0, 64)}}
			}
			n, err := s.qp.PostRecv(batch)
			if n != depth || (tt.batch > depth) != errors.Is(err, verbs.ErrQueueFull) || (tt.batch == depth && err != nil) {
				t.Fatalf("PostRecv of %d = %d, %v; want %d (ErrQueueFull if over)", tt.batch, n, err, depth)
			}
			if n, err := s.qp.PostRecv(batch[:1]); n != 0 || !errors.Is(err, verbs.ErrQueueFull) {
				t.Fatalf("PostRecv on a full queue = %d, %v", n, err)
			}
			if err := s.qp.Modify(verbs.QPErr); err != nil {
				t.Fatal(err)
			}
			ids := []uint64{0, 1, 2, 3}
			wantFlushed(t, "receives", poll(t, s.rcq, depth), ids, []verbs.WCOpcode{verbs.WCRecv, verbs.WCRecv, verbs.WCRecv, verbs.WCRecv})
			noCompletion(t, s.rcq)
		})
		t.Run("send/"+tt.name, func(t *testing.T) {
			srv, p := rawSide(t, depth, 1)
			sink := srv.region(64, verbs.AccessLocalWrite)
			// Read 0 stays outstanding and Read 1 waits for the ORD of 1:
			// nothing behind them leaves the queue.
			srv.post(verbs.SendWR{ID: 0, Opcode: verbs.WRRead, SGL: []verbs.SGE{sink.mr.SGE(0, 32)}, RKey: 0x4200},
				verbs.SendWR{ID: 1, Opcode: verbs.WRRead, SGL: []verbs.SGE{sink.mr.SGE(32, 32)}, RKey: 0x4200})
			p.readRequest(1)
			const free = depth - 2
			batch := make([]verbs.SendWR, tt.batch-2)
			for i := range batch {
				batch[i] = verbs.SendWR{ID: uint64(i + 2), Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("q")}
			}
			n, err := srv.qp.PostSend(batch)
			if n != free || (len(batch) > free) != errors.Is(err, verbs.ErrQueueFull) || (len(batch) == free && err != nil) {
				t.Fatalf("PostSend of %d into %d free = %d, %v; want %d (ErrQueueFull if over)", len(batch), free, n, err, free)
			}
			if n, err := srv.qp.PostSend(batch[:1]); n != 0 || !errors.Is(err, verbs.ErrQueueFull) {
				t.Fatalf("PostSend on a full queue = %d, %v", n, err)
			}
			if use := srv.qp.Info().SQUse; use != depth {
				t.Fatalf("SQ use %d, want %d", use, depth)
			}
			srv.qp.Disconnect()
			wantFlushed(t, "sends", poll(t, srv.scq, depth), []uint64{0, 1, 2, 3}, []verbs.WCOpcode{verbs.WCRead, verbs.WCRead, verbs.WCSend, verbs.WCSend})
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
		flags     []verbs.SendFlags // per request: Read, Write, Send, Write
		want      []uint64          // completion IDs, in order
	}{
		{"none-signaled-but-last", false, []verbs.SendFlags{0, 0, 0, verbs.FlagSignaled}, []uint64{4}},
		{"read-signaled", false, []verbs.SendFlags{verbs.FlagSignaled, 0, 0, verbs.FlagSignaled}, []uint64{1, 4}},
		{"send-signaled", false, []verbs.SendFlags{0, 0, verbs.FlagSignaled, verbs.FlagSignaled}, []uint64{3, 4}},
		{"all-signaled", false, []verbs.SendFlags{verbs.FlagSignaled, verbs.FlagSignaled, verbs.FlagSignaled, verbs.FlagSignaled}, []uint64{1, 2, 3, 4}},
		{"signal-all-qp", true, []verbs.SendFlags{0, 0, 0, 0}, []uint64{1, 2, 3, 4}},
		{"signal-all-qp-mixed", true, []verbs.SendFlags{verbs.FlagSignaled, 0, verbs.FlagSignaled, 0}, []uint64{1, 2, 3, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := unconnectedPair(t, pairOpts{depth: 16})
			cli.newQP(verbs.QPInitAttr{MaxSendWR: 16, MaxRecvWR: 16, SignalAll: tt.signalAll})
			connect(t, cli, srv, verbs.ConnParam{}, verbs.ConnParam{})
			const size = 256 << 10
			remote := srv.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			fill(remote.buf(), 21)
			wdst := srv.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			sink := cli.region(size, verbs.AccessLocalWrite)
			src := cli.region(size, verbs.AccessLocalWrite)
			fill(src.buf(), 22)
			rbuf := srv.region(size, verbs.AccessLocalWrite)
			srv.recv(verbs.RecvWR{ID: 50, SGL: []verbs.SGE{rbuf.mr.SGE(0, size)}})
			cli.post(
				verbs.SendWR{ID: 1, Opcode: verbs.WRRead, Flags: tt.flags[0], SGL: []verbs.SGE{sink.mr.SGE(0, size)}, RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()},
				verbs.SendWR{ID: 2, Opcode: verbs.WRWrite, Flags: tt.flags[1], SGL: []verbs.SGE{src.mr.SGE(0, 100)}, RemoteAddr: wdst.mr.Addr() + size - 100, RKey: wdst.mr.RKey()},
				verbs.SendWR{ID: 3, Opcode: verbs.WRSend, Flags: tt.flags[2], SGL: []verbs.SGE{src.mr.SGE(0, size)}},
				verbs.SendWR{ID: 4, Opcode: verbs.WRWrite, Flags: tt.flags[3] | verbs.FlagInline, Inline: []byte("last"), RemoteAddr: wdst.mr.Addr(), RKey: wdst.mr.RKey()},
			)
			ops := map[uint64]verbs.WCOpcode{1: verbs.WCRead, 2: verbs.WCWrite, 3: verbs.WCSend, 4: verbs.WCWrite}
			lens := map[uint64]uint32{1: size, 2: 100, 3: size, 4: 4}
			for i, wc := range poll(t, cli.scq, len(tt.want)) {
				wantWC(t, wc, tt.want[i], ops[tt.want[i]], verbs.WCSuccess, lens[tt.want[i]])
			}
			// The last request completed, so all before it did: nothing
			// else may be queued.
			noCompletion(t, cli.scq)
			wantWC(t, poll(t, srv.rcq, 1)[0], 50, verbs.WCRecv, verbs.WCSuccess, size)
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
		code verbs.WROpcode
		size int
	}
	tests := []struct {
		name string
		ops  []op
	}{
		{"read-write-send", []op{{verbs.WRRead, 4 << 20}, {verbs.WRWrite, 64 << 10}, {verbs.WRSend, 16}}},
		{"read-read-write-send", []op{{verbs.WRRead, 2 << 20}, {verbs.WRRead, 8}, {verbs.WRWrite, 1}, {verbs.WRSend, 0}}},
		{"write-read-send-read-write", []op{{verbs.WRWrite, 1 << 20}, {verbs.WRRead, 1 << 20}, {verbs.WRSend, 100}, {verbs.WRRead, 4}, {verbs.WRWrite, 4}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{depth: 16})
			var wrs []verbs.SendWR
			var want []verbs.WCOpcode
			type check struct{ got, want *guarded }
			var checks []check
			nsend := 0
			for i, o := range tt.ops {
				n := max(o.size, 1)
				wr := verbs.SendWR{ID: uint64(i + 1), Opcode: o.code, Flags: verbs.FlagSignaled}
				switch o.code {
				case verbs.WRRead:
					remote := srv.region(n, verbs.AccessRemoteRead)
					fill(remote.buf(), uint64(i))
					sink := cli.region(n, verbs.AccessLocalWrite)
					wr.SGL, wr.RemoteAddr, wr.RKey = []verbs.SGE{sink.mr.SGE(0, o.size)}, remote.mr.Addr(), remote.mr.RKey()
					checks = append(checks, check{sink, remote})
					want = append(want, verbs.WCRead)
				case verbs.WRWrite:
					remote := srv.region(n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
					src := cli.region(n, verbs.AccessLocalWrite)
					fill(src.buf(), uint64(i))
					wr.SGL, wr.RemoteAddr, wr.RKey = []verbs.SGE{src.mr.SGE(0, o.size)}, remote.mr.Addr(), remote.mr.RKey()
					checks = append(checks, check{remote, src})
					want = append(want, verbs.WCWrite)
				case verbs.WRSend:
					rb := srv.region(n, verbs.AccessLocalWrite)
					src := cli.region(n, verbs.AccessLocalWrite)
					fill(src.buf(), uint64(i))
					srv.recv(verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{rb.mr.SGE(0, n)}})
					wr.SGL = []verbs.SGE{src.mr.SGE(0, o.size)}
					checks = append(checks, check{rb, src})
					want = append(want, verbs.WCSend)
					nsend++
				}
				wrs = append(wrs, wr)
			}
			cli.post(wrs...)
			for i, wc := range poll(t, cli.scq, len(wrs)) {
				wantWC(t, wc, uint64(i+1), want[i], verbs.WCSuccess, uint32(tt.ops[i].size))
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
			cli, srv := newPair(t, pairOpts{depth: 32, cliParam: verbs.ConnParam{InitiatorDepth: tt.ord}})
			if got := cli.qp.Info().ORD; got != int(tt.ord) {
				t.Fatalf("negotiated ORD %d, want %d", got, tt.ord)
			}
			remote := srv.region(tt.reads*tt.size, verbs.AccessRemoteRead)
			fill(remote.buf(), 5)
			sink := cli.region(tt.reads*tt.size, verbs.AccessLocalWrite)
			wrs := make([]verbs.SendWR, tt.reads)
			for i := range wrs {
				off := i * tt.size
				wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(off, tt.size)},
					RemoteAddr: remote.mr.Addr() + uint64(off), RKey: remote.mr.RKey()}
			}
			cli.post(wrs...)
			for i, wc := range poll(t, cli.scq, tt.reads) {
				wantWC(t, wc, uint64(i), verbs.WCRead, verbs.WCSuccess, uint32(tt.size))
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
	sink := srv.region(reads*size, verbs.AccessLocalWrite)
	wrs := make([]verbs.SendWR, reads)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(i*size, size)}, RemoteAddr: 0x10000, RKey: 0x4200}
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
		wantWC(t, poll(t, srv.scq, 1)[0], uint64(i), verbs.WCRead, verbs.WCSuccess, size)
	}
	sameBytes(t, "reads", sink.buf(), want)
	sink.checkGuards(t)
}

// TestFence: a fenced request waits for every earlier Read, so when the
// peer receives the Send the Read has completed locally.
func TestFence(t *testing.T) {
	tests := []struct {
		name string
		wrs  func(read verbs.SendWR, dst *guarded) []verbs.SendWR
	}{
		{"fenced-send", func(read verbs.SendWR, _ *guarded) []verbs.SendWR {
			return []verbs.SendWR{read, {ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagFence | verbs.FlagInline, Inline: []byte("after read")}}
		}},
		{"fenced-write-then-send", func(read verbs.SendWR, dst *guarded) []verbs.SendWR {
			return []verbs.SendWR{read,
				{ID: 2, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled | verbs.FlagFence | verbs.FlagInline, Inline: []byte("fenced"), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()},
				{ID: 3, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("after read")}}
		}},
		{"fenced-send-with-inv", func(read verbs.SendWR, dst *guarded) []verbs.SendWR {
			return []verbs.SendWR{read, {ID: 2, Opcode: verbs.WRSendWithInv, Flags: verbs.FlagSignaled | verbs.FlagFence | verbs.FlagInline, Inline: []byte("after read"), InvalidateRKey: dst.mr.RKey()}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{depth: 16})
			const size = 8 << 20
			remote := srv.region(size, verbs.AccessRemoteRead)
			fill(remote.buf(), 3)
			dst := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			rb := srv.region(64, verbs.AccessLocalWrite)
			srv.recv(verbs.RecvWR{ID: 9, SGL: []verbs.SGE{rb.mr.SGE(0, 64)}})
			sink := cli.region(size, verbs.AccessLocalWrite)
			read := verbs.SendWR{ID: 1, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(0, size)}, RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()}
			wrs := tt.wrs(read, dst)
			cli.post(wrs...)
			wantWC(t, poll(t, srv.rcq, 1)[0], 9, verbs.WCRecv, verbs.WCSuccess, 10)
			// The Send left after the Read completed, and the Read's
			// completion was queued then: it is there without waiting.
			if got := stats(cli).ReadsCompleted.Load(); got != 1 {
				t.Fatalf("peer received the fenced Send with %d Reads completed, want 1", got)
			}
			var wc [1]verbs.WorkCompletion
			if n, err := cli.scq.Poll(wc[:]); n != 1 || err != nil {
				t.Fatalf("no Read completion when the fenced Send arrived (%d, %v)", n, err)
			}
			wantWC(t, wc[0], 1, verbs.WCRead, verbs.WCSuccess, size)
			for i, wc := range poll(t, cli.scq, len(wrs)-1) {
				if wc.ID != uint64(i+2) || wc.Status != verbs.WCSuccess {
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
			var mrs []*verbs.MR
			var qps []*verbs.QP
			for i := 0; i < tt.mrs; i++ {
				mr, err := pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
				if err != nil {
					t.Fatal(err)
				}
				mrs = append(mrs, mr)
			}
			for i := 0; i < tt.qps; i++ {
				qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: 2, MaxRecvWR: 2})
				if err != nil {
					t.Fatal(err)
				}
				qps = append(qps, qp)
			}
			// Busy until the last object is gone.
			for i := 0; i < len(mrs)+len(qps); i++ {
				if err := pd.Dealloc(); !errors.Is(err, verbs.ErrBusy) {
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
		op   verbs.WROpcode
		code rdmap.Code
		st   verbs.WCStatus
	}{
		{"peer-write", verbs.WRWrite, rdmap.TermDDPTaggedInvalidSTag, verbs.WCSuccess},
		{"peer-read", verbs.WRRead, rdmap.TermRDMAPInvalidSTag, verbs.WCRemAccessErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{depth: 8})
			dst := srv.region(n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			rkey := dst.mr.RKey()
			// It works before; the Send behind the Write says it is placed.
			rb := srv.region(8, verbs.AccessLocalWrite)
			srv.recv(verbs.RecvWR{ID: 7, SGL: []verbs.SGE{rb.mr.SGE(0, 8)}})
			cli.post(writeWR(cli, dst, 0, n, rkey), verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("placed")})
			wantWC(t, poll(t, cli.scq, 1)[0], 1, verbs.WCWrite, verbs.WCSuccess, n)
			wantWC(t, poll(t, srv.rcq, 1)[0], 7, verbs.WCRecv, verbs.WCSuccess, 6)
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
			if tt.op == verbs.WRWrite {
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
		rb := srv.region(64, verbs.AccessLocalWrite)
		srv.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{rb.mr.SGE(0, 64)}})
		src := cli.region(64, verbs.AccessLocalWrite)
		sge := src.mr.SGE(0, 64)
		if err := src.mr.Dereg(); err != nil {
			t.Fatal(err)
		}
		cli.post(verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sge}})
		wc := poll(t, cli.scq, 1)[0]
		if wc.ID != 2 || wc.Status != verbs.WCLocProtErr {
			t.Fatalf("Send from a deregistered lkey: {id %d %v}, want {id 2 %v}", wc.ID, wc.Status, verbs.WCLocProtErr)
		}
		cli.waitEvent(verbs.EventDisconnected)
		if st := cli.qp.State(); st != verbs.QPErr {
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
		access verbs.Access
	}{
		{"empty", nil, 0x1000, verbs.AccessLocalWrite},
		{"remote-write-without-local-write", make([]byte, 8), 0x1000, verbs.AccessRemoteWrite},
		{"remote-write-and-read-without-local-write", make([]byte, 8), 0x1000, verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
		{"unknown-access-bit", make([]byte, 8), 0x1000, verbs.Access(8)},
		{"wraps", make([]byte, 32), ^uint64(0) - 15, verbs.AccessLocalWrite},
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
