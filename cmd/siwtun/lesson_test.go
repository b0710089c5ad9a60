package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/internal/browsertest"
	"github.com/siwtun/siwtun/web"
)

// TestLessonList checks that --lesson alone lists every lesson.
func TestLessonList(t *testing.T) {
	out := mustRun(t, "demo", "--lesson")
	for _, l := range lessons {
		if !strings.Contains(out, l.name+"  ") || !strings.Contains(out, l.summary) {
			t.Errorf("--lesson does not list %s:\n%s", l.name, out)
		}
	}
	if _, err := runRoot(t, "demo", "--lesson", "no-such-lesson"); err == nil || !strings.Contains(err.Error(), "negotiation") {
		t.Errorf("an unknown lesson: %v", err)
	}
}

// TestLessons runs every lesson, checks what its view must show, and loads
// it in a headless Chromium (no console errors, the figures' RFC links,
// arrows told apart without colour) with the segment the lesson is about
// chosen, saving a screenshot of each as a test artefact.
func TestLessons(t *testing.T) {
	checks := map[string]struct {
		check func(v *web.View) error
		// choose is a predicate on a page segment s (JavaScript).
		choose string
		// show is the section of the page the screenshot shows.
		show string
		// page, if not nil, checks the loaded page further.
		page func(t *testing.T, br *browsertest.Browser)
	}{
		"negotiation": {func(v *web.View) error {
			// Two connections: revision 1 without CRC nor P2P, revision 2
			// with CRC and a Write RTR; both ends of each.
			var rev1, rev2 int
			for _, q := range v.QPs {
				switch {
				case q.MPARev == 1 && !q.CRC && q.P2P == "none":
					rev1++
				case q.MPARev == 2 && q.CRC && q.P2P == "write":
					rev2++
				default:
					return fmt.Errorf("queue pair %s/%d: p2p %s rev %d crc %v", q.Dev, q.LQPN, q.P2P, q.MPARev, q.CRC)
				}
			}
			if rev1 != 2 || rev2 != 2 {
				return fmt.Errorf("%d queue pairs at rev 1 without CRC, %d at rev 2 with CRC and P2P: want 2 and 2", rev1, rev2)
			}
			// What the checker saw each side send.
			want := [][2]string{{"mpa req rev 1 pd", ""}, {"mpa rep rev 1 pd", ""}, {"mpa req rev 2 C enhanced ird 4 ord 4", "p2p rtr=write pd"}, {"mpa rep rev 2 C enhanced", "p2p rtr=write pd"}}
			for _, w := range want {
				n := 0
				for _, c := range v.Conns {
					if strings.HasPrefix(c.Frame, w[0]) && strings.Contains(c.Frame, w[1]) {
						n++
					}
				}
				if n != 1 {
					return fmt.Errorf("%d directions sent %q ... %q: %+v", n, w[0], w[1], v.Conns)
				}
			}
			return nil
		}, `s.cls === 'mpa-req' && /rev 2/.test(s.fr)`, "bm", checkNegotiationPage},
		"markers": {func(v *web.View) error {
			// Markers in RDMA Write segments at both MTUs: FPDUs of at
			// most 1460 octets with 2 or 3 Markers, and of more than 8000
			// with 17 or 18.
			var small, jumbo int
			for _, s := range v.Segments {
				if s.Class != "write" || len(s.Markers) == 0 {
					continue
				}
				for _, m := range s.Markers {
					if !m.OK {
						return fmt.Errorf("segment %d: marker %+v not ok", s.N, m)
					}
				}
				switch {
				case s.Len <= 1460 && (len(s.Markers) == 2 || len(s.Markers) == 3):
					small++
				case s.Len > 8000 && len(s.Markers) >= 17:
					jumbo++
				}
			}
			if small == 0 || jumbo == 0 {
				return fmt.Errorf("%d Write segments with markers at MTU 1500, %d at MTU 9000: want some of both", small, jumbo)
			}
			return nil
		}, `s.cls === 'write' && (s.mk || []).length > 1`, "bm", checkMarkersPage},
		"placement": {func(v *web.View) error {
			for _, r := range v.Regions {
				if r.Len != 16384 {
					return fmt.Errorf("region %+v", r)
				}
			}
			return nil
		}, `s.cls === 'write' && (s.fp || []).some(f => f.hd && f.hd.l)`, "mem", nil},
		"out-of-order": {func(v *web.View) error {
			for _, p := range v.Places {
				if p.OOO {
					return nil
				}
			}
			return fmt.Errorf("no out-of-order placement")
		}, `s.ooo && (s.pl || []).length > 0`, "mem", nil},
		"terminate": {func(v *web.View) error {
			// One Terminate per broken rule, in order: invalid STag, base or
			// bounds, MPA CRC.
			want := []string{"invalid STag", "bounds", "CRC"}
			if len(v.Terminates) != len(want) {
				return fmt.Errorf("%d terminates, want %d: %+v", len(v.Terminates), len(want), v.Terminates)
			}
			for i, w := range want {
				if !strings.Contains(v.Terminates[i].Detail, w) {
					return fmt.Errorf("terminate %d: %q, want %q in it", i, v.Terminates[i].Detail, w)
				}
			}
			return nil
		}, `s.cls === 'term'`, "bm", nil},
		"credits": {func(v *web.View) error {
			if len(v.Terminates) != 1 || !strings.Contains(v.Terminates[0].Detail, "no buffer") {
				return fmt.Errorf("terminates %+v", v.Terminates)
			}
			return nil
		}, `s.cls === 'term'`, "bm", nil},
		"anatomy": {checkAnatomyLesson, `s.cls === 'write' && s.len === 24`, "anat", checkAnatomyPage},
	}
	br := browsertest.New(t)
	dir := t.TempDir()
	for _, l := range lessons {
		c, ok := checks[l.name]
		if !ok {
			t.Errorf("lesson %s has no test", l.name)
			continue
		}
		page := filepath.Join(dir, l.name+".html")
		out, err := runRoot(t, "demo", "--lesson", l.name, "--html", page)
		if err != nil {
			t.Fatalf("lesson %s: %v\n%s", l.name, err, out)
		}
		v := readView(t, page)
		if err := c.check(&v); err != nil {
			t.Errorf("lesson %s: %v", l.name, err)
		}
		if len(v.Steps) < 2 || v.Steps[0].Text != l.intro {
			t.Errorf("lesson %s: steps %+v", l.name, v.Steps)
		}
		openPage(t, br, "file://"+page)
		i := browsertest.Eval[int](t, br, `siwtunView.view.segs.findIndex(s => { s = siwtunView.detail(s); return `+c.choose+` })`)
		if i < 0 {
			t.Errorf("lesson %s: no segment where %s", l.name, c.choose)
		} else {
			browsertest.Eval[bool](t, br, fmt.Sprintf(`(siwtunView.select(%d), true)`, i))
		}
		browsertest.Eval[bool](t, br, `(document.getElementById('`+c.show+`').scrollIntoView(), true)`)
		br.Do(t, 10*time.Second, chromedp.Sleep(100*time.Millisecond))
		if c.page != nil {
			c.page(t, br)
		}
		checkFigureLinks(t, br)
		checkArrowCues(t, br)
		if errs := br.Errors(); len(errs) > 0 {
			t.Errorf("lesson %s: console errors: %q", l.name, errs)
		}
		shot := br.Screenshot(t, "lesson-"+l.name+".png")
		// SIWTUN_DOC_SCREENSHOTS=doc/teaching refreshes doc/teaching.md's pictures.
		if docDir := os.Getenv("SIWTUN_DOC_SCREENSHOTS"); docDir != "" {
			data, err := os.ReadFile(shot)
			if err != nil {
				t.Fatal(err)
			}
			small, err := browsertest.Quantize(data, 256)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(docDir, "lesson-"+l.name+".png"), small, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkNegotiationPage checks what the negotiation lesson's page shows of
// its two connections: the queue pairs' cards and the negotiation table
// name both revisions, and the byte map of the revision 2 Request has the
// RFC 6581 IRD/ORD block the revision 1 Request has not.
func checkNegotiationPage(t *testing.T, br *browsertest.Browser) {
	t.Helper()
	qps := browsertest.Eval[string](t, br, `document.getElementById('qpbody').textContent`)
	for _, w := range []string{"MPA rev 1, CRC off", "P2P RTR none", "MPA rev 2, CRC on", "P2P RTR write"} {
		if !strings.Contains(qps, w) {
			t.Errorf("negotiation: the queue pairs' cards do not say %q: %s", w, qps)
		}
	}
	neg := browsertest.Eval[string](t, br, `document.getElementById('negbody').textContent`)
	for _, w := range []string{"mpa req rev 1 pd", "mpa rep rev 1 pd", "mpa req rev 2 C enhanced", "mpa rep rev 2 C enhanced"} {
		if !strings.Contains(neg, w) {
			t.Errorf("negotiation: the negotiation table does not show %q: %s", w, neg)
		}
	}
	// The byte map of each Request: the IRD/ORD row at revision 2 only.
	const reqJS = `siwtunView.view.segs.filter(s => s.cls === 'mpa-req').map(s => s.n)`
	reqs := browsertest.Eval[[]int](t, br, reqJS)
	if len(reqs) != 2 {
		t.Fatalf("negotiation: %d MPA Requests on the page, want 2", len(reqs))
	}
	for k, n := range reqs {
		sel := browsertest.Eval[string](t, br, fmt.Sprintf(`(siwtunView.select(%d), document.getElementById('bytemap').querySelector('tr[data-field="flags M C R, Rev"]').dataset.value)`, n))
		irdord := browsertest.Eval[string](t, br, `(document.querySelector('#bytemap tr[data-field="IRD/ORD, P2P RTR"]') || {dataset: {value: ''}}).dataset.value`)
		switch k {
		case 0:
			if !strings.HasPrefix(sel, "mpa req rev 1 pd") || irdord != "" {
				t.Errorf("negotiation: the first Request's flags say %q, its IRD/ORD row %q: want rev 1 and no IRD/ORD block", sel, irdord)
			}
		case 1:
			if !strings.HasPrefix(sel, "mpa req rev 2 C enhanced") || irdord != "IRD 4 ORD 4 P2P" {
				t.Errorf("negotiation: the second Request's flags say %q, its IRD/ORD row %q: want rev 2 with CRC and IRD 4 ORD 4 P2P", sel, irdord)
			}
		}
	}
	// Back to the segment the screenshot shows.
	browsertest.Eval[bool](t, br, fmt.Sprintf(`(siwtunView.select(%d), true)`, reqs[1]))
}

// checkMarkersPage checks the markers lesson's page at both MTUs: the
// byte map of an RDMA Write segment of each shows its Markers, each with
// its FPDUPTR back to the FPDU's header found good, as many as the segment
// holds 512-octet stretches of the stream.
func checkMarkersPage(t *testing.T, br *browsertest.Browser) {
	t.Helper()
	type seg struct {
		N     int `json:"n"`
		Len   int `json:"len"`
		Marks int `json:"marks"`
	}
	segs := browsertest.Eval[[]seg](t, br, `siwtunView.view.segs.filter(s => s.cls === 'write').map(s => ({n: s.n, len: s.len, marks: (siwtunView.detail(s).mk || []).length}))`)
	chosen := browsertest.Eval[int](t, br, `siwtunView.state.sel`)
	var small, jumbo *seg
	for i := range segs {
		s := &segs[i]
		if small == nil && s.Len <= 1460 && s.Marks >= 2 {
			small = s
		}
		if jumbo == nil && s.Len > 8000 {
			jumbo = s
		}
	}
	if small == nil || jumbo == nil {
		t.Fatalf("markers: Write segments with markers at MTU 1500 %+v and 9000 %+v: want both", small, jumbo)
	}
	for _, s := range []*seg{small, jumbo} {
		rows := browsertest.Eval[[]bmRow](t, br, fmt.Sprintf(`(siwtunView.select(%d), %s)`, s.N, bmRowsJS))
		ok := 0
		for _, r := range rows {
			if r.Field == "Marker (FPDUPTR)" && r.Len == 4 && strings.Contains(r.Value, ": ok;") {
				ok++
			}
		}
		if ok != s.Marks || ok < s.Len/512-1 {
			t.Errorf("markers: segment %d (%d octets) shows %d good Markers in its byte map, the view has %d", s.N, s.Len, ok, s.Marks)
		}
	}
	browsertest.Eval[bool](t, br, fmt.Sprintf(`(siwtunView.select(%d), true)`, chosen))
}

// checkAnatomyLesson checks the anatomy lesson's view: one connection
// taken apart, every leg of both directions resting on (nearly) every
// round trip, and the steps telling each leg's median and the largest
// legs as the anatomy has them.
func checkAnatomyLesson(v *web.View) error {
	a := v.Anatomy
	if a == nil || len(a.Conns) != 1 || a.Control {
		return fmt.Errorf("anatomy %+v: want one connection and no controls", a)
	}
	c := a.Conns[0]
	if len(c.Legs) != len(anatomy.Legs)+1 {
		return fmt.Errorf("%d rows, want %d legs and the one-way trip", len(c.Legs), len(anatomy.Legs))
	}
	for _, l := range c.Legs {
		for d, st := range l.Dirs {
			if st.N < anatomyIters*9/10 || st.Median <= 0 || st.P99 < st.Median {
				return fmt.Errorf("%s -> %s, direction %d: %+v over %d round trips", l.From, l.To, d, st, anatomyIters)
			}
		}
	}
	if rt := c.RoundTrip; rt.N < anatomyIters*9/10 || rt.Median < c.Legs[len(anatomy.Legs)].Dirs[0].Median {
		return fmt.Errorf("round trip %+v, one way %+v", rt, c.Legs[len(anatomy.Legs)].Dirs[0])
	}
	var text strings.Builder
	for _, s := range v.Steps {
		text.WriteString(s.Title + "\n" + s.Text + "\n")
	}
	us := func(ns int64) string { return fmt.Sprintf("%.1f", float64(ns)/1000) }
	for _, l := range c.Legs[:len(anatomy.Legs)] {
		want := fmt.Sprintf("%s → %s: median %s µs (%s the other way), p99 %s µs — ", l.From, l.To, us(l.Dirs[0].Median), us(l.Dirs[1].Median), us(l.Dirs[0].P99))
		if !strings.Contains(text.String(), want) {
			return fmt.Errorf("the steps do not say %q:\n%s", want, text.String())
		}
	}
	legs := slices.Clone(c.Legs[:len(anatomy.Legs)])
	slices.SortStableFunc(legs, func(a, b web.AnatomyLeg) int { return int(b.Dirs[0].Median - a.Dirs[0].Median) })
	var top []string
	for _, l := range legs[:3] {
		top = append(top, fmt.Sprintf("%s → %s (%s µs)", l.From, l.To, us(l.Dirs[0].Median)))
	}
	if want := "The largest legs siwtun0 -> siwtun1 were " + strings.Join(top, ", "); !strings.Contains(text.String(), want) {
		return fmt.Errorf("the steps do not say %q:\n%s", want, text.String())
	}
	return nil
}

// checkAnatomyPage checks the anatomy lesson's page: its tables show the
// view's figures, leg by leg and direction by direction, as the CLI
// rounds them, with a bar for each leg.
func checkAnatomyPage(t *testing.T, br *browsertest.Browser) {
	t.Helper()
	type row struct {
		From  string   `json:"from"`
		To    string   `json:"to"`
		Med   int64    `json:"med"`
		N     int      `json:"n"`
		Cells []string `json:"cells"`
		Bar   bool     `json:"bar"`
	}
	rows := browsertest.Eval[[][]row](t, br, `[...document.querySelectorAll('#anat table.anatomy')].map((t) => [...t.querySelectorAll('tbody tr')].map((r) => ({from: r.dataset.from, to: r.dataset.to,
	  med: +r.dataset.med, n: +r.dataset.n, cells: [...r.querySelectorAll('td.num')].map((c) => c.textContent), bar: !!r.querySelector('.abar')})))`)
	v := browsertest.Eval[web.Anatomy](t, br, `siwtunView.view.anatomy`)
	if len(v.Conns) != 1 || len(rows) != 2 {
		t.Fatalf("anatomy: %d connections in the view, %d tables on the page; want 1 and 2", len(v.Conns), len(rows))
	}
	us := func(ns int64) string { return fmt.Sprintf("%.1f", float64(ns)/1000) }
	for d := range 2 {
		for k, l := range v.Conns[0].Legs {
			st, r := l.Dirs[d], rows[d][k]
			want := []string{us(st.Median), us(st.P99), fmt.Sprint(st.N)}
			if r.From != l.From || r.To != l.To || r.Med != st.Median || strings.Join(r.Cells, " ") != strings.Join(want, " ") || r.Bar == l.Total {
				t.Errorf("anatomy, direction %d, %s -> %s: the page shows %+v, the view %+v", d, l.From, l.To, r, st)
			}
		}
	}
}
