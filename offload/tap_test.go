package offload

import (
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/netstack"
)

// TestWatchLeavesOutWindows: a Watch whose reader falls behind leaves out
// a whole window of events, from the one that found the queue full until
// the reader has taken three quarters of the queue, and then queues a gap
// report that counts them and gives each direction's sequence range,
// before the event that reopened the queue. Times never go back.
func TestWatchLeavesOutWindows(t *testing.T) {
	d := &Device{}
	w := &Watch{d: d, ch: make(chan TapEvent, 8)}
	d.tap.watches = map[*Watch]struct{}{w: {}}
	a := netip.MustParseAddrPort("198.18.1.2:4000")
	b := netip.MustParseAddrPort("198.18.2.2:7174")
	seq := uint32(0xfffff000) // the range wraps
	seg := func() TapEvent {
		s := &TapSegment{Dir: netstack.Outbound, Src: a, Dst: b, Seq: seq, Payload: make([]byte, 1000)}
		seq += 1000
		return TapEvent{Segment: s}
	}
	for range 8 {
		d.tap.send(seg())
	}
	// The queue is full: these are left out, a whole window.
	firstLeft := seq
	for range 5 {
		d.tap.send(seg())
	}
	d.tap.send(TapEvent{Place: &Placement{Len: 1}})
	// Reading 5 leaves 3, not yet a quarter: still left out.
	for range 5 {
		<-w.ch
	}
	d.tap.send(seg())
	if got := w.Dropped(); got != 7 {
		t.Fatalf("left out %d events, want 7", got)
	}
	<-w.ch // 2 left: the next event reopens the queue
	d.tap.send(seg())
	var evs []TapEvent
	for len(w.ch) > 0 {
		evs = append(evs, <-w.ch)
	}
	if len(evs) != 4 {
		t.Fatalf("%d events queued after the gap, want 2 old, the gap and the new one", len(evs))
	}
	g := evs[2].Gap
	if g == nil {
		t.Fatalf("event 2 is %+v, want the gap", evs[2])
	}
	if g.Segments != 6 || g.Places != 1 || g.Completions != 0 || len(g.Dirs) != 1 || g.MoreDirs {
		t.Fatalf("gap %+v", g)
	}
	if dir := g.Dirs[0]; dir.Src != a || dir.Dst != b || dir.Seq != firstLeft || dir.End != firstLeft+6000 || dir.Segments != 6 {
		t.Errorf("gap direction %+v, want seq %d to %d, 6 segments", dir, firstLeft, firstLeft+6000)
	}
	if evs[3].Segment == nil || evs[3].Segment.Seq != firstLeft+6000 {
		t.Errorf("after the gap: %+v", evs[3])
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Time.Before(evs[i-1].Time) {
			t.Errorf("event %d at %v before event %d at %v", i, evs[i].Time, i-1, evs[i-1].Time)
		}
	}
	if !g.From.Before(g.To) && g.From != g.To {
		t.Errorf("gap from %v to %v", g.From, g.To)
	}
}

// TestWatchIdle: an idle Watch queues a heartbeat only when its queue is
// empty, and a gap whose window ended is reported by the heartbeat rather
// than waiting for the next event.
func TestWatchIdle(t *testing.T) {
	d := &Device{}
	w := &Watch{d: d, ch: make(chan TapEvent, 4)}
	d.tap.watches = map[*Watch]struct{}{w: {}}
	w.Idle()
	if e := <-w.ch; e.Time.IsZero() || e.Segment != nil || e.Gap != nil {
		t.Fatalf("heartbeat %+v", e)
	}
	d.tap.send(TapEvent{Place: &Placement{Len: 1}})
	w.Idle()
	if len(w.ch) != 1 {
		t.Fatalf("a heartbeat was queued behind an event (%d queued)", len(w.ch))
	}
	for range 4 {
		d.tap.send(TapEvent{Place: &Placement{Len: 1}})
	}
	for len(w.ch) > 0 {
		<-w.ch
	}
	time.Sleep(time.Millisecond)
	w.Idle()
	e := <-w.ch
	if e.Gap == nil || e.Gap.Places != 1 {
		t.Fatalf("after the reader caught up, Idle queued %+v, want the gap of the placement left out", e)
	}
}
