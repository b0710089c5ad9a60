package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRenderPage: the table goes between the markers, the text around them
// stays, rendering again changes nothing, and a page without markers is
// refused.
func TestRenderPage(t *testing.T) {
	r := fixture()
	r.Analyze()
	page := []byte("# Performance\n\nBefore.\n\n" + PageBegin + "\nold table\n" + PageEnd + "\n\nAfter.\n")
	out, err := RenderPage(page, r, "bench/results/20260501-120000.json")
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{"# Performance\n\nBefore.\n\n" + PageBegin, "```text\n" + table.String() + "```\n", PageEnd + "\n\nAfter.\n",
		"`bench/results/20260501-120000.json`, started 2026-05-01 12:00 UTC."} {
		if !strings.Contains(s, want) {
			t.Errorf("rendered page lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "old table") {
		t.Errorf("the old table is still there:\n%s", s)
	}
	again, err := RenderPage(out, r, "bench/results/20260501-120000.json")
	if err != nil || !bytes.Equal(again, out) {
		t.Errorf("rendering twice differs (err %v):\n%s", err, again)
	}
	r.Note = "Made by hand."
	if noted, _ := RenderPage(page, r, "x.json"); !strings.Contains(string(noted), "started 2026-05-01 12:00 UTC. Made by hand.\n") {
		t.Errorf("the note is not shown:\n%s", noted)
	}
	if _, err := RenderPage([]byte("# no markers\n"), r, "x.json"); err == nil {
		t.Error("a page without markers was accepted")
	}
}

// TestNewestFull: the newest run that measured every suite is taken; a
// newer run of fewer suites is not.
func TestNewestFull(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r *Results) {
		t.Helper()
		var b bytes.Buffer
		if err := r.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := NewestFull(dir); err == nil {
		t.Error("an empty directory gave a run")
	}
	old, full, narrow := fixture(), fixture(), fixture()
	old.Started = time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	full.Suites = AllSuites
	narrow.Suites = []string{SuiteCLib}
	write("20260401-000000.json", old)
	write("20260501-120000.json", full)
	write("20260601-000000.json", narrow)
	path, r, err := NewestFull(dir)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != "20260501-120000.json" || !r.Started.Equal(full.Started) {
		t.Errorf("NewestFull took %s (started %v)", path, r.Started)
	}
}

// TestPerformancePageCurrent: doc/performance.md shows the newest full run
// committed in bench/results, as go generate ./bench renders it.
func TestPerformancePageCurrent(t *testing.T) {
	path, r, err := NewestFull("results")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join("..", "doc", "performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := RenderPage(page, r, filepath.Join("bench", "results", filepath.Base(path)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(page, want) {
		t.Errorf("doc/performance.md does not show %s as it is: run go generate ./bench", path)
	}
}
