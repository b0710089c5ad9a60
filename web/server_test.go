package web

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
)

// readEvents reads server-sent events from r until n data events or the
// end of the stream, returning their data and the names of other events.
func readEvents(t *testing.T, r io.Reader, n int) (data []string, names []string) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() && len(data) < n {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "data: ") && strings.TrimSpace(l[6:]) != "":
			data = append(data, l[6:])
		case strings.HasPrefix(l, "event: "):
			names = append(names, l[7:])
		}
	}
	return data, names
}

// TestServer serves a live Builder: the page, the view, the updates as
// server-sent events from any version, a reload event for a version it
// does not have, and the end of the streams at Close.
func TestServer(t *testing.T) {
	b, _ := synthTrace(t, 30, 1420, true)
	live := NewBuilder("live", "siwtun0", "", nil)
	live.SetLive()
	s, err := Serve("127.0.0.1:0", live)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Feed the synthetic trace's segments to the live Builder.
	v := b.Snapshot()
	feed := func(from, to int) {
		for _, seg := range v.Segments[from:to] {
			addrs := strings.Split(v.Addrs[seg.A], " > ")
			ws := &ctl.WatchSegment{Dir: "out", Seq: seg.Seq, Ack: seg.Ack, Payload: make([]byte, seg.Len)}
			if !seg.Out {
				ws.Dir = "in"
			}
			ws.Src, _ = parseAddrPort(addrs[0])
			ws.Dst, _ = parseAddrPort(addrs[1])
			live.Event(true, ctl.WatchEvent{Time: time.Now(), Segment: ws})
		}
	}
	feed(0, 10)
	for _, tc := range []struct {
		name   string
		path   string
		status int
		want   string
	}{
		{"page", "/", 200, `id="siwtun-data"`},
		{"view", "/view.json", 200, `"live":true`},
		{"bad from", "/events?from=x", 400, "from must be"},
		{"negative from", "/events?from=-1", 400, "from must be"},
		{"no such path", "/nothing", 404, ""},
	} {
		resp, err := http.Get(s.URL() + tc.path[1:])
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: %d %.200q", tc.name, resp.StatusCode, body)
		}
	}
	// From version 0 the stream replays every update, then follows.
	resp, err := http.Get(s.URL() + "events?from=0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		feed(10, 20)
	}()
	defer func() { <-fed }()
	_, want, _ := live.Updates(0)
	data, _ := readEvents(t, resp.Body, len(want)+1)
	var last Update
	if err := json.Unmarshal([]byte(data[len(data)-1]), &last); err != nil {
		t.Fatal(err)
	}
	if len(data) != len(want)+1 || last.Version != len(want)+1 {
		t.Errorf("%d events, the last version %d; %d updates were kept before", len(data), last.Version, len(want))
	}
	// A version the server does not have: reload.
	for _, from := range []string{"100000"} {
		r, err := http.Get(s.URL() + "events?from=" + from)
		if err != nil {
			t.Fatal(err)
		}
		_, names := readEvents(t, r.Body, 1)
		r.Body.Close()
		if len(names) != 1 || names[0] != "reload" {
			t.Errorf("from=%s: events %q, want reload", from, names)
		}
	}
	// Close ends the open stream cleanly.
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		done <- err
	}()
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the stream ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end at Close")
	}
}

func parseAddrPort(s string) (netip.AddrPort, error) { return netip.ParseAddrPort(s) }

// TestUpdatesKept checks which versions a live Builder can still replay
// once it has dropped its oldest updates.
func TestUpdatesKept(t *testing.T) {
	old := maxLog
	maxLog = 8
	defer func() { maxLog = old }()
	b := NewBuilder("kept", "siwtun0", "", nil)
	b.SetLive()
	for i := 0; i < 20; i++ {
		b.Step(time.Now(), "step", "")
	}
	for _, tc := range []struct {
		from int
		ok   bool
		n    int
	}{{0, false, 0}, {11, false, 0}, {12, true, 8}, {19, true, 1}, {20, true, 0}, {21, false, 0}} {
		got, _, ok := b.Updates(tc.from)
		if ok != tc.ok || len(got) != tc.n {
			t.Errorf("Updates(%d): %d updates, ok %v; want %d, %v", tc.from, len(got), ok, tc.n, tc.ok)
		}
	}
}
