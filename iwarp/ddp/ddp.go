// Package ddp encodes and decodes the Direct Data Placement (DDP) segment
// header of RFC 5041, the middle layer of iWARP between MPA (RFC 5044) and
// RDMAP (RFC 5040).
//
// A DDP segment header starts with a 16-bit control word whose first octet
// belongs to DDP (T, L, reserved bits, DV) and whose second octet is the first
// octet of the RsvdULP field, owned by the upper layer (RDMAP puts its RV and
// opcode there). The tagged form (T=1) then carries an STag and a 64-bit
// tagged offset (14 octets in total); the untagged form (T=0) carries the
// remaining 32 bits of RsvdULP, a queue number, a message sequence number
// and a message offset (18 octets in total). All fields are big-endian.
//
//	byte 0: T(0x80) L(0x40) Rsvd(0x3C) DV(0x03)
//	byte 1: RsvdULP[0] (RDMAP: RV(0xC0) Rsvd(0x30) Opcode(0x0F))
//	tagged:   STag(4) TO(8)
//	untagged: RsvdULP[1:5](4) QN(4) MSN(4) MO(4)
//
// The codec is deliberately permissive: it decodes the version and the
// reserved bits as they are on the wire and leaves their validation (and the
// Terminate that a bad version calls for) to the engine.
package ddp

import (
	"encoding/binary"
	"fmt"
)

// Protocol constants.
const (
	// Version is the DDP version (DV) defined by RFC 5041.
	Version = 1
	// TaggedHeaderLen is the length in octets of a tagged DDP header,
	// control word included.
	TaggedHeaderLen = 14
	// UntaggedHeaderLen is the length in octets of an untagged DDP header,
	// control word included.
	UntaggedHeaderLen = 18
)

// Untagged queue numbers used by RDMAP (RFC 5040 §5.1; siw
// enum rdmap_untagged_qn).
const (
	// QNSend is the queue of the four Send message variants.
	QNSend = 0
	// QNReadRequest is the queue of RDMA Read Request messages.
	QNReadRequest = 1
	// QNTerminate is the queue of Terminate messages.
	QNTerminate = 2
	// QNAtomicResponse is the queue of RFC 7306's Atomic Response
	// messages (RFC 7306 §5.2, §10.2; its Atomic Requests share
	// QNReadRequest).
	QNAtomicResponse = 3
)

// Bits of the first octet of the control word.
const (
	flagTagged   = 0x80
	flagLast     = 0x40
	maskReserved = 0x3C
	maskVersion  = 0x03
)

// constError is an error that can be a constant.
type constError string

// Error implements error.
func (e constError) Error() string { return string(e) }

// ErrShort reports a buffer shorter than the header it should hold. Errors
// returned by Unmarshal wrap it; test with errors.Is.
const ErrShort = constError("ddp: buffer too short")

// Header is a DDP segment header, tagged or untagged.
//
// Fields that do not belong to the form selected by Tagged are ignored by
// Marshal and zeroed by Unmarshal.
type Header struct {
	// Tagged is the T bit: tagged buffer model (true) or untagged (false).
	Tagged bool
	// Last is the L bit: this segment is the last of its DDP message.
	Last bool
	// Version is the 2-bit DDP version (DV). Unmarshal decodes it as is;
	// senders set it to Version.
	Version uint8
	// Reserved holds the 4 reserved DDP control bits (right-aligned),
	// decoded as is; senders leave it zero.
	Reserved uint8
	// ULPCtrl is octet 1 of the control word, the first octet of RsvdULP.
	// RDMAP stores its version and opcode here (see rdmap.Ctrl).
	ULPCtrl uint8
	// ULPData is the remainder of RsvdULP in the untagged form; RDMAP
	// carries the Invalidate STag of Send with Invalidate here and zero
	// otherwise.
	ULPData uint32
	// STag is the data sink steering tag (tagged form).
	STag uint32
	// TO is the tagged offset of the segment's first payload octet
	// (tagged form).
	TO uint64
	// QN is the queue number (untagged form).
	QN uint32
	// MSN is the message sequence number (untagged form).
	MSN uint32
	// MO is the message offset of the segment's first payload octet
	// (untagged form).
	MO uint32
}

// HeaderLen returns the length of the DDP header that starts with the octet
// first: TaggedHeaderLen if its T bit is set, else UntaggedHeaderLen.
func HeaderLen(first byte) int {
	if first&flagTagged != 0 {
		return TaggedHeaderLen
	}
	return UntaggedHeaderLen
}

// Len returns the encoded length of h: TaggedHeaderLen or UntaggedHeaderLen.
func (h *Header) Len() int {
	if h.Tagged {
		return TaggedHeaderLen
	}
	return UntaggedHeaderLen
}

// Marshal writes the h.Len() octets of h to the front of b and returns that
// length. Version and Reserved are truncated to their field widths. Marshal
// panics if b is shorter than h.Len(); sizing the buffer is the caller's job.
func (h *Header) Marshal(b []byte) int {
	n := h.Len()
	_ = b[n-1] // bounds check once; a short buffer is a programming error
	c := h.Version&maskVersion | h.Reserved<<2&maskReserved
	if h.Tagged {
		c |= flagTagged
	}
	if h.Last {
		c |= flagLast
	}
	b[0] = c
	b[1] = h.ULPCtrl
	if h.Tagged {
		binary.BigEndian.PutUint32(b[2:6], h.STag)
		binary.BigEndian.PutUint64(b[6:14], h.TO)
		return n
	}
	binary.BigEndian.PutUint32(b[2:6], h.ULPData)
	binary.BigEndian.PutUint32(b[6:10], h.QN)
	binary.BigEndian.PutUint32(b[10:14], h.MSN)
	binary.BigEndian.PutUint32(b[14:18], h.MO)
	return n
}

// Unmarshal decodes the DDP header at the front of b into h and returns its
// length. The only error is a buffer too short for the header form announced
// by the T bit (wrapping ErrShort); version and reserved bits are decoded as
// they are and not checked here. On error h is left unchanged.
func (h *Header) Unmarshal(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("ddp: header: empty buffer: %w", ErrShort)
	}
	n := HeaderLen(b[0])
	if len(b) < n {
		return 0, fmt.Errorf("ddp: header: %s form needs %d octets, have %d: %w",
			form(b[0]&flagTagged != 0), n, len(b), ErrShort)
	}
	c := b[0]
	*h = Header{
		Tagged:   c&flagTagged != 0,
		Last:     c&flagLast != 0,
		Version:  c & maskVersion,
		Reserved: c & maskReserved >> 2,
		ULPCtrl:  b[1],
	}
	if h.Tagged {
		h.STag = binary.BigEndian.Uint32(b[2:6])
		h.TO = binary.BigEndian.Uint64(b[6:14])
		return n, nil
	}
	h.ULPData = binary.BigEndian.Uint32(b[2:6])
	h.QN = binary.BigEndian.Uint32(b[6:10])
	h.MSN = binary.BigEndian.Uint32(b[10:14])
	h.MO = binary.BigEndian.Uint32(b[14:18])
	return n, nil
}

// String returns a one-line summary such as
// "ddp T L stag 0x1a2b to 0x7f0000001000" or "ddp U L qn 0 msn 1 mo 0".
// The L is omitted on a segment that is not the last one; the ULP control
// octet, a non-zero ULPData, an unexpected version and non-zero reserved
// bits are appended.
func (h Header) String() string {
	l := ""
	if h.Last {
		l = " L"
	}
	extra := fmt.Sprintf(" ulp 0x%02x", h.ULPCtrl)
	if h.Version != Version {
		extra += fmt.Sprintf(" dv %d", h.Version)
	}
	if h.Reserved != 0 {
		extra += fmt.Sprintf(" rsvd 0x%x", h.Reserved)
	}
	if h.Tagged {
		return fmt.Sprintf("ddp T%s stag 0x%x to 0x%x%s", l, h.STag, h.TO, extra)
	}
	if h.ULPData != 0 {
		extra += fmt.Sprintf(" ulpdata 0x%x", h.ULPData)
	}
	return fmt.Sprintf("ddp U%s qn %d msn %d mo %d%s", l, h.QN, h.MSN, h.MO, extra)
}

func form(tagged bool) string {
	if tagged {
		return "tagged"
	}
	return "untagged"
}
