package web

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/internal/browsertest"
)

// TestAnatomyConnOf: the page's rows are the assembled legs in order,
// then the one-way trip, in nanoseconds, with the CLI's leg names.
func TestAnatomyConnOf(t *testing.T) {
	an := anatomy.Anatomy{RoundTrip: anatomy.Stat{N: 3, Median: 500 * time.Microsecond, P99: 900 * time.Microsecond}}
	for d := range an.Dirs {
		an.Dirs[d] = anatomy.Direction{From: []string{"a", "b"}[d], To: []string{"b", "a"}[d]}
		for i, l := range anatomy.Legs {
			an.Dirs[d].Legs = append(an.Dirs[d].Legs, anatomy.Stat{Leg: l, N: 3, Median: time.Duration(1000*(i+1) + d), P99: time.Duration(2000 * (i + 1))})
		}
		an.Dirs[d].Legs = append(an.Dirs[d].Legs, anatomy.Stat{Leg: anatomy.Leg{From: anatomy.Post, To: anatomy.Seen}, N: 3, Median: 99000})
	}
	c := AnatomyConnOf("a:1 <-> b:2", an, nil)
	if len(c.Legs) != len(anatomy.Legs)+1 || c.Dirs != [2]string{"a -> b", "b -> a"} || c.RoundTrip.Median != 500000 {
		t.Fatalf("%+v", c)
	}
	for i, l := range anatomy.Legs {
		g := c.Legs[i]
		if g.From != l.From.String() || g.To != l.To.String() || g.Name != l.Name() || g.Total || g.Dirs[1].Median != int64(1000*(i+1)+1) || g.Dirs[0].P99 != int64(2000*(i+1)) {
			t.Errorf("row %d: %+v", i, g)
		}
	}
	if last := c.Legs[len(anatomy.Legs)]; !last.Total || last.From != "post" || last.To != "seen" || last.Dirs[0].Median != 99000 {
		t.Errorf("one-way row %+v", last)
	}
	renamed := AnatomyConnOf("x", an, func(l anatomy.Leg) string { return "leg " + l.To.String() })
	if renamed.Legs[5].Name != "leg tun-read" {
		t.Errorf("renamed leg: %q", renamed.Legs[5].Name)
	}
}

// TestAnatomyControl: POST /anatomy drives the control (only with the
// page's header, only known actions), and the recorders stop once no
// page has had its event stream open for the grace period.
func TestAnatomyControl(t *testing.T) {
	b := NewBuilder("live", "siwtun0", "siwtun1", nil)
	b.SetLive()
	var mu sync.Mutex
	var calls []string
	stopped := make(chan struct{}, 1)
	b.SetAnatomyControl(func(action string) error {
		mu.Lock()
		calls = append(calls, action)
		mu.Unlock()
		b.SetAnatomy(Anatomy{Recording: action == AnatomyStart})
		if action == AnatomyStop {
			stopped <- struct{}{}
		}
		return nil
	})
	if v := b.Snapshot(); v.Anatomy == nil || !v.Anatomy.Control || v.Anatomy.Recording {
		t.Fatalf("view's anatomy after SetAnatomyControl: %+v", v.Anatomy)
	}
	srv := httptest.NewServer(handler(b, nil, 50*time.Millisecond))
	defer srv.Close()
	post := func(action string, page bool) int {
		req, _ := http.NewRequest("POST", srv.URL+"/anatomy?action="+action, nil)
		if page {
			req.Header.Set(anatomyHeader, "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		action string
		page   bool
		want   int
	}{{"start", false, 403}, {"nonsense", true, 400}, {"start", true, 204}, {"show", true, 204}} {
		if got := post(tc.action, tc.page); got != tc.want {
			t.Errorf("POST action %q (page header %v): %d, want %d", tc.action, tc.page, got, tc.want)
		}
	}
	if v := b.Snapshot(); v.Anatomy.Recording {
		t.Errorf("show reported recording off, the view says on: %+v", v.Anatomy)
	}
	post("start", true)
	// A page opens its stream and leaves: the recorders stop after the
	// grace period.
	resp, err := http.Get(srv.URL + "/events?from=0")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // longer than the grace: the page is still there
	mu.Lock()
	n := len(calls)
	mu.Unlock()
	if n != 3 {
		t.Fatalf("calls while a page is open: %q", calls)
	}
	resp.Body.Close()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatalf("the recorders were not stopped after the last page left; calls %q", calls)
	}
	mu.Lock()
	if got := strings.Join(calls, " "); got != "start show start stop" {
		t.Errorf("calls %q", got)
	}
	mu.Unlock()

	// Started by a request of its own, with no page open: the recorders
	// stop after the grace period too.
	post("start", true)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatalf("the recorders started with no page open were not stopped; calls %q", calls)
	}

	// Without a control the page cannot drive anything.
	plain := httptest.NewServer(Handler(NewBuilder("x", "siwtun0", "", nil)))
	defer plain.Close()
	req, _ := http.NewRequest("POST", plain.URL+"/anatomy?action=start", nil)
	req.Header.Set(anatomyHeader, "1")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("POST without a control: %d, want 404", resp.StatusCode)
	}
}

// TestAnatomyPage draws an anatomy in headless Chromium: each cell reads
// as the CLI prints it (Go's %.1f, exact ties rounded to even, "-" for a
// leg of no message), each leg of messages has a bar, the largest median
// is marked, and a page without a control has no buttons.
func TestAnatomyPage(t *testing.T) {
	an := anatomy.Anatomy{RoundTrip: anatomy.Stat{N: 5, Median: 301250, P99: 991750}}
	meds := []time.Duration{75250, 75750, 1250, 2250, 150, 123456789, 99999950, 250, 750, 4050}
	for d := range an.Dirs {
		an.Dirs[d] = anatomy.Direction{From: []string{"siwtun0", "siwtun1"}[d], To: []string{"siwtun1", "siwtun0"}[d]}
		for i, l := range anatomy.Legs {
			n := 5
			if d == 1 && i == 0 {
				n = 0 // no application stamps that way
			}
			an.Dirs[d].Legs = append(an.Dirs[d].Legs, anatomy.Stat{Leg: l, N: n, Median: meds[i] + time.Duration(d*500), P99: 2 * meds[i]})
		}
		an.Dirs[d].Legs = append(an.Dirs[d].Legs, anatomy.Stat{Leg: anatomy.Leg{From: anatomy.Post, To: anatomy.Seen}, N: 5, Median: 250250, P99: 260750})
	}
	b := NewBuilder("anatomy", "siwtun0", "siwtun1", nil)
	conn := AnatomyConnOf("siwtun0:40000 <-> siwtun1:18515", an, nil)
	b.SetAnatomy(Anatomy{Conns: []AnatomyConn{conn}})
	path := filepath.Join(t.TempDir(), "anatomy.html")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteHTML(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	br := browsertest.New(t)
	br.Do(t, 60*time.Second, navigate("file://"+path))
	waitReady(t, br, false)
	type row struct {
		Cells   []string `json:"cells"`
		Bar     bool     `json:"bar"`
		Largest bool     `json:"largest"`
	}
	rows := browsertest.Eval[[][]row](t, br, `[...document.querySelectorAll('#anat table.anatomy')].map((t) => [...t.querySelectorAll('tbody tr')].map((r) => ({
	  cells: [...r.querySelectorAll('td.num')].map((c) => c.textContent), bar: !!r.querySelector('.abar'), largest: /largest/.test(r.textContent)})))`)
	if len(rows) != 2 {
		t.Fatalf("%d tables, want one per direction", len(rows))
	}
	us := func(s AnatomyStat, ns int64) string {
		if s.N == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", float64(ns)/1000)
	}
	for d := range 2 {
		for k, l := range conn.Legs {
			st, r := l.Dirs[d], rows[d][k]
			want := []string{us(st, st.Median), us(st, st.P99), fmt.Sprint(st.N)}
			if strings.Join(r.Cells, " ") != strings.Join(want, " ") {
				t.Errorf("direction %d, %s -> %s: the page reads %q, the CLI %q", d, l.From, l.To, r.Cells, want)
			}
			if r.Bar != (!l.Total && st.N > 0) {
				t.Errorf("direction %d, %s -> %s: bar %v", d, l.From, l.To, r.Bar)
			}
			if r.Largest != (k == 5) { // 123456789 ns, the largest median
				t.Errorf("direction %d, %s -> %s: marked largest %v", d, l.From, l.To, r.Largest)
			}
		}
	}
	if n := browsertest.Eval[int](t, br, `document.querySelectorAll('#anat button').length`); n != 0 {
		t.Errorf("%d buttons on a page without a control", n)
	}
	if rt := browsertest.Eval[string](t, br, `document.querySelector('#anat p.rt').textContent`); !strings.Contains(rt, "median 301.2 µs, p99 991.8 µs over 5 round trips") {
		t.Errorf("round trip line %q", rt)
	}
	if errs := br.Errors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
}
