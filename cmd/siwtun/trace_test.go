package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/ctl/watch"
)

// TestTraceGap: siwtun trace prints a window the daemon left out where it
// was, as text and as a JSON line of type gap.
func TestTraceGap(t *testing.T) {
	from := time.Date(2026, 1, 1, 10, 0, 1, 0, time.UTC)
	g := &ctl.WatchGap{From: from, To: from.Add(50 * time.Millisecond), Segments: 1200, Places: 40, WCs: 2}
	var text strings.Builder
	s := &traceSink{w: &text}
	if err := s.Block(&watch.Block{Gap: g, Time: g.To}); err != nil {
		t.Fatal(err)
	}
	want := "10:00:01.050000 --- not observed: the daemon left out 1200 segments, 40 placements, 2 completions from 10:00:01.000000 to 10:00:01.050000 (this trace fell behind)\n"
	if text.String() != want {
		t.Errorf("trace printed %q, want %q", text.String(), want)
	}
	var js strings.Builder
	s = &traceSink{w: &js, json: true, enc: json.NewEncoder(&js)}
	if err := s.Block(&watch.Block{Gap: g, Time: g.To}); err != nil {
		t.Fatal(err)
	}
	var line traceLine
	if err := json.Unmarshal([]byte(js.String()), &line); err != nil || line.Type != "gap" || line.Gap == nil || line.Gap.Segments != 1200 {
		t.Errorf("trace -j printed %s (%v)", js.String(), err)
	}
}
