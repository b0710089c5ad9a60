package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
)

// TestJoinerOutOfOrder: an out-of-order placement, reported just before
// its segment, joins that segment's block, and the same FPDU's in-order
// placement later joins it too; one whose segment never comes is handed on
// alone (here by the final flush).
func TestJoinerOutOfOrder(t *testing.T) {
	var out []*segBlock
	j := &joiner{sink: func(b *segBlock) error { out = append(out, b); return nil }}
	now := time.Now()
	ooo := ctl.WatchPlace{QP: 1, Op: "RDMA Write", STag: 0x200, TO: 0x1000, Len: 1388, OutOfOrder: true}
	stray := ctl.WatchPlace{QP: 1, Op: "RDMA Write", STag: 0x200, TO: 0x9000, Len: 10, OutOfOrder: true}
	if err := j.place(ooo, now); err != nil {
		t.Fatal(err)
	}
	if err := j.place(stray, now); err != nil {
		t.Fatal(err)
	}
	seg := &segBlock{seg: &ctl.WatchSegment{Seq: 7}, time: now, arrived: now,
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
	if out[1].seg != nil || len(out[1].places) != 1 || out[1].places[0] != stray {
		t.Errorf("second block %+v, want the stray placement alone", out[1])
	}
	b := out[0]
	if b.seg != seg.seg || len(b.places) != 2 || !b.places[0].OutOfOrder || b.places[1].OutOfOrder {
		t.Errorf("segment block places %+v, want the out-of-order then the in-order placement", b.places)
	}
}

// TestTraceGap: siwtun trace prints a window the daemon left out where it
// was, as text and as a JSON line of type gap.
func TestTraceGap(t *testing.T) {
	from := time.Date(2026, 1, 1, 10, 0, 1, 0, time.UTC)
	g := &ctl.WatchGap{From: from, To: from.Add(50 * time.Millisecond), Segments: 1200, Places: 40, WCs: 2}
	var text strings.Builder
	s := &traceSink{w: &text}
	if err := s.block(&segBlock{gap: g, time: g.To}); err != nil {
		t.Fatal(err)
	}
	want := "10:00:01.050000 --- not observed: the daemon left out 1200 segments, 40 placements, 2 completions from 10:00:01.000000 to 10:00:01.050000 (this trace fell behind)\n"
	if text.String() != want {
		t.Errorf("trace printed %q, want %q", text.String(), want)
	}
	var js strings.Builder
	s = &traceSink{w: &js, json: true, enc: json.NewEncoder(&js)}
	if err := s.block(&segBlock{gap: g, time: g.To}); err != nil {
		t.Fatal(err)
	}
	var line traceLine
	if err := json.Unmarshal([]byte(js.String()), &line); err != nil || line.Type != "gap" || line.Gap == nil || line.Gap.Segments != 1200 {
		t.Errorf("trace -j printed %s (%v)", js.String(), err)
	}
}
