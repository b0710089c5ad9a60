package mpa

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

// Hex of the two keys.
var (
	hexReq = hex.EncodeToString([]byte(keyReq)) // 4d504120494420526571204672616d65
	hexRep = hex.EncodeToString([]byte(keyRep)) // 4d504120494420526570204672616d65
)

func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	return b
}

// frameVectors are golden startup frames: wire bytes and their Frame.
func frameVectors(t testing.TB) []struct {
	name  string
	wire  []byte
	frame Frame
	str   string
} {
	pd256 := seq(252)
	pd512 := seq(512)
	return []struct {
		name  string
		wire  []byte
		frame Frame
		str   string
	}{
		{
			name:  "req rev1 plain",
			wire:  testkit.Hex(t, hexReq+"00 01 0000"),
			frame: Frame{Rev: 1},
			str:   "mpa req rev 1 pd 0",
		},
		{
			name:  "req rev1 M C pd",
			wire:  testkit.Hex(t, hexReq+"c0 01 0003 616263"),
			frame: Frame{Rev: 1, Markers: true, CRC: true, PrivateData: []byte("abc")},
			str:   "mpa req rev 1 C M pd 3",
		},
		{
			name:  "rep rev1 C",
			wire:  testkit.Hex(t, hexRep+"40 01 0000"),
			frame: Frame{Reply: true, Rev: 1, CRC: true},
			str:   "mpa rep rev 1 C pd 0",
		},
		{
			name:  "req rev2 enhanced siw default",
			wire:  testkit.Hex(t, hexReq+"10 02 0004 0001 0001"),
			frame: Frame{Rev: 2, Enhanced: true, IRD: 1, ORD: 1},
			str:   "mpa req rev 2 enhanced ird 1 ord 1 pd 0",
		},
		{
			name:  "req rev2 p2p write+read (siw, irdma)",
			wire:  testkit.Hex(t, hexReq+"50 02 0006 8080 c010 7a7a"),
			frame: Frame{Rev: 2, CRC: true, Enhanced: true, IRD: 0x80, ORD: 0x10, P2P: true, RTR: RTRWrite | RTRRead, PrivateData: []byte("zz")},
			str:   "mpa req rev 2 C enhanced ird 128 ord 16 p2p rtr=write|read pd 2",
		},
		{
			name:  "req rev2 p2p send rtr, max ird/ord",
			wire:  testkit.Hex(t, hexReq+"10 02 0004 ffff 3fff"),
			frame: Frame{Rev: 2, Enhanced: true, IRD: IRDORDMax, ORD: IRDORDMax, P2P: true, RTR: RTRSend},
			str:   "mpa req rev 2 enhanced ird 16383 ord 16383 p2p rtr=send pd 0",
		},
		{
			name:  "rep rev2 p2p read rtr (chelsio)",
			wire:  testkit.Hex(t, hexRep+"50 02 0004 8020 4001"),
			frame: Frame{Reply: true, Rev: 2, CRC: true, Enhanced: true, IRD: 0x20, ORD: 1, P2P: true, RTR: RTRRead},
			str:   "mpa rep rev 2 C enhanced ird 32 ord 1 p2p rtr=read pd 0",
		},
		{
			name:  "rep reject rev2 enhanced with pd",
			wire:  testkit.Hex(t, hexRep+"30 02 0007 0002 0002 6e6f21"),
			frame: Frame{Reply: true, Reject: true, Rev: 2, Enhanced: true, IRD: 2, ORD: 2, PrivateData: []byte("no!")},
			str:   "mpa rep rev 2 R enhanced ird 2 ord 2 pd 3",
		},
		{
			name:  "rep reject rev1 M cleared",
			wire:  testkit.Hex(t, hexRep+"20 01 0000"),
			frame: Frame{Reply: true, Reject: true, Rev: 1},
			str:   "mpa rep rev 1 R pd 0",
		},
		{
			// A siwtun Reply to a siwtun Request: the extension block
			// announces Immediate Data, atomics and ExtReady; the flags
			// octet's reserved bits are zero.
			name:  "rep rev2 siwtun block imm atomic ready",
			wire:  testkit.Hex(t, hexRep+"50 02 000c 0010 0004 7369777475 6e 01 83"),
			frame: Frame{Reply: true, Rev: 2, CRC: true, Enhanced: true, IRD: 16, ORD: 4, Ext: ExtAll | ExtReady},
			str:   "mpa rep rev 2 C enhanced ird 16 ord 4 pd 0 ext imm|atomic|ready",
		},
		{
			name:  "rep rev2 without enhanced flag",
			wire:  testkit.Hex(t, hexRep+"80 02 0002 0102"),
			frame: Frame{Reply: true, Rev: 2, Markers: true, PrivateData: []byte{1, 2}},
			str:   "mpa rep rev 2 M pd 2",
		},
		{
			name:  "req rev2 pd 256 incl block",
			wire:  append(testkit.Hex(t, hexReq+"10 02 0100 0004 0004"), pd256...),
			frame: Frame{Rev: 2, Enhanced: true, IRD: 4, ORD: 4, PrivateData: pd256},
			str:   "mpa req rev 2 enhanced ird 4 ord 4 pd 252",
		},
		{
			name:  "req rev2 with siwtun extension block",
			wire:  testkit.Hex(t, hexReq+"50 02 000f 0010 0010 616263 7369777475 6e 01 01"),
			frame: Frame{Rev: 2, CRC: true, Enhanced: true, IRD: 16, ORD: 16, PrivateData: []byte("abc"), Ext: ExtImmediate},
			str:   "mpa req rev 2 C enhanced ird 16 ord 16 pd 3 ext imm",
		},
		{
			name:  "rep rev1 extension block only",
			wire:  testkit.Hex(t, hexRep+"40 01 0008 73697774756e 01 01"),
			frame: Frame{Reply: true, Rev: 1, CRC: true, Ext: ExtImmediate},
			str:   "mpa rep rev 1 C pd 0 ext imm",
		},
		{
			name:  "unknown extension bits kept",
			wire:  testkit.Hex(t, hexReq+"00 01 0008 73697774756e 01 43"),
			frame: Frame{Rev: 1, Ext: 0x43},
			str:   "mpa req rev 1 pd 0 ext imm|atomic|0x40",
		},
		{
			name:  "block with no extensions is ULP data",
			wire:  testkit.Hex(t, hexReq+"00 01 0008 73697774756e 01 00"),
			frame: Frame{Rev: 1, PrivateData: testkit.Hex(t, "73697774756e 01 00")},
			str:   "mpa req rev 1 pd 8",
		},
		{
			name:  "block of another version is ULP data",
			wire:  testkit.Hex(t, hexReq+"00 01 0008 73697774756e 02 01"),
			frame: Frame{Rev: 1, PrivateData: testkit.Hex(t, "73697774756e 02 01")},
			str:   "mpa req rev 1 pd 8",
		},
		{
			name:  "req rev1 pd 512",
			wire:  append(testkit.Hex(t, hexReq+"40 01 0200"), pd512...),
			frame: Frame{Rev: 1, CRC: true, PrivateData: pd512},
			str:   "mpa req rev 1 C pd 512",
		},
	}
}

func TestFrameCodec(t *testing.T) {
	for _, tt := range frameVectors(t) {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseFrame(tt.wire)
			if err != nil {
				t.Fatalf("ParseFrame: %v", err)
			}
			if !reflect.DeepEqual(got, tt.frame) {
				t.Errorf("ParseFrame = %+v, want = %+v", got, tt.frame)
			}
			if s := got.String(); s != tt.str {
				t.Errorf("String = %q, want = %q", s, tt.str)
			}
			wire, err := tt.frame.Append([]byte{0xee})
			if err != nil {
				t.Fatalf("Append: %v", err)
			}
			if wire[0] != 0xee || !bytes.Equal(wire[1:], tt.wire) {
				t.Errorf("Append = %x, want = ee%x", wire, tt.wire)
			}
		})
	}
}

func TestParseFrameIgnoresEnhancedBelowRev2(t *testing.T) {
	// Bit 0x10 is reserved in rev 1: the 4 octets stay private data.
	f, err := ParseFrame(testkit.Hex(t, hexReq+"10 01 0004 8001 c001"))
	if err != nil {
		t.Fatal(err)
	}
	want := Frame{Rev: 1, PrivateData: testkit.Hex(t, "8001c001")}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("ParseFrame = %+v, want = %+v", f, want)
	}
}

// TestReservedBitsZero: RFC 5044 §7.1 has the flags octet's reserved bits
// sent as zero and not checked on receipt. Frames with every reserved bit
// set parse as if they were clear; every frame Config.Request, Respond and
// RejectReply build, whatever the configuration (Ready included), has
// them clear, and a Request never carries ExtReady, so a peer that echoes
// the Request's private data in its Reply cannot claim it.
func TestReservedBitsZero(t *testing.T) {
	for _, tt := range []struct{ wire, want string }{
		{hexReq + "5f 02 0004 0001 0001", "mpa req rev 2 C enhanced ird 1 ord 1 pd 0"},
		{hexRep + "5f 02 0004 0001 0001", "mpa rep rev 2 C enhanced ird 1 ord 1 pd 0"},
		{hexRep + "1f 01 0000", "mpa rep rev 1 pd 0"},
	} {
		f, err := ParseFrame(testkit.Hex(t, tt.wire))
		if err != nil || f.String() != tt.want {
			t.Errorf("ParseFrame(%s) = %q, %v; want %q", tt.wire, f.String(), err, tt.want)
		}
	}
	check := func(what string, f Frame) {
		t.Helper()
		b, err := f.Append(nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		reserved := byte(0x0f)
		if f.Rev < 2 {
			reserved |= flagEnhanced
		}
		if b[16]&reserved != 0 {
			t.Errorf("%s: flags %#02x set reserved bits %#02x", what, b[16], b[16]&reserved)
		}
	}
	for _, rev := range []uint8{1, 2} {
		for _, ext := range []Ext{0, ExtImmediate, ExtAll, ExtAll | ExtReady} {
			for _, ready := range []bool{false, true} {
				for _, p2p := range []RTR{0, RTRWrite | RTRRead} {
					c := Config{Rev: rev, CRC: true, IRD: 4, ORD: 4, Ext: ext, Ready: ready}
					if rev == 2 {
						c.P2P = p2p
					}
					name := fmt.Sprintf("rev %d ext %v ready %v p2p %v", rev, ext, ready, c.P2P)
					req, err := c.Request()
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if req.Ext&ExtReady != 0 {
						t.Errorf("%s: the Request announces %v", name, req.Ext)
					}
					check(name+": Request", req)
					rep, _, err := Respond(&c, req)
					if err != nil {
						t.Fatalf("%s: Respond: %v", name, err)
					}
					check(name+": Reply", rep)
					check(name+": reject", c.RejectReply(req, []byte("no")))
				}
			}
		}
	}
}

func TestParseFrameErrors(t *testing.T) {
	tests := []struct {
		name string
		wire []byte
		want string // substring of the error
	}{
		{name: "empty", wire: nil, want: "short MPA frame"},
		{name: "header short", wire: testkit.Hex(t, hexReq+"00 01 00"), want: "short MPA frame"},
		{name: "bad key", wire: testkit.Hex(t, hex.EncodeToString([]byte("MPA ID Rex Frame"))+"00 01 0000"), want: "bad MPA frame key"},
		{name: "lowercase key", wire: testkit.Hex(t, hex.EncodeToString([]byte("mpa id req frame"))+"00 01 0000"), want: "bad MPA frame key"},
		{name: "pd length 513", wire: append(testkit.Hex(t, hexReq+"00 01 0201"), make([]byte, 513)...), want: "PD_Length 513 exceeds 512"},
		{name: "pd short", wire: testkit.Hex(t, hexReq+"00 01 0004 0102"), want: "only 2 octets"},
		{name: "trailing", wire: testkit.Hex(t, hexReq+"00 01 0000 00"), want: "1 extra octets"},
		{name: "enhanced pd 3", wire: testkit.Hex(t, hexReq+"10 02 0003 000100"), want: "shorter than the IRD/ORD block"},
		{name: "enhanced pd 0", wire: testkit.Hex(t, hexRep+"10 02 0000"), want: "shorter than the IRD/ORD block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseFrame(tt.wire)
			var me *Error
			if !errors.As(err, &me) || me.Code != CodeInvalidFrame {
				t.Fatalf("ParseFrame error = %v, want *Error code 0x04", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

func TestFrameAppendErrors(t *testing.T) {
	tests := []struct {
		name  string
		frame Frame
	}{
		{name: "pd 513", frame: Frame{Rev: 1, PrivateData: make([]byte, 513)}},
		{name: "pd 509 + block", frame: Frame{Rev: 2, Enhanced: true, PrivateData: make([]byte, 509)}},
		{name: "ird too big", frame: Frame{Rev: 2, Enhanced: true, IRD: 0x4000}},
		{name: "ord too big", frame: Frame{Rev: 2, Enhanced: true, ORD: 0xffff}},
		{name: "ird without enhanced", frame: Frame{Rev: 2, IRD: 1}},
		{name: "p2p without enhanced", frame: Frame{Rev: 2, P2P: true, RTR: RTRRead}},
		{name: "unknown rtr", frame: Frame{Rev: 2, Enhanced: true, RTR: 0x80}},
		{name: "enhanced rev1", frame: Frame{Rev: 1, Enhanced: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.frame.Append([]byte{1})
			if err == nil {
				t.Fatalf("Append = %x, want an error", b)
			}
			if len(b) != 1 {
				t.Errorf("Append returned %d octets on error, want the input back", len(b))
			}
		})
	}
}

func TestFrameReader(t *testing.T) {
	for _, tt := range frameVectors(t) {
		t.Run(tt.name, func(t *testing.T) {
			for _, chunk := range []int{1, 3, 19, 20, 21, 1000} {
				// The frame followed by FPDU octets that must not be eaten.
				stream := append(append([]byte(nil), tt.wire...), 0xde, 0xad, 0xbe, 0xef)
				var r FrameReader
				used := 0
				done := false
				for !done {
					end := min(used+chunk, len(stream))
					n, d, err := r.Feed(stream[used:end])
					if err != nil {
						t.Fatalf("chunk %d: Feed: %v", chunk, err)
					}
					if n == 0 && !d {
						t.Fatalf("chunk %d: Feed made no progress", chunk)
					}
					used += n
					done = d
				}
				if used != len(tt.wire) {
					t.Fatalf("chunk %d: consumed %d octets, the frame has %d", chunk, used, len(tt.wire))
				}
				if n, d, err := r.Feed([]byte{1}); n != 0 || !d || err != nil {
					t.Errorf("Feed after done = %d, %v, %v; want 0, true, nil", n, d, err)
				}
				f, err := r.Frame()
				if err != nil {
					t.Fatalf("Frame: %v", err)
				}
				if !reflect.DeepEqual(f, tt.frame) {
					t.Errorf("Frame = %+v, want = %+v", f, tt.frame)
				}
				r.Reset()
				if _, err := r.Frame(); err == nil {
					t.Errorf("Frame after Reset: no error")
				}
			}
		})
	}
}

func TestFrameReaderErrors(t *testing.T) {
	tests := []struct {
		name string
		wire []byte
		want uint8
	}{
		{name: "bad key", wire: testkit.Hex(t, hexReq[:30]+"00 00 01 0000"), want: CodeInvalidFrame},
		{name: "pd 0xffff", wire: testkit.Hex(t, hexRep+"00 01 ffff"), want: CodeInvalidFrame},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r FrameReader
			_, done, err := r.Feed(tt.wire)
			var me *Error
			if done || !errors.As(err, &me) || me.Code != tt.want {
				t.Fatalf("Feed = done %v, %v; want an *Error code %#x", done, err, tt.want)
			}
			if _, _, err2 := r.Feed([]byte{0}); err2 == nil {
				t.Errorf("error not sticky")
			}
		})
	}
	var r FrameReader
	if _, err := r.Frame(); err == nil {
		t.Errorf("Frame on an empty reader: no error")
	}
}

func TestFrameReaderNoAlloc(t *testing.T) {
	wire := frameVectors(t)[4].wire
	var r FrameReader
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset()
		if _, _, err := r.Feed(wire); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Frame(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("FrameReader allocates %v times per frame, want 0", allocs)
	}
}

func TestFrameStringExample(t *testing.T) {
	f := Frame{Rev: 2, CRC: true, Markers: true, Enhanced: true, IRD: 1, ORD: 1, P2P: true, RTR: RTRWrite, PrivateData: make([]byte, 12)}
	if got, want := f.String(), "mpa req rev 2 C M enhanced ird 1 ord 1 p2p rtr=write pd 12"; got != want {
		t.Errorf("String = %q, want = %q", got, want)
	}
}

func TestRTRString(t *testing.T) {
	tests := []struct {
		rtr  RTR
		want string
	}{
		{0, "none"},
		{RTRWrite, "write"},
		{RTRRead | RTRSend, "read|send"},
		{RTRWrite | RTRRead | RTRSend | 0x40, "write|read|send|0x40"},
	}
	for _, tt := range tests {
		if got := tt.rtr.String(); got != tt.want {
			t.Errorf("RTR(%#x).String() = %q, want = %q", uint8(tt.rtr), got, tt.want)
		}
	}
}
