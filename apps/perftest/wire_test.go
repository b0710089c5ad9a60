package perftest

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

// TestDestGolden: the 56-byte struct pingpong_dest, every integer
// big-endian (rdma_write_keys with HAVE_ENDIAN), 4 bytes of padding before
// the 64-bit address, the GID raw.
func TestDestGolden(t *testing.T) {
	d := Dest{LID: 0, OutReads: 128, QPN: 0x11, PSN: 0x5e3e06, RKey: 0x00000300,
		VAddr: 0x00007f0e0c8aa000, GID: gidFor(netip.MustParseAddr("198.18.1.2")), SRQN: 0, GIDIndex: 0}
	want := testkit.Hex(t, "00000000 00000080 00000011 005e3e06 00000300 00000000 00007f0e0c8aa000"+
		" 00000000000000000000ffffc6120102 00000000 00000000")
	got := d.Marshal()
	if !bytes.Equal(got, want) {
		t.Fatalf("Marshal:\n got %x\nwant %x", got, want)
	}
	back, err := UnmarshalDest(got)
	if err != nil || back != d {
		t.Fatalf("UnmarshalDest = %+v, %v; want %+v", back, err, d)
	}
	// A longer pingpong_dest (a later perftest) is read by its first 56
	// bytes; a shorter one is refused.
	if back, err := UnmarshalDest(append(got, 1, 2, 3, 4, 5, 6, 7, 8)); err != nil || back != d {
		t.Fatalf("64-byte dest: %+v, %v", back, err)
	}
	if _, err := UnmarshalDest(got[:55]); !errors.Is(err, errShortMessage) {
		t.Fatalf("55-byte dest: %v, want errShortMessage", err)
	}
}

func TestSmallMessagesGolden(t *testing.T) {
	cases := []struct {
		name string
		got  []byte
		want string
	}{
		{"version", marshalVersion(Version), "362e3036 00000000 00000000 00000000"},
		{"page size", marshalInt32(4096), "00001000"},
		{"cache line", marshalInt32(64), "00000040"},
		{"MTU 1024", marshalMTU(3), "3300"},
		{"MTU 4096", marshalMTU(5), "3500"},
	}
	for _, c := range cases {
		if w := testkit.Hex(t, c.want); !bytes.Equal(c.got, w) {
			t.Errorf("%s: %x, want %x", c.name, c.got, w)
		}
	}
	var cr [4]byte
	marshalCredit(cr[:], 852)
	if w := testkit.Hex(t, "54030000"); !bytes.Equal(cr[:], w) {
		t.Errorf("credit 852: %x, want %x (little-endian, the sender's host order)", cr, w)
	}
}

// TestReportGolden: xchg_bw_reports' five 8-byte fields, integers and
// IEEE 754 doubles big-endian.
func TestReportGolden(t *testing.T) {
	r := BWResult{Size: 65536, Iters: 5000, Peak: 8609.87, Average: 6595.36, MsgRate: 0.105526}
	f := reportFields(r)
	want := []string{"0000000000010000", "0000000000001388", "40c0d0ef5c28f5c3", "40b9c35c28f5c28f", "3fbb03c07ee0b0af"}
	for i, w := range want {
		if !bytes.Equal(f[i], testkit.Hex(t, w)) {
			t.Errorf("field %d: %x, want %s", i, f[i], w)
		}
	}
	back, err := parseReport(f)
	if err != nil || back != r {
		t.Fatalf("parseReport = %+v, %v; want %+v", back, err, r)
	}
	f[4] = f[4][:7]
	if _, err := parseReport(f); !errors.Is(err, errShortMessage) {
		t.Fatalf("short field: %v", err)
	}
}

func TestParseVersion(t *testing.T) {
	for _, c := range []struct {
		in   string
		str  string
		num  float64
		fail bool
	}{
		{in: "6.06", str: "6.06", num: 6.06},
		{in: "5.70", str: "5.70", num: 5.70},
		{in: "6.28xyz", str: "6.28xyz", num: 6.28},
		{in: "abc", str: "abc", num: 0},
		{in: "", str: "", num: 0},
		{in: "7.", str: "7.", num: 7},
	} {
		v, err := parseVersion(marshalVersion(c.in))
		if err != nil || v != c.str || versionNumber(v) != c.num {
			t.Errorf("%q: %q %v, number %v; want %q %v", c.in, v, err, versionNumber(v), c.str, c.num)
		}
	}
	if _, err := parseVersion([]byte("6.06")); !errors.Is(err, errShortMessage) {
		t.Errorf("4-byte version: %v", err)
	}
}

func TestParseMTU(t *testing.T) {
	for in, want := range map[string]int{"3\x00": 3, "5\x00": 5, "1": 1, "0\x00": 0, "6\x00": 0, "x\x00": 0, "": 0, "\x00\x00": 0} {
		if got := parseMTU([]byte(in)); got != want {
			t.Errorf("parseMTU(%q) = %d, want %d", in, got, want)
		}
	}
}

func FuzzUnmarshalDest(f *testing.F) {
	f.Add(make([]byte, destLen))
	f.Add((&Dest{QPN: 7, RKey: 9, VAddr: 1 << 40}).Marshal())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := UnmarshalDest(b)
		if err != nil {
			if len(b) >= destLen {
				t.Fatalf("%d bytes refused: %v", len(b), err)
			}
			return
		}
		if again := d.Marshal(); !bytes.Equal(again[:20], b[:20]) || !bytes.Equal(again[24:], b[24:destLen]) {
			t.Fatalf("round trip differs:\n in %x\nout %x", b[:destLen], again)
		}
	})
}

func FuzzParseReport(f *testing.F) {
	f.Add(bytes.Repeat([]byte{0}, 40))
	r := reportFields(BWResult{Size: 1 << 20, Iters: 1000, Peak: 1, Average: 2, MsgRate: 3})
	f.Add(bytes.Join(r[:], nil))
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var fs [5][]byte
		for i := range fs {
			lo := min(i*8, len(b))
			fs[i] = b[lo:min(lo+8, len(b))]
		}
		got, err := parseReport(fs)
		if err != nil {
			return
		}
		again := reportFields(got)
		if !bytes.Equal(bytes.Join(again[:], nil), b[:40]) {
			t.Fatalf("round trip differs: %x", b[:40])
		}
	})
}

func FuzzParseControlText(f *testing.F) {
	f.Add([]byte("6.06\x00"))
	f.Add([]byte("3\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if m := parseMTU(b); m < 0 || m > 5 {
			t.Fatalf("parseMTU(%q) = %d", b, m)
		}
		v, err := parseVersion(b)
		if (err != nil) != (len(b) < versionLen) {
			t.Fatalf("parseVersion(%q): %v", b, err)
		}
		if n := versionNumber(v); n < 0 {
			t.Fatalf("versionNumber(%q) = %v", v, n)
		}
		if _, err := parseInt32(b); (err != nil) != (len(b) < sysDataLen) {
			t.Fatalf("parseInt32(%q): %v", b, err)
		}
	})
}
