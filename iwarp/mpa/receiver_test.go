package mpa

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

func TestReceiverMarkerErrors(t *testing.T) {
	tests := []struct {
		name string
		wire string
	}{
		{name: "leading marker with FPDUPTR 4", wire: "00000004 0002aabb 00000000"},
		{name: "leading marker with FPDUPTR 512", wire: "00000200 0002aabb 00000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Receiver
			r.Init(false, true, &recorder{t: t})
			n, err := r.Write(testkit.Hex(t, tt.wire))
			var me *Error
			if !errors.As(err, &me) || me.Code != CodeMarkerMismatch || n != 4 {
				t.Fatalf("Write = %d, %v; want 4, code 0x03", n, err)
			}
		})
	}
	// An FPDU without a leading marker only accepts the exact distance.
	var s Sender
	s.Init(false, true)
	var stream []byte
	s.Begin(stream, 498)
	s.Write(seq(498))
	stream = s.Finish() // 508 octets
	s.Begin(stream, 14)
	s.Write(seq(14))
	stream = s.Finish()
	if binary.BigEndian.Uint16(stream[514:]) != 4 {
		t.Fatalf("setup: marker at 512 = %x", stream[512:516])
	}
	for _, v := range []uint16{0, 8, 4 + 512, 0xfffc} {
		bad := append([]byte(nil), stream...)
		binary.BigEndian.PutUint16(bad[514:], v)
		var r Receiver
		r.Init(false, true, &recorder{t: t})
		if _, err := r.Write(bad); code(err) != int(CodeMarkerMismatch) {
			t.Errorf("FPDUPTR %d: err %v, want code 0x03", v, err)
		}
	}
	// The low two bits and the reserved half are ignored.
	for _, v := range [][2]uint16{{0, 5}, {0, 7}, {0xffff, 4}} {
		ok := append([]byte(nil), stream...)
		binary.BigEndian.PutUint16(ok[512:], v[0])
		binary.BigEndian.PutUint16(ok[514:], v[1])
		var r Receiver
		r.Init(false, true, &recorder{t: t})
		if _, err := r.Write(ok); err != nil {
			t.Errorf("marker %04x%04x: %v", v[0], v[1], err)
		}
	}
}

// errHandler fails at a chosen call.
type errHandler struct {
	failAt string
	err    error
}

func (h *errHandler) BeginFPDU(int) error {
	if h.failAt == "begin" {
		return h.err
	}
	return nil
}

func (h *errHandler) ULPDU([]byte) error {
	if h.failAt == "ulpdu" {
		return h.err
	}
	return nil
}

func (h *errHandler) EndFPDU(bool) error {
	if h.failAt == "end" {
		return h.err
	}
	return nil
}

func TestReceiverHandlerErrors(t *testing.T) {
	wire := testkit.Hex(t, "0003112233000000 00000000 0001aa00 00000000")
	tests := []struct {
		failAt string
		want   int // octets consumed when the error is returned
	}{
		{failAt: "begin", want: 2},
		{failAt: "ulpdu", want: 5},
		{failAt: "end", want: 12},
	}
	for _, tt := range tests {
		t.Run(tt.failAt, func(t *testing.T) {
			sentinel := errors.New("handler says no")
			var r Receiver
			r.Init(true, false, &errHandler{failAt: tt.failAt, err: sentinel})
			n, err := r.Write(wire)
			if err != sentinel || n != tt.want {
				t.Fatalf("Write = %d, %v; want %d, the handler's error as is", n, err, tt.want)
			}
			if _, err := r.Write(wire); err != sentinel {
				t.Errorf("error not sticky: %v", err)
			}
		})
	}
}

func TestReceiverNotInitialized(t *testing.T) {
	var r Receiver
	if _, err := r.Write([]byte{0}); err == nil {
		t.Fatal("Write on an uninitialized Receiver: no error")
	}
}

// TestReceiverAwaiting: the octets the FPDU being received still lacks,
// after each prefix of a stream of one FPDU with a 5-octet ULPDU (2
// length, 5 data, 1 pad, 4 CRC: 12 octets) and then the next FPDU's
// first octet.
func TestReceiverAwaiting(t *testing.T) {
	var s Sender
	s.Init(true, false)
	s.Begin(nil, 5)
	s.Write(seq(5))
	stream := append(s.Finish(), 0x00)
	want := []int{0, 1, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1}
	if len(stream)+1 != len(want) {
		t.Fatalf("setup: stream of %d octets", len(stream))
	}
	for n := range want {
		var r Receiver
		r.Init(true, false, &recorder{t: t})
		if _, err := r.Write(stream[:n]); err != nil {
			t.Fatalf("%d octets: %v", n, err)
		}
		if got := r.Awaiting(); got != want[n] {
			t.Errorf("after %d octets: Awaiting %d, want %d", n, got, want[n])
		}
	}
}
