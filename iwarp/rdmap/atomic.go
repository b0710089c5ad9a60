package rdmap

import (
	"encoding/binary"
	"fmt"
)

// RFC 7306 atomic operations. An Atomic Request (OpAtomicRequest) rides the
// untagged queue of RDMA Read Requests (QN 1, sharing its MSNs and the
// responder's IRD with Read Requests: RFC 7306 §5.2, §5.2.2 item 4); the
// Atomic Response (OpAtomicResponse) comes back on its own untagged queue,
// QN 3 (ddp.QNAtomicResponse, §5.2.2 item 3), in the order of the requests
// (§5.4 item 8). Both are one DDP segment holding exactly their header
// (§4.2: no ULP payload).

// AtomicRequestLen is the length in octets of an Atomic Request header
// after the untagged DDP header (RFC 7306 §5.2.1, Figure 4):
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
// octets) and the Original Remote Data Value (8 octets), big-endian
// (RFC 7306 §5.2.2, Figure 6, and the segment of Appendix A.2; the "32
// bytes" of §4's prose matches neither).
const AtomicResponseLen = 12

// AtomicAlign is the alignment RFC 7306 requires of an atomic operation's
// Remote Tagged Offset: the 64-bit word it operates on (§5.1.1, §5.1.2,
// §8.2).
const AtomicAlign = 8

// AtomicOp is an Atomic Request's operation code (AOpCode, RFC 7306
// §5.2.1, Figure 5; IANA's "RDMAP Message Atomic Operation Subcodes",
// §10.1).
type AtomicOp uint8

// Atomic operation codes. RFC 7306 defines two, and an RNIC that supports
// atomics implements both (§5); 0x1 is registered as Reserved (§10.1) and
// every other value is unassigned. The Swap the field descriptions of
// §5.2.1 mention has no code: a request with AOpCode 0x1 is one the RNIC
// does not support (§5.2.1 item 4).
const (
	// AtomicFetchAdd adds Add Data to the remote word (carries cut at the
	// bits set in Add Mask) and returns its original value (§5.1.1).
	AtomicFetchAdd AtomicOp = 0
	// AtomicReserved is AOpCode 0x1, registered as Reserved (§10.1).
	AtomicReserved AtomicOp = 1
	// AtomicCmpSwap replaces the bits of the remote word set in Swap Mask
	// by those of Swap Data if the bits of the word set in Compare Mask
	// equal those of Compare Data, and returns its original value either
	// way (§5.1.2).
	AtomicCmpSwap AtomicOp = 2
)

// String returns the operation's RFC name, or "AOpCode(0xN)" for a code
// RFC 7306 does not define (0x1 included).
func (o AtomicOp) String() string {
	switch o {
	case AtomicFetchAdd:
		return "FetchAdd"
	case AtomicCmpSwap:
		return "CmpSwap"
	}
	return fmt.Sprintf("AOpCode(0x%x)", uint8(o))
}

// Valid reports whether o is one of RFC 7306's two operations (FetchAdd,
// CmpSwap). A responder refuses an Atomic Request of any other code
// (§5.2.1 item 4).
func (o AtomicOp) Valid() bool { return o == AtomicFetchAdd || o == AtomicCmpSwap }

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
	// the Swap Data and Swap Mask of a CmpSwap.
	AddSwap, AddSwapMask uint64
	// Compare and CompareMask are a CmpSwap's Compare Data and Mask.
	Compare, CompareMask uint64
}

// FetchAdd returns the Atomic Request of a FetchAdd of add to the word at
// stag/to with the given Add Mask (0: a plain 64-bit add), its unused
// fields as RFC 7306 §5.2.1 has them sent: Compare Data zero, Compare Mask
// all ones.
func FetchAdd(reqID, stag uint32, to, add, addMask uint64) AtomicRequest {
	return AtomicRequest{Op: AtomicFetchAdd, ReqID: reqID, STag: stag, TO: to,
		AddSwap: add, AddSwapMask: addMask, CompareMask: ^uint64(0)}
}

// CmpSwap returns the Atomic Request of a CmpSwap of the word at stag/to
// (RFC 7306 §5.1.2). The verbs' unmasked Compare-and-Swap has both masks
// all ones.
func CmpSwap(reqID, stag uint32, to, compare, compareMask, swap, swapMask uint64) AtomicRequest {
	return AtomicRequest{Op: AtomicCmpSwap, ReqID: reqID, STag: stag, TO: to,
		AddSwap: swap, AddSwapMask: swapMask, Compare: compare, CompareMask: compareMask}
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
		s += fmt.Sprintf(" swap 0x%x", m.AddSwap)
		if m.AddSwapMask != ^uint64(0) {
			s += fmt.Sprintf(" mask 0x%x", m.AddSwapMask)
		}
	}
	return s
}

// Apply returns the new value of a remote word holding old after the
// request, and whether the word changes: the pseudocode of RFC 7306
// §5.1.1 (masked FetchAdd) and §5.1.2 (masked CmpSwap). It is the
// operation alone; the responder makes it atomic. A code that is not
// Valid leaves the word as it is.
func (m *AtomicRequest) Apply(old uint64) (uint64, bool) {
	switch m.Op {
	case AtomicFetchAdd:
		return maskedAdd(old, m.AddSwap, m.AddSwapMask), true
	case AtomicCmpSwap:
		if old&m.CompareMask != m.Compare&m.CompareMask {
			return old, false
		}
		return old&^m.AddSwapMask | m.AddSwap&m.AddSwapMask, true
	}
	return old, false
}

// maskedAdd adds a to x in fields whose most significant bits are the
// bits set in mask: a carry out of such a bit is dropped (RFC 7306
// §5.1.1). With mask 0 it is the plain 64-bit add.
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
