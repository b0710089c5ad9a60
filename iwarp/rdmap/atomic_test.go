package rdmap

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/iwarp/ddp"
)

// TestAtomicRequestGolden checks the 52 octets of Atomic Requests byte
// for byte, both ways, and their summaries.
func TestAtomicRequestGolden(t *testing.T) {
	tests := []struct {
		name string
		m    AtomicRequest
		wire string
		str  string
	}{
		{name: "fetch add", m: AtomicRequest{Op: AtomicFetchAdd, ReqID: 7, STag: 0x01020304, TO: 0x7f0000001000, AddSwap: 1},
			wire: "00000000 00000007 01020304 00007f0000001000 0000000000000001 0000000000000000 0000000000000000 0000000000000000",
			str:  "atomic FetchAdd id 7 stag 0x01020304 to 0x7f0000001000 add 0x1"},
		{name: "fetch add masked", m: AtomicRequest{Op: AtomicFetchAdd, ReqID: 1, STag: 5, TO: 8, AddSwap: 0x0101, AddSwapMask: 0x8080},
			wire: "00000000 00000001 00000005 0000000000000008 0000000000000101 0000000000008080 0000000000000000 0000000000000000",
			str:  "atomic FetchAdd id 1 stag 0x00000005 to 0x8 add 0x101 mask 0x8080"},
		{name: "compare and swap", m: AtomicRequest{Op: AtomicCmpSwap, ReqID: 0xfffffffe, STag: 0xaabbccdd, TO: 0x10,
			AddSwap: 0x1122334455667788, AddSwapMask: ^uint64(0), Compare: 0x2a, CompareMask: ^uint64(0)},
			wire: "00000002 fffffffe aabbccdd 0000000000000010 1122334455667788 ffffffffffffffff 000000000000002a ffffffffffffffff",
			str:  "atomic CmpSwap id 4294967294 stag 0xaabbccdd to 0x10 compare 0x2a swap 0x1122334455667788"},
		// AOpCode 0x1 is Reserved (RFC 7306 §10.1): decoded as it is,
		// named by its number.
		{name: "reserved aopcode 1", m: AtomicRequest{Op: AtomicReserved, ReqID: 2, STag: 3, TO: 0x18, AddSwap: 0xff00, AddSwapMask: 0xffff},
			wire: "00000001 00000002 00000003 0000000000000018 000000000000ff00 000000000000ffff 0000000000000000 0000000000000000",
			str:  "atomic AOpCode(0x1) id 2 stag 0x00000003 to 0x18"},
		{name: "reserved bits and unknown aopcode kept", m: AtomicRequest{Op: 0xf, Reserved: 0xabcdef1},
			wire: "abcdef1f 00000000 00000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000",
			str:  "atomic AOpCode(0xf) id 0 stag 0x00000000 to 0x0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := testkit.Hex(t, tc.wire)
			buf := make([]byte, AtomicRequestLen)
			if n := tc.m.Marshal(buf); n != AtomicRequestLen || !bytes.Equal(buf, want) {
				t.Fatalf("Marshal = %d %x, want %x", n, buf, want)
			}
			var got AtomicRequest
			if err := got.Unmarshal(append(want, 0xee)); err != nil || got != tc.m {
				t.Fatalf("Unmarshal = %+v, %v; want %+v", got, err, tc.m)
			}
			if s := got.String(); s != tc.str {
				t.Fatalf("String = %q, want %q", s, tc.str)
			}
		})
	}
}

// TestAtomicConstructorsGolden checks the requests FetchAdd and CmpSwap
// build, octet for octet: RFC 7306 §5.2.1 has a FetchAdd sent with
// Compare Data zero and Compare Mask all ones, and a plain (unmasked)
// CmpSwap with both masks all ones.
func TestAtomicConstructorsGolden(t *testing.T) {
	all := ^uint64(0)
	tests := []struct {
		name string
		m    AtomicRequest
		wire string
	}{
		{"fetch add", FetchAdd(7, 0x01020304, 0x7f0000001000, 1, 0),
			"00000000 00000007 01020304 00007f0000001000 0000000000000001 0000000000000000 0000000000000000 ffffffffffffffff"},
		{"fetch add masked", FetchAdd(1, 5, 8, 0x0101, 0x8080),
			"00000000 00000001 00000005 0000000000000008 0000000000000101 0000000000008080 0000000000000000 ffffffffffffffff"},
		{"cmp swap", CmpSwap(0xfffffffe, 0xaabbccdd, 0x10, 0x2a, all, 0x1122334455667788, all),
			"00000002 fffffffe aabbccdd 0000000000000010 1122334455667788 ffffffffffffffff 000000000000002a ffffffffffffffff"},
		{"cmp swap masked", CmpSwap(3, 4, 0x20, 0xf0, 0xf0, 0x0f, 0x0f),
			"00000002 00000003 00000004 0000000000000020 000000000000000f 000000000000000f 00000000000000f0 00000000000000f0"},
	}
	for _, tc := range tests {
		buf := make([]byte, AtomicRequestLen)
		tc.m.Marshal(buf)
		if want := testkit.Hex(t, tc.wire); !bytes.Equal(buf, want) {
			t.Errorf("%s: %x, want %x", tc.name, buf, want)
		}
	}
}

// TestAtomicOpValid checks that exactly RFC 7306's two codes are valid:
// 0x0 FetchAdd and 0x2 CmpSwap (§5.2.1 Figure 5); 0x1 is Reserved and
// the rest unassigned (§10.1).
func TestAtomicOpValid(t *testing.T) {
	for o := AtomicOp(0); o < 16; o++ {
		want := o == 0 || o == 2
		if o.Valid() != want {
			t.Errorf("AtomicOp(%d).Valid() = %v, want %v", o, o.Valid(), want)
		}
		if name := o.String(); want != !strings.HasPrefix(name, "AOpCode(") {
			t.Errorf("AtomicOp(%d).String() = %q", o, name)
		}
	}
}

// TestAtomicResponseGolden checks Atomic Responses byte for byte.
func TestAtomicResponseGolden(t *testing.T) {
	tests := []struct {
		m    AtomicResponse
		wire string
		str  string
	}{
		{AtomicResponse{ReqID: 7, Value: 0x2a}, "00000007 000000000000002a", "atomic response id 7 value 0x2a"},
		{AtomicResponse{ReqID: ^uint32(0), Value: ^uint64(0)}, strings.Repeat("ff", AtomicResponseLen), "atomic response id 4294967295 value 0xffffffffffffffff"},
		{AtomicResponse{ReqID: 0x01020304, Value: 0x0506070809101112}, "01020304 0506070809101112", "atomic response id 16909060 value 0x506070809101112"},
	}
	for _, tc := range tests {
		want := testkit.Hex(t, tc.wire)
		buf := make([]byte, AtomicResponseLen)
		if n := tc.m.Marshal(buf); n != AtomicResponseLen || !bytes.Equal(buf, want) {
			t.Fatalf("Marshal = %d %x, want %x", n, buf, want)
		}
		var got AtomicResponse
		if err := got.Unmarshal(append(want, 1, 2)); err != nil || got != tc.m {
			t.Fatalf("Unmarshal = %+v, %v; want %+v", got, err, tc.m)
		}
		if s := got.String(); s != tc.str {
			t.Fatalf("String = %q, want %q", s, tc.str)
		}
	}
}

// TestAtomicMessageGolden builds whole Atomic Request and Response
// messages (untagged DDP header with the RDMAP control octet, QN 1 and 3)
// and checks every octet, both ways.
func TestAtomicMessageGolden(t *testing.T) {
	req := FetchAdd(3, 0x11223344, 0x1000, 1, 0)
	resp := AtomicResponse{ReqID: 3, Value: 99}
	tests := []struct {
		name string
		op   Opcode
		msn  uint32
		body []byte
		wire string
	}{
		{name: "atomic request", op: OpAtomicRequest, msn: 2, body: func() []byte { b := make([]byte, AtomicRequestLen); req.Marshal(b); return b }(),
			wire: "414a 00000000 00000001 00000002 00000000 " +
				"00000000 00000003 11223344 0000000000001000 0000000000000001 0000000000000000 0000000000000000 ffffffffffffffff"},
		{name: "atomic response", op: OpAtomicResponse, msn: 1, body: func() []byte { b := make([]byte, AtomicResponseLen); resp.Marshal(b); return b }(),
			wire: "414b 00000000 00000003 00000001 00000000 00000003 0000000000000063"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: Ctrl(tc.op), QN: tc.op.QN(), MSN: tc.msn}
			buf := make([]byte, ddp.UntaggedHeaderLen+len(tc.body))
			n := h.Marshal(buf)
			copy(buf[n:], tc.body)
			if want := testkit.Hex(t, tc.wire); !bytes.Equal(buf, want) {
				t.Fatalf("message %x, want %x", buf, want)
			}
			var h2 ddp.Header
			n2, err := h2.Unmarshal(buf)
			if err != nil {
				t.Fatal(err)
			}
			if _, op := ParseCtrl(h2.ULPCtrl); op != tc.op || h2.Tagged || h2.QN != tc.op.QN() || !op.Valid() || !op.Extended() || !op.Atomic() {
				t.Fatalf("decoded %v opcode %v", h2, op)
			}
			if tc.op == OpAtomicRequest {
				var m AtomicRequest
				if err := m.Unmarshal(buf[n2:]); err != nil || m != req {
					t.Fatalf("AtomicRequest %+v %v", m, err)
				}
			} else {
				var m AtomicResponse
				if err := m.Unmarshal(buf[n2:]); err != nil || m != resp {
					t.Fatalf("AtomicResponse %+v %v", m, err)
				}
			}
		})
	}
}

// TestAtomicApply checks each operation's result on the remote word.
func TestAtomicApply(t *testing.T) {
	all := ^uint64(0)
	tests := []struct {
		name    string
		m       AtomicRequest
		old     uint64
		want    uint64
		changed bool
	}{
		{"fetch add", AtomicRequest{Op: AtomicFetchAdd, AddSwap: 5}, 10, 15, true},
		{"fetch add wraps", AtomicRequest{Op: AtomicFetchAdd, AddSwap: 2}, all, 1, true},
		{"fetch add masked: two 8-bit fields, carries cut", AtomicRequest{Op: AtomicFetchAdd, AddSwap: 0x0101, AddSwapMask: 0x8080}, 0x00ff, 0x0100, true},
		{"fetch add masked: carry inside a field", AtomicRequest{Op: AtomicFetchAdd, AddSwap: 0x01, AddSwapMask: 0x8000}, 0x00ff, 0x0100, true},
		{"cmp swap equal", AtomicRequest{Op: AtomicCmpSwap, Compare: 7, CompareMask: all, AddSwap: 9, AddSwapMask: all}, 7, 9, true},
		{"cmp swap differs", AtomicRequest{Op: AtomicCmpSwap, Compare: 8, CompareMask: all, AddSwap: 9, AddSwapMask: all}, 7, 7, false},
		{"cmp swap masked compare", AtomicRequest{Op: AtomicCmpSwap, Compare: 0xf0, CompareMask: 0xf0, AddSwap: 1, AddSwapMask: all}, 0xf7, 1, true},
		{"cmp swap masked swap", AtomicRequest{Op: AtomicCmpSwap, Compare: 0x34, CompareMask: 0xff, AddSwap: 0xabcd, AddSwapMask: 0x00ff}, 0x1234, 0x12cd, true},
		// The example of RFC 7306 §5.1.1: Add Mask 0 is the plain 64-bit add.
		{"fetch add mask 0 carries through", AtomicRequest{Op: AtomicFetchAdd, AddSwap: 1}, 0x00000000ffffffff, 0x0000000100000000, true},
		{"reserved op 1 (no Swap in RFC 7306)", AtomicRequest{Op: AtomicReserved, AddSwap: 0xabcd, AddSwapMask: all}, 0x1234, 0x1234, false},
		{"unknown op", AtomicRequest{Op: 9, AddSwap: 1}, 3, 3, false},
	}
	for _, tc := range tests {
		if got, ch := tc.m.Apply(tc.old); got != tc.want || ch != tc.changed {
			t.Errorf("%s: Apply(0x%x) = 0x%x %v, want 0x%x %v", tc.name, tc.old, got, ch, tc.want, tc.changed)
		}
	}
}

func TestAtomicShort(t *testing.T) {
	for _, n := range []int{0, 4, AtomicRequestLen - 1} {
		m := AtomicRequest{ReqID: 9}
		err := m.Unmarshal(make([]byte, n))
		if !errors.Is(err, ErrShort) || !strings.HasPrefix(err.Error(), "rdmap: atomic request: ") || m != (AtomicRequest{ReqID: 9}) {
			t.Fatalf("request, %d octets: error %v, m %+v", n, err, m)
		}
	}
	for _, n := range []int{0, 4, AtomicResponseLen - 1} {
		m := AtomicResponse{ReqID: 9}
		err := m.Unmarshal(make([]byte, n))
		if !errors.Is(err, ErrShort) || !strings.HasPrefix(err.Error(), "rdmap: atomic response: ") || m != (AtomicResponse{ReqID: 9}) {
			t.Fatalf("response, %d octets: error %v, m %+v", n, err, m)
		}
	}
}

func FuzzAtomicRequest(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, AtomicRequestLen))
	f.Add(testkit.Hex(f, "00000002 fffffffe aabbccdd 0000000000000010 1122334455667788 ffffffffffffffff 000000000000002a ffffffffffffffff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m AtomicRequest
		if err := m.Unmarshal(b); err != nil {
			if !errors.Is(err, ErrShort) || len(b) >= AtomicRequestLen {
				t.Fatalf("error %v for %d octets", err, len(b))
			}
			return
		}
		_ = m.String()
		_, _ = m.Apply(0x0123456789abcdef)
		buf := make([]byte, AtomicRequestLen)
		m.Marshal(buf)
		if !bytes.Equal(buf, b[:AtomicRequestLen]) {
			t.Fatalf("Marshal(Unmarshal(%x)) = %x", b[:AtomicRequestLen], buf)
		}
	})
}

func FuzzAtomicResponse(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, AtomicResponseLen))
	f.Add(testkit.Hex(f, "00000007 000000000000002a"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m AtomicResponse
		if err := m.Unmarshal(b); err != nil {
			if !errors.Is(err, ErrShort) || len(b) >= AtomicResponseLen {
				t.Fatalf("error %v for %d octets", err, len(b))
			}
			return
		}
		_ = m.String()
		buf := make([]byte, AtomicResponseLen)
		m.Marshal(buf)
		if !bytes.Equal(buf, b[:AtomicResponseLen]) {
			t.Fatalf("Marshal(Unmarshal(%x)) = %x", b[:AtomicResponseLen], buf)
		}
	})
}
