package mpa

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestSenderWireLenAndMax(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, markers := range []bool{false, true} {
		var s Sender
		s.Init(false, markers)
		for range 300 {
			for _, seg := range []int{0, 7, 8, 9, 24, 100, 508, 512, 516, 1420, 1448, 8920, 70000} {
				m := s.MaxULPDULen(seg)
				if m == 0 {
					if s.WireLen(0) <= seg && s.WireLen(1) <= seg {
						t.Fatalf("markers=%v pos %d seg %d: MaxULPDULen 0 but 1 fits", markers, s.StreamOffset(), seg)
					}
					continue
				}
				if s.WireLen(m) > seg {
					t.Fatalf("markers=%v pos %d seg %d: WireLen(%d) = %d", markers, s.StreamOffset(), seg, m, s.WireLen(m))
				}
				if m < MaxULPDULen && s.WireLen(m+1) <= seg {
					t.Fatalf("markers=%v pos %d seg %d: %d is not the largest", markers, s.StreamOffset(), seg, m)
				}
			}
			// Advance by a random FPDU and check WireLen against reality.
			l := rng.IntN(2000)
			wl := s.WireLen(l)
			s.Begin(nil, l)
			s.Write(make([]byte, l))
			if got := len(s.Finish()); got != wl {
				t.Fatalf("WireLen(%d) = %d, FPDU is %d", l, wl, got)
			}
		}
	}
	// A segment-sized FPDU fills the segment exactly when the pad allows it.
	var s Sender
	s.Init(true, false)
	if m := s.MaxULPDULen(1448); m != 1442 || s.WireLen(m) != 1448 {
		t.Errorf("MaxULPDULen(1448) = %d (WireLen %d), want 1442 (1448)", m, s.WireLen(m))
	}
}

func TestSenderPanics(t *testing.T) {
	tests := []struct {
		name string
		f    func(s *Sender)
	}{
		{name: "write past length", f: func(s *Sender) { s.Begin(nil, 2); s.Write([]byte{1, 2, 3}) }},
		{name: "finish short", f: func(s *Sender) { s.Begin(nil, 2); s.Write([]byte{1}); s.Finish() }},
		{name: "begin twice", f: func(s *Sender) { s.Begin(nil, 2); s.Begin(nil, 2) }},
		{name: "write without begin", f: func(s *Sender) { s.Write([]byte{1}) }},
		{name: "finish without begin", f: func(s *Sender) { s.Finish() }},
		{name: "too long", f: func(s *Sender) { s.Begin(nil, MaxULPDULen+1) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("no panic")
				}
			}()
			var s Sender
			s.Init(true, true)
			tt.f(&s)
		})
	}
	defer func() {
		if recover() == nil {
			t.Errorf("Begin before Init: no panic")
		}
	}()
	var s Sender
	s.Begin(nil, 1)
}

// TestSenderCRCWhileCopying checks the FPDUs of a Sender whose pieces are
// long enough to be checksummed as they are copied (fuseMin) against the
// octet-at-a-time oracle: ULPDUs up to a jumbo FPDU's, written in random
// pieces from one octet to thousands (so fused pieces sit between short
// ones, Markers and headers), into buffers too small as often as not (so
// they grow while an FPDU is built).
func TestSenderCRCWhileCopying(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, markers := range []bool{false, true} {
		var s Sender
		s.Init(true, markers)
		fused := 0
		for i := range 400 {
			ulpdu := make([]byte, rng.IntN(9000))
			for j := range ulpdu {
				ulpdu[j] = byte(rng.Uint32())
			}
			start := s.StreamOffset()
			s.Begin(make([]byte, 0, rng.IntN(2*len(ulpdu)+1)), len(ulpdu))
			for p := ulpdu; len(p) > 0; {
				n := min(len(p), 1+rng.IntN(3000))
				if n >= fuseMin {
					fused++
				}
				s.Write(p[:n])
				p = p[n:]
			}
			got := s.Finish()
			if want := refFPDU(start, ulpdu, true, markers, PtrFromFPDUStart); !bytes.Equal(got, want) {
				t.Fatalf("markers=%v, FPDU %d (%d octets at %d): Sender built\n%x\nwant\n%x", markers, i, len(ulpdu), start, got, want)
			}
		}
		if fused == 0 {
			t.Fatalf("markers=%v: no piece was long enough to be checksummed while copied", markers)
		}
	}
}
