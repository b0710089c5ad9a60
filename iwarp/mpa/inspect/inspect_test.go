package inspect

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// awkward is an FPDU stream (markers on) in which the Markers fall where
// they are hardest to get right: FPDU 1 has a leading Marker and one
// between its pad and its CRC; FPDU 2 ends exactly at a Marker position,
// so that Marker leads FPDU 3; FPDU 4 has a Marker inside its DDP header.
var awkwardULPDUs = []int{504, 498, 494, 100}

// TestAwkwardMarkerPositions checks the stream the Sender builds for
// awkwardULPDUs octet by octet where the Markers are, and what the
// Analyzer reports for several segmentations of it.
func TestAwkwardMarkerPositions(t *testing.T) {
	st := buildStream(t, true, true, awkwardULPDUs)
	// Golden octets: the stream around each Marker.
	golden := []struct {
		name string
		at   int
		hex  string
	}{
		{"leading Marker of FPDU 1, then ULPDU_Length 504 and the DDP control word of a tagged Write, not last", 0, "00000000" + "01f8" + "8140"},
		{"pad of FPDU 1, Marker pointing 512 back, then the CRC", 510, "0000" + "00000200"},
		{"end of FPDU 2 (CRC), leading Marker of FPDU 3, ULPDU_Length 494", 1020, "" /* CRC octets vary */},
		{"FPDU 4: ULPDU_Length 100, control word, STag, then a Marker pointing 8 back inside the DDP header", 1528, "0064" + "c140" + "00000200" + "00000008"},
	}
	for _, g := range golden {
		if g.hex == "" {
			if got := hex.EncodeToString(st.b[1024:1030]); got != "00000000"+"01ee" {
				t.Errorf("%s: got %s", g.name, got)
			}
			continue
		}
		want, _ := hex.DecodeString(g.hex)
		if got := st.b[g.at : g.at+len(want)]; !bytes.Equal(got, want) {
			t.Errorf("%s: octets at %d are %x, want %x", g.name, g.at, got, want)
		}
	}
	if want := []uint64{0, 520, 1024, 1528}; !slices.Equal(st.starts, want) {
		t.Fatalf("FPDU starts %v, want %v", st.starts, want)
	}

	tests := []struct {
		name    string
		cuts    []int
		aligned []bool
		splits  []string // per segment: "" or "start FPDU n +before/len" / "end ..."
		markers [][]string
	}{{
		name:    "one segment per FPDU",
		cuts:    []int{520, 1024, 1528},
		aligned: []bool{true, true, true, true},
		splits:  []string{"", "", "", ""},
		markers: [][]string{{"0:0:1", "512:512:1"}, nil, {"1024:0:3"}, {"1536:8:4"}},
	}, {
		name:    "all in one segment",
		aligned: []bool{true},
		splits:  []string{""},
		markers: [][]string{{"0:0:1", "512:512:1", "1024:0:3", "1536:8:4"}},
	}, {
		name:    "cut between the Marker and the CRC of FPDU 1",
		cuts:    []int{516, 1024},
		aligned: []bool{false, false, true},
		splits:  []string{"end 1 516/520", "start 1 516/520", ""},
		markers: [][]string{{"0:0:1", "512:512:1"}, nil, {"1024:0:3", "1536:8:4"}},
	}, {
		name:    "cut inside the Marker in FPDU 4's header",
		cuts:    []int{1538},
		aligned: []bool{false, false},
		splits:  []string{"end 4 10/112", "start 4 10/112"},
		markers: [][]string{{"0:0:1", "512:512:1", "1024:0:3"}, {"1536:8:4"}},
	}, {
		name:    "cut after the Marker that leads FPDU 3",
		cuts:    []int{1028},
		aligned: []bool{false, false},
		splits:  []string{"end 3 4/0", "start 3 4/504"},
		markers: [][]string{{"0:0:1", "512:512:1", "1024:0:3"}, {"1536:8:4"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, rs := analyse(conversation(t, true, true, st.b, tt.cuts))
			fr := fpduReports(rs)
			if len(fr) != len(tt.aligned) {
				t.Fatalf("%d FPDU segments, want %d", len(fr), len(tt.aligned))
			}
			for i, r := range fr {
				if *r.Aligned != tt.aligned[i] {
					t.Errorf("segment %d: aligned %v, want %v", i, *r.Aligned, tt.aligned[i])
				}
				if got := splitString(&r); got != tt.splits[i] {
					t.Errorf("segment %d: split %q, want %q", i, got, tt.splits[i])
				}
				var ms []string
				for _, m := range r.Markers {
					if !m.OK || m.FPDUPTR != m.Want {
						t.Errorf("segment %d: marker %+v not OK", i, m)
					}
					ms = append(ms, fmt.Sprintf("%d:%d:%d", m.Offset, m.FPDUPTR, m.FPDU))
				}
				if !slices.Equal(ms, tt.markers[i]) {
					t.Errorf("segment %d: markers %v, want %v", i, ms, tt.markers[i])
				}
			}
			sum := a.Summary()
			init := sum[0]
			if init.FPDUs != 4 || init.CRCGood != 4 || init.CRCBad != 0 || init.MarkersOK != 4 || init.MarkersBad != 0 || !init.Markers || !init.CRC {
				t.Errorf("summary %+v", init)
			}
			if resp := sum[1]; resp.Markers || resp.FPDUs != 0 || resp.Role != "responder" {
				t.Errorf("responder summary %+v", resp)
			}
		})
	}
}

// splitString renders a Report's split for comparison.
func splitString(r *Report) string {
	var parts []string
	if s := r.SplitEnd; s != nil {
		parts = append(parts, fmt.Sprintf("end %d %d/%d", s.FPDU, s.Before, s.Len))
	}
	if s := r.SplitStart; s != nil {
		parts = append(parts, fmt.Sprintf("start %d %d/%d", s.FPDU, s.Before, s.Len))
	}
	return strings.Join(parts, ", ")
}

// TestCorruptFPDUPTR: a Marker whose FPDUPTR is wrong is reported, with
// the value it should have, and the walk goes on (the FPDU's CRC, which
// covers the Marker, fails too).
func TestCorruptFPDUPTR(t *testing.T) {
	st := buildStream(t, true, true, awkwardULPDUs)
	for _, tc := range []struct {
		name  string
		at    int // stream offset of the octet changed
		value byte
		ptr   uint16 // the FPDUPTR then
		want  uint16
		fpdu  uint64
	}{
		{"Marker inside FPDU 4's header", 1539, 12, 12, 8, 4},
		{"leading Marker of FPDU 3", 1027, 4, 4, 0, 3},
		{"Marker between pad and CRC", 514, 0, 0, 512, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bytes.Clone(st.b)
			b[tc.at] = tc.value
			a, rs := analyse(conversation(t, true, true, b, []int{520, 1024, 1528}))
			var bad []Marker
			var crc []string
			for _, r := range fpduReports(rs) {
				for _, m := range r.Markers {
					if !m.OK {
						bad = append(bad, m)
					}
				}
				for _, f := range r.FPDUs {
					crc = append(crc, f.CRC)
				}
			}
			if len(bad) != 1 || bad[0].Want != tc.want || bad[0].FPDU != tc.fpdu || bad[0].FPDUPTR != tc.ptr {
				t.Fatalf("bad markers %+v", bad)
			}
			wantCRC := []string{"good", "good", "good", "good"}
			wantCRC[tc.fpdu-1] = "bad"
			if !slices.Equal(crc, wantCRC) {
				t.Errorf("CRC verdicts %v, want %v", crc, wantCRC)
			}
			if s := a.Summary()[0]; s.MarkersBad != 1 || s.MarkersOK != 3 || s.FPDUs != 4 || s.CRCBad != 1 {
				t.Errorf("summary %+v", s)
			}
		})
	}
}

// TestResegmented cuts random valid streams at random places and checks
// every verdict against what the stream's construction says.
func TestResegmented(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for iter := range 200 {
		crc, markers := rng.IntN(2) == 0, rng.IntN(3) > 0
		var ulpdus []int
		for range 1 + rng.IntN(12) {
			ulpdus = append(ulpdus, 14+rng.IntN(3000))
		}
		st := buildStream(t, crc, markers, ulpdus)
		var cuts []int
		for c := rng.IntN(400) + 1; c < len(st.b); c += 1 + rng.IntN(2000) {
			cuts = append(cuts, c)
		}
		if rng.IntN(3) == 0 { // cut exactly at FPDU boundaries
			cuts = nil
			for _, s := range st.starts[1:] {
				if rng.IntN(2) == 0 {
					cuts = append(cuts, int(s))
				}
			}
		}
		bound := map[int]bool{len(st.b): true}
		for _, s := range st.starts {
			bound[int(s)] = true
		}
		a, rs := analyse(conversation(t, crc, markers, st.b, cuts))
		fr := fpduReports(rs)
		if len(fr) != len(cuts)+1 {
			t.Fatalf("iter %d: %d FPDU segments, want %d", iter, len(fr), len(cuts)+1)
		}
		for i, r := range fr {
			lo := 0
			if i > 0 {
				lo = cuts[i-1]
			}
			hi := len(st.b)
			if i < len(cuts) {
				hi = cuts[i]
			}
			if want := bound[lo] && bound[hi]; *r.Aligned != want || r.Offset != uint64(lo) {
				t.Fatalf("iter %d segment %d [%d,%d): aligned %v offset %d", iter, i, lo, hi, *r.Aligned, r.Offset)
			}
			here := 0
			for _, f := range r.FPDUs {
				here += f.Here
				k := slices.Index(st.starts, f.Offset)
				if k < 0 || uint64(k+1) != f.Index || (f.Len != 0 && f.Len != st.lens[k]) {
					t.Fatalf("iter %d segment %d: FPDU %+v does not match the stream", iter, i, f)
				}
			}
			if here != hi-lo {
				t.Fatalf("iter %d segment %d: FPDU octets %d, segment has %d", iter, i, here, hi-lo)
			}
		}
		s := a.Summary()[0]
		wantMarkers := 0
		if markers {
			wantMarkers = (len(st.b) + 511) / 512
		}
		wantGood := 0
		if crc {
			wantGood = len(ulpdus)
		}
		if s.FPDUs != len(ulpdus) || s.CRCGood != wantGood || s.CRCBad != 0 || s.MarkersOK != wantMarkers || s.MarkersBad != 0 {
			t.Fatalf("iter %d: summary %+v, want %d FPDUs, %d markers", iter, s, len(ulpdus), wantMarkers)
		}
	}
}

// TestOutOfOrderAndRetransmission: a segment that arrives ahead of a gap is
// held and analysed once the gap is filled; a repeated one is reported as
// a retransmission; the verdicts are those of the in-order stream.
func TestOutOfOrderAndRetransmission(t *testing.T) {
	st := buildStream(t, true, true, awkwardULPDUs)
	segs := conversation(t, true, true, st.b, []int{520, 1024, 1528})
	n := len(segs)
	// ... FPDU1, FPDU3, FPDU2, FPDU2 again, FPDU4
	segs[n-3], segs[n-2] = segs[n-2], segs[n-3]
	segs = slices.Insert(segs, n-1, segs[n-2])
	a, rs := analyse(segs)
	var kinds []Kind
	var held []bool
	for _, r := range rs {
		if r.Len > 0 && r.Kind != KindRequest && r.Kind != KindReply {
			kinds = append(kinds, r.Kind)
			held = append(held, r.Held)
		}
	}
	wantKinds := []Kind{KindFPDU, KindHeld, KindFPDU, KindFPDU, KindRetransmission, KindFPDU}
	if !slices.Equal(kinds, wantKinds) || !slices.Equal(held, []bool{false, false, false, true, false, false}) {
		t.Fatalf("kinds %v held %v, want %v", kinds, held, wantKinds)
	}
	s := a.Summary()[0]
	if s.FPDUs != 4 || s.CRCGood != 4 || s.MarkersOK != 4 || s.Aligned != 4 || s.Held != 1 || s.Retransmissions != 1 || s.RetransJudged != 1 || s.RetransAligned != 1 {
		t.Errorf("summary %+v", s)
	}
}

// TestRetransmissionAlignment: a retransmission, whose octets were all
// seen, is judged against the FPDU boundaries of the stream: whole FPDUs
// (one or several) are aligned, a cut that starts or ends inside an FPDU
// is not, and the MPA frame's octets are not judged.
func TestRetransmissionAlignment(t *testing.T) {
	st := buildStream(t, true, true, awkwardULPDUs)
	segs := conversation(t, true, true, st.b, []int{520, 1024, 1528})
	first := segs[5] // the first FPDU segment
	again := func(from, to int) Segment {
		return Segment{Src: first.Src, Dst: first.Dst, Seq: first.Seq + uint32(from), Flags: FlagACK, Payload: st.b[from:to]}
	}
	segs = append(segs,
		again(520, 1024),  // FPDU 2
		again(0, 1024),    // FPDUs 1 and 2
		again(600, 1100),  // inside FPDU 2 to inside FPDU 3
		again(1024, 1100), // FPDU 3's start
		again(1100, 1528), // FPDU 3's end
		Segment{Src: segs[3].Src, Dst: segs[3].Dst, Seq: segs[3].Seq, Flags: FlagACK, Payload: segs[3].Payload}, // the MPA Request
	)
	_, rs := analyse(segs)
	var got []string
	for _, r := range rs {
		if r.Kind == KindRetransmission {
			switch {
			case r.Aligned == nil:
				got = append(got, "-")
			case *r.Aligned:
				got = append(got, "aligned")
			default:
				got = append(got, "split")
			}
			if r.Aligned != nil && r.Clean() != *r.Aligned {
				t.Errorf("retransmission at %d: aligned %v, clean %v", r.Seq-first.Seq, *r.Aligned, r.Clean())
			}
		}
	}
	want := []string{"aligned", "aligned", "split", "split", "split", "-"}
	if !slices.Equal(got, want) {
		t.Errorf("retransmissions judged %v, want %v", got, want)
	}
	a, _ := analyse(segs)
	var b bytes.Buffer
	if err := WriteSummary(&b, a.Summary()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "6 (2 of 5 aligned)") {
		t.Errorf("summary does not count the judged retransmissions:\n%s", b.String())
	}
}

// TestMidStreamAndNotIWARP: a direction whose start was not captured is
// undecoded; a connection that does not speak MPA is recognised as such.
func TestMidStreamAndNotIWARP(t *testing.T) {
	st := buildStream(t, true, false, []int{100, 200})
	segs := conversation(t, true, false, st.b, nil)
	_, rs := analyse(segs[5:]) // no SYN, no MPA frames
	if rs[0].Kind != KindUndecoded || rs[0].Note == "" {
		t.Errorf("mid-stream segment: %+v", rs[0])
	}
	http := []Segment{
		{Src: cliAP, Dst: srvAP, Seq: 1, Flags: FlagSYN},
		{Src: cliAP, Dst: srvAP, Seq: 2, Payload: []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{Src: cliAP, Dst: srvAP, Seq: 29, Payload: []byte("more")},
	}
	a, rs := analyse(http)
	if rs[1].Kind != KindOther || rs[2].Kind != KindOther {
		t.Errorf("HTTP: kinds %v %v", rs[1].Kind, rs[2].Kind)
	}
	if s := a.Summary()[0]; s.Note != "not MPA" {
		t.Errorf("HTTP summary note %q", s.Note)
	}
}

// TestReportText pins the human rendering of one segment.
func TestReportText(t *testing.T) {
	st := buildStream(t, true, true, awkwardULPDUs)
	_, rs := analyse(conversation(t, true, true, st.b, []int{516, 1024}))
	fr := fpduReports(rs)
	var b bytes.Buffer
	if err := WriteReport(&b, &fr[0], "out "); err != nil {
		t.Fatal(err)
	}
	want := `out 198.18.0.1:40000 > 198.18.0.2:7174 seq 4294963225 len 516 [ACK] stream 0 NOT ALIGNED
    split: ends 516 octets into FPDU 1 of 520
    FPDU 1 RDMA Write stag 0x200 to 0x7f0000001000 payload 490, len 520, first 516 octets here
    marker at stream 0 (+0) fpduptr 0 -> FPDU 1: ok
    marker at stream 512 (+512) fpduptr 512 -> FPDU 1: ok
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
