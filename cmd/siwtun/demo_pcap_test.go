package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// TestDemoPcap runs the in-process demo with markers and -w and checks the
// pcapng it wrote: both directions decoded, every marker and CRC good.
func TestDemoPcap(t *testing.T) {
	file := filepath.Join(t.TempDir(), "demo.pcapng")
	out := mustRun(t, "demo", "--markers", "-w", file, "--size", "3000")
	if !strings.Contains(out, "packets written to "+file) || !strings.Contains(out, "marker at stream 0 (+0) fpduptr 0 -> FPDU 1: ok") {
		t.Errorf("demo printed:\n%s", out)
	}
	segs, err := capture.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	a := inspect.New()
	for _, s := range segs {
		a.Add(s)
	}
	sums := a.Summary()
	if len(sums) != 2 {
		t.Fatalf("%d directions", len(sums))
	}
	for _, s := range sums {
		if !s.Markers || !s.CRC || s.FPDUs == 0 || s.CRCGood != s.FPDUs || s.MarkersOK == 0 || s.MarkersBad != 0 || s.Note != "" {
			t.Errorf("%+v", s)
		}
	}
}
