package uverbs

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs"
)

// mwRound runs memory windows on owner's side with peer as the remote
// user: a type 2 window bound by WRBindMW at an offset of a region, a peer
// Write and Read through it; a type 1 window bound by MW.Bind and read;
// the peer's Send with Invalidate of the type 2 window (WITH_INV and its
// rkey), a second bind with a new key, Local Invalidate, and the peer's
// Write after it: refused with DDP's tagged "invalid STag" Terminate,
// nothing placed. The region cannot be deregistered while a window is
// bound to it; deallocating the windows frees it.
func mwRound(t *testing.T, owner, peer *side) {
	const n = 4096
	mr := owner.region(t, n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessMWBind)
	src := peer.region(t, n, verbs.AccessLocalWrite)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i*7 + 1)
	}
	if a := owner.dev.Query(); a.MaxMW <= 0 {
		t.Fatalf("MaxMW %d", a.MaxMW)
	}
	mw2, err := owner.pd.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	mw1, err := owner.pd.AllocMW(verbs.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if mw2.RKey()>>8 == mw1.RKey()>>8 || mw2.RKey()>>8 == mr.RKey()>>8 {
		t.Fatalf("windows and region share an index: 0x%08x 0x%08x 0x%08x", mw2.RKey(), mw1.RKey(), mr.RKey())
	}
	bindWR := func(id uint64, rkey uint32, off, length uint64) verbs.SendWR {
		return verbs.SendWR{ID: id, Opcode: verbs.WRBindMW, Flags: verbs.FlagSignaled, Bind: verbs.MWBind{
			MW: mw2.RKey(), RKey: rkey, MRKey: mr.LKey(), Addr: mr.Addr() + off, Length: length,
			Access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead}}
	}
	rkey2 := verbs.IncRKey(mw2.RKey())
	if _, err := owner.qp.PostSend([]verbs.SendWR{bindWR(1, rkey2, 512, 1024)}); err != nil {
		t.Fatal(err)
	}
	if wc := poll(t, owner.scq, 1)[0]; wc.ID != 1 || wc.Opcode != verbs.WCBindMW || wc.Status != verbs.WCSuccess {
		t.Fatalf("bind completion %+v", wc)
	}
	// The peer writes 300 bytes at offset 100 of the window, and reads
	// them back.
	post := func(wr verbs.SendWR) verbs.WorkCompletion {
		t.Helper()
		if _, err := peer.qp.PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		return poll(t, peer.scq, 1)[0]
	}
	if wc := post(verbs.SendWR{ID: 2, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.SGE(0, 300)},
		RemoteAddr: mr.Addr() + 612, RKey: rkey2}); wc.Status != verbs.WCSuccess {
		t.Fatalf("Write through the window: %+v", wc)
	}
	if wc := post(verbs.SendWR{ID: 3, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.SGE(1000, 300)},
		RemoteAddr: mr.Addr() + 612, RKey: rkey2}); wc.Status != verbs.WCSuccess || wc.ByteLen != 300 {
		t.Fatalf("Read through the window: %+v", wc)
	}
	// A Send behind them: its receive's completion, polled here, comes
	// after the Write's placement (one receive goroutine on the owner's
	// side), so the owner's bytes are read after they were written.
	if _, err := owner.qp.PostRecv([]verbs.RecvWR{{ID: 20, SGL: []verbs.SGE{mr.SGE(3500, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := post(verbs.SendWR{ID: 21, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.SGE(0, 8)}}); wc.Status != verbs.WCSuccess {
		t.Fatalf("Send: %+v", wc)
	}
	if wc := poll(t, owner.rcq, 1)[0]; wc.ID != 20 || wc.Status != verbs.WCSuccess {
		t.Fatalf("receive: %+v", wc)
	}
	if !bytes.Equal(mr.Bytes()[612:912], src.Bytes()[:300]) || !bytes.Equal(src.Bytes()[1000:1300], src.Bytes()[:300]) {
		t.Fatal("the Write or the Read through the window moved the wrong bytes")
	}
	if bytes.ContainsFunc(mr.Bytes()[:612], func(r rune) bool { return r != 0 }) {
		t.Fatal("bytes before the Write's target changed")
	}
	// A type 1 window, bound by MW.Bind: read-only over the region's
	// first 256 bytes.
	old1 := mw1.RKey()
	if err := mw1.Bind(owner.qp, verbs.MWBindInfo{ID: 4, Flags: verbs.FlagSignaled, MR: mr, Addr: mr.Addr(), Length: 256, Access: verbs.AccessRemoteRead}); err != nil {
		t.Fatal(err)
	}
	if wc := poll(t, owner.scq, 1)[0]; wc.ID != 4 || wc.Opcode != verbs.WCBindMW || wc.Status != verbs.WCSuccess {
		t.Fatalf("MW.Bind completion %+v", wc)
	}
	if mw1.RKey() != verbs.IncRKey(old1) {
		t.Fatalf("type 1 rkey 0x%08x after Bind, want 0x%08x", mw1.RKey(), verbs.IncRKey(old1))
	}
	if wc := post(verbs.SendWR{ID: 5, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.SGE(2000, 8)},
		RemoteAddr: mr.Addr() + 248, RKey: mw1.RKey()}); wc.Status != verbs.WCSuccess {
		t.Fatalf("Read through the type 1 window: %+v", wc)
	}
	if err := mw2.Bind(owner.qp, verbs.MWBindInfo{MR: mr, Length: 8}); !errors.Is(err, verbs.ErrMWBind) {
		t.Fatalf("MW.Bind of a type 2 window: %v", err)
	}
	// The peer's Send with Invalidate of the type 2 window.
	if _, err := owner.qp.PostRecv([]verbs.RecvWR{{ID: 6, SGL: []verbs.SGE{mr.SGE(3000, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := post(verbs.SendWR{ID: 7, Opcode: verbs.WRSendWithInv, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.SGE(0, 10)},
		InvalidateRKey: rkey2}); wc.Status != verbs.WCSuccess {
		t.Fatalf("Send with Invalidate: %+v", wc)
	}
	if wc := poll(t, owner.rcq, 1)[0]; wc.ID != 6 || wc.Status != verbs.WCSuccess || wc.Flags&verbs.WCWithInv == 0 || wc.InvalidatedRKey != rkey2 {
		t.Fatalf("receive of the Send with Invalidate: %+v, want WITH_INV of 0x%08x", wc, rkey2)
	}
	// Bound again under a new key, then invalidated locally.
	rkey3 := verbs.IncRKey(rkey2)
	if _, err := owner.qp.PostSend([]verbs.SendWR{bindWR(8, rkey3, 0, 2048),
		{ID: 9, Opcode: verbs.WRLocalInv, Flags: verbs.FlagSignaled, InvalidateRKey: rkey3}}); err != nil {
		t.Fatal(err)
	}
	for i, wc := range poll(t, owner.scq, 2) {
		if wc.ID != uint64(8+i) || wc.Status != verbs.WCSuccess || wc.Opcode != []verbs.WCOpcode{verbs.WCBindMW, verbs.WCLocalInv}[i] {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	snap := append([]byte(nil), mr.Bytes()...)
	// The Write completes once TCP has it (as on Linux siw); the
	// owner's Terminate ends the stream.
	post(verbs.SendWR{ID: 10, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.SGE(0, 100)},
		RemoteAddr: mr.Addr(), RKey: rkey3})
	if e := waitEvent(t, peer.qp, verbs.EventTerminateReceived); e.Code != rdmap.TermDDPTaggedInvalidSTag {
		t.Fatalf("Terminate %v, want %v", e.Code, rdmap.TermDDPTaggedInvalidSTag)
	}
	if !bytes.Equal(snap, mr.Bytes()) {
		t.Fatal("the Write to the invalidated window landed")
	}
	// mw1 is still bound: the region stays.
	if err := mr.Dereg(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("Dereg with a window bound: %v, want ErrBusy", err)
	}
	if err := owner.pd.Dealloc(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("PD Dealloc with windows: %v, want ErrBusy", err)
	}
	for _, w := range []*verbs.MW{mw1, mw2} {
		if err := w.Dealloc(); err != nil {
			t.Fatal(err)
		}
	}
	if err := mr.Dereg(); err != nil {
		t.Fatalf("Dereg once the windows are gone: %v", err)
	}
}

// TestMWOverSocket: memory windows of an application on the verbs socket
// (the bind's SQE, AllocMW, DeallocMW), the in-process peer using them;
// and the same with the in-process side owning the windows and the
// socket's client using them.
func TestMWOverSocket(t *testing.T) {
	for _, sockOwns := range []bool{true, false} {
		t.Run(fmt.Sprintf("socket-owns=%v", sockOwns), func(t *testing.T) {
			r := newRig(t)
			sock, peer := newEnd(t, r.dial(), 16), newEnd(t, r.peer, 16)
			connect(t, sock, peer)
			if sockOwns {
				mwRound(t, sock, peer)
			} else {
				mwRound(t, peer, sock)
			}
		})
	}
}

// TestMWBindErrorOverSocket: a bind breaking a rule (a region without
// MW_BIND) completes with IBV_WC_MW_BIND_ERR and the QP goes to ERR; the
// window's STag still names nothing.
func TestMWBindErrorOverSocket(t *testing.T) {
	r := newRig(t)
	sock, peer := newEnd(t, r.dial(), 16), newEnd(t, r.peer, 16)
	connect(t, sock, peer)
	mr := sock.region(t, 64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	mw, err := sock.pd.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{ID: 1, Opcode: verbs.WRBindMW, Bind: verbs.MWBind{MW: mw.RKey(), RKey: verbs.IncRKey(mw.RKey()),
		MRKey: mr.LKey(), Addr: mr.Addr(), Length: 64, Access: verbs.AccessRemoteWrite}}
	if _, err := sock.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	if wc := poll(t, sock.scq, 1)[0]; wc.ID != 1 || wc.Status != verbs.WCMWBindErr || wc.Opcode != verbs.WCBindMW {
		t.Fatalf("bind to a region without MW_BIND: %+v", wc)
	}
	waitEvent(t, sock.qp, verbs.EventDisconnected)
	if st := sock.qp.State(); st != verbs.QPErr {
		t.Fatalf("QP state %v, want ERR", st)
	}
	if _, ok := r.daemon.Regions().Lookup(wr.Bind.RKey); ok {
		t.Fatal("the refused bind's rkey names memory")
	}
}
