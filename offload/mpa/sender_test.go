package mpa

import (
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
