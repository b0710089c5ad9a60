package verbs_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// TestWatchMarkersCRC opens a Watch on the client device before it
// connects (markers and CRC on both ways), runs Writes, a Read and Sends,
// and checks what the tap saw with the capture checker: every marker at
// its place with a correct FPDUPTR, every CRC good; the Read Response's
// placements cover the sink; the completions match the work requests.
func TestWatchMarkersCRC(t *testing.T) {
	const size = 20000
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	markers := func(c *offload.Config) { c.Markers = true }
	cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", markers, 64)
	srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", markers, 64)
	w := cli.eng.Watch(1 << 16)
	connect(t, cli, srv, verbs.ConnParam{}, verbs.ConnParam{})
	exercise(t, cli, srv, size, 3)
	time.Sleep(50 * time.Millisecond) // the last ACKs
	w.Close()

	a := inspect.New()
	var placedRead int
	var wcs []uint64
	segments := 0
	for e := range w.Events() {
		switch {
		case e.Segment != nil:
			s := e.Segment
			segments++
			for _, r := range a.Add(inspect.Segment{Time: e.Time, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Flags: s.Flags, Payload: s.Payload}) {
				for _, m := range r.Markers {
					if !m.OK {
						t.Errorf("bad marker %+v in %+v", m, r)
					}
				}
			}
		case e.Place != nil:
			if e.Place.QP != cli.qp.Num() {
				t.Errorf("placement on QP %d", e.Place.QP)
			}
			if e.Place.Op == rdmap.OpReadResponse {
				placedRead += e.Place.Len
			}
		case e.Completion != nil:
			wcs = append(wcs, e.Completion.ID)
		}
	}
	if segments == 0 {
		t.Fatal("the tap saw no segment")
	}
	if w.Dropped() != 0 {
		t.Fatalf("%d events dropped", w.Dropped())
	}
	sums := a.Summary()
	if len(sums) != 2 {
		t.Fatalf("%d directions: %+v", len(sums), sums)
	}
	for _, s := range sums {
		if !s.CRC || !s.Markers || s.FPDUs == 0 || s.CRCGood != s.FPDUs || s.MarkersOK == 0 || s.MarkersBad != 0 || s.Note != "" {
			t.Errorf("direction %v > %v: %+v", s.Src, s.Dst, s)
		}
	}
	if sums[0].Src != netip.AddrPortFrom(cliAddr.Addr(), sums[0].Src.Port()) || sums[0].Role != "initiator" {
		t.Errorf("first direction %+v", sums[0])
	}
	if placedRead != size {
		t.Errorf("Read Response placements cover %d octets, want %d", placedRead, size)
	}
	want := []uint64{1, 2, 3, 20, 21, 22, 23}
	if len(wcs) < len(want) {
		t.Fatalf("completions %v, want at least %v", wcs, want)
	}
	for i, id := range want {
		if wcs[i] != id {
			t.Fatalf("completions %v, want %v first", wcs, want)
		}
	}

	// Nothing is seen once the Watch is closed; a new one works.
	w2 := cli.eng.Watch(16)
	w2.Close()
	if _, ok := <-w2.Events(); ok {
		t.Error("closed Watch delivered an event")
	}
}
