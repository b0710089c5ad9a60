package offload

import (
	"testing"

	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// TestHopsNoAllocs: with the recorder on, the receive engine stamps every
// FPDU it places, at the TCP sequence number where the FPDU starts, and
// still allocates nothing.
func TestHopsNoAllocs(t *testing.T) {
	const runs, wlen, slen = 50, 1400, 1000
	qp, reg, _ := rxQP(t, true, false, wlen+slen)
	const rxStart = 0xfffff000 // the stream starts just before the wrap
	qp.hops = qpHops{ok: true, rxStart: rxStart, lport: 18515, rport: 40000}
	qp.dev.hops.Start()
	recv := []ibv.RecvWR{{ID: 7, SGL: []ibv.SGE{{Addr: rxAddr + wlen, Length: slen, LKey: reg.STag()}}}}
	stream := rxStream(true, false, runs+1, reg.STag(), rxAddr, wlen, slen)
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		if _, err := qp.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if _, err := qp.rx.mpa.Write(stream[i]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per Write and Send received with the recorder on, want 0", allocs)
	}
	recs := qp.dev.hops.Snapshot().Records
	// A Write and a Send each time: two FPDUs, one after the other.
	if len(recs) != 2*(runs+1) {
		t.Fatalf("%d stamps, want %d", len(recs), 2*(runs+1))
	}
	seq := uint32(rxStart)
	for _, r := range recs {
		if r.Hop != anatomy.Placed || r.SrcPort != 40000 || r.DstPort != 18515 || r.Seq != seq || r.Len == 0 {
			t.Fatalf("stamp %+v, want Placed from 40000 to 18515 at %d", r, seq)
		}
		seq += r.Len
	}
	var total uint32
	for _, s := range stream {
		total += uint32(len(s))
	}
	if seq-rxStart != total {
		t.Errorf("the stamps cover %d octets of the stream, want %d", seq-rxStart, total)
	}
}
