package mpa

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli) // test oracle only

// refFPDU is a deliberately naive, octet-at-a-time FPDU builder used as an
// oracle for the Sender: start is the FPDU's stream offset.
func refFPDU(start uint64, ulpdu []byte, crcOn, markers bool, ptr MarkerPtr) []byte {
	body := binary.BigEndian.AppendUint16(nil, uint16(len(ulpdu)))
	body = append(body, ulpdu...)
	for len(body)%4 != 0 {
		body = append(body, 0)
	}
	var out []byte
	pos := start
	leading := false
	marker := func() {
		d := pos - start
		if d == 0 {
			leading = true
		} else if leading && ptr == PtrFromULPDULength {
			d -= 4
		}
		out = append(out, 0, 0, byte(d>>8), byte(d))
		pos += 4
	}
	for _, c := range body {
		if markers && pos%512 == 0 {
			marker()
		}
		out = append(out, c)
		pos++
	}
	if markers && pos%512 == 0 {
		marker()
	}
	var crc uint32
	if crcOn {
		crc = crc32.Checksum(out, castagnoli)
	}
	return binary.LittleEndian.AppendUint32(out, crc)
}

func TestCRCCheckValue(t *testing.T) {
	if got := crc32.Checksum([]byte("123456789"), crc32.MakeTable(crc32.Castagnoli)); got != 0xE3069283 {
		t.Fatalf("CRC32c(123456789) = %#x, want 0xe3069283", got)
	}
	// An FPDU whose CRC input is known: ULPDU_Length 7 + "1234567" =
	// "\x00\x07" "1234567" + pad 3. The trailer carries the standard
	// value least-significant octet first (as siw does).
	var s Sender
	s.Init(true, false)
	s.Begin(nil, 7)
	s.Write([]byte("1234567"))
	f := s.Finish()
	body := []byte("\x00\x071234567\x00\x00\x00")
	if !bytes.Equal(f[:12], body) {
		t.Fatalf("FPDU body = %x, want %x", f[:12], body)
	}
	want := crc32.Checksum(body, castagnoli)
	wantWire := []byte{byte(want), byte(want >> 8), byte(want >> 16), byte(want >> 24)}
	if !bytes.Equal(f[12:], wantWire) {
		t.Errorf("CRC trailer = %x, want %x (LE of %#x)", f[12:], wantWire, want)
	}
	// The check string itself in LE order: 83 92 06 E3.
	if got := binary.LittleEndian.AppendUint32(nil, 0xE3069283); !bytes.Equal(got, []byte{0x83, 0x92, 0x06, 0xE3}) {
		t.Errorf("LE(0xE3069283) = %x", got)
	}
}

// fpduCase is one FPDU of a golden FPDU stream.
type fpduCase struct {
	name  string
	ulpdu []byte
	wire  string // expected wire bytes in hex; "" = check against refFPDU only
}

// fpduStreams are golden FPDU streams: each case is sent in order on one
// stream starting at offset 0.
func fpduStreams() []struct {
	name    string
	crc     bool
	markers bool
	cases   []fpduCase
} {
	h14 := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	return []struct {
		name    string
		crc     bool
		markers bool
		cases   []fpduCase
	}{
		{
			name: "pad 0..3 no crc",
			cases: []fpduCase{
				{name: "pad 0", ulpdu: []byte{0xaa, 0xbb}, wire: "0002aabb 00000000"},
				{name: "pad 1", ulpdu: []byte{0xaa}, wire: "0001aa00 00000000"},
				{name: "pad 2", ulpdu: nil, wire: "00000000 00000000"},
				{name: "pad 3", ulpdu: []byte{1, 2, 3}, wire: "0003010203000000 00000000"},
			},
		},
		{
			name: "pad 0..3 crc",
			crc:  true,
			cases: []fpduCase{
				{name: "pad 0", ulpdu: []byte{0xaa, 0xbb}},
				{name: "pad 1", ulpdu: []byte{0xaa}},
				{name: "pad 2", ulpdu: nil},
				{name: "pad 3", ulpdu: []byte{1, 2, 3}},
			},
		},
		{
			name:    "marker at FPDU start, inside header, between pad and CRC",
			markers: true,
			cases: []fpduCase{
				// Stream offset 0: the first Marker leads the first FPDU.
				{name: "leading marker", ulpdu: []byte{0x11, 0x22, 0x33}, wire: "00000000 0003112233000000 00000000"},
				// 16 + 492 = 508.
				{name: "filler to 508", ulpdu: seq(486)},
				// At 508: ULPDU_Length, 2 header octets, Marker (FPDUPTR 4).
				{name: "marker inside DDP header", ulpdu: h14, wire: "000e0102 00000004 030405060708090a0b0c0d0e 00000000"},
				// 508+24 = 532 → fill to 1020.
				{name: "filler to 1020", ulpdu: seq(482)},
				// At 1020: length + 1 octet + pad 1 reach 1024: Marker, then CRC.
				{name: "marker between pad and CRC", ulpdu: []byte{0xaa}, wire: "0001aa00 00000004 00000000"},
				// 1032 → 1528.
				{name: "filler to 1528", ulpdu: seq(490)},
				// At 1528: CRC ends at 1536, the FPDU boundary.
				{name: "ends at boundary", ulpdu: []byte{0xbb, 0xcc}, wire: "0002bbcc 00000000"},
				{name: "marker at boundary leads the next FPDU", ulpdu: []byte{0xdd, 0xee}, wire: "00000000 0002ddee 00000000"},
				// At 1548: markers at 2048 and 2560 inside one FPDU.
				{name: "two markers in one FPDU", ulpdu: seq(1100)},
				// 2664 → 3072.
				{name: "filler to 3072", ulpdu: seq(402)},
				{name: "leading marker then later markers", ulpdu: seq(2000)},
			},
		},
		{
			name:    "markers and crc",
			crc:     true,
			markers: true,
			cases: []fpduCase{
				{name: "leading marker", ulpdu: []byte{0x11, 0x22, 0x33}},
				{name: "filler to 508", ulpdu: seq(486)},
				{name: "marker inside DDP header", ulpdu: h14},
				{name: "filler to 1020", ulpdu: seq(482)},
				{name: "marker between pad and CRC", ulpdu: []byte{0xaa}},
				{name: "filler to 1528", ulpdu: seq(490)},
				{name: "ends at boundary", ulpdu: []byte{0xbb, 0xcc}},
				{name: "marker at boundary leads the next FPDU", ulpdu: []byte{0xdd, 0xee}},
				{name: "two markers in one FPDU", ulpdu: seq(1100)},
				{name: "filler to 3072", ulpdu: seq(402)},
				{name: "big, leading marker then 17 more", ulpdu: seq(9000)},
			},
		},
	}
}

func TestSenderGolden(t *testing.T) {
	for _, st := range fpduStreams() {
		for _, ptr := range []MarkerPtr{PtrFromFPDUStart, PtrFromULPDULength} {
			if ptr == PtrFromULPDULength && !st.markers {
				continue
			}
			t.Run(st.name+"/"+ptr.String(), func(t *testing.T) {
				var s Sender
				s.Init(st.crc, st.markers)
				s.SetMarkerPtr(ptr)
				buf := make([]byte, 0, 1<<17)
				for _, c := range st.cases {
					start := s.StreamOffset()
					wl := s.WireLen(len(c.ulpdu))
					s.Begin(buf[:0], len(c.ulpdu))
					// Header and payload in uneven chunks.
					for p := c.ulpdu; len(p) > 0; {
						n := min(len(p), 1+len(p)/3)
						s.Write(p[:n])
						p = p[n:]
					}
					got := s.Finish()
					want := refFPDU(start, c.ulpdu, st.crc, st.markers, ptr)
					if c.wire != "" && ptr == PtrFromFPDUStart {
						if w := testkit.Hex(t, c.wire); !bytes.Equal(want, w) {
							t.Fatalf("%s: oracle %x disagrees with golden %x", c.name, want, w)
						}
					}
					if !bytes.Equal(got, want) {
						t.Errorf("%s at %d: Sender built\n%x\nwant\n%x", c.name, start, got, want)
					}
					if wl != len(got) {
						t.Errorf("%s at %d: WireLen = %d, FPDU is %d", c.name, start, wl, len(got))
					}
					if s.StreamOffset() != start+uint64(len(got)) {
						t.Errorf("%s: StreamOffset %d after %d+%d", c.name, s.StreamOffset(), start, len(got))
					}
					if st.crc {
						crc := crc32.Checksum(got[:len(got)-4], castagnoli)
						if binary.LittleEndian.Uint32(got[len(got)-4:]) != crc {
							t.Errorf("%s: CRC does not cover all octets incl. markers", c.name)
						}
					}
				}
			})
		}
	}
}

func TestReceiverGolden(t *testing.T) {
	for _, st := range fpduStreams() {
		for _, ptr := range []MarkerPtr{PtrFromFPDUStart, PtrFromULPDULength} {
			if ptr == PtrFromULPDULength && !st.markers {
				continue
			}
			t.Run(st.name+"/"+ptr.String(), func(t *testing.T) {
				var stream []byte
				var want [][]byte
				var s Sender
				s.Init(st.crc, st.markers)
				s.SetMarkerPtr(ptr)
				for _, c := range st.cases {
					s.Begin(stream, len(c.ulpdu))
					s.Write(c.ulpdu)
					stream = s.Finish()
					want = append(want, append([]byte{}, c.ulpdu...))
				}
				for _, chunk := range []int{1, 2, 3, 5, 511, 512, 513, len(stream)} {
					rec := &recorder{t: t}
					var r Receiver
					r.Init(st.crc, st.markers, rec)
					for p := stream; len(p) > 0; {
						n := min(chunk, len(p))
						if m, err := r.Write(p[:n]); err != nil || m != n {
							t.Fatalf("chunk %d: Write = %d, %v", chunk, m, err)
						}
						p = p[n:]
					}
					for i := range rec.ulpdus {
						if len(rec.ulpdus[i]) == 0 {
							rec.ulpdus[i] = []byte{}
						}
					}
					if !reflect.DeepEqual(rec.ulpdus, want) {
						t.Fatalf("chunk %d: ULPDUs differ", chunk)
					}
					for i, ok := range rec.crcOK {
						if !ok {
							t.Errorf("chunk %d: FPDU %d CRC mismatch", chunk, i)
						}
					}
					stats := r.Stats()
					if stats.Bytes != uint64(len(stream)) || stats.FPDUs != uint64(len(want)) || stats.BadMarkers != 0 {
						t.Errorf("chunk %d: stats %+v", chunk, stats)
					}
					if st.markers {
						if wantM := uint64((len(stream) + 511) / 512); stats.Markers != wantM {
							t.Errorf("chunk %d: %d markers, want %d", chunk, stats.Markers, wantM)
						}
						// Only the "leading then later markers" FPDUs tell the readings apart.
						fromStart, fromLen := stats.PtrFromFPDUStart, stats.PtrFromULPDULength
						if ptr == PtrFromFPDUStart && (fromStart == 0 || fromLen != 0) ||
							ptr == PtrFromULPDULength && (fromLen == 0 || fromStart != 0) {
							t.Errorf("chunk %d: reading counts start=%d len=%d for a %v sender", chunk, fromStart, fromLen, ptr)
						}
					}
				}
			})
		}
	}
}

// markedStream builds a stream of FPDUs with the given options and returns
// it with each FPDU's stream offset.
func markedStream(rng *rand.Rand, n int, crc, markers bool, maxLen int) (stream []byte, starts []uint64, ulpdus [][]byte) {
	var s Sender
	s.Init(crc, markers)
	if rng.IntN(2) == 0 {
		s.SetMarkerPtr(PtrFromULPDULength)
	}
	for range n {
		l := rng.IntN(maxLen + 1)
		if rng.IntN(8) == 0 {
			l = rng.IntN(4)
		}
		u := make([]byte, l)
		for i := range u {
			u[i] = byte(rng.Uint32())
		}
		starts = append(starts, s.StreamOffset())
		s.Begin(stream, l)
		s.Write(u)
		stream = s.Finish()
		ulpdus = append(ulpdus, u)
	}
	return stream, starts, ulpdus
}

// feedRandom writes stream to r in random chunks (many of 1 octet).
func feedRandom(rng *rand.Rand, r *Receiver, stream []byte) (int, error) {
	done := 0
	for len(stream) > 0 {
		var n int
		switch rng.IntN(4) {
		case 0:
			n = 1
		case 1:
			n = rng.IntN(8) + 1
		case 2:
			n = rng.IntN(1500) + 1
		default:
			n = rng.IntN(9000) + 1
		}
		n = min(n, len(stream))
		m, err := r.Write(stream[:n])
		done += m
		if err != nil {
			return done, err
		}
		stream = stream[n:]
	}
	return done, nil
}

func TestRoundTripProperty(t *testing.T) {
	for _, crc := range []bool{false, true} {
		for _, markers := range []bool{false, true} {
			for seed := range uint64(20) {
				rng := rand.New(rand.NewPCG(seed, 0x6d7061))
				maxLen := 3000
				if seed%4 == 3 {
					maxLen = 9000
				}
				stream, starts, want := markedStream(rng, 60, crc, markers, maxLen)
				rec := &recorder{t: t}
				var r Receiver
				r.Init(crc, markers, rec)
				if n, err := feedRandom(rng, &r, stream); err != nil || n != len(stream) {
					t.Fatalf("crc=%v markers=%v seed=%d: fed %d of %d: %v", crc, markers, seed, n, len(stream), err)
				}
				if len(rec.ulpdus) != len(want) {
					t.Fatalf("seed %d: %d ULPDUs, want %d", seed, len(rec.ulpdus), len(want))
				}
				for i := range want {
					if !bytes.Equal(rec.ulpdus[i], want[i]) || !rec.crcOK[i] {
						t.Fatalf("crc=%v markers=%v seed=%d: FPDU %d differs or bad CRC", crc, markers, seed, i)
					}
				}

				// A corrupted octet inside the ULPDU (not a Marker, not the
				// length): the CRC catches it, or with CRC off the data differs.
				i := rng.IntN(len(want))
				for len(want[i]) == 0 {
					i = rng.IntN(len(want))
				}
				var pos uint64
				for {
					pos = starts[i] + 2 + uint64(rng.IntN(len(want[i])+8))
					if markers && starts[i]%512 == 0 {
						pos += 4
					}
					end := uint64(len(stream))
					if i+1 < len(starts) {
						end = starts[i+1]
					}
					if pos < end-4 && (!markers || pos%512 >= 4) {
						break
					}
				}
				bad := append([]byte(nil), stream...)
				bad[pos] ^= 0x40
				rec = &recorder{t: t}
				r.Init(crc, markers, rec)
				if _, err := feedRandom(rng, &r, bad); err != nil {
					t.Fatalf("seed %d: corrupted data octet gave error %v", seed, err)
				}
				if crc {
					for j, ok := range rec.crcOK {
						if ok == (j == i) {
							t.Fatalf("seed %d: corrupted FPDU %d: crcOK %v for FPDU %d", seed, i, ok, j)
						}
					}
					if r.Stats().CRCErrors != 1 {
						t.Errorf("seed %d: CRCErrors = %d", seed, r.Stats().CRCErrors)
					}
				}

				if !markers {
					continue
				}
				// A corrupted Marker: FPDUPTR high octet.
				m := uint64(rng.IntN(len(stream)/512+1)) * 512
				if m >= uint64(len(stream)) {
					m = 0
				}
				bad = append([]byte(nil), stream...)
				bad[m+2] ^= 0x10
				rec = &recorder{t: t}
				r.Init(crc, markers, rec)
				n, err := feedRandom(rng, &r, bad)
				var me *Error
				if !errors.As(err, &me) || me.Code != CodeMarkerMismatch {
					t.Fatalf("seed %d: corrupted marker at %d: err %v, want code 0x03", seed, m, err)
				}
				if uint64(n) != m+4 {
					t.Errorf("seed %d: consumed %d, marker ends at %d", seed, n, m+4)
				}
				if r.Stats().BadMarkers != 1 {
					t.Errorf("seed %d: BadMarkers = %d", seed, r.Stats().BadMarkers)
				}
				if _, err2 := r.Write([]byte{0}); err2 != err {
					t.Errorf("error not sticky: %v", err2)
				}
			}
		}
	}
}

func TestReceiverMarkerErrors(t *testing.T) {
	tests := []struct {
		name string
		wire string
	}{
		{name: "leading marker with FPDUPTR 4", wire: "00000004 0002aabb 00000000"},
		{name: "leading marker with FPDUPTR 512", wire: "00000200 0002aabb 00000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Receiver
			r.Init(false, true, &recorder{t: t})
			n, err := r.Write(testkit.Hex(t, tt.wire))
			var me *Error
			if !errors.As(err, &me) || me.Code != CodeMarkerMismatch || n != 4 {
				t.Fatalf("Write = %d, %v; want 4, code 0x03", n, err)
			}
		})
	}
	// An FPDU without a leading marker only accepts the exact distance.
	var s Sender
	s.Init(false, true)
	var stream []byte
	s.Begin(stream, 498)
	s.Write(seq(498))
	stream = s.Finish() // 508 octets
	s.Begin(stream, 14)
	s.Write(seq(14))
	stream = s.Finish()
	if binary.BigEndian.Uint16(stream[514:]) != 4 {
		t.Fatalf("setup: marker at 512 = %x", stream[512:516])
	}
	for _, v := range []uint16{0, 8, 4 + 512, 0xfffc} {
		bad := append([]byte(nil), stream...)
		binary.BigEndian.PutUint16(bad[514:], v)
		var r Receiver
		r.Init(false, true, &recorder{t: t})
		if _, err := r.Write(bad); code(err) != int(CodeMarkerMismatch) {
			t.Errorf("FPDUPTR %d: err %v, want code 0x03", v, err)
		}
	}
	// The low two bits and the reserved half are ignored.
	for _, v := range [][2]uint16{{0, 5}, {0, 7}, {0xffff, 4}} {
		ok := append([]byte(nil), stream...)
		binary.BigEndian.PutUint16(ok[512:], v[0])
		binary.BigEndian.PutUint16(ok[514:], v[1])
		var r Receiver
		r.Init(false, true, &recorder{t: t})
		if _, err := r.Write(ok); err != nil {
			t.Errorf("marker %04x%04x: %v", v[0], v[1], err)
		}
	}
}

// errHandler fails at a chosen call.
type errHandler struct {
	failAt string
	err    error
}

func (h *errHandler) BeginFPDU(int) error {
	if h.failAt == "begin" {
		return h.err
	}
	return nil
}

func (h *errHandler) ULPDU([]byte) error {
	if h.failAt == "ulpdu" {
		return h.err
	}
	return nil
}

func (h *errHandler) EndFPDU(bool) error {
	if h.failAt == "end" {
		return h.err
	}
	return nil
}

func TestReceiverHandlerErrors(t *testing.T) {
	wire := testkit.Hex(t, "0003112233000000 00000000 0001aa00 00000000")
	tests := []struct {
		failAt string
		want   int // octets consumed when the error is returned
	}{
		{failAt: "begin", want: 2},
		{failAt: "ulpdu", want: 5},
		{failAt: "end", want: 12},
	}
	for _, tt := range tests {
		t.Run(tt.failAt, func(t *testing.T) {
			sentinel := errors.New("handler says no")
			var r Receiver
			r.Init(true, false, &errHandler{failAt: tt.failAt, err: sentinel})
			n, err := r.Write(wire)
			if err != sentinel || n != tt.want {
				t.Fatalf("Write = %d, %v; want %d, the handler's error as is", n, err, tt.want)
			}
			if _, err := r.Write(wire); err != sentinel {
				t.Errorf("error not sticky: %v", err)
			}
		})
	}
}

func TestReceiverNotInitialized(t *testing.T) {
	var r Receiver
	if _, err := r.Write([]byte{0}); err == nil {
		t.Fatal("Write on an uninitialized Receiver: no error")
	}
}

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

// nopHandler counts octets.
type nopHandler struct{ n, fpdus int }

func (h *nopHandler) BeginFPDU(int) error   { return nil }
func (h *nopHandler) ULPDU(p []byte) error  { h.n += len(p); return nil }
func (h *nopHandler) EndFPDU(ok bool) error { h.fpdus++; return nil }

func TestFPDUZeroAlloc(t *testing.T) {
	for _, crc := range []bool{false, true} {
		for _, markers := range []bool{false, true} {
			var s Sender
			s.Init(crc, markers)
			buf := make([]byte, 0, 1<<16)
			payload := seq(1400)
			hdr := seq(18)
			allocs := testing.AllocsPerRun(200, func() {
				s.Begin(buf[:0], len(hdr)+len(payload))
				s.Write(hdr)
				s.Write(payload)
				s.Finish()
			})
			if allocs != 0 {
				t.Errorf("crc=%v markers=%v: Sender allocates %v per FPDU", crc, markers, allocs)
			}
			var r Receiver
			h := &nopHandler{}
			r.Init(crc, markers, h)
			// Feed the receiver a consistent stream: rebuild from offset 0.
			s.Init(crc, markers)
			var stream []byte
			for range 8 {
				s.Begin(stream, 1418)
				s.Write(seq(1418))
				stream = s.Finish()
			}
			allocs = testing.AllocsPerRun(10, func() {
				r.Init(crc, markers, h)
				for p := stream; len(p) > 0; {
					n := min(len(p), 1448)
					if _, err := r.Write(p[:n]); err != nil {
						t.Fatal(err)
					}
					p = p[n:]
				}
			})
			if allocs != 0 {
				t.Errorf("crc=%v markers=%v: Receiver allocates %v per stream", crc, markers, allocs)
			}
		}
	}
}

// TestCanonicalCRCTable guards the fast CRC path: hash/crc32 uses SSE4.2
// (amd64) or the CRC32 instructions (arm64) only for the very table
// crc32.MakeTable(crc32.Castagnoli) returns, never for a copy.
func TestCanonicalCRCTable(t *testing.T) {
	canon := crc32.MakeTable(crc32.Castagnoli)
	var s Sender
	s.Init(true, true)
	var r Receiver
	r.Init(true, true, &nopHandler{})
	if s.tab != canon || r.tab != canon {
		t.Fatalf("CRC table is not the canonical Castagnoli table")
	}
}
