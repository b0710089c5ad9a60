package offload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// atomicReq sends an Atomic Request (QN 1) with MSN msn.
func (p *peerStream) atomicReq(msn uint32, m rdmap.AtomicRequest) {
	var b [rdmap.AtomicRequestLen]byte
	m.Marshal(b[:])
	p.fpdu(ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpAtomicRequest), QN: ddp.QNReadRequest, MSN: msn}, b[:])
}

// atomicQP is immQP with IRD ird and a region of 64 bytes at rxAddr that
// remote atomics may use.
func atomicQP(tb testing.TB, crc, markers bool, ext mpa.Ext, ird int) (*QP, *Region) {
	tb.Helper()
	qp, _, _ := immQP(tb, crc, markers, ext, 8)
	reg, err := qp.dev.Regions().Register(1, make([]byte, 64), rxAddr+0x1000, ibv.AccessLocalWrite|ibv.AccessRemoteAtomic)
	if err != nil {
		tb.Fatal(err)
	}
	qp.mu.Lock()
	qp.ird = ird
	qp.mu.Unlock()
	return qp, reg
}

// TestRxAtomicRequest: Atomic Requests as a peer's engine sends them are
// performed on the region's word in stream order, with CRC on and off,
// markers on and off, the stream cut into every kind of chunk, and their
// responses queued in order with each original value.
func TestRxAtomicRequest(t *testing.T) {
	all := ^uint64(0)
	for _, crc := range []bool{false, true} {
		for _, markers := range []bool{false, true} {
			t.Run(fmt.Sprintf("crc=%v/markers=%v", crc, markers), func(t *testing.T) {
				qp, reg := atomicQP(t, crc, markers, mpa.ExtAll, 16)
				binary.NativeEndian.PutUint64(reg.Bytes()[8:], 40)
				p := newPeerStream(crc, markers)
				to := uint64(rxAddr + 0x1000 + 8)
				reqs := []rdmap.AtomicRequest{
					{Op: rdmap.AtomicFetchAdd, ReqID: 1, STag: reg.STag(), TO: to, AddSwap: 2},
					{Op: rdmap.AtomicCmpSwap, ReqID: 2, STag: reg.STag(), TO: to, Compare: 42, CompareMask: all, AddSwap: 7, AddSwapMask: all},
					{Op: rdmap.AtomicCmpSwap, ReqID: 3, STag: reg.STag(), TO: to, Compare: 42, CompareMask: all, AddSwap: 9, AddSwapMask: all},
					// RFC 7306 has no Swap: a CmpSwap whose Compare Mask is 0
					// always swaps (§5.1.2), here the masked bits.
					{Op: rdmap.AtomicCmpSwap, ReqID: 4, STag: reg.STag(), TO: to, AddSwap: 0xff00, AddSwapMask: 0xff00},
					{Op: rdmap.AtomicFetchAdd, ReqID: 5, STag: reg.STag(), TO: to, AddSwap: 0x0101, AddSwapMask: 0x8080},
				}
				for i, m := range reqs {
					p.atomicReq(uint32(i+1), m)
				}
				if err := feed(qp, p.out, 1, 5, 17, 3000); err != nil {
					t.Fatal(err)
				}
				want := []uint64{40, 42, 7, 7, 0xff07}
				if len(qp.irq) != len(want) {
					t.Fatalf("%d responses queued, want %d", len(qp.irq), len(want))
				}
				for i, e := range qp.irq {
					if !e.atomic || e.reqID != uint32(i+1) || e.value != want[i] {
						t.Fatalf("response %d: %+v, want id %d value %d", i, e, i+1, want[i])
					}
				}
				if got := binary.NativeEndian.Uint64(reg.Bytes()[8:]); got != 0x0008 { // the high field 0xff+1 drops its carry
					t.Fatalf("word 0x%x, want 0x8", got)
				}
				if got := qp.stats.AtomicsRx.Load(); got != uint64(len(reqs)) {
					t.Fatalf("InRdmaAtomics %d", got)
				}
			})
		}
	}
}

// TestRxAtomicErrors: what a peer may get wrong with atomics and the
// Terminate each earns; the word is never touched.
func TestRxAtomicErrors(t *testing.T) {
	good := func(reg *Region) rdmap.AtomicRequest {
		return rdmap.FetchAdd(1, reg.STag(), rxAddr+0x1000, 1, 0)
	}
	body := func(m rdmap.AtomicRequest) []byte {
		b := make([]byte, rdmap.AtomicRequestLen)
		m.Marshal(b)
		return b
	}
	hdr := func(mut func(*ddp.Header)) ddp.Header {
		h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpAtomicRequest), QN: ddp.QNReadRequest, MSN: 1}
		mut(&h)
		return h
	}
	tests := []struct {
		name  string
		ext   mpa.Ext
		ird   int
		build func(p *peerStream, reg, plain *Region)
		code  rdmap.Code
	}{
		{name: "not negotiated", ext: mpa.ExtImmediate, ird: 4, build: func(p *peerStream, reg, plain *Region) { p.atomicReq(1, good(reg)) },
			code: rdmap.TermRDMAPUnexpectedOp},
		// RFC 7306 §8.2: a word not 64-bit aligned earns Remote Operation
		// Error / Catastrophic error, localized to RDMAP Stream, and
		// (§5.1.1, §5.1.2) the memory is not modified.
		{name: "misaligned", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			m := good(reg)
			m.TO += 4
			p.atomicReq(1, m)
		}, code: rdmap.TermRDMAPCatastrophicStream},
		{name: "misaligned by one octet", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			m := good(reg)
			m.TO++
			p.atomicReq(1, m)
		}, code: rdmap.TermRDMAPCatastrophicStream},
		{name: "outside the region", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			m := good(reg)
			m.TO += 64
			p.atomicReq(1, m)
		}, code: rdmap.TermRDMAPBaseBounds},
		{name: "invalid STag", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			m := good(reg)
			m.STag ^= 0x100
			p.atomicReq(1, m)
		}, code: rdmap.TermRDMAPInvalidSTag},
		{name: "no REMOTE_ATOMIC", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			m := good(reg)
			m.STag, m.TO = plain.STag(), rxAddr+0x2000
			p.atomicReq(1, m)
		}, code: rdmap.TermRDMAPAccess},
		// RFC 7306 §10.1 registers AOpCode 0x1 as Reserved: no Swap. A
		// request for it is an operation the RNIC does not support
		// (§5.2.1 item 4), reported as an unexpected opcode (§1.1).
		{name: "reserved AOpCode 1", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			m := good(reg)
			m.Op, m.AddSwapMask = rdmap.AtomicReserved, ^uint64(0)
			p.atomicReq(1, m)
		}, code: rdmap.TermRDMAPUnexpectedOp},
		{name: "unknown AOpCode", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			m := good(reg)
			m.Op = 7
			p.atomicReq(1, m)
		}, code: rdmap.TermRDMAPUnexpectedOp},
		{name: "beyond IRD", ext: mpa.ExtAll, ird: 1, build: func(p *peerStream, reg, plain *Region) {
			p.atomicReq(1, good(reg))
			p.atomicReq(2, good(reg))
		}, code: rdmap.TermRDMAPCatastrophicStream},
		{name: "wrong queue", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			p.fpdu(hdr(func(h *ddp.Header) { h.QN = ddp.QNAtomicResponse }), body(good(reg)))
		}, code: rdmap.TermDDPInvalidQN},
		{name: "wrong MSN", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			p.fpdu(hdr(func(h *ddp.Header) { h.MSN = 2 }), body(good(reg)))
		}, code: rdmap.TermDDPInvalidMSN},
		{name: "not one segment", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			p.fpdu(hdr(func(h *ddp.Header) { h.Last = false }), body(good(reg)))
		}, code: rdmap.TermDDPInvalidMO},
		{name: "longer than its header", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			p.fpdu(hdr(func(*ddp.Header) {}), body(good(reg)), []byte{1, 2, 3, 4})
		}, code: rdmap.TermDDPTooLong},
		{name: "shorter than its header", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			p.fpdu(hdr(func(*ddp.Header) {}), body(good(reg))[:40])
		}, code: rdmap.TermDDPLocalCatastrophic},
		{name: "response with nothing outstanding", ext: mpa.ExtAll, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			var b [rdmap.AtomicResponseLen]byte
			(&rdmap.AtomicResponse{ReqID: 1, Value: 2}).Marshal(b[:])
			p.fpdu(ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpAtomicResponse), QN: ddp.QNAtomicResponse, MSN: 1}, b[:])
		}, code: rdmap.TermRDMAPUnexpectedOp},
		{name: "response not negotiated", ext: mpa.ExtImmediate, ird: 4, build: func(p *peerStream, reg, plain *Region) {
			var b [rdmap.AtomicResponseLen]byte
			p.fpdu(ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpAtomicResponse), QN: ddp.QNAtomicResponse, MSN: 1}, b[:])
		}, code: rdmap.TermRDMAPUnexpectedOp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			qp, reg := atomicQP(t, true, false, tt.ext, tt.ird)
			plain, err := qp.dev.Regions().Register(1, make([]byte, 64), rxAddr+0x2000, ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			p := newPeerStream(true, false)
			tt.build(p, reg, plain)
			err = feed(qp, p.out, len(p.out))
			var te *terminateError
			if !errors.As(err, &te) {
				t.Fatalf("stream accepted (%v), want a Terminate", err)
			}
			qp.mu.Lock()
			term := qp.term
			if qp.termDone != nil {
				close(qp.termDone) // no TX goroutine sends it here: Close need not wait
				qp.termDone = nil
			}
			qp.mu.Unlock()
			if term == nil || term.Code != tt.code {
				t.Fatalf("Terminate %v, want %v (%v)", term, tt.code, err)
			}
			if tt.name != "beyond IRD" {
				for i, b := range reg.Bytes() {
					if b != 0 {
						t.Fatalf("byte %d of the region written", i)
					}
				}
			}
		})
	}
}

// TestRxAtomicNoAllocs: Atomic Requests go through the receive engine
// without allocating once the IRQ has grown.
func TestRxAtomicNoAllocs(t *testing.T) {
	const runs = 50
	qp, reg := atomicQP(t, true, false, mpa.ExtAll, 16)
	p := newPeerStream(true, false)
	var chunks [][]byte
	for i := range runs + 2 {
		start := len(p.out)
		p.atomicReq(uint32(i+1), rdmap.AtomicRequest{Op: rdmap.AtomicFetchAdd, ReqID: uint32(i), STag: reg.STag(), TO: rxAddr + 0x1000, AddSwap: 1})
		chunks = append(chunks, p.out[start:])
	}
	if _, err := qp.rx.mpa.Write(chunks[0]); err != nil { // grows the IRQ
		t.Fatal(err)
	}
	i := 1
	allocs := testing.AllocsPerRun(runs, func() {
		qp.mu.Lock()
		qp.irq = qp.irq[:0]
		qp.mu.Unlock()
		if _, err := qp.rx.mpa.Write(chunks[i]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per Atomic Request, want 0", allocs)
	}
	if got := binary.NativeEndian.Uint64(reg.Bytes()); got != runs+2 {
		t.Errorf("word %d, want %d", got, runs+2)
	}
}
