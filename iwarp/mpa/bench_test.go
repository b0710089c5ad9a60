package mpa

import (
	"fmt"
	"testing"
)

// benchCases are segment sizes (MSS-sized FPDUs: 1500 and 9000 MTU) and
// the MPA options.
func benchCases(b *testing.B, f func(b *testing.B, seg int, crc, markers bool)) {
	for _, seg := range []int{1420, 8920} {
		for _, crc := range []bool{false, true} {
			for _, markers := range []bool{false, true} {
				b.Run(fmt.Sprintf("seg=%d/crc=%v/markers=%v", seg, crc, markers), func(b *testing.B) {
					f(b, seg, crc, markers)
				})
			}
		}
	}
}

// BenchmarkSenderFPDU builds one segment-sized FPDU per op: an 18-octet
// DDP/RDMAP header and as much payload as fits.
func BenchmarkSenderFPDU(b *testing.B) {
	benchCases(b, func(b *testing.B, seg int, crc, markers bool) {
		var s Sender
		s.Init(crc, markers)
		buf := make([]byte, 0, seg)
		hdr := seq(18)
		payload := seq(seg)
		b.SetBytes(int64(seg))
		b.ReportAllocs()
		for b.Loop() {
			n := s.MaxULPDULen(seg)
			s.Begin(buf[:0], n)
			s.Write(hdr)
			s.Write(payload[:n-len(hdr)])
			s.Finish()
		}
	})
}

// BenchmarkReceiverFPDU parses one segment-sized FPDU per op, handed over
// as one chunk the way tcp.Endpoint.Read hands over a segment.
func BenchmarkReceiverFPDU(b *testing.B) {
	benchCases(b, func(b *testing.B, seg int, crc, markers bool) {
		var s Sender
		s.Init(crc, markers)
		var stream []byte
		var fpdus [][2]int // offsets of each FPDU in stream
		for range 64 {
			n := s.MaxULPDULen(seg)
			at := len(stream)
			s.Begin(stream, n)
			s.Write(seq(n))
			stream = s.Finish()
			fpdus = append(fpdus, [2]int{at, len(stream)})
		}
		var r Receiver
		h := &nopHandler{}
		r.Init(crc, markers, h)
		b.SetBytes(int64(seg))
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if i == len(fpdus) {
				i = 0
				r.Init(crc, markers, h)
			}
			f := fpdus[i]
			if _, err := r.Write(stream[f[0]:f[1]]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
