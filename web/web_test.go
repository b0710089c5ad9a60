package web

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/browsertest"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// TestByteMapMatchesChecker checks every segment's byte map against the
// checker's report of it: the spans tile the payload, each Marker span
// sits where the checker found the Marker, each FPDU spans exactly its
// octets in the segment, and a CRC span ends each FPDU that ends here.
func TestByteMapMatchesChecker(t *testing.T) {
	for _, tc := range []struct {
		name    string
		emss    int
		markers bool
	}{
		{"mtu1500", 1420, false},
		{"mtu1500-markers", 1420, true},
		{"mtu9000-markers", 8940, true},
		{"odd-size-markers", 333, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, segs := synthTrace(t, 200, tc.emss, tc.markers)
			v := b.Snapshot()
			if len(v.Segments) != len(segs) {
				t.Fatalf("%d segments in the view, %d fed", len(v.Segments), len(segs))
			}
			a := inspect.New()
			for i, s := range segs {
				rs := a.Add(s)
				if len(rs) != 1 {
					t.Fatalf("segment %d: %d reports", i, len(rs))
				}
				checkMap(t, &v.Segments[i], &rs[0], tc.markers)
			}
		})
	}
}

func checkMap(t *testing.T, s *Segment, r *inspect.Report, markers bool) {
	t.Helper()
	at := 0
	for _, sp := range s.Map {
		if sp.At != at || sp.Len <= 0 {
			t.Fatalf("segment %d: span %+v does not follow octet %d", s.N, sp, at)
		}
		at += sp.Len
	}
	if at != r.Len {
		t.Fatalf("segment %d: spans cover %d of %d octets", s.N, at, r.Len)
	}
	var markerAt []int
	perFPDU := make(map[int]int)
	for _, sp := range s.Map {
		if sp.Field == FieldMarker {
			markerAt = append(markerAt, sp.At)
			if sp.Marker < 0 || r.Markers[sp.Marker].At != sp.At {
				t.Errorf("segment %d: marker span %+v does not name the checker's marker there", s.N, sp)
			}
		}
		if sp.FPDU >= 0 {
			perFPDU[sp.FPDU] += sp.Len
		}
	}
	if len(markerAt) != len(r.Markers) {
		t.Errorf("segment %d: %d marker spans, checker found %d", s.N, len(markerAt), len(r.Markers))
	}
	if !markers && len(markerAt) > 0 {
		t.Errorf("segment %d: markers without markers", s.N)
	}
	for i, f := range r.FPDUs {
		if perFPDU[i] != f.Here {
			t.Errorf("segment %d FPDU %d: %d octets mapped, checker says %d here", s.N, f.Index, perFPDU[i], f.Here)
		}
		if f.Ends && f.Begins && f.Len != mpa.FPDUWireLen(f.Offset, f.ULPDULen, markers) {
			t.Errorf("segment %d FPDU %d: len %d", s.N, f.Index, f.Len)
		}
		if f.Ends {
			last := s.Map[0]
			for _, sp := range s.Map {
				if sp.FPDU == i {
					last = sp
				}
			}
			if last.Field != FieldCRC || last.Len != 4 || last.At+4 != f.At+f.Here {
				t.Errorf("segment %d FPDU %d: last span %+v is not its CRC", s.N, f.Index, last)
			}
		}
	}
}

// TestViewLadderClasses checks what the synthetic trace's arrows say.
func TestViewLadderClasses(t *testing.T) {
	b, _ := synthTrace(t, 30, 1420, true)
	v := b.Snapshot()
	want := map[int][2]string{0: {"ctl", "SYN"}, 3: {"mpa-req", "MPA Req"}, 4: {"mpa-rep", "MPA Rep"}, 5: {"write", "Write"}}
	for i, w := range want {
		if s := v.Segments[i]; s.Class != w[0] || s.Label != w[1] {
			t.Errorf("segment %d: class %q label %q, want %q %q", i, s.Class, s.Label, w[0], w[1])
		}
	}
	if v.Segments[5].Aligned == nil || !*v.Segments[5].Aligned {
		t.Errorf("segment 5 not aligned")
	}
}

// TestPageLarge loads a 100,000-segment trace in headless Chromium and
// logs the load time and the JavaScript heap; the page must load without
// console errors and hold one ladder arrow per segment.
func TestPageLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the 100,000-segment page")
	}
	if raceEnabled {
		// make test runs it again without -race.
		t.Skip("the race detector makes building 100,000 segments take minutes: go test -run TestPageLarge ./web runs it")
	}
	const n = 100000
	t0 := time.Now()
	b, _ := synthTrace(t, n, 1420, true)
	built := time.Since(t0)
	path := filepath.Join(browsertest.ArtifactDir(t), "large-100k.html")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteHTML(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, _ := os.Stat(path)
	br := browsertest.New(t)
	t1 := time.Now()
	br.Do(t, 120*time.Second, navigate("file://"+path))
	waitReady(t, br, false)
	load := time.Since(t1)
	waitReady(t, br, true)
	all := time.Since(t1)
	heap := browsertest.Eval[float64](t, br, `performance.memory ? performance.memory.usedJSHeapSize : -1`)
	arrows := browsertest.Eval[string](t, br, `document.getElementById('ladder').dataset.arrows`)
	if arrows != fmt.Sprint(n) {
		t.Errorf("ladder holds %s arrows, want %d", arrows, n)
	}
	drawn := browsertest.Eval[string](t, br, `document.getElementById('ladder').dataset.drawn`)
	phases := browsertest.Eval[map[string]float64](t, br, `siwtunView.timing`)
	// Choosing a segment in the middle and at the end must stay fast.
	selMs := browsertest.Eval[float64](t, br, `(() => { const t = performance.now(); siwtunView.select(50000); siwtunView.select(99999); return performance.now() - t; })()`)
	if errs := br.Errors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
	t.Logf("100,000 segments: built in %v, page %.1f MB; ladder up in %v, details in %v (in the page: HTML parsed by %.0f ms, view decoded by %.0f ms, parsed by %.0f ms, drawn by %.0f ms, details decoded by %.0f ms); JS heap %.1f MB; %s arrows drawn in view; two selections %.1f ms",
		built.Round(time.Millisecond), float64(st.Size())/1e6, load.Round(time.Millisecond), all.Round(time.Millisecond), phases["scriptStart"],
		phases["decoded"], phases["parsed"], phases["drawn"], phases["details"], heap/1e6, drawn, selMs)
	br.Screenshot(t, "large-100k.png")
}

// waitReady waits until the page is up (its ladder drawn) and, with
// details, until it has decoded the segments' details too.
func waitReady(t *testing.T, br *browsertest.Browser, details bool) {
	t.Helper()
	cond := `document.body !== null && document.body.dataset.ready === '1'`
	if details {
		cond += ` && document.body.dataset.details === '1'`
	}
	for i := 0; ; i++ {
		if browsertest.Eval[bool](t, br, cond) {
			return
		}
		if i > 600 {
			t.Fatalf("the page never got ready; console errors: %q", br.Errors())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPageNoNetwork checks that the page names no external resource: only
// links (a href), which are never fetched.
func TestPageNoNetwork(t *testing.T) {
	b, _ := synthTrace(t, 20, 1420, false)
	var sb strings.Builder
	if err := b.WriteHTML(&sb); err != nil {
		t.Fatal(err)
	}
	page := sb.String()
	for _, bad := range []string{"src=\"http", "src='http", "@import", "url(http", "fetch(\"http", "<link rel=\"stylesheet\""} {
		if strings.Contains(page, bad) {
			t.Errorf("page contains %q", bad)
		}
	}
}

func navigate(url string) chromedp.Action[chromedp.Void] { return chromedp.Navigate(url) }

// TestNewDevices checks that queue pairs and regions of new devices of
// the same names (a lesson's next part) are kept apart from the earlier
// ones, though their numbers and STags repeat, and that the same devices'
// records are updated in place.
func TestNewDevices(t *testing.T) {
	lookup := func(dev string, stag uint32) (Region, bool) { return Region{Len: 64}, true }
	b := NewBuilder("parts", "siwtun0", "siwtun1", lookup)
	now := time.Now()
	place := func() {
		b.Event(false, ctl.WatchEvent{Time: now, Place: &ctl.WatchPlace{QP: 1, Op: "RDMA Write", STag: 0x100, TO: 0x1000, Len: 64}})
	}
	b.SetState(now, "siwtun0", []ctl.QP{{LQPN: 1, State: "RTS", MPARev: 1}}, nil)
	place()
	b.SetState(now, "siwtun0", []ctl.QP{{LQPN: 1, State: "ERR", MPARev: 1}}, nil)
	place()
	b.NewDevices()
	b.SetState(now, "siwtun0", []ctl.QP{{LQPN: 1, State: "RTS", MPARev: 2}}, nil)
	place()
	v := b.Snapshot()
	if len(v.QPs) != 2 || v.QPs[0].MPARev != 1 || v.QPs[0].State != "ERR" || len(v.QPs[0].History) != 2 || v.QPs[1].MPARev != 2 {
		t.Errorf("queue pairs %+v: want the first QP 1 (rev 1, RTS then ERR) and the new one (rev 2)", v.QPs)
	}
	if len(v.Regions) != 2 || len(v.Places) != 3 || v.Places[1].Region != 0 || v.Places[2].Region != 1 {
		t.Errorf("regions %+v, placements %+v: want the first two placements in the first region, the third in a new one", v.Regions, v.Places)
	}
}
