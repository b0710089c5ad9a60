package offload

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// srqQPs are n QPs in INIT on one device, all attached to one SRQ of
// depth, each with its receive engine started (CRC on, markers as given,
// RFC 7306 negotiated) and its receive completions recorded, and a region
// of size bytes at rxAddr for the SRQ's receives.
func srqQPs(tb testing.TB, n, depth, size int, markers bool) (*SRQ, []*QP, []*recCQ, *Region) {
	tb.Helper()
	dev, err := NewDevice(nil, DefaultConfig("siwtun0"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { dev.Close() })
	srq, err := dev.CreateSRQ(1, SRQAttr{MaxWR: depth})
	if err != nil {
		tb.Fatal(err)
	}
	reg, err := dev.Regions().Register(1, make([]byte, size), rxAddr, ibv.AccessLocalWrite|ibv.AccessRemoteWrite)
	if err != nil {
		tb.Fatal(err)
	}
	var qps []*QP
	var cqs []*recCQ
	for range n {
		rcq := &recCQ{wcs: make([]ibv.WorkCompletion, 0, 256), sol: make([]bool, 0, 256)}
		qp, err := dev.CreateQP(1, &countCQ{}, rcq, QPAttr{MaxSendWR: 4, MaxRecvWR: 1000, SRQ: srq})
		if err != nil {
			tb.Fatal(err)
		}
		if err := qp.Modify(ibv.QPInit); err != nil {
			tb.Fatal(err)
		}
		qp.rx.init(qp, &mpa.Params{CRC: true, MarkersRx: markers, Ext: mpa.ExtImmediate}, 0, nil)
		qps = append(qps, qp)
		cqs = append(cqs, rcq)
	}
	return srq, qps, cqs, reg
}

// TestSRQPlacement: Sends arriving on three QPs in turn take the SRQ's
// receives in posting order, whatever QP they arrive on: each lands in the
// next receive's buffers (two SGEs), byte for byte, and completes into the
// QP's own receive CQ with that QP's number; an Immediate Data message of
// a Write with Immediate Data takes one too. Markers on and off, the
// stream cut into small reads.
func TestSRQPlacement(t *testing.T) {
	for _, markers := range []bool{false, true} {
		t.Run(fmt.Sprintf("markers=%v", markers), func(t *testing.T) {
			const slot, n = 256, 12
			srq, qps, cqs, reg := srqQPs(t, 3, 16, slot*(n+4), markers)
			for i := range n + 4 {
				wr := ibv.RecvWR{ID: uint64(100 + i), SGL: []ibv.SGE{
					{Addr: rxAddr + uint64(i*slot), Length: 100, LKey: reg.STag()},
					{Addr: rxAddr + uint64(i*slot+128), Length: 100, LKey: reg.STag()}}}
				if _, err := srq.PostRecv([]ibv.RecvWR{wr}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := qps[0].PostRecv([]ibv.RecvWR{{ID: 1}}); !errors.Is(err, ibv.ErrInvalidWR) {
				t.Fatalf("PostRecv on a QP with an SRQ: %v, want ErrInvalidWR", err)
			}
			streams := make([]*peerStream, len(qps))
			for i := range streams {
				streams[i] = newPeerStream(true, markers)
			}
			var want [][]byte
			for i := range n - 1 {
				d := pattern(150+i, i)
				want = append(want, d)
				p := streams[i%len(qps)]
				p.out = p.out[:0]
				p.send(rdmap.OpSend, d, 64)
				if err := feed(qps[i%len(qps)], p.out, 7, 64, 3); err != nil {
					t.Fatalf("Send %d: %v", i, err)
				}
			}
			// The last receive: a Write with Immediate Data on QP 1.
			p := streams[1]
			p.out = p.out[:0]
			p.write(reg.STag(), rxAddr+uint64((n-1)*slot), []byte("written"), 64)
			p.imm(rdmap.OpImmediate, rdmap.Immediate{Data: 0xabc})
			if err := feed(qps[1], p.out, 5); err != nil {
				t.Fatal(err)
			}
			buf := reg.buf
			for i, d := range want {
				got := append(append([]byte(nil), buf[i*slot:i*slot+100]...), buf[i*slot+128:i*slot+128+len(d)-100]...)
				if !bytes.Equal(got, d) {
					t.Fatalf("receive %d holds %x, want %x", i, got, d)
				}
			}
			seen := map[uint64]bool{}
			for qi, cq := range cqs {
				for k, wc := range cq.wcs {
					if wc.Status != ibv.WCSuccess || wc.QPNum != qps[qi].Num() {
						t.Fatalf("QP %d completion %d: %+v", qps[qi].Num(), k, wc)
					}
					i := int(wc.ID - 100)
					switch {
					case i == n-1:
						if qi != 1 || wc.Opcode != ibv.WCRecvRDMAWithImm || wc.ImmData != 0xabc || wc.ByteLen != 7 {
							t.Fatalf("Write with Immediate's receive: %+v on QP index %d", wc, qi)
						}
					case i%len(qps) != qi || wc.ByteLen != uint32(len(want[i])) || wc.Opcode != ibv.WCRecv:
						t.Fatalf("receive %d completed on QP index %d as %+v, want index %d, %d bytes", i, qi, wc, i%len(qps), len(want[i]))
					}
					seen[wc.ID] = true
				}
			}
			if len(seen) != n || srq.Count() != 4 || srq.Stats().Taken != n {
				t.Fatalf("%d receives completed, SRQ holds %d, stats %+v; want %d, 4", len(seen), srq.Count(), srq.Stats(), n)
			}
		})
	}
}

// TestSRQEmptyTerminate: a Send arriving at a QP whose SRQ is empty gets
// DDP's untagged "no buffer" Terminate (layer DDP, etype untagged buffer,
// code 0x02), as on a QP with no receive posted; the Terminate's bytes are
// checked against the golden ones (with the offending Send's DDP header
// copied). The refill is asked first; another QP's SRQ receives are not
// touched by the failure.
func TestSRQEmptyTerminate(t *testing.T) {
	srq, qps, cqs, reg := srqQPs(t, 2, 4, 256, false)
	refills := 0
	srq.SetRecvRefill(func() { refills++ })
	p := newPeerStream(true, false)
	p.send(rdmap.OpSend, []byte("hello"), 64)
	err := feed(qps[0], p.out, len(p.out))
	var te *terminateError
	if !errors.As(err, &te) {
		t.Fatalf("Send on an empty SRQ: %v, want a Terminate", err)
	}
	qps[0].mu.Lock()
	term := qps[0].term
	if qps[0].termDone != nil {
		close(qps[0].termDone)
		qps[0].termDone = nil
	}
	qps[0].mu.Unlock()
	if term == nil || term.Code != rdmap.TermDDPNoBuffer {
		t.Fatalf("Terminate %v, want %v", term, rdmap.TermDDPNoBuffer)
	}
	b := make([]byte, term.Len())
	b = b[:term.Marshal(b)]
	// Terminate control: layer 1 (DDP), etype 2 (untagged buffer), code
	// 0x02 (no buffer), M and D set (segment length valid, DDP header
	// copied), no RDMAP header; the DDP segment length (23: the 18-octet
	// untagged header and 5 octets); then the Send's DDP/RDMAP header: L,
	// DDP version 1, RDMAP version 1 opcode 3 (Send), QN 0, MSN 1, MO 0.
	const golden = "1202c000" + "0017" + "4143" + "00000000" + "00000000" + "00000001" + "00000000"
	if got := hex.EncodeToString(b); got != golden {
		t.Fatalf("Terminate bytes\n got %s\nwant %s", got, golden)
	}
	if refills != 1 {
		t.Fatalf("the refill was asked %d times, want 1", refills)
	}
	if len(cqs[0].wcs) != 0 {
		t.Fatalf("completions on the failed QP: %+v", cqs[0].wcs)
	}
	// The SRQ and the other QP go on.
	if _, err := srq.PostRecv([]ibv.RecvWR{{ID: 7, SGL: []ibv.SGE{{Addr: rxAddr, Length: 64, LKey: reg.STag()}}}}); err != nil {
		t.Fatal(err)
	}
	q := newPeerStream(true, false)
	q.send(rdmap.OpSend, []byte("after"), 64)
	if err := feed(qps[1], q.out, len(q.out)); err != nil {
		t.Fatal(err)
	}
	if len(cqs[1].wcs) != 1 || cqs[1].wcs[0].ID != 7 || cqs[1].wcs[0].QPNum != qps[1].Num() || string(reg.buf[:5]) != "after" {
		t.Fatalf("the other QP's receive: %+v, buffer %q", cqs[1].wcs, reg.buf[:5])
	}
}

// TestSRQLimitEvent: the limit event fires once, when a Send's take brings
// the count of posted receives below the armed limit, and disarms the
// limit (Query shows 0); receives the refill brings in count first (no
// event while they keep the count at the limit); re-arming fires again.
// Arming above the depth, and resizing below what the SRQ holds, fail.
func TestSRQLimitEvent(t *testing.T) {
	srq, qps, _, reg := srqQPs(t, 1, 8, 64, false)
	post := func(n int) {
		t.Helper()
		for range n {
			if _, err := srq.PostRecv([]ibv.RecvWR{{ID: 1, SGL: []ibv.SGE{{Addr: rxAddr, Length: 64, LKey: reg.STag()}}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	p := newPeerStream(true, false)
	send := func() {
		t.Helper()
		p.out = p.out[:0]
		p.send(rdmap.OpSend, []byte("x"), 64)
		if err := feed(qps[0], p.out, len(p.out)); err != nil {
			t.Fatal(err)
		}
	}
	events := func() int {
		n := 0
		for {
			select {
			case e := <-srq.Events():
				if e.Type != ibv.EventSRQLimitReached {
					t.Fatalf("event %v", e)
				}
				n++
			default:
				return n
			}
		}
	}
	if err := srq.Modify(SRQAttr{Limit: 9}, SRQLimit); !errors.Is(err, ibv.ErrInvalidWR) {
		t.Fatalf("limit above the depth: %v", err)
	}
	post(5)
	if err := srq.Modify(SRQAttr{MaxWR: 4}, SRQMaxWR); !errors.Is(err, ibv.ErrInvalidWR) {
		t.Fatalf("resize below the count: %v", err)
	}
	if err := srq.Modify(SRQAttr{Limit: 3}, SRQLimit); err != nil {
		t.Fatal(err)
	}
	// The refill posts one receive while it is asked for fewer than 4.
	refill := 2
	srq.SetRecvRefill(func() {
		if refill > 0 {
			refill--
			post(1)
		}
	})
	send() // 5 → 4
	send() // 4 → 3
	send() // 3 → 2, the refill brings 3
	send() // 3 → 2, the refill brings 3
	if n := events(); n != 0 || srq.Query().Limit != 3 {
		t.Fatalf("%d events with the count kept at the limit (limit now %d)", n, srq.Query().Limit)
	}
	send() // 3 → 2: below, nothing refilled
	if n := events(); n != 1 || srq.Query().Limit != 0 || srq.Count() != 2 {
		t.Fatalf("%d events, limit %d, count %d; want 1, disarmed, 2", n, srq.Query().Limit, srq.Count())
	}
	send() // 2 → 1: disarmed
	if n := events(); n != 0 {
		t.Fatalf("%d events after the limit disarmed", n)
	}
	if err := srq.Modify(SRQAttr{Limit: 1, MaxWR: 16}, SRQLimit|SRQMaxWR); err != nil {
		t.Fatal(err)
	}
	if a := srq.Query(); a.MaxWR != 16 || a.Limit != 1 || srq.Count() != 1 {
		t.Fatalf("after modify: %+v, count %d", a, srq.Count())
	}
	send() // 1 → 0
	if n := events(); n != 1 {
		t.Fatalf("%d events after re-arming, want 1", n)
	}
	if err := srq.Destroy(); !errors.Is(err, ibv.ErrBusy) {
		t.Fatalf("destroy with a QP attached: %v, want ErrBusy", err)
	}
	qps[0].Destroy()
	qps[0].Destroy()
	if err := srq.Destroy(); err != nil {
		t.Fatalf("destroy after the QP: %v", err)
	}
}

// TestSRQNoAllocs: Sends taking SRQ receives go through the receive
// engine without allocating.
func TestSRQNoAllocs(t *testing.T) {
	srq, qps, cqs, reg := srqQPs(t, 1, 256, 64, false)
	wr := []ibv.RecvWR{{ID: 1, SGL: []ibv.SGE{{Addr: rxAddr, Length: 64, LKey: reg.STag()}}}}
	// AllocsPerRun runs the function once more than asked: runs+1 Sends,
	// MSN 1 on, each with its receive posted.
	const runs = 50
	streams := make([][]byte, runs+1)
	for i := range streams {
		q := newPeerStream(true, false)
		q.msn = uint32(i + 1)
		q.send(rdmap.OpSend, pattern(64, i), 64)
		streams[i] = q.out
	}
	for range runs + 1 {
		if _, err := srq.PostRecv(wr); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	var ferr error
	allocs := testing.AllocsPerRun(runs, func() {
		if err := feed(qps[0], streams[i], len(streams[i])); err != nil && ferr == nil {
			ferr = err
		}
		i++
		cqs[0].wcs = cqs[0].wcs[:0]
	})
	if ferr != nil {
		t.Fatal(ferr)
	}
	if allocs != 0 {
		t.Fatalf("%v allocs per Send taking an SRQ receive", allocs)
	}
	if st := srq.Stats(); st.Taken != runs+1 {
		t.Fatalf("SRQ stats %+v, want %d taken", st, runs+1)
	}
}

// TestSRQProtectionDomain: an SRQ receive's lkeys belong to the SRQ's
// protection domain, whichever QP (of another PD) takes it: a region of
// the SRQ's PD receives; one of the QP's PD is a protection error (the
// receive completes with IBV_WC_LOC_PROT_ERR, and a Terminate goes out).
func TestSRQProtectionDomain(t *testing.T) {
	dev, err := NewDevice(nil, DefaultConfig("siwtun0"))
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	srq, err := dev.CreateSRQ(2, SRQAttr{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	srqReg, err := dev.Regions().Register(2, make([]byte, 64), rxAddr, ibv.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	qpReg, err := dev.Regions().Register(1, make([]byte, 64), rxAddr+0x1000, ibv.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	rcq := &recCQ{wcs: make([]ibv.WorkCompletion, 0, 8)}
	qp, err := dev.CreateQP(1, &countCQ{}, rcq, QPAttr{MaxSendWR: 1, SRQ: srq})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(ibv.QPInit); err != nil {
		t.Fatal(err)
	}
	qp.rx.init(qp, &mpa.Params{CRC: true}, 0, nil)
	if _, err := srq.PostRecv([]ibv.RecvWR{
		{ID: 1, SGL: []ibv.SGE{{Addr: rxAddr, Length: 64, LKey: srqReg.STag()}}},
		{ID: 2, SGL: []ibv.SGE{{Addr: rxAddr + 0x1000, Length: 64, LKey: qpReg.STag()}}},
	}); err != nil {
		t.Fatal(err)
	}
	p := newPeerStream(true, false)
	p.send(rdmap.OpSend, []byte("same PD as the SRQ"), 64)
	if err := feed(qp, p.out, len(p.out)); err != nil {
		t.Fatal(err)
	}
	if len(rcq.wcs) != 1 || rcq.wcs[0].Status != ibv.WCSuccess || string(srqReg.buf[:4]) != "same" {
		t.Fatalf("receive in the SRQ's PD: %+v", rcq.wcs)
	}
	p.out = p.out[:0]
	p.send(rdmap.OpSend, []byte("QP's PD"), 64)
	var te *terminateError
	if err := feed(qp, p.out, len(p.out)); !errors.As(err, &te) {
		t.Fatalf("receive in the QP's PD: %v, want a Terminate", err)
	}
	qp.mu.Lock()
	if qp.termDone != nil {
		close(qp.termDone)
		qp.termDone = nil
	}
	qp.mu.Unlock()
	if len(rcq.wcs) != 2 || rcq.wcs[1].ID != 2 || rcq.wcs[1].Status != ibv.WCLocProtErr {
		t.Fatalf("completions %+v, want receive 2 with a protection error", rcq.wcs)
	}
}
