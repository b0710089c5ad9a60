package ddp

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

// goldenCases covers every header form RDMAP uses. The control octets are
// the canonical ones of the reference (§1.6): 0x41 0x43 Send last, 0xC1 0x40
// Write last, 0x41 0x41 Read Request, 0xC1 0x42 Read Response last,
// 0x41 0x47 Terminate.
type goldenCase struct {
	name string
	hdr  Header
	wire string
	str  string
}

func goldenCases() []goldenCase {
	return []goldenCase{
		{
			name: "tagged write last",
			hdr:  Header{Tagged: true, Last: true, Version: 1, ULPCtrl: 0x40, STag: 0x12345678, TO: 0x0102030405060708},
			wire: "c1 40 12345678 0102030405060708",
			str:  "ddp T L stag 0x12345678 to 0x102030405060708 ulp 0x40",
		},
		{
			name: "tagged write not last",
			hdr:  Header{Tagged: true, Version: 1, ULPCtrl: 0x40, STag: 0xc27d2a00, TO: 0x55e9a6e1bbc0},
			wire: "81 40 c27d2a00 000055e9a6e1bbc0",
			str:  "ddp T stag 0xc27d2a00 to 0x55e9a6e1bbc0 ulp 0x40",
		},
		{
			name: "tagged read response last",
			hdr:  Header{Tagged: true, Last: true, Version: 1, ULPCtrl: 0x42, STag: 0xffffffff, TO: 0xffffffffffffffff},
			wire: "c1 42 ffffffff ffffffffffffffff",
			str:  "ddp T L stag 0xffffffff to 0xffffffffffffffff ulp 0x42",
		},
		{
			name: "tagged read response not last",
			hdr:  Header{Tagged: true, Version: 1, ULPCtrl: 0x42, STag: 1, TO: 0},
			wire: "81 42 00000001 0000000000000000",
			str:  "ddp T stag 0x1 to 0x0 ulp 0x42",
		},
		{
			name: "untagged send last",
			hdr:  Header{Last: true, Version: 1, ULPCtrl: 0x43, QN: QNSend, MSN: 1, MO: 0},
			wire: "41 43 00000000 00000000 00000001 00000000",
			str:  "ddp U L qn 0 msn 1 mo 0 ulp 0x43",
		},
		{
			name: "untagged send not last with MO",
			hdr:  Header{Version: 1, ULPCtrl: 0x43, QN: QNSend, MSN: 0xfffffffe, MO: 1428},
			wire: "01 43 00000000 00000000 fffffffe 00000594",
			str:  "ddp U qn 0 msn 4294967294 mo 1428 ulp 0x43",
		},
		{
			name: "untagged send with invalidate",
			hdr:  Header{Last: true, Version: 1, ULPCtrl: 0x44, ULPData: 0xdeadbeef, QN: QNSend, MSN: 7, MO: 64},
			wire: "41 44 deadbeef 00000000 00000007 00000040",
			str:  "ddp U L qn 0 msn 7 mo 64 ulp 0x44 ulpdata 0xdeadbeef",
		},
		{
			name: "untagged send with SE",
			hdr:  Header{Last: true, Version: 1, ULPCtrl: 0x45, QN: QNSend, MSN: 2, MO: 0},
			wire: "41 45 00000000 00000000 00000002 00000000",
			str:  "ddp U L qn 0 msn 2 mo 0 ulp 0x45",
		},
		{
			name: "untagged send with SE and invalidate",
			hdr:  Header{Version: 1, ULPCtrl: 0x46, ULPData: 0x00abcdef, QN: QNSend, MSN: 3, MO: 2856},
			wire: "01 46 00abcdef 00000000 00000003 00000b28",
			str:  "ddp U qn 0 msn 3 mo 2856 ulp 0x46 ulpdata 0xabcdef",
		},
		{
			name: "untagged read request",
			hdr:  Header{Last: true, Version: 1, ULPCtrl: 0x41, QN: QNReadRequest, MSN: 1, MO: 0},
			wire: "41 41 00000000 00000001 00000001 00000000",
			str:  "ddp U L qn 1 msn 1 mo 0 ulp 0x41",
		},
		{
			name: "untagged terminate",
			hdr:  Header{Last: true, Version: 1, ULPCtrl: 0x47, QN: QNTerminate, MSN: 1, MO: 0},
			wire: "41 47 00000000 00000002 00000001 00000000",
			str:  "ddp U L qn 2 msn 1 mo 0 ulp 0x47",
		},
		{
			name: "bad version and reserved bits decoded as is",
			hdr:  Header{Tagged: true, Version: 2, Reserved: 0xf, ULPCtrl: 0x80, STag: 5, TO: 6},
			wire: "be 80 00000005 0000000000000006",
			str:  "ddp T stag 0x5 to 0x6 ulp 0x80 dv 2 rsvd 0xf",
		},
		{
			name: "version zero",
			hdr:  Header{Last: true, Version: 0, ULPCtrl: 0x43, MSN: 1},
			wire: "40 43 00000000 00000000 00000001 00000000",
			str:  "ddp U L qn 0 msn 1 mo 0 ulp 0x43 dv 0",
		},
	}
}

func TestHeaderGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			want := testkit.Hex(t, tc.wire)
			if got := tc.hdr.Len(); got != len(want) {
				t.Fatalf("Len() = %d, want %d", got, len(want))
			}
			if got := HeaderLen(want[0]); got != len(want) {
				t.Fatalf("HeaderLen(%#x) = %d, want %d", want[0], got, len(want))
			}
			buf := bytes.Repeat([]byte{0xAA}, len(want)+4)
			n := tc.hdr.Marshal(buf)
			if n != len(want) || !bytes.Equal(buf[:n], want) {
				t.Fatalf("Marshal = %d %x, want %d %x", n, buf[:n], len(want), want)
			}
			if !bytes.Equal(buf[n:], []byte{0xAA, 0xAA, 0xAA, 0xAA}) {
				t.Fatalf("Marshal wrote past its header: %x", buf[n:])
			}
			// Unmarshal with trailing payload, which must be ignored.
			var got Header
			m, err := got.Unmarshal(append(want, 1, 2, 3))
			if err != nil || m != len(want) {
				t.Fatalf("Unmarshal = %d, %v; want %d, nil", m, err, len(want))
			}
			if got != tc.hdr {
				t.Fatalf("Unmarshal = %+v, want %+v", got, tc.hdr)
			}
			if s := got.String(); s != tc.str {
				t.Fatalf("String() = %q, want %q", s, tc.str)
			}
		})
	}
}

func TestHeaderMarshalIgnoresOtherForm(t *testing.T) {
	tests := []struct {
		name string
		hdr  Header
		wire string
	}{
		{
			name: "tagged ignores untagged fields",
			hdr:  Header{Tagged: true, Last: true, Version: 1, ULPCtrl: 0x40, STag: 1, TO: 2, ULPData: 9, QN: 9, MSN: 9, MO: 9},
			wire: "c1 40 00000001 0000000000000002",
		},
		{
			name: "untagged ignores tagged fields",
			hdr:  Header{Last: true, Version: 1, ULPCtrl: 0x43, STag: 9, TO: 9, QN: 0, MSN: 1, MO: 0},
			wire: "41 43 00000000 00000000 00000001 00000000",
		},
		{
			name: "oversized version and reserved are truncated",
			hdr:  Header{Version: 0xfd, Reserved: 0xf5, ULPCtrl: 0x43},
			wire: "15 43 00000000 00000000 00000000 00000000",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := testkit.Hex(t, tc.wire)
			buf := make([]byte, len(want))
			if n := tc.hdr.Marshal(buf); n != len(want) || !bytes.Equal(buf, want) {
				t.Fatalf("Marshal = %d %x, want %x", n, buf, want)
			}
		})
	}
}

func TestHeaderUnmarshalShort(t *testing.T) {
	tests := []struct {
		name string
		wire string
	}{
		{name: "empty", wire: ""},
		{name: "control word only", wire: "c140"},
		{name: "tagged 13 octets", wire: "c1 40 00000001 00000000000000"},
		{name: "untagged 17 octets", wire: "41 43 00000000 00000000 00000001 000000"},
		{name: "untagged with tagged length", wire: "41 43 00000000 00000000 00000001"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := Header{STag: 77}
			n, err := h.Unmarshal(testkit.Hex(t, tc.wire))
			if !errors.Is(err, ErrShort) || n != 0 {
				t.Fatalf("Unmarshal = %d, %v; want 0, ErrShort", n, err)
			}
			if !strings.HasPrefix(err.Error(), "ddp: header: ") {
				t.Fatalf("error lacks context: %q", err)
			}
			if h != (Header{STag: 77}) {
				t.Fatalf("Unmarshal modified h on error: %+v", h)
			}
		})
	}
}

func TestMarshalShortPanics(t *testing.T) {
	tests := []struct {
		name string
		hdr  Header
		size int
	}{
		{name: "tagged", hdr: Header{Tagged: true}, size: TaggedHeaderLen - 1},
		{name: "untagged", hdr: Header{}, size: UntaggedHeaderLen - 1},
		{name: "untagged in tagged size", hdr: Header{}, size: TaggedHeaderLen},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("Marshal into a short buffer did not panic")
				}
			}()
			tc.hdr.Marshal(make([]byte, tc.size))
		})
	}
}

// siwSegment is one line of testdata/siw-rping-segments.txt.
type siwSegment struct {
	name, sender string
	ulpduLen     int
	prefix       []byte
}

func loadSiwSegments(t testing.TB) map[string]siwSegment {
	t.Helper()
	f, err := os.Open("testdata/siw-rping-segments.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	segs := map[string]siwSegment{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) != 5 {
			t.Fatalf("bad testdata line %q", line)
		}
		n, err := strconv.Atoi(fs[3])
		if err != nil {
			t.Fatalf("bad length in %q: %v", line, err)
		}
		segs[fs[0]] = siwSegment{name: fs[0], sender: fs[1], ulpduLen: n, prefix: testkit.Hex(t, fs[4])}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return segs
}

// TestSiwGolden decodes DDP headers that Linux siw put on the wire
// (rping, MTU 1500) and checks that re-encoding reproduces them exactly.
func TestSiwGolden(t *testing.T) {
	segs := loadSiwSegments(t)
	const (
		rrStag = 0x91b82000     // rping client's sink buffer (Read Response target)
		rrTO   = 0x55c655e4a0f0 // its address
		wStag  = 0xc27d2a00     // rping client's buffer the server writes into
		wTO    = 0x55e9a6e1bbc0
		seg    = 1442 - TaggedHeaderLen // payload per full tagged segment
	)
	tests := []struct {
		name string
		want Header
	}{
		{"send-msn1", Header{Last: true, Version: 1, ULPCtrl: 0x43, QN: QNSend, MSN: 1}},
		{"send-msn2", Header{Last: true, Version: 1, ULPCtrl: 0x43, QN: QNSend, MSN: 2}},
		{"send-zero-msn1", Header{Last: true, Version: 1, ULPCtrl: 0x43, QN: QNSend, MSN: 1}},
		{"send-zero-msn8", Header{Last: true, Version: 1, ULPCtrl: 0x43, QN: QNSend, MSN: 8}},
		{"readreq-msn1", Header{Last: true, Version: 1, ULPCtrl: 0x41, QN: QNReadRequest, MSN: 1}},
		{"readreq-msn4", Header{Last: true, Version: 1, ULPCtrl: 0x41, QN: QNReadRequest, MSN: 4}},
		{"readresp-first", Header{Tagged: true, Version: 1, ULPCtrl: 0x42, STag: rrStag, TO: rrTO}},
		{"readresp-middle", Header{Tagged: true, Version: 1, ULPCtrl: 0x42, STag: rrStag, TO: rrTO + seg}},
		{"readresp-last", Header{Tagged: true, Last: true, Version: 1, ULPCtrl: 0x42, STag: rrStag, TO: rrTO + 2*seg}},
		{"write-first", Header{Tagged: true, Version: 1, ULPCtrl: 0x40, STag: wStag, TO: wTO}},
		{"write-middle", Header{Tagged: true, Version: 1, ULPCtrl: 0x40, STag: wStag, TO: wTO + seg}},
		{"write-last", Header{Tagged: true, Last: true, Version: 1, ULPCtrl: 0x40, STag: wStag, TO: wTO + 2*seg}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, ok := segs[tc.name]
			if !ok {
				t.Fatalf("segment %q missing from testdata", tc.name)
			}
			var h Header
			n, err := h.Unmarshal(s.prefix)
			if err != nil {
				t.Fatal(err)
			}
			if n != HeaderLen(s.prefix[0]) || n > s.ulpduLen {
				t.Fatalf("header length %d, ULPDU %d", n, s.ulpduLen)
			}
			if h != tc.want {
				t.Fatalf("decoded %v (%+v), want %v", h, h, tc.want)
			}
			buf := make([]byte, n)
			h.Marshal(buf)
			if !bytes.Equal(buf, s.prefix[:n]) {
				t.Fatalf("re-encoded %x, wire had %x", buf, s.prefix[:n])
			}
		})
	}
	// The three segments of one 3000-octet Read Response cover it exactly.
	last := segs["readresp-last"]
	if total := 2*seg + last.ulpduLen - TaggedHeaderLen; total != 3000 {
		t.Fatalf("read response segments carry %d octets, want 3000", total)
	}
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		hdr  Header
	}{
		{name: "zero untagged", hdr: Header{}},
		{name: "zero tagged", hdr: Header{Tagged: true}},
		{name: "max tagged", hdr: Header{Tagged: true, Last: true, Version: 3, Reserved: 15, ULPCtrl: 0xff, STag: ^uint32(0), TO: ^uint64(0)}},
		{name: "max untagged", hdr: Header{Last: true, Version: 3, Reserved: 15, ULPCtrl: 0xff, ULPData: ^uint32(0), QN: ^uint32(0), MSN: ^uint32(0), MO: ^uint32(0)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf [UntaggedHeaderLen]byte
			n := tc.hdr.Marshal(buf[:])
			var got Header
			m, err := got.Unmarshal(buf[:n])
			if err != nil || m != n || got != tc.hdr {
				t.Fatalf("round trip: %d %v %+v, want %d %+v", m, err, got, n, tc.hdr)
			}
		})
	}
}

func TestZeroAllocs(t *testing.T) {
	tests := []struct {
		name string
		hdr  Header
	}{
		{name: "tagged", hdr: goldenCases()[0].hdr},
		{name: "untagged", hdr: goldenCases()[4].hdr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf [UntaggedHeaderLen]byte
			var h Header
			allocs := testing.AllocsPerRun(100, func() {
				n := tc.hdr.Marshal(buf[:])
				if _, err := h.Unmarshal(buf[:n]); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Fatalf("%v allocs per Marshal+Unmarshal, want 0", allocs)
			}
		})
	}
}

func BenchmarkHeader(b *testing.B) {
	benches := []struct {
		name string
		hdr  Header
	}{
		{name: "tagged", hdr: goldenCases()[0].hdr},
		{name: "untagged", hdr: goldenCases()[6].hdr},
	}
	for _, bc := range benches {
		b.Run(bc.name+"/marshal", func(b *testing.B) {
			var buf [UntaggedHeaderLen]byte
			b.ReportAllocs()
			for b.Loop() {
				bc.hdr.Marshal(buf[:])
			}
		})
		b.Run(bc.name+"/unmarshal", func(b *testing.B) {
			var buf [UntaggedHeaderLen]byte
			n := bc.hdr.Marshal(buf[:])
			var h Header
			b.ReportAllocs()
			for b.Loop() {
				if _, err := h.Unmarshal(buf[:n]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func FuzzDDPHeader(f *testing.F) {
	for _, tc := range goldenCases() {
		f.Add(testkit.Hex(f, tc.wire))
	}
	f.Add([]byte{})
	f.Add([]byte{0xc1})
	f.Add(testkit.Hex(f, "41 43 00000000 00000000 00000001"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		n, err := h.Unmarshal(b)
		if err != nil {
			if !errors.Is(err, ErrShort) || len(b) >= UntaggedHeaderLen {
				t.Fatalf("unexpected error %v for %d octets", err, len(b))
			}
			return
		}
		if n != h.Len() || n != HeaderLen(b[0]) || n > len(b) {
			t.Fatalf("Unmarshal returned %d, Len %d, HeaderLen %d", n, h.Len(), HeaderLen(b[0]))
		}
		_ = h.String()
		buf := make([]byte, n)
		if m := h.Marshal(buf); m != n {
			t.Fatalf("Marshal returned %d, want %d", m, n)
		}
		// The header is a bijection on its n octets.
		if !bytes.Equal(buf, b[:n]) {
			t.Fatalf("Marshal(Unmarshal(%x)) = %x", b[:n], buf)
		}
		var h2 Header
		if m, err := h2.Unmarshal(buf); err != nil || m != n || h2 != h {
			t.Fatalf("second round: %d %v %+v, want %+v", m, err, h2, h)
		}
	})
}
