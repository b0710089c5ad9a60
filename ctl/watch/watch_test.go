package watch

import (
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
)

// TestJoinerOutOfOrder: an out-of-order placement, reported just before
// its segment, joins that segment's block, and the same FPDU's in-order
// placement later joins it too; one whose segment never comes is handed on
// alone (here by the final flush).
func TestJoinerOutOfOrder(t *testing.T) {
	var out []*Block
	j := &joiner{sink: func(b *Block) error { out = append(out, b); return nil }}
	now := time.Now()
	ooo := ctl.WatchPlace{QP: 1, Op: "RDMA Write", STag: 0x200, TO: 0x1000, Len: 1388, OutOfOrder: true}
	stray := ctl.WatchPlace{QP: 1, Op: "RDMA Write", STag: 0x200, TO: 0x9000, Len: 10, OutOfOrder: true}
	if err := j.place(ooo, now); err != nil {
		t.Fatal(err)
	}
	if err := j.place(stray, now); err != nil {
		t.Fatal(err)
	}
	seg := &Block{Seg: &ctl.WatchSegment{Seq: 7}, Time: now, arrived: now,
		keys: []placeKey{{tagged: true, stag: 0x200, to: 0x1000}}}
	if err := j.segment(seg); err != nil {
		t.Fatal(err)
	}
	if len(out) != 0 {
		t.Fatalf("handed on %d blocks before the in-order placement", len(out))
	}
	inOrder := ooo
	inOrder.OutOfOrder = false
	if err := j.place(inOrder, now); err != nil {
		t.Fatal(err)
	}
	if err := j.flush(true); err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 {
		t.Fatalf("%d blocks, want the segment and the stray placement", len(out))
	}
	if out[1].Seg != nil || len(out[1].Places) != 1 || out[1].Places[0] != stray {
		t.Errorf("second block %+v, want the stray placement alone", out[1])
	}
	b := out[0]
	if b.Seg != seg.Seg || len(b.Places) != 2 || !b.Places[0].OutOfOrder || b.Places[1].OutOfOrder {
		t.Errorf("segment block places %+v, want the out-of-order then the in-order placement", b.Places)
	}
}
