package inspect

import (
	"fmt"
	"testing"
)

// gapStream builds a connection whose initiator sends FPDUs of the given
// ULPDU lengths, cut into segments at cuts (nil: one FPDU per segment).
// It returns the handshake and frame segments and the FPDU segments apart.
func gapStream(t *testing.T, crc, markers bool, ulpdus []int, cuts func(st stream) []int) (head, data []Segment, st stream) {
	t.Helper()
	st = buildStream(t, crc, markers, ulpdus)
	var c []int
	if cuts != nil {
		c = cuts(st)
	} else {
		for i := 1; i < len(st.starts); i++ {
			c = append(c, int(st.starts[i]))
		}
	}
	segs := conversation(t, crc, markers, st.b, c)
	return segs[:5], segs[5:], st
}

// unobserved is the range of segs as NotObserved takes it.
func unobserved(segs []Segment) Unobserved {
	last := segs[len(segs)-1]
	return Unobserved{Src: segs[0].Src, Dst: segs[0].Dst, Seq: segs[0].Seq, End: last.Seq + uint32(len(last.Payload))}
}

// sizes returns n ULPDU lengths that vary.
func sizes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 300 + (i*137)%900
	}
	return out
}

// TestGapResyncAligned: segments left out of a live watch (one FPDU per
// segment) are counted as not observed, nothing after them is held or
// flagged out of order, and the checker picks the FPDU stream up at the
// first segment after them, verified by CRC, Marker or header as the mode
// allows; every later segment is aligned with good CRCs.
func TestGapResyncAligned(t *testing.T) {
	for _, mode := range []struct{ crc, markers bool }{{true, false}, {true, true}, {false, true}, {false, false}} {
		t.Run(fmt.Sprintf("crc=%v,markers=%v", mode.crc, mode.markers), func(t *testing.T) {
			head, data, _ := gapStream(t, mode.crc, mode.markers, sizes(40), nil)
			a := New()
			for _, s := range head {
				a.Add(s)
			}
			var rs []Report
			for _, s := range data[:10] {
				rs = append(rs, a.Add(s)...)
			}
			skipped := data[10:20]
			a.NotObserved([]Unobserved{unobserved(skipped)}, false)
			missed := 0
			for _, s := range skipped {
				missed += len(s.Payload)
			}
			var after []Report
			for _, s := range data[20:] {
				after = append(after, a.Add(s)...)
			}
			if len(after) != 20 {
				t.Fatalf("%d reports for the 20 segments after the gap", len(after))
			}
			for i, r := range after {
				if r.Kind != KindFPDU || r.Held || r.Aligned == nil || !*r.Aligned || len(r.FPDUs) != 1 || !r.FPDUs[0].Ends {
					t.Errorf("segment %d after the gap: %+v", i, r)
				}
				if mode.crc && r.FPDUs[0].CRC != "good" {
					t.Errorf("segment %d after the gap: CRC %s", i, r.FPDUs[0].CRC)
				}
				for _, m := range r.Markers {
					if !m.OK {
						t.Errorf("segment %d after the gap: marker %+v", i, m)
					}
				}
			}
			if after[0].NotObserved != missed || after[0].Resync == "" {
				t.Errorf("first report after the gap: not observed %d, resync %q; want %d octets and how it resynchronised", after[0].NotObserved, after[0].Resync, missed)
			}
			t.Logf("resync: %s", after[0].Resync)
			sum := a.Summary()[0]
			if sum.Held != 0 || sum.NotObserved != uint64(missed) || sum.Resyncs != 1 || sum.FPDUs != 30 || sum.Aligned != 30 || sum.FPDUSegments != 30 || sum.Note != "" {
				t.Errorf("summary %+v", sum)
			}
		})
	}
}

// TestGapResyncUnaligned: after a gap, a segment that starts inside an
// FPDU gets no alignment verdict; with CRC on (or Markers) the checker
// finds the first whole FPDU in it and walks on from there; with neither
// it waits, reporting the segments as unsynced, never inventing FPDUs.
func TestGapResyncUnaligned(t *testing.T) {
	cut := func(st stream) []int {
		var c []int
		for o := 1100; o < len(st.b); o += 1100 {
			c = append(c, o)
		}
		return c
	}
	for _, mode := range []struct{ crc, markers, finds bool }{{true, false, true}, {false, true, true}, {false, false, false}} {
		t.Run(fmt.Sprintf("crc=%v,markers=%v", mode.crc, mode.markers), func(t *testing.T) {
			head, data, st := gapStream(t, mode.crc, mode.markers, sizes(60), cut)
			a := New()
			for _, s := range head {
				a.Add(s)
			}
			for _, s := range data[:5] {
				a.Add(s)
			}
			a.NotObserved([]Unobserved{unobserved(data[5:9])}, false)
			var after []Report
			for _, s := range data[9:] {
				after = append(after, a.Add(s)...)
			}
			starts := map[uint64]bool{}
			for _, o := range st.starts {
				starts[o] = true
			}
			first := after[0]
			if !mode.finds {
				for i, r := range after {
					if r.Kind != KindUnsynced || len(r.FPDUs) > 0 || r.Aligned != nil {
						t.Errorf("segment %d after the gap: %+v", i, r)
					}
				}
				if s := a.Summary()[0]; s.Unsynced != len(after) || s.Resyncs != 0 {
					t.Errorf("summary %+v", s)
				}
				return
			}
			if first.Aligned != nil || first.Resync == "" || len(first.FPDUs) == 0 || !first.FPDUs[0].Begins {
				t.Fatalf("first segment after the gap: %+v", first)
			}
			for i, r := range after {
				for _, f := range r.FPDUs {
					if f.Begins && !starts[f.Offset] {
						t.Errorf("segment %d: FPDU at stream offset %d, where the sender began none", i, f.Offset)
					}
					if f.Ends && mode.crc && f.CRC != "good" {
						t.Errorf("segment %d: FPDU %d CRC %s", i, f.Index, f.CRC)
					}
				}
				if i > 0 && (r.Aligned == nil || *r.Aligned) {
					t.Errorf("segment %d after the gap: alignment %v, want not aligned (cut at 1100 octets)", i, r.Aligned)
				}
			}
		})
	}
}

// TestGapAndReorder: a segment is held and flagged out of order only when
// octets in front of it are known not to have arrived. A hole that a gap
// may have filled (the octets passed while the watch left them out) is no
// reason; a hole outside the gap's range is, before and after the gap.
func TestGapAndReorder(t *testing.T) {
	head, data, _ := gapStream(t, true, false, sizes(30), nil)
	a := New()
	for _, s := range head {
		a.Add(s)
	}
	for _, s := range data[:5] {
		a.Add(s)
	}
	// 6 arrives before 5 (out of order), then the watch leaves out 5
	// itself: 6 was out of order on the wire.
	if r := a.Add(data[6]); len(r) != 1 || r[0].Kind != KindHeld {
		t.Fatalf("segment 6 ahead of 5: %+v", r)
	}
	a.NotObserved([]Unobserved{unobserved(data[5:6])}, false)
	// The watch then leaves out 7..9; 11 arrives ahead of 10, which
	// arrives next: 11 was out of order, as 10 is outside the gap.
	a.NotObserved([]Unobserved{unobserved(data[7:10])}, false)
	var rs []Report
	for _, i := range []int{11, 10, 12} {
		rs = append(rs, a.Add(data[i])...)
	}
	held := map[uint32]bool{}
	for _, r := range rs {
		if r.Kind == KindHeld {
			held[r.Seq] = true
			continue
		}
		if r.Kind != KindFPDU || r.Aligned == nil || !*r.Aligned {
			t.Errorf("report %+v", r)
		}
		want := r.Seq == data[6].Seq || r.Seq == data[11].Seq
		if r.Held != want {
			t.Errorf("segment seq %d reported out of order %v, want %v", r.Seq, r.Held, want)
		}
	}
	if len(held) != 1 || !held[data[11].Seq] {
		t.Errorf("held on arrival: %v, want only segment 11", held)
	}
	got := map[uint32]bool{}
	for _, r := range rs {
		if r.Kind == KindFPDU {
			got[r.Seq] = true
		}
	}
	for _, i := range []int{6, 10, 11, 12} {
		if !got[data[i].Seq] {
			t.Errorf("segment %d was never analysed", i)
		}
	}
	s := a.Summary()[0]
	want := len(data[5].Payload)
	for _, d := range data[7:10] {
		want += len(d.Payload)
	}
	if s.NotObserved != uint64(want) || s.Held != 2 {
		t.Errorf("summary: %d octets not observed (want %d), %d held (want 2)", s.NotObserved, want, s.Held)
	}
}
