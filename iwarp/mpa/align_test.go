package mpa

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// sliceReader is a PayloadReader over one segment's bytes.
type sliceReader []byte

func (s sliceReader) ReadPayload(p []byte, off int) int {
	if off < 0 || off >= len(s) {
		return 0
	}
	return copy(p, s[off:])
}

// alignStream builds an MPA Reply followed by FPDUs of the given ULPDU
// lengths and returns the stream, the offset of the first FPDU and the
// FPDU boundaries (stream offsets where an FPDU, with its leading Marker,
// begins; the last is the end).
func alignStream(t testing.TB, markers bool, lens []int) (stream []byte, first int, bounds map[int]bool) {
	t.Helper()
	f := Frame{Reply: true, Rev: 2, CRC: true, PrivateData: []byte("pd")}
	stream, err := f.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	first = len(stream)
	var s Sender
	s.Init(true, markers)
	bounds = map[int]bool{len(stream): true}
	for i, l := range lens {
		payload := make([]byte, l)
		for j := range payload {
			payload[j] = byte(i + j)
		}
		s.Begin(stream, l)
		s.Write(payload)
		stream = s.Finish()
		bounds[len(stream)] = true
	}
	return stream, first, bounds
}

// TestAlignerSegmentations cuts valid streams (markers on and off, FPDUs of
// many sizes) into segments in several ways — on FPDU boundaries, several
// FPDUs per segment, at random points — and checks every classification
// against the boundaries the Sender produced, with sequence numbers that
// wrap.
func TestAlignerSegmentations(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, markers := range []bool{false, true} {
		lens := make([]int, 400)
		for i := range lens {
			lens[i] = []int{0, 1, 3, 18, 28, 500, 508, 510, 1000, 1400, 4000, 8900}[rng.IntN(12)]
		}
		stream, first, bounds := alignStream(t, markers, lens)
		isBound := func(off int) bool {
			if bounds[off] {
				return true
			}
			// A segment may also end right after a Marker that leads the
			// next FPDU.
			return markers && bounds[off-MarkerLen] && (off-MarkerLen-first)%MarkerInterval == 0
		}
		cuts := map[string]func(off int) int{
			"fpdu": func(off int) int { // one FPDU per segment
				for e := off + 1; e <= len(stream); e++ {
					if bounds[e] {
						return e
					}
				}
				return len(stream)
			},
			"fixed1400": func(off int) int { return min(off+1400, len(stream)) },
			"random":    func(off int) int { return min(off+1+rng.IntN(3000), len(stream)) },
			"several": func(off int) int { // up to three whole FPDUs
				n, e := 1+rng.IntN(3), off
				for e < len(stream) && n > 0 {
					e++
					if bounds[e] {
						n--
					}
				}
				return e
			},
		}
		for name, cut := range cuts {
			t.Run(fmt.Sprintf("markers=%v/%s", markers, name), func(t *testing.T) {
				isn := uint32(0xffff_f000) // wraps inside the stream
				var a Aligner
				aligned, total := 0, 0
				for off := 0; off < len(stream); {
					end := cut(off)
					if off < first && end > first {
						end = first // the frame in a segment of its own
					}
					got := a.Classify(isn+1+uint32(off), end-off, sliceReader(stream[off:end]))
					if off == 0 {
						a.Configure(markers)
					}
					if off >= first {
						want := bounds[off] && isBound(end)
						if !got.Known || got.Aligned != want {
							t.Fatalf("segment [%d,%d): got %+v, want aligned=%v", off, end, got, want)
						}
						if want && got.FPDUs == 0 && end-off > MarkerLen {
							t.Fatalf("segment [%d,%d): aligned with no FPDU", off, end)
						}
						total++
						if want {
							aligned++
						}
					}
					off = end
				}
				t.Logf("%d segments, %d aligned", total, aligned)
				if name == "fpdu" || name == "several" {
					if aligned != total {
						t.Fatalf("%d of %d FPDU-cut segments aligned", aligned, total)
					}
				}
			})
		}
	}
}

// TestAlignerSplit reports which FPDU was split and by how much.
func TestAlignerSplit(t *testing.T) {
	stream, first, _ := alignStream(t, false, []int{100, 200})
	var a Aligner
	a.Classify(1, first, sliceReader(stream[:first]))
	a.Configure(false)
	// FPDU 1 is 2+100+2+4 = 108 octets; cut 50 octets into FPDU 2.
	seg := stream[first : first+108+50]
	got := a.Classify(1+uint32(first), len(seg), sliceReader(seg))
	want := Alignment{Known: true, FPDUs: 1, SplitOff: 108, SplitBy: 208 - 50}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// The rest starts inside FPDU 2.
	rest := stream[first+158:]
	if got := a.Classify(1+uint32(first+158), len(rest), sliceReader(rest)); got.Aligned || got.SplitOff != -1 {
		t.Fatalf("rest: got %+v", got)
	}
}

// TestAlignerOutOfOrder classifies segments out of order and sent again.
func TestAlignerOutOfOrder(t *testing.T) {
	lens := []int{1000, 1000, 1000, 1000}
	stream, first, bounds := alignStream(t, true, lens)
	var offs []int
	for off := range bounds {
		offs = append(offs, off)
	}
	var a Aligner
	a.Classify(7, first, sliceReader(stream[:first]))
	a.Configure(true)
	seg := func(i int) (uint32, []byte) {
		// The i-th FPDU, found by walking the boundaries in order.
		start, n := first, 0
		for off := first + 1; off <= len(stream); off++ {
			if bounds[off] {
				if n == i {
					return 7 + uint32(start), stream[start:off]
				}
				start, n = off, n+1
			}
		}
		t.Fatalf("no FPDU %d", i)
		return 0, nil
	}
	for _, i := range []int{0, 2, 1, 3, 2, 0} {
		seq, b := seg(i)
		if got := a.Classify(seq, len(b), sliceReader(b)); !got.Aligned || got.FPDUs != 1 {
			t.Fatalf("FPDU %d: %+v", i, got)
		}
	}
}

func FuzzAligner(f *testing.F) {
	stream, first, _ := alignStream(f, true, []int{10, 600, 1400, 3})
	f.Add(stream, first, uint16(100), true)
	f.Fuzz(func(t *testing.T, stream []byte, first int, cut uint16, markers bool) {
		var a Aligner
		a.SetStart(1 + uint32(first))
		a.Configure(markers)
		step := int(cut%4096) + 1
		for off := 0; off < len(stream); off += step {
			end := min(off+step, len(stream))
			got := a.Classify(1+uint32(off), end-off, sliceReader(stream[off:end]))
			if got.Aligned && got.SplitOff != 0 {
				t.Fatalf("aligned segment with a split: %+v", got)
			}
		}
	})
}

// TestAlignerBeyond follows the in-order edge through gaps, fills,
// retransmissions and more gaps than the Aligner remembers.
func TestAlignerBeyond(t *testing.T) {
	const base = 0xffff_ff00 // the edge wraps
	type seg struct {
		off, n int
		beyond bool
	}
	cases := []struct {
		name string
		segs []seg
	}{
		{"in order", []seg{{0, 100, false}, {100, 100, false}, {200, 50, false}}},
		{"one gap", []seg{{0, 100, false}, {200, 100, true}, {300, 100, true}, {100, 100, false}, {400, 10, false}}},
		{"retransmission", []seg{{0, 100, false}, {50, 100, false}, {0, 150, false}, {150, 10, false}}},
		{"overlapping ahead", []seg{{100, 100, true}, {150, 100, true}, {0, 100, false}, {250, 10, false}}},
		{"fill bridges two ranges", []seg{{100, 50, true}, {200, 50, true}, {150, 50, true}, {0, 100, false}, {250, 1, false}}},
		{"many gaps", []seg{
			{20, 10, true}, {40, 10, true}, {60, 10, true}, {80, 10, true}, {100, 10, true},
			{120, 10, true}, {140, 10, true}, {160, 10, true}, {180, 10, true}, {200, 10, true},
			// Only eight ranges are kept: [180, 190) and [200, 210) were
			// forgotten, so after the fill up to 200 the edge stops there.
			{0, 200, false}, {210, 10, true}, {200, 10, false}, {220, 1, false},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var a Aligner
			a.SetStart(base)
			a.Configure(false)
			for i, s := range c.segs {
				r := a.Classify(base+uint32(s.off), s.n, sliceReader(make([]byte, s.n)))
				if r.Beyond != s.beyond {
					t.Fatalf("segment %d [%d, +%d): Beyond %v, want %v", i, s.off, s.n, r.Beyond, s.beyond)
				}
			}
		})
	}
}
