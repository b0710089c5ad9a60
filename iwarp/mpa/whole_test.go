package mpa

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

// withCRC fills in the CRC trailer of the FPDU seg[off:off+n].
func withCRC(seg []byte, off, n int) []byte {
	binary.LittleEndian.PutUint32(seg[off+n-4:], crc32.Checksum(seg[off:off+n-4], crc32.MakeTable(crc32.Castagnoli)))
	return seg
}

// TestFindFPDUsGolden checks hand-built segments octet by octet.
func TestFindFPDUsGolden(t *testing.T) {
	type want struct {
		off, n   int
		byMarker bool
		ulpdu    string
	}
	cases := []struct {
		name    string
		seg     []byte
		pos     uint32
		markers bool
		crc     bool
		want    []want
	}{{
		// Two FPDUs, no Markers: "ABCDEF" (2+6 = 8, no pad) and "xyz"
		// (2+3 = 5, 3 pad octets), each with its CRC.
		name: "aligned, no markers",
		seg: withCRC(withCRC(testkit.Hex(t, "0006 414243444546 00000000"+
			"0003 78797a 000000 00000000"), 0, 12), 12, 12),
		pos:  1000,
		crc:  true,
		want: []want{{0, 12, false, "ABCDEF"}, {12, 12, false, "xyz"}},
	}, {
		// The segment starts 12 octets before a Marker (stream 500): the
		// tail of an FPDU, then the Marker (FPDUPTR 0, a leading Marker)
		// and an FPDU "ABCDEF".
		name:    "leading marker inside the segment",
		seg:     testkit.Hex(t, "0102030405060708090a0b0c 00000000 0006 414243444546 00000000"),
		pos:     500,
		markers: true,
		want:    []want{{12, 16, true, "ABCDEF"}},
	}, {
		// A Marker in the middle of an FPDU that starts at stream 508 (seg
		// offset 8): FPDUPTR 4. The FPDU is "0006 'AB' marker 'CDEF'
		// pad(none) CRC".
		name:    "marker inside an FPDU",
		seg:     testkit.Hex(t, "aaaaaaaaaaaaaaaa 0006 4142 00000004 43444546 00000000 bbbb"),
		pos:     500,
		markers: true,
		want:    []want{{8, 16, true, "ABCDEF"}},
	}, {
		// A Marker whose FPDUPTR (16) points before the segment: the FPDU
		// is not whole, nothing is found.
		name:    "marker pointing before the segment",
		seg:     testkit.Hex(t, "4142 0000 00000010 43444546"),
		pos:     508,
		markers: true,
	}, {
		// A Marker that disagrees with the FPDU it sits in: dropped.
		name:    "disagreeing marker",
		seg:     testkit.Hex(t, "aaaaaaaaaaaaaaaa 0006 4142 00000008 43444546 00000000"),
		pos:     500,
		markers: true,
	}, {
		// Aligned but split at the end: nothing (no Markers to go by).
		name: "split, no markers",
		seg:  testkit.Hex(t, "0006 414243444546 00000000 0010 41"),
		pos:  0,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := FindFPDUs(nil, c.seg, c.pos, c.markers)
			if len(got) != len(c.want) {
				t.Fatalf("found %+v, want %d FPDUs", got, len(c.want))
			}
			for i, w := range c.want {
				g := got[i]
				if g.Off != w.off || g.Len != w.n || g.ByMarker != w.byMarker {
					t.Errorf("FPDU %d = %+v, want off %d len %d byMarker %v", i, g, w.off, w.n, w.byMarker)
				}
				u, ok := g.ULPDU(nil, c.seg, c.pos, c.markers, c.crc)
				if !ok || string(u) != w.ulpdu {
					t.Errorf("FPDU %d ULPDU %q (crc ok %v), want %q", i, u, ok, w.ulpdu)
				}
			}
		})
	}
}

// TestFindFPDUsLeadingMarkerReadings: a Marker after a leading Marker may
// count FPDUPTR from the FPDU's first octet or from its ULPDU_Length; both
// locate the same FPDU, and a CRC error is reported.
func TestFindFPDUsLeadingMarkerReadings(t *testing.T) {
	for _, ptr := range []MarkerPtr{PtrFromFPDUStart, PtrFromULPDULength} {
		t.Run(ptr.String(), func(t *testing.T) {
			var s Sender
			s.Init(true, true)
			s.SetMarkerPtr(ptr)
			first := sendFPDU(t, &s, bytes.Repeat([]byte{1}, 500))  // stream 0 on
			second := sendFPDU(t, &s, bytes.Repeat([]byte{7}, 700)) // starts at a Marker position
			if s0 := len(first); s0%MarkerInterval != 0 {
				t.Fatalf("second FPDU starts at %d, not at a Marker", s0)
			}
			// The segment starts 20 octets into the first FPDU.
			seg := append(append([]byte(nil), first[20:]...), second...)
			pos := uint32(20)
			got := FindFPDUs(nil, seg, pos, true)
			if len(got) != 1 || got[0].Off != len(first)-20 || got[0].Len != len(second) || !got[0].ByMarker {
				t.Fatalf("found %+v, want the second FPDU at %d (+%d)", got, len(first)-20, len(second))
			}
			u, ok := got[0].ULPDU(nil, seg, pos, true, true)
			if !ok || !bytes.Equal(u, bytes.Repeat([]byte{7}, 700)) {
				t.Fatalf("ULPDU of %d octets, crc ok %v", len(u), ok)
			}
			seg[len(seg)-10] ^= 1
			if _, ok := got[0].ULPDU(nil, seg, pos, true, true); ok {
				t.Fatal("CRC error not found")
			}
		})
	}
}

// sendFPDU builds the next FPDU of s carrying ulpdu.
func sendFPDU(t testing.TB, s *Sender, ulpdu []byte) []byte {
	t.Helper()
	s.Begin(nil, len(ulpdu))
	s.Write(ulpdu)
	return s.Finish()
}

// TestFindFPDUsStreams cuts Sender-built streams (markers and CRC on and
// off, FPDUs of many sizes) into segments — on FPDU boundaries and at
// random points — and checks that every FPDU found is a real one with its
// ULPDU intact, that aligned segments are found whole, and that with
// Markers every whole FPDU holding a Marker is found.
func TestFindFPDUsStreams(t *testing.T) {
	for _, markers := range []bool{false, true} {
		for _, crc := range []bool{false, true} {
			t.Run(fmt.Sprintf("markers=%v/crc=%v", markers, crc), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(btoi(markers)*2+btoi(crc)), 9))
				var s Sender
				s.Init(crc, markers)
				var stream []byte
				type real struct {
					off, n int
					ulpdu  []byte
				}
				var fpdus []real
				for i := 0; i < 300; i++ {
					u := make([]byte, 2+rng.IntN(1500))
					for j := range u {
						u[j] = byte(rng.Uint32())
					}
					off := len(stream)
					s.Begin(stream, len(u))
					s.Write(u)
					stream = s.Finish()
					fpdus = append(fpdus, real{off, len(stream) - off, u})
				}
				byOff := map[int]real{}
				for _, f := range fpdus {
					byOff[f.off] = f
				}
				check := func(lo, hi int, aligned bool) {
					seg := stream[lo:hi]
					pos := uint32(lo) + 0xffff_fe00 // wraps: only pos mod 512 matters
					got := FindFPDUs(nil, seg, pos, markers)
					seen := map[int]bool{}
					for _, g := range got {
						r, ok := byOff[lo+g.Off]
						if !ok || r.n != g.Len {
							t.Fatalf("segment [%d, %d): %+v is not an FPDU", lo, hi, g)
						}
						u, ok := g.ULPDU(nil, seg, pos, markers, crc)
						if !ok || !bytes.Equal(u, r.ulpdu) {
							t.Fatalf("segment [%d, %d): FPDU at %d: ULPDU differs (crc ok %v)", lo, hi, r.off, ok)
						}
						seen[r.off] = true
						hasMarker := markers && (r.off%MarkerInterval == 0 || r.off/MarkerInterval != (r.off+r.n-1)/MarkerInterval)
						if hasMarker && !g.ByMarker {
							t.Fatalf("segment [%d, %d): FPDU at %d holds a Marker but is not ByMarker", lo, hi, r.off)
						}
					}
					for _, r := range fpdus {
						if r.off < lo || r.off+r.n > hi {
							continue
						}
						hasMarker := markers && (r.off%MarkerInterval == 0 || r.off/MarkerInterval != (r.off+r.n-1)/MarkerInterval)
						if (aligned || hasMarker) && !seen[r.off] {
							t.Fatalf("segment [%d, %d) (aligned %v): FPDU [%d, +%d) not found; found %+v", lo, hi, aligned, r.off, r.n, got)
						}
					}
				}
				// Aligned segments of 1 to 3 FPDUs.
				for i := 0; i < len(fpdus); {
					k := min(1+rng.IntN(3), len(fpdus)-i)
					last := fpdus[i+k-1]
					check(fpdus[i].off, last.off+last.n, true)
					i += k
				}
				// Random cuts.
				for range 2000 {
					lo := rng.IntN(len(stream))
					hi := min(len(stream), lo+1+rng.IntN(4000))
					check(lo, hi, false)
				}
			})
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func FuzzFindFPDUs(f *testing.F) {
	var s Sender
	s.Init(true, true)
	f.Add(sendFPDU(f, &s, []byte("hello, world")), uint32(0), true, true)
	f.Add(sendFPDU(f, &s, bytes.Repeat([]byte{3}, 900)), uint32(20), true, false)
	f.Add([]byte("\x00\x06ABCDEF\x00\x00\x00\x00"), uint32(7), false, false)
	f.Add([]byte("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x00\x00\x00\x00\x00\x06ABCDEF\x00\x00\x00\x00"), uint32(500), true, false)
	f.Fuzz(func(t *testing.T, seg []byte, pos uint32, markers, crc bool) {
		got := FindFPDUs(nil, seg, pos, markers)
		end := 0
		for _, g := range got {
			if g.Off < end || g.Len < 8 || g.Off+g.Len > len(seg) {
				t.Fatalf("FPDU %+v overlaps or is out of [%d, %d)", g, end, len(seg))
			}
			end = g.Off + g.Len
			u, ok := g.ULPDU(nil, seg, pos, markers, crc)
			if !ok {
				continue
			}
			if len(u) > g.Len {
				t.Fatalf("ULPDU of %d octets from an FPDU of %d", len(u), g.Len)
			}
		}
	})
}
