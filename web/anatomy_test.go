package web

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/anatomy"
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
	defer mu.Unlock()
	if got := strings.Join(calls, " "); got != "start show start stop" {
		t.Errorf("calls %q", got)
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
