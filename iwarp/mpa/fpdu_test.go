package mpa

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
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
