package rdmap

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/iwarp/ddp"
)

// TestImmediateGolden checks the Immediate Data octets of an Immediate
// Data message, and a whole message (untagged DDP header, QN 0, then the
// 8 octets) byte for byte.
func TestImmediateGolden(t *testing.T) {
	tests := []struct {
		name        string
		m           Immediate
		wire        string
		str         string
		sendFollows bool
	}{
		{name: "write with immediate", m: Immediate{Data: 0x2a}, wire: "0000002a 00000000",
			str: "immediate data 0x0000002a"},
		{name: "send with immediate", m: Immediate{Data: 0xdeadbeef, Flags: ImmSendFollows}, wire: "deadbeef 00000001",
			str: "immediate data 0xdeadbeef (send follows)", sendFollows: true},
		{name: "unknown flags", m: Immediate{Data: 1, Flags: 0x80000002}, wire: "00000001 80000002",
			str: "immediate data 0x00000001 flags 0x80000002"},
		{name: "all ones", m: Immediate{Data: ^uint32(0), Flags: ^uint32(0)}, wire: strings.Repeat("ff", ImmediateDataLen),
			str: "immediate data 0xffffffff (send follows) flags 0xfffffffe", sendFollows: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := testkit.Hex(t, tc.wire)
			buf := make([]byte, ImmediateDataLen)
			if n := tc.m.Marshal(buf); n != ImmediateDataLen || !bytes.Equal(buf, want) {
				t.Fatalf("Marshal = %d %x, want %x", n, buf, want)
			}
			var got Immediate
			if err := got.Unmarshal(append(want, 0xee)); err != nil || got != tc.m {
				t.Fatalf("Unmarshal = %+v, %v; want %+v", got, err, tc.m)
			}
			if s := got.String(); s != tc.str {
				t.Fatalf("String = %q, want %q", s, tc.str)
			}
			if got.SendFollows() != tc.sendFollows {
				t.Fatalf("SendFollows = %v", got.SendFollows())
			}
		})
	}
}

// TestImmediateMessageGolden builds whole Immediate Data messages (DDP
// untagged header with the RDMAP control octet, then the Immediate Data)
// and checks every octet.
func TestImmediateMessageGolden(t *testing.T) {
	tests := []struct {
		name string
		op   Opcode
		msn  uint32
		m    Immediate
		wire string
	}{
		{name: "immediate data", op: OpImmediate, msn: 7, m: Immediate{Data: 0x01020304},
			wire: "4148 00000000 00000000 00000007 00000000 01020304 00000000"},
		{name: "immediate data with SE", op: OpImmediateSE, msn: 1, m: Immediate{Data: 0xcafe},
			wire: "4149 00000000 00000000 00000001 00000000 0000cafe 00000000"},
		{name: "send follows", op: OpImmediate, msn: 0x10000, m: Immediate{Data: 5, Flags: ImmSendFollows},
			wire: "4148 00000000 00000000 00010000 00000000 00000005 00000001"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: Ctrl(tc.op), QN: tc.op.QN(), MSN: tc.msn}
			buf := make([]byte, ddp.UntaggedHeaderLen+ImmediateDataLen)
			n := h.Marshal(buf)
			tc.m.Marshal(buf[n:])
			if want := testkit.Hex(t, tc.wire); !bytes.Equal(buf, want) {
				t.Fatalf("message %x, want %x", buf, want)
			}
			var h2 ddp.Header
			n2, err := h2.Unmarshal(buf)
			if err != nil {
				t.Fatal(err)
			}
			if _, op := ParseCtrl(h2.ULPCtrl); op != tc.op || h2.Tagged || h2.QN != ddp.QNSend || !op.Valid() || !op.Extended() {
				t.Fatalf("decoded %v opcode %v", h2, op)
			}
			var m Immediate
			if err := m.Unmarshal(buf[n2:]); err != nil || m != tc.m {
				t.Fatalf("Immediate %+v %v, want %+v", m, err, tc.m)
			}
		})
	}
}

func TestImmediateShort(t *testing.T) {
	for _, n := range []int{0, 4, ImmediateDataLen - 1} {
		m := Immediate{Data: 9}
		err := m.Unmarshal(make([]byte, n))
		if !errors.Is(err, ErrShort) || !strings.HasPrefix(err.Error(), "rdmap: immediate data: ") {
			t.Fatalf("%d octets: error %v, want ErrShort with context", n, err)
		}
		if m != (Immediate{Data: 9}) {
			t.Fatalf("Unmarshal modified m on error: %+v", m)
		}
	}
}

func TestImmediateMarshalShortPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	var m Immediate
	m.Marshal(make([]byte, ImmediateDataLen-1))
}

func FuzzImmediate(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, ImmediateDataLen))
	f.Add(testkit.Hex(f, "deadbeef 00000001"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Immediate
		if err := m.Unmarshal(b); err != nil {
			if !errors.Is(err, ErrShort) || len(b) >= ImmediateDataLen {
				t.Fatalf("error %v for %d octets", err, len(b))
			}
			return
		}
		_ = m.String()
		buf := make([]byte, ImmediateDataLen)
		m.Marshal(buf)
		if !bytes.Equal(buf, b[:ImmediateDataLen]) {
			t.Fatalf("Marshal(Unmarshal(%x)) = %x", b[:ImmediateDataLen], buf)
		}
		var m2 Immediate
		if err := m2.Unmarshal(buf); err != nil || m2 != m {
			t.Fatalf("second round %+v %v, want %+v", m2, err, m)
		}
	})
}
