package verbs_test

import (
	"errors"
	"testing"

	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// TestIRDEqualsORD: a requester at ORD 1 against a responder at IRD 1 sends
// each Read as soon as the previous one completes; the responder must have
// freed the slot by then (no spurious IRD overflow).
func TestIRDEqualsORD(t *testing.T) {
	cli, srv := newPair(t, pairOpts{depth: 64,
		srv:      func(c *offload.Config) { c.IRD = 1 },
		cliParam: verbs.ConnParam{InitiatorDepth: 1}, srvParam: verbs.ConnParam{ResponderResources: 1}})
	remote := srv.region(256, verbs.AccessRemoteRead)
	fill(remote.buf(), 3)
	sink := cli.region(256, verbs.AccessLocalWrite)
	for batch := 0; batch < 4; batch++ {
		wrs := make([]verbs.SendWR, 50)
		for i := range wrs {
			wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(0, 256)}, RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()}
		}
		cli.post(wrs...)
		for i, wc := range poll(t, cli.scq, len(wrs)) {
			wantWC(t, wc, uint64(i), verbs.WCRead, verbs.WCSuccess, 256)
		}
	}
	if n := stats(srv).IRDOverflows.Load(); n != 0 {
		t.Fatalf("%d IRD overflows", n)
	}
	sameBytes(t, "read", sink.buf(), remote.buf())
}

// TestQPReuseAfterOwnDisconnect: a QP that disconnected itself, or that
// sent a Terminate, is reset and connects again, Terminate included.
func TestQPReuseAfterOwnDisconnect(t *testing.T) {
	cli, srv := newPair(t, pairOpts{depth: 8})
	// srv detects an error and terminates; then both reset and reconnect.
	cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("x"), RemoteAddr: 0, RKey: 0x12345678})
	terminated(t, srv, cli, rdmap.TermDDPTaggedInvalidSTag)
	poll(t, cli.scq, 1)
	for _, s := range []*side{cli, srv} {
		for _, to := range []verbs.QPState{verbs.QPReset, verbs.QPInit} {
			if err := s.qp.Modify(to); err != nil {
				t.Fatalf("%s: Modify(%v): %v", s.dev.Name(), to, err)
			}
		}
		s.events = nil
	}
	connectOn(t, cli, srv, srvPort+1, verbs.ConnParam{}, verbs.ConnParam{})
	exercise(t, cli, srv, 3000, 4)
	// The same error again: the reused QP terminates again.
	cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("x"), RemoteAddr: 0, RKey: 0x12345678})
	terminated(t, srv, cli, rdmap.TermDDPTaggedInvalidSTag)
	poll(t, cli.scq, 1)
	// And a QP that disconnected itself.
	for _, s := range []*side{cli, srv} {
		s.qp.Disconnect()
		for _, to := range []verbs.QPState{verbs.QPReset, verbs.QPInit} {
			if err := s.qp.Modify(to); err != nil {
				t.Fatalf("%s: Modify(%v): %v", s.dev.Name(), to, err)
			}
		}
		s.events = nil
	}
	connectOn(t, cli, srv, srvPort+2, verbs.ConnParam{}, verbs.ConnParam{})
	exercise(t, cli, srv, 3000, 5)
}

// TestPartialPostSendStillSends: the requests before a bad one go out.
func TestPartialPostSendStillSends(t *testing.T) {
	cli, srv := newPair(t, pairOpts{depth: 8})
	dst := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	n, err := cli.qp.PostSend([]verbs.SendWR{
		{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("ok"), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()},
		{ID: 2, Opcode: verbs.WROpcode(5)}, // IBV_WR_ATOMIC_CMP_AND_SWP
	})
	if n != 1 || !errors.Is(err, verbs.ErrInvalidWR) {
		t.Fatalf("PostSend = %d, %v; want 1, ErrInvalidWR", n, err)
	}
	wantWC(t, poll(t, cli.scq, 1)[0], 1, verbs.WCWrite, verbs.WCSuccess, 2)
}

// TestFreedObjects: a freed PD takes no new objects; a CQ in use is busy;
// a destroyed QP cannot be destroyed twice.
func TestFreedObjects(t *testing.T) {
	s := loneSide(t, 4)
	pd, err := s.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(make([]byte, 8), verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrDestroyed) {
		t.Fatalf("RegMR on a freed PD: %v, want ErrDestroyed", err)
	}
	if _, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: 1, MaxRecvWR: 1}); !errors.Is(err, verbs.ErrDestroyed) {
		t.Fatalf("CreateQP on a freed PD: %v, want ErrDestroyed", err)
	}
	if err := pd.Dealloc(); !errors.Is(err, verbs.ErrDestroyed) {
		t.Fatalf("second Dealloc: %v, want ErrDestroyed", err)
	}
	if err := s.scq.Destroy(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("Destroy of a CQ in use: %v, want ErrBusy", err)
	}
	if err := s.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := s.qp.Destroy(); !errors.Is(err, verbs.ErrDestroyed) {
		t.Fatalf("second QP Destroy: %v, want ErrDestroyed", err)
	}
	if err := s.scq.Destroy(); err != nil {
		t.Fatalf("Destroy of a CQ no longer used: %v", err)
	}
}

// TestCompletedOnceWithTCP: send requests all of whose bytes were handed
// to TCP complete with success even when the peer closes the connection as
// soon as it has them (the QP entering ERR while the TX goroutine finishes a
// request must not flush it); a request cut short by the close is flushed.
func TestCompletedOnceWithTCP(t *testing.T) {
	for i := 0; i < 20; i++ {
		cli, srv := newPair(t, pairOpts{depth: 8})
		dst := srv.region(8<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		src := cli.region(8<<20, verbs.AccessLocalWrite)
		fill(src.buf(), uint64(i))
		srv.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{dst.mr.SGE(1<<20, 64)}})
		cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, 1<<20)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()},
			verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("bye")},
			verbs.SendWR{ID: 3, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, 8<<20)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
		wantWC(t, poll(t, srv.rcq, 1)[0], 1, verbs.WCRecv, verbs.WCSuccess, 3)
		srv.qp.Disconnect()
		sameBytes(t, "write", dst.buf()[:1<<20], src.buf()[:1<<20])
		wcs := poll(t, cli.scq, 3)
		wantWC(t, wcs[0], 1, verbs.WCWrite, verbs.WCSuccess, 1<<20)
		wantWC(t, wcs[1], 2, verbs.WCSend, verbs.WCSuccess, 3)
		if st := wcs[2].Status; wcs[2].ID != 3 || (st != verbs.WCSuccess && st != verbs.WCFlushErr) {
			t.Fatalf("third completion %+v", wcs[2])
		}
		dst.checkGuards(t)
	}
}
