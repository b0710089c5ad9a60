package mpa

import (
	"os"
	"reflect"
	"testing"
)

func addFrameSeeds(f *testing.F) {
	for _, v := range frameVectors(f) {
		f.Add(v.wire)
	}
	for _, p := range []string{pcapCRC, pcapNoCRC} {
		if b, err := os.ReadFile(p); err == nil {
			if s, err := parsePcap(b); err == nil {
				f.Add(s.init[:FrameHeaderLen+4])
				f.Add(s.resp[:FrameHeaderLen+4])
			}
		}
	}
	f.Add([]byte(keyReq + "\x10\x02\x00\x03abc"))
	f.Add([]byte(keyRep + "\x00\x01\x02\x01"))
}

func FuzzParseFrame(f *testing.F) {
	addFrameSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ParseFrame(b)
		if err != nil {
			return
		}
		if len(fr.PrivateData) > MaxPrivateDataRecv || fr.IRD > IRDORDMax || fr.ORD > IRDORDMax {
			t.Fatalf("ParseFrame accepted out-of-range frame %+v", fr)
		}
		_ = fr.String()
		wire, err := fr.Append(nil)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", fr, err)
		}
		back, err := ParseFrame(wire)
		if err != nil {
			t.Fatalf("re-parsing %x: %v", wire, err)
		}
		if !reflect.DeepEqual(back, fr) {
			t.Fatalf("round trip: %+v became %+v", fr, back)
		}
		if len(wire) != len(b) {
			t.Fatalf("re-encoding changed the length: %d → %d", len(b), len(wire))
		}
	})
}

func FuzzFrameReader(f *testing.F) {
	addFrameSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		chunk := int(b[0])%23 + 1
		var r FrameReader
		used := 0
		done := false
		var err error
		for !done && err == nil && used < len(b) {
			var n int
			n, done, err = r.Feed(b[used:min(used+chunk, len(b))])
			used += n
		}
		if used > len(b) {
			t.Fatalf("consumed %d of %d", used, len(b))
		}
		if !done {
			return
		}
		got, ferr := r.Frame()
		want, perr := ParseFrame(b[:used])
		if (ferr == nil) != (perr == nil) {
			t.Fatalf("FrameReader %v, ParseFrame %v", ferr, perr)
		}
		if ferr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("FrameReader %+v, ParseFrame %+v", got, want)
		}
		if used != FrameHeaderLen+int(b[18])<<8+int(b[19]) {
			t.Fatalf("consumed %d octets of a frame with PD_Length %d", used, int(b[18])<<8+int(b[19]))
		}
	})
}

// strictHandler fails the test if the Receiver breaks the Handler contract.
type strictHandler struct {
	t      *testing.T
	in     bool
	want   int
	got    int
	errAt  int // fail the n-th call (0 = never)
	calls  int
	fpdus  int
	failed bool
}

func (h *strictHandler) call() error {
	h.calls++
	if h.calls == h.errAt {
		h.failed = true
		return errFuzzStop{}
	}
	return nil
}

func (h *strictHandler) BeginFPDU(n int) error {
	if h.failed {
		h.t.Fatal("called after returning an error")
	}
	if h.in || n < 0 || n > MaxULPDULen {
		h.t.Fatalf("BeginFPDU(%d) in=%v", n, h.in)
	}
	h.in, h.want, h.got = true, n, 0
	return h.call()
}

func (h *strictHandler) ULPDU(p []byte) error {
	if h.failed {
		h.t.Fatal("called after returning an error")
	}
	h.got += len(p)
	if !h.in || len(p) == 0 || h.got > h.want {
		h.t.Fatalf("ULPDU: %d octets of %d (chunk %d, in=%v)", h.got, h.want, len(p), h.in)
	}
	return h.call()
}

func (h *strictHandler) EndFPDU(bool) error {
	if h.failed {
		h.t.Fatal("called after returning an error")
	}
	if !h.in || h.got != h.want {
		h.t.Fatalf("EndFPDU after %d of %d octets", h.got, h.want)
	}
	h.in = false
	h.fpdus++
	return h.call()
}

// errFuzzStop is the error strictHandler fails with.
type errFuzzStop struct{}

func (errFuzzStop) Error() string { return "fuzz handler stop" }

func FuzzReceiver(f *testing.F) {
	for _, st := range fpduStreams() {
		var s Sender
		s.Init(st.crc, st.markers)
		var stream []byte
		for _, c := range st.cases {
			s.Begin(stream, len(c.ulpdu))
			s.Write(c.ulpdu)
			stream = s.Finish()
		}
		var flags byte
		if st.crc {
			flags |= 1
		}
		if st.markers {
			flags |= 2
		}
		// Small seeds keep the fuzzer's minimization fast.
		stream = stream[:min(len(stream), 1600)]
		f.Add(flags, byte(7), stream)
		f.Add(flags|4, byte(1), stream)
	}
	for _, p := range []string{pcapCRC, pcapNoCRC} {
		if b, err := os.ReadFile(p); err == nil {
			if s, err := parsePcap(b); err == nil {
				f.Add(byte(1), byte(200), s.init[FrameHeaderLen+4:][:1600])
				f.Add(byte(0), byte(3), s.resp[FrameHeaderLen+4:][:1600])
			}
		}
	}
	f.Fuzz(func(t *testing.T, flags, chunk byte, stream []byte) {
		h := &strictHandler{t: t}
		if flags&4 != 0 {
			h.errAt = int(chunk%16) + 1
		}
		var r Receiver
		r.Init(flags&1 != 0, flags&2 != 0, h)
		step := int(chunk)%64 + 1
		total := 0
		var err error
		for p := stream; len(p) > 0 && err == nil; {
			n := min(step, len(p))
			var m int
			m, err = r.Write(p[:n])
			if m > n || (err == nil && m != n) {
				t.Fatalf("Write(%d octets) = %d, %v", n, m, err)
			}
			total += m
			p = p[n:]
		}
		if err != nil {
			if h.failed && err != (errFuzzStop{}) {
				t.Fatalf("handler error replaced by %v", err)
			}
			if _, err2 := r.Write([]byte{0}); err2 != err {
				t.Fatalf("error not sticky: %v then %v", err, err2)
			}
		}
		st := r.Stats()
		if st.Bytes != uint64(total) || st.FPDUs != uint64(h.fpdus) {
			t.Fatalf("stats %+v, consumed %d, %d FPDUs", st, total, h.fpdus)
		}
	})
}
