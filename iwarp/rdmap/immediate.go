package rdmap

import (
	"encoding/binary"
	"fmt"
)

// ImmediateDataLen is the length in octets of the Immediate Data an
// Immediate Data message carries after its untagged DDP header (RFC 7306:
// 8 octets, the whole ULP payload of the message).
const ImmediateDataLen = 8

// ImmSendFollows is the Immediate.Flags bit of an Immediate Data message
// that carries the immediate value of the Send right behind it (siwtun's
// Send with Immediate Data, see Immediate).
const ImmSendFollows = 1 << 0

// Immediate is the Immediate Data of an Immediate Data message (RFC 7306)
// as siwtun fills its 8 octets, which RFC 7306 leaves to the ULP:
//
//	octets 0..3  Data   the verbs immediate value (libibverbs' imm_data), big-endian
//	octets 4..7  Flags  zero, or ImmSendFollows
//
// Data sits where the 32-bit imm_data of a libibverbs work request sits in
// the 64-bit Immediate Data of Chelsio's RFC 7306 hardware (the first
// four octets, the rest zero), so an RDMA Write with Immediate Data of
// siwtun is the RFC's RDMA Write followed by an Immediate Data message.
//
// Flags is siwtun's: a Send with Immediate Data has no opcode of its own in
// RFC 7306, and siwtun sends it as an Immediate Data message with
// ImmSendFollows, which consumes no receive, followed by the Send, which
// completes its receive with the immediate value. Only peers that
// negotiated siwtun's RFC 7306 support (the MPA private data's extension
// block, package mpa) ever see Immediate Data.
type Immediate struct {
	// Data is the immediate value.
	Data uint32
	// Flags are siwtun's flags: ImmSendFollows or 0.
	Flags uint32
}

// SendFollows reports whether the Immediate Data belongs to the Send that
// follows it.
func (m Immediate) SendFollows() bool { return m.Flags&ImmSendFollows != 0 }

// Marshal writes the ImmediateDataLen octets of m to the front of b and
// returns ImmediateDataLen. It panics if b is shorter.
func (m *Immediate) Marshal(b []byte) int {
	_ = b[ImmediateDataLen-1]
	binary.BigEndian.PutUint32(b[0:4], m.Data)
	binary.BigEndian.PutUint32(b[4:8], m.Flags)
	return ImmediateDataLen
}

// Unmarshal decodes the Immediate Data at the front of b (the octets after
// the untagged DDP header). Extra octets are ignored; the only error is a
// short buffer (wrapping ErrShort), in which case m is unchanged.
func (m *Immediate) Unmarshal(b []byte) error {
	if len(b) < ImmediateDataLen {
		return fmt.Errorf("rdmap: immediate data: need %d octets, have %d: %w", ImmediateDataLen, len(b), ErrShort)
	}
	*m = Immediate{Data: binary.BigEndian.Uint32(b[0:4]), Flags: binary.BigEndian.Uint32(b[4:8])}
	return nil
}

// String returns a one-line summary of m: "immediate data 0x0000002a",
// with " (send follows)" or the unknown flags after it.
func (m Immediate) String() string {
	s := fmt.Sprintf("immediate data 0x%08x", m.Data)
	if m.SendFollows() {
		s += " (send follows)"
	}
	if rest := m.Flags &^ ImmSendFollows; rest != 0 {
		s += fmt.Sprintf(" flags 0x%x", rest)
	}
	return s
}
