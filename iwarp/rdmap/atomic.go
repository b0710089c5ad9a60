package rdmap

import (
	"encoding/binary"
	"fmt"
)

// RFC 7306 atomic operations. An Atomic Request (OpAtomicRequest) rides the
// untagged queue of RDMA Read Requests (QN 1, sharing its MSNs and the
// responder's IRD with Read Requests); the Atomic Response
// (OpAtomicResponse) comes back on its own untagged queue, QN 3
// (ddp.QNAtomicResponse), in the order of the requests. Both are one DDP
// segment holding exactly their header.

// AtomicRequestLen is the length in octets of an Atomic Request header
// after the untagged DDP header:
//
//	octets  0..3   Reserved (28 bits) | AOpCode (4 bits)
//	octets  4..7   Request Identifier
//	octets  8..11  Remote STag
//	octets 12..19  Remote Tagged Offset (8-octet aligned)
//	octets 20..27  Add or Swap Data
//	octets 28..35  Add or Swap Mask
//	octets 36..43  Compare Data
//	octets 44..51  Compare Mask
//
// every field big-endian.
const AtomicRequestLen = 52

// AtomicResponseLen is the length in octets of an Atomic Response header
// after the untagged DDP header: the Original Request Identifier (4
// octets) and the Original Remote Data Value (8 octets), big-endian.
const AtomicResponseLen = 12

// AtomicAlign is the alignment RFC 7306 requires of an atomic operation's
// Remote Tagged Offset: the 64-bit word it operates on.
const AtomicAlign = 8

// AtomicOp is an Atomic Request's operation code (AOpCode, RFC 7306).
type AtomicOp uint8

// Atomic operation codes.
const (
	// AtomicFetchAdd adds Add Data to the remote word (carries cut at the
	// bits set in Add Mask) and returns its original value.
	AtomicFetchAdd AtomicOp = 0
	// AtomicSwap replaces the bits of the remote word set in Swap Mask by
	// those of Swap Data and returns its original value.
	AtomicSwap AtomicOp = 1
	// AtomicCmpSwap does what AtomicSwap does if the bits of the remote
	// word set in Compare Mask equal those of Compare Data, and returns
	// its original value either way.
	AtomicCmpSwap AtomicOp = 2
)

// String returns the operation's RFC name, or "AOpCode(0xN)".
func (o AtomicOp) String() string {
	switch o {
	case AtomicFetchAdd:
		return "FetchAdd"
	case AtomicSwap:
		return "Swap"
	case AtomicCmpSwap:
		return "CmpSwap"
	}
	return fmt.Sprintf("AOpCode(0x%x)", uint8(o))
}

// Valid reports whether o is one of RFC 7306's three operations.
func (o AtomicOp) Valid() bool { return o <= AtomicCmpSwap }

// AtomicRequest is the header of an Atomic Request message.
type AtomicRequest struct {
	// Op is the operation; Reserved the 28 bits before it (zero when
	// sent, kept as received).
	Op       AtomicOp
	Reserved uint32
	// ReqID identifies the request; the Atomic Response returns it.
	ReqID uint32
	// STag and TO name the remote 64-bit word.
	STag uint32
	TO   uint64
	// AddSwap and AddSwapMask are the Add Data and Add Mask of a FetchAdd,
	// the Swap Data and Swap Mask of a Swap or CmpSwap.
	AddSwap, AddSwapMask uint64
	// Compare and CompareMask are a CmpSwap's Compare Data and Mask.
	Compare, CompareMask uint64
}

// Marshal writes the AtomicRequestLen octets of m to the front of b and
// returns AtomicRequestLen. It panics if b is shorter.
func (m *AtomicRequest) Marshal(b []byte) int {
	_ = b[AtomicRequestLen-1]
	be := binary.BigEndian
	be.PutUint32(b[0:4], m.Reserved<<4|uint32(m.Op&0xF))
	be.PutUint32(b[4:8], m.ReqID)
	be.PutUint32(b[8:12], m.STag)
	be.PutUint64(b[12:20], m.TO)
	be.PutUint64(b[20:28], m.AddSwap)
	be.PutUint64(b[28:36], m.AddSwapMask)
	be.PutUint64(b[36:44], m.Compare)
	be.PutUint64(b[44:52], m.CompareMask)
	return AtomicRequestLen
}

// Unmarshal decodes the Atomic Request header at the front of b. Extra
// octets are ignored; the only error is a short buffer (wrapping
// ErrShort), in which case m is unchanged. An unknown AOpCode is decoded
// as it is (see AtomicOp.Valid).
func (m *AtomicRequest) Unmarshal(b []byte) error {
	if len(b) < AtomicRequestLen {
		return fmt.Errorf("rdmap: atomic request: need %d octets, have %d: %w", AtomicRequestLen, len(b), ErrShort)
	}
	be := binary.BigEndian
	w := be.Uint32(b[0:4])
	*m = AtomicRequest{
		Op: AtomicOp(w & 0xF), Reserved: w >> 4,
		ReqID: be.Uint32(b[4:8]), STag: be.Uint32(b[8:12]), TO: be.Uint64(b[12:20]),
		AddSwap: be.Uint64(b[20:28]), AddSwapMask: be.Uint64(b[28:36]),
		Compare: be.Uint64(b[36:44]), CompareMask: be.Uint64(b[44:52]),
	}
	return nil
}

// String returns a one-line summary: "atomic FetchAdd id 7 stag
// 0x01020304 to 0x1000 add 0x1", with the masks when they are not the
// plain operation's (Add Mask 0, Swap and Compare Mask all ones).
func (m AtomicRequest) String() string {
	s := fmt.Sprintf("atomic %v id %d stag 0x%08x to 0x%x", m.Op, m.ReqID, m.STag, m.TO)
	switch m.Op {
	case AtomicFetchAdd:
		s += fmt.Sprintf(" add 0x%x", m.AddSwap)
		if m.AddSwapMask != 0 {
			s += fmt.Sprintf(" mask 0x%x", m.AddSwapMask)
		}
	case AtomicCmpSwap:
		s += fmt.Sprintf(" compare 0x%x", m.Compare)
		if m.CompareMask != ^uint64(0) {
			s += fmt.Sprintf(" mask 0x%x", m.CompareMask)
		}
		fallthrough
	case AtomicSwap:
		s += fmt.Sprintf(" swap 0x%x", m.AddSwap)
		if m.AddSwapMask != ^uint64(0) {
			s += fmt.Sprintf(" mask 0x%x", m.AddSwapMask)
		}
	}
	return s
}

// Apply returns the new value of a remote word holding old after the
// request, and whether the word changes. It is the operation alone; the
// responder makes it atomic.
func (m *AtomicRequest) Apply(old uint64) (uint64, bool) {
	switch m.Op {
	case AtomicFetchAdd:
		return maskedAdd(old, m.AddSwap, m.AddSwapMask), true
	case AtomicSwap:
		return old&^m.AddSwapMask | m.AddSwap&m.AddSwapMask, true
	case AtomicCmpSwap:
		if old&m.CompareMask != m.Compare&m.CompareMask {
			return old, false
		}
		return old&^m.AddSwapMask | m.AddSwap&m.AddSwapMask, true
	}
	return old, false
}

// maskedAdd adds a to x in fields whose most significant bits are the
// bits set in mask: a carry out of such a bit is dropped. With mask 0 it
// is the plain 64-bit add.
func maskedAdd(x, a, mask uint64) uint64 {
	if mask == 0 {
		return x + a
	}
	var sum, carry uint64
	for i := uint(0); i < 64; i++ {
		bx, ba := x>>i&1, a>>i&1
		s := bx ^ ba ^ carry
		carry = bx&ba | carry&(bx^ba)
		sum |= s << i
		if mask>>i&1 != 0 {
			carry = 0
		}
	}
	return sum
}

// AtomicResponse is the header of an Atomic Response message.
type AtomicResponse struct {
	// ReqID is the Original Request Identifier.
	ReqID uint32
	// Value is the Original Remote Data Value: the word before the
	// operation.
	Value uint64
}

// Marshal writes the AtomicResponseLen octets of m to the front of b and
// returns AtomicResponseLen. It panics if b is shorter.
func (m *AtomicResponse) Marshal(b []byte) int {
	_ = b[AtomicResponseLen-1]
	binary.BigEndian.PutUint32(b[0:4], m.ReqID)
	binary.BigEndian.PutUint64(b[4:12], m.Value)
	return AtomicResponseLen
}

// Unmarshal decodes the Atomic Response header at the front of b. Extra
// octets are ignored; the only error is a short buffer (wrapping
// ErrShort), in which case m is unchanged.
func (m *AtomicResponse) Unmarshal(b []byte) error {
	if len(b) < AtomicResponseLen {
		return fmt.Errorf("rdmap: atomic response: need %d octets, have %d: %w", AtomicResponseLen, len(b), ErrShort)
	}
	*m = AtomicResponse{ReqID: binary.BigEndian.Uint32(b[0:4]), Value: binary.BigEndian.Uint64(b[4:12])}
	return nil
}

// String returns "atomic response id 7 value 0x2a".
func (m AtomicResponse) String() string {
	return fmt.Sprintf("atomic response id %d value 0x%x", m.ReqID, m.Value)
}
