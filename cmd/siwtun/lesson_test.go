package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

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
// it in a headless Chromium (no console errors) with the segment the
// lesson is about chosen, saving a screenshot of each as a test artefact.
func TestLessons(t *testing.T) {
	checks := map[string]struct {
		check func(v *web.View) error
		// choose is a predicate on a page segment s (JavaScript).
		choose string
		// show is the section of the page the screenshot shows.
		show string
	}{
		"negotiation": {func(v *web.View) error {
			for _, q := range v.QPs {
				if q.P2P != "write" || q.MPARev != 2 || !q.CRC {
					return fmt.Errorf("queue pair %s/%d: p2p %s rev %d crc %v", q.Dev, q.LQPN, q.P2P, q.MPARev, q.CRC)
				}
			}
			return nil
		}, `s.cls === 'mpa-req'`, "bm"},
		"markers": {func(v *web.View) error {
			for _, s := range v.Segments {
				if len(s.Markers) > 0 {
					return nil
				}
			}
			return fmt.Errorf("no marker")
		}, `s.cls === 'write' && (s.mk || []).length > 1`, "bm"},
		"placement": {func(v *web.View) error {
			for _, r := range v.Regions {
				if r.Len != 16384 {
					return fmt.Errorf("region %+v", r)
				}
			}
			return nil
		}, `s.cls === 'write' && (s.fp || []).some(f => f.hd && f.hd.l)`, "mem"},
		"out-of-order": {func(v *web.View) error {
			for _, p := range v.Places {
				if p.OOO {
					return nil
				}
			}
			return fmt.Errorf("no out-of-order placement")
		}, `s.ooo && (s.pl || []).length > 0`, "mem"},
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
		}, `s.cls === 'term'`, "bm"},
		"credits": {func(v *web.View) error {
			if len(v.Terminates) != 1 || !strings.Contains(v.Terminates[0].Detail, "no buffer") {
				return fmt.Errorf("terminates %+v", v.Terminates)
			}
			return nil
		}, `s.cls === 'term'`, "bm"},
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
		if errs := br.Errors(); len(errs) > 0 {
			t.Errorf("lesson %s: console errors: %q", l.name, errs)
		}
		shot := br.Screenshot(t, "lesson-"+l.name+".png")
		// SIWTUN_DOC_SCREENSHOTS=doc/teaching refreshes README's pictures.
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
