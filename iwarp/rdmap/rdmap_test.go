package rdmap

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/iwarp/ddp"
)

// TestCanonicalControl checks the first two octets of each message kind
// against the canonical values of the reference (§1.6) and OSC's
// iWarpRTTfake.c (0x4143, 0xc140).
func TestCanonicalControl(t *testing.T) {
	tests := []struct {
		name         string
		op           Opcode
		tagged, last bool
		want         string
	}{
		{name: "send last", op: OpSend, last: true, want: "4143"},
		{name: "write last", op: OpWrite, tagged: true, last: true, want: "c140"},
		{name: "read request", op: OpReadRequest, last: true, want: "4141"},
		{name: "read response last", op: OpReadResponse, tagged: true, last: true, want: "c142"},
		{name: "terminate", op: OpTerminate, last: true, want: "4147"},
		{name: "write not last", op: OpWrite, tagged: true, want: "8140"},
		{name: "read response not last", op: OpReadResponse, tagged: true, want: "8142"},
		{name: "send with invalidate", op: OpSendInv, last: true, want: "4144"},
		{name: "send with SE", op: OpSendSE, last: true, want: "4145"},
		{name: "send with SE and invalidate not last", op: OpSendSEInv, want: "0146"},
		{name: "immediate data (RFC 7306)", op: OpImmediate, last: true, want: "4148"},
		{name: "immediate data with SE (RFC 7306)", op: OpImmediateSE, last: true, want: "4149"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.op.Tagged() != tc.tagged {
				t.Fatalf("%v.Tagged() = %v", tc.op, tc.op.Tagged())
			}
			h := ddp.Header{Tagged: tc.tagged, Last: tc.last, Version: ddp.Version, ULPCtrl: Ctrl(tc.op)}
			buf := make([]byte, h.Len())
			h.Marshal(buf)
			if got := hex.EncodeToString(buf[:2]); got != tc.want {
				t.Fatalf("control word %s, want %s", got, tc.want)
			}
			v, op := ParseCtrl(buf[1])
			if v != Version || op != tc.op {
				t.Fatalf("ParseCtrl(%#x) = %d, %v", buf[1], v, op)
			}
		})
	}
}

func TestParseCtrl(t *testing.T) {
	tests := []struct {
		name    string
		c       uint8
		version uint8
		op      Opcode
	}{
		{name: "send", c: 0x43, version: 1, op: OpSend},
		{name: "version 2 terminate", c: 0x87, version: 2, op: OpTerminate},
		{name: "reserved bits ignored", c: 0x7f, version: 1, op: 0xf},
		{name: "zero", c: 0x00, version: 0, op: OpWrite},
		{name: "RFC 7306 atomic request", c: 0x4a, version: 1, op: 0xa},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, op := ParseCtrl(tc.c)
			if v != tc.version || op != tc.op {
				t.Fatalf("ParseCtrl(%#x) = %d, %v; want %d, %v", tc.c, v, op, tc.version, tc.op)
			}
		})
	}
}

func TestOpcode(t *testing.T) {
	tests := []struct {
		name                                        string
		op                                          Opcode
		ctrl                                        uint8
		str                                         string
		valid, tagged, send, solicited, invalidates bool
		ext                                         bool
		qn                                          uint32
	}{
		{name: "write", op: OpWrite, ctrl: 0x40, str: "RDMA Write", valid: true, tagged: true, qn: NoQN},
		{name: "read request", op: OpReadRequest, ctrl: 0x41, str: "RDMA Read Request", valid: true, qn: ddp.QNReadRequest},
		{name: "read response", op: OpReadResponse, ctrl: 0x42, str: "RDMA Read Response", valid: true, tagged: true, qn: NoQN},
		{name: "send", op: OpSend, ctrl: 0x43, str: "Send", valid: true, send: true, qn: ddp.QNSend},
		{name: "send inv", op: OpSendInv, ctrl: 0x44, str: "Send with Invalidate", valid: true, send: true, invalidates: true, qn: ddp.QNSend},
		{name: "send se", op: OpSendSE, ctrl: 0x45, str: "Send with SE", valid: true, send: true, solicited: true, qn: ddp.QNSend},
		{name: "send se inv", op: OpSendSEInv, ctrl: 0x46, str: "Send with SE and Invalidate", valid: true, send: true, solicited: true, invalidates: true, qn: ddp.QNSend},
		{name: "terminate", op: OpTerminate, ctrl: 0x47, str: "Terminate", valid: true, qn: ddp.QNTerminate},
		{name: "immediate data (RFC 7306)", op: OpImmediate, ctrl: 0x48, str: "Immediate Data", valid: true, ext: true, qn: ddp.QNSend},
		{name: "immediate data with SE (RFC 7306)", op: OpImmediateSE, ctrl: 0x49, str: "Immediate Data with SE", valid: true, ext: true, solicited: true, qn: ddp.QNSend},
		{name: "atomic request (RFC 7306)", op: OpAtomicRequest, ctrl: 0x4a, str: "Atomic Request", valid: true, ext: true, qn: ddp.QNReadRequest},
		{name: "atomic response (RFC 7306)", op: OpAtomicResponse, ctrl: 0x4b, str: "Atomic Response", valid: true, ext: true, qn: ddp.QNAtomicResponse},
		{name: "unassigned 0xc", op: 0xc, ctrl: 0x4c, str: "Opcode(0xc)", qn: NoQN},
		{name: "out of range", op: 0x1f, ctrl: 0x4f, str: "Opcode(0x1f)", qn: NoQN},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.op
			if got := Ctrl(o); got != tc.ctrl {
				t.Errorf("Ctrl = %#x, want %#x", got, tc.ctrl)
			}
			if got := o.String(); got != tc.str {
				t.Errorf("String = %q, want %q", got, tc.str)
			}
			if o.Valid() != tc.valid || o.Tagged() != tc.tagged || o.IsSend() != tc.send ||
				o.Solicited() != tc.solicited || o.Invalidates() != tc.invalidates || o.Extended() != tc.ext || o.QN() != tc.qn {
				t.Errorf("Valid %v Tagged %v IsSend %v Solicited %v Invalidates %v Extended %v QN %d",
					o.Valid(), o.Tagged(), o.IsSend(), o.Solicited(), o.Invalidates(), o.Extended(), o.QN())
			}
		})
	}
}

func TestReadRequestGolden(t *testing.T) {
	tests := []struct {
		name string
		rr   ReadRequest
		wire string
		str  string
	}{
		{
			name: "typical",
			rr:   ReadRequest{SinkSTag: 0x11223344, SinkTO: 0x0000_7fff_0000_1000, Size: 4096, SrcSTag: 0xaabbccdd, SrcTO: 0x8000},
			wire: "11223344 00007fff00001000 00001000 aabbccdd 0000000000008000",
			str:  "read request sink 0x11223344@0x7fff00001000 size 4096 src 0xaabbccdd@0x8000",
		},
		{
			name: "zero length read",
			rr:   ReadRequest{SinkSTag: 1, SrcSTag: 2},
			wire: "00000001 0000000000000000 00000000 00000002 0000000000000000",
			str:  "read request sink 0x1@0x0 size 0 src 0x2@0x0",
		},
		{
			name: "all ones",
			rr:   ReadRequest{SinkSTag: ^uint32(0), SinkTO: ^uint64(0), Size: ^uint32(0), SrcSTag: ^uint32(0), SrcTO: ^uint64(0)},
			wire: strings.Repeat("ff", ReadRequestLen),
			str:  "read request sink 0xffffffff@0xffffffffffffffff size 4294967295 src 0xffffffff@0xffffffffffffffff",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := testkit.Hex(t, tc.wire)
			buf := make([]byte, ReadRequestLen)
			if n := tc.rr.Marshal(buf); n != ReadRequestLen || !bytes.Equal(buf, want) {
				t.Fatalf("Marshal = %d %x, want %x", n, buf, want)
			}
			var got ReadRequest
			if err := got.Unmarshal(append(want, 0xee)); err != nil || got != tc.rr {
				t.Fatalf("Unmarshal = %+v, %v; want %+v", got, err, tc.rr)
			}
			if s := got.String(); s != tc.str {
				t.Fatalf("String = %q, want %q", s, tc.str)
			}
		})
	}
}

func TestReadRequestShort(t *testing.T) {
	tests := []struct {
		name string
		n    int
	}{
		{name: "empty", n: 0},
		{name: "one short", n: ReadRequestLen - 1},
		{name: "sink only", n: 12},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ReadRequest{Size: 9}
			err := r.Unmarshal(make([]byte, tc.n))
			if !errors.Is(err, ErrShort) || !strings.HasPrefix(err.Error(), "rdmap: read request: ") {
				t.Fatalf("Unmarshal error %v, want ErrShort with context", err)
			}
			if r != (ReadRequest{Size: 9}) {
				t.Fatalf("Unmarshal modified r on error: %+v", r)
			}
		})
	}
}

func TestReadRequestMarshalShortPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	var r ReadRequest
	r.Marshal(make([]byte, ReadRequestLen-1))
}

// loadSiw returns the ULPDU prefixes of testdata/siw-rping-segments.txt by
// name.
func loadSiw(t testing.TB) map[string][]byte {
	t.Helper()
	f, err := os.Open("testdata/siw-rping-segments.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	segs := map[string][]byte{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 || strings.HasPrefix(fs[0], "#") {
			continue
		}
		if len(fs) != 5 {
			t.Fatalf("bad testdata line %q", sc.Text())
		}
		segs[fs[0]] = testkit.Hex(t, fs[4])
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return segs
}

// TestSiwGolden decodes RDMAP headers that Linux siw sent during rping:
// the control octet of each message kind and the Read Request header, whose
// sink must match the STag/TO of the Read Response that answers it and
// whose source is the buffer the client advertised in its first Send.
func TestSiwGolden(t *testing.T) {
	segs := loadSiw(t)
	tests := []struct {
		name string
		op   Opcode
	}{
		{"send-msn1", OpSend},
		{"send-zero-msn8", OpSend},
		{"readreq-msn1", OpReadRequest},
		{"readresp-first", OpReadResponse},
		{"readresp-last", OpReadResponse},
		{"write-middle", OpWrite},
		{"write-last", OpWrite},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := segs[tc.name]
			if len(b) < 2 {
				t.Fatalf("segment %q missing", tc.name)
			}
			v, op := ParseCtrl(b[1])
			if v != Version || op != tc.op || !op.Valid() {
				t.Fatalf("ParseCtrl(%#x) = %d, %v; want %d, %v", b[1], v, op, Version, tc.op)
			}
			var h ddp.Header
			if _, err := h.Unmarshal(b); err != nil {
				t.Fatal(err)
			}
			if h.Tagged != op.Tagged() || (!h.Tagged && h.QN != op.QN()) {
				t.Fatalf("%v in %v", op, h)
			}
		})
	}

	t.Run("read request header", func(t *testing.T) {
		b := segs["readreq-msn1"]
		var rr ReadRequest
		if err := rr.Unmarshal(b[ddp.UntaggedHeaderLen:]); err != nil {
			t.Fatal(err)
		}
		want := ReadRequest{SinkSTag: 0x91b82000, SinkTO: 0x55c655e4a0f0, Size: 3000, SrcSTag: 0x1537c600, SrcTO: 0x55e9a6e1c7c0}
		if rr != want {
			t.Fatalf("decoded %v, want %v", rr, want)
		}
		buf := make([]byte, ReadRequestLen)
		rr.Marshal(buf)
		if !bytes.Equal(buf, b[ddp.UntaggedHeaderLen:ddp.UntaggedHeaderLen+ReadRequestLen]) {
			t.Fatalf("re-encoded %x", buf)
		}
		// The Read Response is placed at the request's sink.
		var resp ddp.Header
		if _, err := resp.Unmarshal(segs["readresp-first"]); err != nil {
			t.Fatal(err)
		}
		if resp.STag != rr.SinkSTag || resp.TO != rr.SinkTO {
			t.Fatalf("response %v does not target sink of %v", resp, rr)
		}
		// The source is what rping's client advertised in its Send
		// (payload: addr(8) rkey(4) size(4)).
		adv := segs["send-msn1"][ddp.UntaggedHeaderLen:]
		if got := hex.EncodeToString(adv); got != "000055e9a6e1c7c01537c60000000bb8" {
			t.Fatalf("advert %s", got)
		}
	})
}

func TestZeroAllocs(t *testing.T) {
	rrWire := testkit.Hex(t, "11223344 00007fff00001000 00001000 aabbccdd 0000000000008000")
	term := NewTerminate(TermRDMAPInvalidSTag, 46,
		testkit.Hex(t, "4141 00000000 00000001 00000001 00000000"), rrWire)
	termBuf := make([]byte, 64)
	immWire := testkit.Hex(t, "0000002a 00000001")
	tests := []struct {
		name string
		fn   func()
	}{
		{name: "read request", fn: func() {
			var r ReadRequest
			buf := make([]byte, ReadRequestLen)
			if err := r.Unmarshal(rrWire); err != nil {
				t.Fatal(err)
			}
			r.Marshal(buf)
		}},
		// The buffer lives outside the closure: Unmarshal makes the
		// Terminate alias it, so a stack buffer would escape, while the
		// engine's receive buffers are on the heap anyway.
		{name: "terminate", fn: func() {
			n := term.Marshal(termBuf)
			var t2 Terminate
			if err := t2.Unmarshal(termBuf[:n]); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "new terminate", fn: func() {
			_ = NewTerminate(TermDDPInvalidMSN, 34, rrWire, nil)
		}},
		{name: "immediate", fn: func() {
			var m Immediate
			if err := m.Unmarshal(immWire); err != nil {
				t.Fatal(err)
			}
			m.Marshal(termBuf)
		}},
		{name: "ctrl", fn: func() {
			_, _ = ParseCtrl(Ctrl(OpSendSEInv))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if a := testing.AllocsPerRun(100, tc.fn); a != 0 {
				t.Fatalf("%v allocs per run, want 0", a)
			}
		})
	}
}

func BenchmarkReadRequest(b *testing.B) {
	r := ReadRequest{SinkSTag: 1, SinkTO: 2, Size: 3, SrcSTag: 4, SrcTO: 5}
	var buf [ReadRequestLen]byte
	b.Run("marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r.Marshal(buf[:])
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		r.Marshal(buf[:])
		var got ReadRequest
		b.ReportAllocs()
		for b.Loop() {
			if err := got.Unmarshal(buf[:]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func FuzzReadRequest(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, ReadRequestLen))
	f.Add(testkit.Hex(f, "11223344 00007fff00001000 00001000 aabbccdd 0000000000008000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r ReadRequest
		if err := r.Unmarshal(b); err != nil {
			if !errors.Is(err, ErrShort) || len(b) >= ReadRequestLen {
				t.Fatalf("error %v for %d octets", err, len(b))
			}
			return
		}
		_ = r.String()
		buf := make([]byte, ReadRequestLen)
		r.Marshal(buf)
		if !bytes.Equal(buf, b[:ReadRequestLen]) {
			t.Fatalf("Marshal(Unmarshal(%x)) = %x", b[:ReadRequestLen], buf)
		}
		var r2 ReadRequest
		if err := r2.Unmarshal(buf); err != nil || r2 != r {
			t.Fatalf("second round %+v %v, want %+v", r2, err, r)
		}
	})
}
