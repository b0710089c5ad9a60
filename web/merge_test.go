package web

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// watchEvent is segment s as device local (or the peer) saw it, at mono.
func watchEvent(s inspect.Segment, local bool, out bool, mono int64) ctl.WatchEvent {
	dir := "in"
	if out == local {
		dir = "out"
	}
	return ctl.WatchEvent{Time: time.Unix(0, mono), Mono: mono, Segment: &ctl.WatchSegment{Dir: dir, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Flags: s.Flags, Payload: s.Payload}}
}

// TestMergerTimeOrder: two devices' streams, each in time order but
// arriving interleaved at random, come out as ladder rows in time order:
// every row's time (the earlier of the two ends') is at least the one
// before, and every segment is matched with its other end.
func TestMergerTimeOrder(t *testing.T) {
	_, segs := synthTrace(t, 400, 1400, false)
	local := segs[0].Src
	var streams [2][]ctl.WatchEvent
	mono := int64(1_000_000_000)
	for _, s := range segs {
		out := s.Src == local
		sender, receiver := 0, 1 // stream index: 0 the local device
		if !out {
			sender, receiver = 1, 0
		}
		streams[sender] = append(streams[sender], watchEvent(s, sender == 0, out, mono))
		streams[receiver] = append(streams[receiver], watchEvent(s, receiver == 0, out, mono+30_000))
		mono += 7_000
	}
	b := NewBuilder("merge", "siwtun0", "siwtun1", nil)
	m := NewMerger(b, 2, time.Hour)
	rng := rand.New(rand.NewPCG(1, 2))
	var next [2]int
	for next[0] < len(streams[0]) || next[1] < len(streams[1]) {
		i := rng.IntN(2)
		if next[i] == len(streams[i]) {
			i = 1 - i
		}
		// A burst from one stream: the other lags behind.
		for n := 1 + rng.IntN(40); n > 0 && next[i] < len(streams[i]); n-- {
			m.Add(i, streams[i][next[i]])
			next[i]++
		}
	}
	for i := range 2 {
		m.Add(i, ctl.WatchEvent{Mono: mono + 1e9, Time: time.Unix(0, mono+1e9)}) // heartbeats
	}
	v := b.Snapshot()
	if len(v.Segments) != len(segs) {
		t.Fatalf("%d rows for %d segments", len(v.Segments), len(segs))
	}
	last := int64(-1)
	for i, s := range v.Segments {
		if s.T < 0 || s.PT < 0 {
			t.Errorf("row %d seen by one end only: %+v", i, s)
		}
		at := min(s.T, s.PT)
		if at < last {
			t.Errorf("row %d at %d µs, before row %d at %d µs", i, at, i-1, last)
		}
		last = at
	}
}

// TestBuilderGap: the local device's daemon leaves out a window of
// segments. The ladder marks the window where it was, no segment after it
// is flagged out of order, the first one says how many octets were not
// observed and how the checker picked the stream up, and the negotiation
// table counts the FPDUs and aligned segments the ladder shows.
func TestBuilderGap(t *testing.T) {
	_, segs := synthTrace(t, 300, 1400, true)
	local := segs[0].Src
	b := NewBuilder("gap", "siwtun0", "", nil)
	mono := int64(5e9)
	var left []inspect.Segment
	for i, s := range segs {
		mono += 10_000
		if i >= 100 && i < 140 {
			left = append(left, s)
			continue
		}
		if i == 140 {
			g := &ctl.WatchGap{FromMono: mono - 400_000, ToMono: mono - 10_000, Segments: uint64(len(left))}
			g.From, g.To = time.Unix(0, g.FromMono), time.Unix(0, g.ToMono)
			dirs := map[[2]string]int{}
			for _, l := range left {
				k := [2]string{l.Src.String(), l.Dst.String()}
				end := l.Seq + uint32(len(l.Payload))
				if j, ok := dirs[k]; ok {
					g.Dirs[j].End = end
					g.Dirs[j].Segments++
					continue
				}
				dirs[k] = len(g.Dirs)
				g.Dirs = append(g.Dirs, ctl.WatchGapDir{Src: l.Src, Dst: l.Dst, Seq: l.Seq, End: end, Segments: 1})
			}
			b.Event(true, ctl.WatchEvent{Time: g.To, Mono: g.ToMono, Gap: g, Dropped: uint64(len(left))})
		}
		b.Event(true, watchEvent(s, true, s.Src == local, mono))
	}
	b.Finish()
	v := b.Snapshot()
	if len(v.Gaps) != 1 || v.Gaps[0].Seg != 100 || v.Gaps[0].Segments != 40 || v.Dropped != 40 {
		t.Fatalf("gaps %+v, dropped %d", v.Gaps, v.Dropped)
	}
	fpdus, aligned, fpduSegs, notObserved := 0, 0, 0, 0
	for i, s := range v.Segments {
		if s.OOO || s.Drop {
			t.Errorf("row %d flagged: %+v", i, s)
		}
		if i > 5 && s.Out && s.Len > 0 && s.Kind != string(inspect.KindFPDU) {
			t.Errorf("row %d (%s) not analysed", i, s.Kind)
		}
		if s.Aligned != nil {
			fpduSegs++
			if *s.Aligned {
				aligned++
			}
		}
		for _, f := range s.FPDUs {
			if f.Ends {
				fpdus++
			}
		}
		notObserved += s.NotObserved
	}
	first := v.Segments[100]
	if first.NotObserved == 0 || first.Resync == "" {
		t.Errorf("first row after the gap: %+v", first)
	}
	var sum inspect.DirSummary
	for _, c := range v.Conns {
		if c.Src == local {
			sum = c
		}
	}
	if sum.FPDUs != fpdus || sum.Aligned != aligned || sum.FPDUSegments != fpduSegs || sum.NotObserved != uint64(notObserved) || sum.Held != 0 {
		t.Errorf("table: %d FPDUs, %d/%d aligned, %d octets not observed, %d held; ladder: %d FPDUs, %d/%d aligned, %d not observed",
			sum.FPDUs, sum.Aligned, sum.FPDUSegments, sum.NotObserved, sum.Held, fpdus, aligned, fpduSegs, notObserved)
	}
}

// TestBuilderPeerGap: a segment the local device sent and the peer never
// reported is dropped, unless the peer's daemon was leaving events out
// when it would have seen it.
func TestBuilderPeerGap(t *testing.T) {
	_, segs := synthTrace(t, 40, 1400, false)
	local := segs[0].Src
	b := NewBuilder("peer gap", "siwtun0", "siwtun1", nil)
	mono := int64(1e9)
	var unseen []int
	for i, s := range segs {
		out := s.Src == local
		mono += 10_000
		b.Event(true, watchEvent(s, true, out, mono))
		switch {
		case i == 20 && out:
			unseen = append(unseen, i) // lost on the link
		case i >= 30 && i < 33 && out:
			unseen = append(unseen, i) // left out by the peer's daemon
		default:
			b.Event(false, watchEvent(s, false, out, mono+20_000))
		}
		if i == 33 {
			g := &ctl.WatchGap{FromMono: mono - 40_000, ToMono: mono - 5_000, Segments: 3}
			g.From, g.To = time.Unix(0, g.FromMono), time.Unix(0, g.ToMono)
			first, last := segs[unseen[1]], segs[unseen[len(unseen)-1]]
			g.Dirs = []ctl.WatchGapDir{{Src: first.Src, Dst: first.Dst, Seq: first.Seq, End: last.Seq + uint32(len(last.Payload)), Segments: 3}}
			b.Event(false, ctl.WatchEvent{Time: g.To, Mono: g.ToMono, Gap: g})
		}
	}
	b.Finish()
	v := b.Snapshot()
	for _, i := range unseen {
		if want := i == 20; v.Segments[i].Drop != want {
			t.Errorf("row %d: dropped %v, want %v", i, v.Segments[i].Drop, want)
		}
	}
	if len(unseen) != 4 {
		t.Fatalf("the test lost %d segments, want 4", len(unseen))
	}
}

// TestMergerBackPressure: a stream far ahead of the other waits in Add
// once maxWait events are held, rather than its events being passed on
// before the other's older ones; the other stream is never held up, and
// once it catches up both go on, in time order.
func TestMergerBackPressure(t *testing.T) {
	b := NewBuilder("merge", "siwtun0", "siwtun1", nil)
	m := NewMerger(b, 2, time.Hour)
	ev := func(mono int64) ctl.WatchEvent { return ctl.WatchEvent{Mono: mono, Time: time.Unix(0, mono)} }
	fast := make(chan struct{})
	go func() {
		defer close(fast)
		for i := 0; i <= maxWait+100; i++ {
			m.Add(1, ev(int64(2e9+i)))
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		m.mu.Lock()
		held := m.held
		m.mu.Unlock()
		if held >= maxWait {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fast stream got only %d events in", held)
		}
	}
	select {
	case <-fast:
		t.Fatal("the fast stream was not held up")
	case <-time.After(50 * time.Millisecond):
	}
	m.Add(0, ev(1e9)) // the slow stream, behind: never held up
	m.Add(0, ev(3e9)) // and past the fast one's events
	select {
	case <-fast:
	case <-time.After(10 * time.Second):
		t.Fatal("the fast stream is still held up after the slow one caught up")
	}
	m.Flush()
	if got := b.reached; got[1] != 3e9 || got[0] != int64(2e9+maxWait+100) { // [1] the local device, [0] the peer
		t.Errorf("reached %v", got)
	}
}

// TestBuilderFull: a view with a segment limit stops at it and says so.
func TestBuilderFull(t *testing.T) {
	_, segs := synthTrace(t, 50, 1400, false)
	b := NewBuilder("full", "siwtun0", "", nil)
	b.SetMaxSegments(20)
	for i, s := range segs {
		b.Event(true, watchEvent(s, true, s.Src == segs[0].Src, int64(1e9+i*1000)))
	}
	if v := b.Snapshot(); len(v.Segments) != 20 || !v.Full {
		t.Errorf("%d segments, full %v; want 20, full", len(v.Segments), v.Full)
	}
}

// TestBuilderFullNotDropped: segments sent just before the view reached
// its limit, whose arrivals came after it, are not flagged dropped: the
// view left those arrivals out, not the link.
func TestBuilderFullNotDropped(t *testing.T) {
	_, segs := synthTrace(t, 60, 1400, false)
	local := segs[0].Src
	b := NewBuilder("full", "siwtun0", "siwtun1", nil)
	b.SetMaxSegments(40)
	mono := int64(1e9)
	for _, s := range segs {
		mono += 10_000
		out := s.Src == local
		b.Event(true, watchEvent(s, true, out, mono))
		b.Event(false, watchEvent(s, false, out, mono+20_000))
	}
	b.Sweep(time.Unix(0, mono+int64(time.Second)), 50*time.Microsecond)
	b.Finish()
	v := b.Snapshot()
	if !v.Full {
		t.Fatal("the view did not fill")
	}
	for i, s := range v.Segments {
		if s.Drop {
			t.Errorf("row %d flagged dropped; every segment arrived", i)
		}
	}
}
