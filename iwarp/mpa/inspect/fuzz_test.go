package inspect

import (
	"testing"
)

// FuzzAnalyzer feeds arbitrary octets as the initiator's FPDU stream, cut
// at arbitrary places, after a valid MPA exchange: the Analyzer must not
// panic, and every FPDU segment's parts must add up to its length (or,
// where it picked the stream up after octets left out, to no more).
func FuzzAnalyzer(f *testing.F) {
	st := buildStream(f, true, true, awkwardULPDUs)
	f.Add(byte(3), []byte{7, 200, 13}, st.b)
	f.Add(byte(1), []byte{}, buildStream(f, true, false, []int{14, 100, 3000}).b)
	f.Add(byte(0), []byte{1, 1, 1, 1}, []byte{0, 14, 0xc1, 0x40, 0, 0, 2, 0})
	f.Add(byte(9), []byte{200, 100, 7, 255, 255}, st.b)
	f.Add(byte(10), []byte{255, 255, 255, 255, 255, 255}, st.b)
	f.Fuzz(func(t *testing.T, mode byte, cutBytes []byte, stream []byte) {
		var cuts []int
		c := 0
		for _, b := range cutBytes {
			c += int(b) + 1
			if c >= len(stream) {
				break
			}
			cuts = append(cuts, c)
		}
		segs := conversation(t, mode&1 != 0, mode&2 != 0, stream, cuts)
		if mode&4 != 0 && len(segs) > 7 { // out of order and repeated
			segs[5], segs[6] = segs[6], segs[5]
			segs = append(segs, segs[5])
		}
		a := New()
		var rs []Report
		for i, s := range segs {
			if mode&8 != 0 && i == 6 && len(s.Payload) > 0 { // left out of a watch
				a.NotObserved([]Unobserved{{Src: s.Src, Dst: s.Dst, Seq: s.Seq, End: s.Seq + uint32(len(s.Payload))}}, mode&16 != 0)
				continue
			}
			rs = append(rs, a.Add(s)...)
		}
		for _, r := range rs {
			if r.Kind != KindFPDU {
				continue
			}
			here := 0
			for _, fp := range r.FPDUs {
				here += fp.Here
				if fp.At < 0 || fp.At+fp.Here > r.Len {
					t.Fatalf("FPDU %+v outside its segment of %d", fp, r.Len)
				}
			}
			if here != r.Len && (r.Resync == "" || here > r.Len) {
				t.Fatalf("FPDU octets %d, segment %d: %+v", here, r.Len, r)
			}
			_ = r.Comment()
		}
		for _, s := range a.Summary() {
			if s.Aligned > s.FPDUSegments || s.CRCGood+s.CRCBad > s.FPDUs || s.RetransAligned > s.RetransJudged || s.RetransJudged > s.Retransmissions {
				t.Fatalf("summary %+v", s)
			}
		}
	})
}
