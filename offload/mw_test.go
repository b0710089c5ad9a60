package offload

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// mwQP is a QP in INIT (PD 1) on a device without a stack, its receive
// engine started (CRC on, no markers), its receive completions recorded,
// and a region of n bytes at rxAddr registered with MW_BIND that windows
// are bound into.
func mwQP(tb testing.TB, n int) (*QP, *Region, *recCQ) {
	tb.Helper()
	dev, err := NewDevice(nil, DefaultConfig("siwtun0"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { dev.Close() })
	rcq := &recCQ{wcs: make([]ibv.WorkCompletion, 0, 16), sol: make([]bool, 0, 16)}
	qp, err := dev.CreateQP(1, &countCQ{}, rcq, QPAttr{MaxSendWR: 4, MaxRecvWR: 16})
	if err != nil {
		tb.Fatal(err)
	}
	if err := qp.Modify(ibv.QPInit); err != nil {
		tb.Fatal(err)
	}
	reg, err := dev.Regions().Register(1, make([]byte, n), rxAddr,
		ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead|ibv.AccessMWBind)
	if err != nil {
		tb.Fatal(err)
	}
	qp.rx.init(qp, &mpa.Params{CRC: true}, 0, nil)
	return qp, reg, rcq
}

// bindWQE is the send queue's BIND_MW request binding window mw (giving
// it key) to [addr, +n) of region mr with access.
func bindWQE(mw, mr *Region, key uint8, addr, n uint64, access ibv.Access) *sendWQE {
	return &sendWQE{id: 9, op: ibv.WRBindMW, bind: ibv.MWBind{
		MW: mw.STag(), RKey: mw.STag()&^0xff | uint32(key), MRKey: mr.STag(),
		Addr: addr, Length: n, Access: access, Type1: mw.MW() == ibv.MWType1,
	}}
}

// terminateOf returns the bytes of the Terminate the QP queued, and
// releases it (no TX goroutine sends it).
func terminateOf(t *testing.T, qp *QP) (rdmap.Code, string) {
	t.Helper()
	qp.mu.Lock()
	term := qp.term
	if qp.termDone != nil {
		close(qp.termDone)
		qp.termDone = nil
	}
	qp.mu.Unlock()
	if term == nil {
		t.Fatal("no Terminate queued")
	}
	b := make([]byte, term.Len())
	return term.Code, hex.EncodeToString(b[:term.Marshal(b)])
}

// TestMWBindRules: every rule of a bind, each broken once (the window
// unchanged), and what a good bind gives: the window's index with the
// consumer's key, its range inside the region, its rights. Bind puts
// nothing on the wire: no TX goroutine runs here.
func TestMWBindRules(t *testing.T) {
	qp, mr, _ := mwQP(t, 4096)
	tab := qp.dev.Regions()
	noBind, err := tab.Register(1, make([]byte, 64), 0x90000, ibv.AccessLocalWrite|ibv.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	roMR, err := tab.Register(1, make([]byte, 64), 0xa0000, ibv.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	otherPD, err := tab.Register(2, make([]byte, 64), 0xb0000, ibv.AccessLocalWrite|ibv.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw2, err := tab.AllocMW(1, ibv.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	mw1, err := tab.AllocMW(1, ibv.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	mwPD2, err := tab.AllocMW(2, ibv.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tab.Lookup(mw2.STag()); ok {
		t.Fatal("a window names memory before its bind")
	}
	rw := ibv.AccessRemoteWrite | ibv.AccessRemoteRead
	bad := []struct {
		name string
		w    *sendWQE
	}{
		{"region without MW_BIND", bindWQE(mw2, noBind, 1, 0x90000, 8, rw)},
		{"REMOTE_WRITE over a region without LOCAL_WRITE", bindWQE(mw2, roMR, 1, 0xa0000, 8, ibv.AccessRemoteWrite)},
		{"region of another PD", bindWQE(mw2, otherPD, 1, 0xb0000, 8, ibv.AccessRemoteRead)},
		{"window of another PD than the QP", bindWQE(mwPD2, otherPD, 1, 0xb0000, 8, ibv.AccessRemoteRead)},
		{"past the region's end", bindWQE(mw2, mr, 1, rxAddr+4000, 97, rw)},
		{"before the region", bindWQE(mw2, mr, 1, rxAddr-1, 8, rw)},
		{"a window as the region", bindWQE(mw2, mw1, 1, 0, 0, rw)},
		{"LOCAL_WRITE right", bindWQE(mw2, mr, 1, rxAddr, 8, ibv.AccessLocalWrite)},
	}
	for _, tc := range bad {
		if st := qp.localOp(tc.w); st != ibv.WCMWBindErr {
			t.Errorf("%s: status %v, want %v", tc.name, st, ibv.WCMWBindErr)
		}
	}
	// The type 1 flag must match the window.
	w := bindWQE(mw2, mr, 1, rxAddr, 8, rw)
	w.bind.Type1 = true
	if st := qp.localOp(w); st != ibv.WCMWBindErr {
		t.Errorf("type 2 window bound as type 1: %v", st)
	}
	// Another index's rkey.
	w = bindWQE(mw2, mr, 1, rxAddr, 8, rw)
	w.bind.RKey = mw1.STag()
	if st := qp.localOp(w); st != ibv.WCMWBindErr {
		t.Errorf("rkey of another window: %v", st)
	}

	// A good bind at an offset.
	w = bindWQE(mw2, mr, 0x5a, rxAddr+100, 200, rw)
	if st := qp.localOp(w); st != ibv.WCSuccess {
		t.Fatalf("bind: %v", st)
	}
	rkey := mw2.STag()&^0xff | 0x5a
	win, ok := tab.Lookup(rkey)
	if !ok || win.Addr() != rxAddr+100 || win.Len() != 200 || win.Access() != rw || win.MW() != ibv.MWType2 {
		t.Fatalf("bound window: %v %+v", ok, win)
	}
	if &win.Bytes()[0] != &mr.Bytes()[100] {
		t.Fatal("the window is not the region's memory at offset 100")
	}
	if rkey != mw2.STag() {
		if _, ok := tab.Lookup(mw2.STag()); ok {
			t.Fatal("the window's old rkey still names memory")
		}
	}
	// A valid type 2 window is not bound again.
	if st := qp.localOp(bindWQE(win, mr, 0x5b, rxAddr, 8, rw)); st != ibv.WCMWBindErr {
		t.Fatalf("bind of a bound type 2 window: %v", st)
	}
	// Its region cannot go while it is bound.
	if err := tab.Deregister(mr.STag()); !errors.Is(err, ErrBusy) {
		t.Fatalf("Deregister of a region with a window: %v, want ErrBusy", err)
	}
	if _, err := tab.Reregister(mr.STag(), 1, mr.Bytes(), rxAddr, ibv.AccessLocalWrite|ibv.AccessMWBind); !errors.Is(err, ErrBusy) {
		t.Fatalf("Reregister of a region with a window: %v, want ErrBusy", err)
	}
	// Local Invalidate: then it binds again, zero length this time.
	if st := qp.localOp(&sendWQE{op: ibv.WRLocalInv, invRKey: rkey}); st != ibv.WCSuccess {
		t.Fatalf("local invalidate: %v", st)
	}
	if _, ok := tab.Lookup(rkey); ok {
		t.Fatal("an invalidated window names memory")
	}
	if st := qp.localOp(&sendWQE{op: ibv.WRLocalInv, invRKey: rkey}); st != ibv.WCMWBindErr {
		t.Fatalf("local invalidate of an invalid STag: %v", st)
	}
	w = bindWQE(win, mr, 0x5b, rxAddr+4096, 0, rw)
	if st := qp.localOp(w); st != ibv.WCSuccess {
		t.Fatalf("zero-length bind at the region's end: %v", st)
	}
	if z, ok := tab.Lookup(w.bind.RKey); !ok || z.Len() != 0 {
		t.Fatalf("zero-length window: %v %+v", ok, z)
	}

	// Type 1: bound again while valid (the old rkey dies), never
	// invalidated, unbound by a zero-length bind without a region.
	w = bindWQE(mw1, mr, 1, rxAddr, 64, ibv.AccessRemoteRead)
	if st := qp.localOp(w); st != ibv.WCSuccess {
		t.Fatalf("type 1 bind: %v", st)
	}
	first := w.bind.RKey
	w = bindWQE(mw1, mr, 2, rxAddr+64, 64, ibv.AccessRemoteRead)
	if st := qp.localOp(w); st != ibv.WCSuccess {
		t.Fatalf("type 1 bind again: %v", st)
	}
	if _, ok := tab.Lookup(first); ok {
		t.Fatal("a type 1 window's previous rkey still names memory")
	}
	if st := qp.localOp(&sendWQE{op: ibv.WRLocalInv, invRKey: w.bind.RKey}); st != ibv.WCMWBindErr {
		t.Fatalf("local invalidate of a type 1 window: %v", st)
	}
	unbind := &sendWQE{op: ibv.WRBindMW, bind: ibv.MWBind{MW: w.bind.RKey, RKey: ibv.IncRKey(w.bind.RKey), Type1: true}}
	if st := qp.localOp(unbind); st != ibv.WCSuccess {
		t.Fatalf("type 1 unbind: %v", st)
	}
	if _, ok := tab.Lookup(w.bind.RKey); ok {
		t.Fatal("an unbound type 1 window names memory")
	}
	// Windows are no local keys.
	if _, ok := tab.LookupMR(tab.slots[tab.secret.slot(mw2.STag()>>8)].STag()); ok {
		t.Fatal("LookupMR found a window")
	}
	// Dealloc frees the windows; then the region goes.
	for _, m := range []*Region{mw1, mw2, mwPD2} {
		if err := tab.DeallocMW(m.STag()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tab.DeallocMW(mw2.STag()); err == nil {
		t.Fatal("a second DeallocMW succeeded")
	}
	if err := tab.Deregister(mr.STag()); err != nil {
		t.Fatalf("Deregister once the windows are gone: %v", err)
	}
}

// TestMWWriteReadAtOffset: an RDMA Write through a window bound at an
// offset of its region lands at that offset, cut into FPDUs and TCP
// reads; a Read Request through it is answered from the same bytes; a
// Write past the window's end, though inside the region, is refused with
// a base-or-bounds Terminate (golden bytes).
func TestMWWriteReadAtOffset(t *testing.T) {
	qp, mr, _ := mwQP(t, 4096)
	tab := qp.dev.Regions()
	mw, err := tab.AllocMW(1, ibv.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	const off, n = 1000, 512
	w := bindWQE(mw, mr, 7, rxAddr+off, n, ibv.AccessRemoteWrite|ibv.AccessRemoteRead)
	if st := qp.localOp(w); st != ibv.WCSuccess {
		t.Fatal(st)
	}
	rkey := w.bind.RKey
	data := pattern(300, 3)
	p := newPeerStream(true, false)
	p.write(rkey, rxAddr+off+100, data, 64)
	if err := feed(qp, p.out, 7, 100); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mr.Bytes()[off+100:off+400], data) {
		t.Fatal("the Write did not land at the window's offset")
	}
	for i, b := range mr.Bytes()[:off+100] {
		if b != 0 {
			t.Fatalf("byte %d before the Write's target changed", i)
		}
	}
	// A Read Request of the same bytes: the IRQ holds them as its source.
	qp.ird = 4
	var rr [rdmap.ReadRequestLen]byte
	(&rdmap.ReadRequest{SinkSTag: 0x1234, SinkTO: 0, Size: 300, SrcSTag: rkey, SrcTO: rxAddr + off + 100}).Marshal(rr[:])
	p.out = p.out[:0]
	p.fpdu(readRequestHeader(1), rr[:])
	if err := feed(qp, p.out, len(p.out)); err != nil {
		t.Fatal(err)
	}
	qp.mu.Lock()
	if len(qp.irq) != 1 || !bytes.Equal(qp.irq[0].src, data) {
		qp.mu.Unlock()
		t.Fatalf("Read through the window: IRQ %+v", qp.irq)
	}
	qp.mu.Unlock()
	// One byte past the window (inside the region): bounds.
	p.out = p.out[:0]
	p.write(rkey, rxAddr+off+n, []byte{1}, 64)
	err = feed(qp, p.out, len(p.out))
	var te *terminateError
	if !errors.As(err, &te) {
		t.Fatalf("Write past the window: %v, want a Terminate", err)
	}
	code, got := terminateOf(t, qp)
	// Terminate control: layer 1 (DDP), etype 1 (tagged buffer), code
	// 0x01 (base or bounds), M and D set; the DDP segment length 15 (the
	// 14-octet tagged header and 1 octet); then the Write's DDP header: T
	// and L, DDP version 1, RDMAP version 1 opcode 0 (Write), the
	// window's STag and TO 0x10000+1000+512.
	want := "1101c000" + "000f" + "c140" + hex.EncodeToString([]byte{byte(rkey >> 24), byte(rkey >> 16), byte(rkey >> 8), byte(rkey)}) + "00000000000105e8"
	if code != rdmap.TermDDPTaggedBaseBounds || got != want {
		t.Fatalf("Terminate %v\n got %s\nwant %s", code, got, want)
	}
	if mr.Bytes()[off+n] != 0 {
		t.Fatal("the refused Write landed")
	}
}

// TestMWRemoteInvalidate: a Send with Invalidate naming a type 2 window
// invalidates it and completes its receive with IBV_WC_WITH_INV and the
// window's rkey; a Write to the window afterwards gets DDP's tagged
// "invalid STag" Terminate (golden bytes) and places nothing. Naming a
// type 1 window, an invalid STag, or a window of another QP gets RDMAP's
// "STag cannot be invalidated", as a protection error (0x0109) or, for
// the invalid STag, an operation error (0x0209), as Linux siw sends them,
// and the receive completes with IBV_WC_REM_INV_REQ_ERR.
func TestMWRemoteInvalidate(t *testing.T) {
	qp, mr, rcq := mwQP(t, 4096)
	tab := qp.dev.Regions()
	mw, err := tab.AllocMW(1, ibv.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	w := bindWQE(mw, mr, 0x21, rxAddr+64, 64, ibv.AccessRemoteWrite)
	if st := qp.localOp(w); st != ibv.WCSuccess {
		t.Fatal(st)
	}
	rkey := w.bind.RKey
	if _, err := qp.PostRecv([]ibv.RecvWR{{ID: 1, SGL: []ibv.SGE{{Addr: rxAddr + 2048, Length: 64, LKey: mr.STag()}}}}); err != nil {
		t.Fatal(err)
	}
	p := newPeerStream(true, false)
	p.sendInv(rkey, []byte("bye"))
	if err := feed(qp, p.out, len(p.out)); err != nil {
		t.Fatal(err)
	}
	if len(rcq.wcs) != 1 || rcq.wcs[0].Flags != ibv.WCWithInv || rcq.wcs[0].InvalidatedRKey != rkey || rcq.wcs[0].Status != ibv.WCSuccess {
		t.Fatalf("receive completion %+v, want WITH_INV of 0x%08x", rcq.wcs, rkey)
	}
	if _, ok := tab.Lookup(rkey); ok {
		t.Fatal("the window is valid after Send with Invalidate")
	}
	p.out = p.out[:0]
	p.write(rkey, rxAddr+64, []byte{0xee, 0xee}, 64)
	err = feed(qp, p.out, len(p.out))
	var te *terminateError
	if !errors.As(err, &te) {
		t.Fatalf("Write after the invalidation: %v, want a Terminate", err)
	}
	code, got := terminateOf(t, qp)
	// Layer 1 (DDP), etype 1 (tagged buffer), code 0x00 (invalid STag),
	// M and D set; segment length 16; the Write's header with TO 0x10040.
	want := "1100c000" + "0010" + "c140" + hex.EncodeToString([]byte{byte(rkey >> 24), byte(rkey >> 16), byte(rkey >> 8), byte(rkey)}) + "0000000000010040"
	if code != rdmap.TermDDPTaggedInvalidSTag || got != want {
		t.Fatalf("Terminate %v\n got %s\nwant %s", code, got, want)
	}
	if mr.Bytes()[64] != 0 {
		t.Fatal("a Write to the invalidated window landed")
	}

	// The refusals, each on a fresh QP.
	for _, tc := range []struct {
		name string
		stag func(qp *QP, mr *Region) uint32
		code rdmap.Code
	}{
		{"type 1 window", func(qp *QP, mr *Region) uint32 {
			m, _ := qp.dev.Regions().AllocMW(1, ibv.MWType1)
			w := bindWQE(m, mr, 1, rxAddr, 8, ibv.AccessRemoteRead)
			qp.localOp(w)
			return w.bind.RKey
		}, rdmap.TermRDMAPProtCannotInvalidate},
		{"type 2 window of another QP", func(qp *QP, mr *Region) uint32 {
			m, _ := qp.dev.Regions().AllocMW(1, ibv.MWType2)
			w := bindWQE(m, mr, 1, rxAddr, 8, ibv.AccessRemoteRead)
			qp.num++ // bound by another QP
			qp.localOp(w)
			qp.num--
			return w.bind.RKey
		}, rdmap.TermRDMAPProtCannotInvalidate},
		{"region of another PD", func(qp *QP, _ *Region) uint32 {
			r, _ := qp.dev.Regions().Register(2, make([]byte, 8), 0, ibv.AccessLocalWrite)
			return r.STag()
		}, rdmap.TermRDMAPProtCannotInvalidate},
		{"invalid STag", func(*QP, *Region) uint32 { return 0x00abcd00 }, rdmap.TermRDMAPCannotInvalidate},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			qp, mr, rcq := mwQP(t, 4096)
			stag := tc.stag(qp, mr)
			if _, err := qp.PostRecv([]ibv.RecvWR{{ID: 1, SGL: []ibv.SGE{{Addr: rxAddr + 2048, Length: 64, LKey: mr.STag()}}}}); err != nil {
				t.Fatal(err)
			}
			p := newPeerStream(true, false)
			p.sendInv(stag, []byte("x"))
			if err := feed(qp, p.out, len(p.out)); !errors.As(err, new(*terminateError)) {
				t.Fatalf("Send with Invalidate: %v, want a Terminate", err)
			}
			code, _ := terminateOf(t, qp)
			if code != tc.code {
				t.Fatalf("Terminate %v, want %v", code, tc.code)
			}
			if len(rcq.wcs) == 0 || rcq.wcs[0].Status != ibv.WCRemInvReqErr || rcq.wcs[0].Flags&ibv.WCWithInv != 0 {
				t.Fatalf("receive completion %+v, want REM_INV_REQ_ERR without WITH_INV", rcq.wcs)
			}
			if stag != 0x00abcd00 {
				if _, ok := qp.dev.Regions().Lookup(stag); !ok {
					t.Fatal("the refused STag was invalidated")
				}
			}
		})
	}
}

// TestMWInvalidateDuringPlacement: a Write whose segment is being placed
// when its window is invalidated (between two TCP reads of the segment)
// places nothing after the invalidation returned and is refused with the
// tagged "invalid STag" Terminate at the segment's end.
func TestMWInvalidateDuringPlacement(t *testing.T) {
	qp, mr, _ := mwQP(t, 4096)
	tab := qp.dev.Regions()
	mw, err := tab.AllocMW(1, ibv.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	w := bindWQE(mw, mr, 3, rxAddr, 1024, ibv.AccessRemoteWrite)
	if st := qp.localOp(w); st != ibv.WCSuccess {
		t.Fatal(st)
	}
	data := bytes.Repeat([]byte{0xab}, 800)
	p := newPeerStream(true, false)
	p.write(w.bind.RKey, rxAddr, data, 1024)
	half := 2 + 14 + 400 // MPA length, tagged header, 400 payload octets
	if _, err := qp.rx.mpa.Write(p.out[:half]); err != nil {
		t.Fatal(err)
	}
	if st := qp.localOp(&sendWQE{op: ibv.WRLocalInv, invRKey: w.bind.RKey}); st != ibv.WCSuccess {
		t.Fatal(st)
	}
	snap := append([]byte(nil), mr.Bytes()...)
	_, err = qp.rx.mpa.Write(p.out[half:])
	if !errors.As(err, new(*terminateError)) {
		t.Fatalf("the rest of the Write: %v, want a Terminate", err)
	}
	if code, _ := terminateOf(t, qp); code != rdmap.TermDDPTaggedInvalidSTag {
		t.Fatalf("Terminate %v", code)
	}
	if !bytes.Equal(snap, mr.Bytes()) {
		t.Fatal("bytes landed after the invalidation returned")
	}
	if !bytes.Equal(mr.Bytes()[:400], data[:400]) {
		t.Fatal("the part before the invalidation did not land")
	}
}

// TestMWNoAllocs: placing a Write through a window allocates nothing.
func TestMWNoAllocs(t *testing.T) {
	qp, mr, _ := mwQP(t, 4096)
	mw, err := qp.dev.Regions().AllocMW(1, ibv.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	w := bindWQE(mw, mr, 3, rxAddr, 1024, ibv.AccessRemoteWrite)
	if st := qp.localOp(w); st != ibv.WCSuccess {
		t.Fatal(st)
	}
	p := newPeerStream(true, false)
	p.write(w.bind.RKey, rxAddr, pattern(512, 1), 256)
	stream := p.out
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := qp.rx.mpa.Write(stream); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per Write through a window", allocs)
	}
}

// sendInv sends a one-FPDU Send with Invalidate of data naming stag.
func (p *peerStream) sendInv(stag uint32, data []byte) {
	p.fpdu(ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSendInv), ULPData: stag, QN: ddp.QNSend, MSN: p.msn}, data)
	p.msn++
}

// readRequestHeader is the DDP header of the Read Request of MSN msn.
func readRequestHeader(msn uint32) ddp.Header {
	return ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpReadRequest), QN: ddp.QNReadRequest, MSN: msn}
}

// TestMWType2OtherQP: a type 2 window is tied to the QP that bound it: a
// Write through it arriving on another QP of the same PD gets DDP's
// tagged "STag not associated" Terminate, a Read Request RDMAP's, and
// nothing is placed; the binding QP's peer reaches it.
func TestMWType2OtherQP(t *testing.T) {
	owner, mr, _ := mwQP(t, 4096)
	dev := owner.dev
	other := func() *QP {
		qp, err := dev.CreateQP(1, &countCQ{}, &countCQ{}, QPAttr{MaxSendWR: 4, MaxRecvWR: 4})
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.Modify(ibv.QPInit); err != nil {
			t.Fatal(err)
		}
		qp.rx.init(qp, &mpa.Params{CRC: true}, 0, nil)
		qp.ird = 4
		return qp
	}
	mw, err := dev.Regions().AllocMW(1, ibv.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	w := bindWQE(mw, mr, 9, rxAddr, 256, ibv.AccessRemoteWrite|ibv.AccessRemoteRead)
	if st := owner.localOp(w); st != ibv.WCSuccess {
		t.Fatal(st)
	}
	rkey := w.bind.RKey
	p := newPeerStream(true, false)
	p.write(rkey, rxAddr, []byte{1, 2, 3}, 64)
	qp := other()
	if err := feed(qp, p.out, len(p.out)); !errors.As(err, new(*terminateError)) {
		t.Fatalf("Write on another QP: %v, want a Terminate", err)
	}
	if code, _ := terminateOf(t, qp); code != rdmap.TermDDPTaggedStagNotAssoc {
		t.Fatalf("Write on another QP: Terminate %v, want %v", code, rdmap.TermDDPTaggedStagNotAssoc)
	}
	if mr.Bytes()[0] != 0 {
		t.Fatal("the Write on another QP landed")
	}
	var rr [rdmap.ReadRequestLen]byte
	(&rdmap.ReadRequest{SinkSTag: 0x1234, Size: 8, SrcSTag: rkey, SrcTO: rxAddr}).Marshal(rr[:])
	p.out = p.out[:0]
	p.fpdu(readRequestHeader(1), rr[:])
	qp = other()
	if err := feed(qp, p.out, len(p.out)); !errors.As(err, new(*terminateError)) {
		t.Fatalf("Read on another QP: %v, want a Terminate", err)
	}
	if code, _ := terminateOf(t, qp); code != rdmap.TermRDMAPStagNotAssoc {
		t.Fatalf("Read on another QP: Terminate %v, want %v", code, rdmap.TermRDMAPStagNotAssoc)
	}
	p = newPeerStream(true, false)
	p.write(rkey, rxAddr, []byte{1, 2, 3}, 64)
	if err := feed(owner, p.out, len(p.out)); err != nil {
		t.Fatalf("Write on the binding QP: %v", err)
	}
	if !bytes.Equal(mr.Bytes()[:3], []byte{1, 2, 3}) {
		t.Fatal("the Write on the binding QP did not land")
	}
}

// TestMWType2DiesWithQP: destroying a QP invalidates the type 2 windows
// bound to it, and only those: a type 1 window and another QP's type 2
// window stay; the region can then go once the survivors are freed.
func TestMWType2DiesWithQP(t *testing.T) {
	qp, mr, _ := mwQP(t, 4096)
	tab := qp.dev.Regions()
	mine, _ := tab.AllocMW(1, ibv.MWType2)
	one, _ := tab.AllocMW(1, ibv.MWType1)
	theirs, _ := tab.AllocMW(1, ibv.MWType2)
	w1, w2, w3 := bindWQE(mine, mr, 1, rxAddr, 8, ibv.AccessRemoteRead), bindWQE(one, mr, 1, rxAddr, 8, ibv.AccessRemoteRead), bindWQE(theirs, mr, 1, rxAddr, 8, ibv.AccessRemoteRead)
	for _, w := range []*sendWQE{w1, w2} {
		if st := qp.localOp(w); st != ibv.WCSuccess {
			t.Fatal(st)
		}
	}
	qp.num += 1000 // theirs: bound by another QP
	if st := qp.localOp(w3); st != ibv.WCSuccess {
		t.Fatal(st)
	}
	qp.num -= 1000
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, ok := tab.Lookup(w1.bind.RKey); ok {
		t.Fatal("a type 2 window outlived its QP")
	}
	for _, k := range []uint32{w2.bind.RKey, w3.bind.RKey} {
		if _, ok := tab.Lookup(k); !ok {
			t.Fatalf("window 0x%08x went with another QP", k)
		}
	}
	if err := tab.Deregister(mr.STag()); !errors.Is(err, ErrBusy) {
		t.Fatalf("Deregister with two windows bound: %v", err)
	}
	for _, m := range []*Region{mine, one, theirs} {
		if err := tab.DeallocMW(m.STag()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tab.Deregister(mr.STag()); err != nil {
		t.Fatal(err)
	}
	if tab.bound2 != 0 {
		t.Fatalf("%d bound type 2 windows counted, want 0", tab.bound2)
	}
}
