package rdmap

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/siwtun/siwtun/iwarp/ddp"
)

// TerminateHeaderLen is the length in octets of the fixed part of the
// Terminate header, the Terminate Control field, which follows the untagged
// DDP header (QN 2, MSN 1, MO 0, L=1) of a Terminate message.
const TerminateHeaderLen = 4

// DDPSegLenLen is the length in octets of the DDP Segment Length field that
// follows the Terminate Control field when the M or D bit is set.
const DDPSegLenLen = 2

// Header control (hdrct) bits in octet 2 of the Terminate Control field.
const (
	hdrctM = 0x80 // DDP Segment Length valid
	hdrctD = 0x40 // terminated DDP header included
	hdrctR = 0x20 // terminated RDMAP (Read Request) header included
)

// Terminate is the RDMAP Terminate header (RFC 5040 §4.8):
//
//	Terminate Control (4): Layer(4) EType(4) ECode(8) M D R Rsvd(13)
//	DDP Segment Length (2)          present if M or D
//	Terminated DDP Header (14|18)   present if D; tagged or untagged per its T bit
//	Terminated RDMAP Header (28)    present if R; a Read Request header
//
// The Terminate Control's 13 reserved bits are written as zero and ignored
// on receipt.
type Terminate struct {
	// Code is the error being reported.
	Code Code
	// HasSegLen is the M bit: DDPSegLen is valid.
	HasSegLen bool
	// HasDDPHeader is the D bit: DDPHeader holds the header of the DDP
	// segment that failed.
	HasDDPHeader bool
	// HasRDMAPHeader is the R bit: RDMAPHeader holds the Read Request
	// header of the message that failed.
	HasRDMAPHeader bool
	// DDPSegLen is the length of the failed DDP segment. The field is on
	// the wire whenever M or D is set, and meaningful only if M is set.
	DDPSegLen uint16
	// DDPHeader is the failed DDP header, ddp.TaggedHeaderLen or
	// ddp.UntaggedHeaderLen octets according to the T bit of its first
	// octet. Unmarshal makes it alias its input.
	DDPHeader []byte
	// RDMAPHeader is the failed Read Request header, ReadRequestLen octets.
	// Unmarshal makes it alias its input.
	RDMAPHeader []byte
}

// ddpHeaderLen is the number of DDPHeader octets Marshal writes; a missing
// first octet counts as zero (untagged).
func (t *Terminate) ddpHeaderLen() int {
	if len(t.DDPHeader) == 0 {
		return ddp.UntaggedHeaderLen
	}
	return ddp.HeaderLen(t.DDPHeader[0])
}

// Len returns the encoded length of t, which follows from the hdrct bits
// and the T bit of DDPHeader.
func (t *Terminate) Len() int {
	n := TerminateHeaderLen
	if t.HasSegLen || t.HasDDPHeader {
		n += DDPSegLenLen
	}
	if t.HasDDPHeader {
		n += t.ddpHeaderLen()
	}
	if t.HasRDMAPHeader {
		n += ReadRequestLen
	}
	return n
}

// Marshal writes the t.Len() octets of t to the front of b and returns that
// length. DDPHeader and RDMAPHeader are copied up to the length the format
// gives them; octets missing from a short slice are written as zero. Marshal
// panics if b is shorter than t.Len().
func (t *Terminate) Marshal(b []byte) int {
	n := t.Len()
	_ = b[n-1]
	binary.BigEndian.PutUint16(b[0:2], uint16(t.Code))
	var hdrct byte
	if t.HasSegLen {
		hdrct |= hdrctM
	}
	if t.HasDDPHeader {
		hdrct |= hdrctD
	}
	if t.HasRDMAPHeader {
		hdrct |= hdrctR
	}
	b[2] = hdrct
	b[3] = 0
	off := TerminateHeaderLen
	if t.HasSegLen || t.HasDDPHeader {
		binary.BigEndian.PutUint16(b[off:], t.DDPSegLen)
		off += DDPSegLenLen
	}
	if t.HasDDPHeader {
		off += copyPad(b[off:off+t.ddpHeaderLen()], t.DDPHeader)
	}
	if t.HasRDMAPHeader {
		off += copyPad(b[off:off+ReadRequestLen], t.RDMAPHeader)
	}
	return off
}

// copyPad fills dst from src and zeroes what src does not cover.
func copyPad(dst, src []byte) int {
	clear(dst[copy(dst, src):])
	return len(dst)
}

// Unmarshal decodes the Terminate header that makes up b (the octets after
// the untagged DDP header of a Terminate message) and checks that b holds
// exactly what the hdrct bits announce. Errors wrap ErrShort (missing
// octets) or ErrMalformed (octets left over).
//
// Even on error, everything decoded before the problem is set; in
// particular Code and the hdrct bits are valid whenever b holds at least
// TerminateHeaderLen octets, so a Terminate with inconsistent lengths can
// still be reported. (Linux siw sets R on a Remote Protection Terminate for
// a failed Send without including an RDMAP header, which makes its
// Terminate 28 octets short of what R announces.)
func (t *Terminate) Unmarshal(b []byte) error {
	*t = Terminate{}
	if len(b) < TerminateHeaderLen {
		return fmt.Errorf("rdmap: terminate: control field needs %d octets, have %d: %w",
			TerminateHeaderLen, len(b), ErrShort)
	}
	t.Code = Code(binary.BigEndian.Uint16(b[0:2]))
	t.HasSegLen = b[2]&hdrctM != 0
	t.HasDDPHeader = b[2]&hdrctD != 0
	t.HasRDMAPHeader = b[2]&hdrctR != 0
	off := TerminateHeaderLen
	if t.HasSegLen || t.HasDDPHeader {
		if len(b) < off+DDPSegLenLen {
			return fmt.Errorf("rdmap: terminate: DDP segment length: need %d octets, have %d: %w",
				off+DDPSegLenLen, len(b), ErrShort)
		}
		t.DDPSegLen = binary.BigEndian.Uint16(b[off:])
		off += DDPSegLenLen
	}
	if t.HasDDPHeader {
		if len(b) <= off {
			return fmt.Errorf("rdmap: terminate: DDP header announced but absent: %w", ErrShort)
		}
		n := ddp.HeaderLen(b[off])
		if len(b) < off+n {
			return fmt.Errorf("rdmap: terminate: DDP header: need %d octets, have %d: %w",
				off+n, len(b), ErrShort)
		}
		t.DDPHeader = b[off : off+n : off+n]
		off += n
	}
	if t.HasRDMAPHeader {
		if len(b) < off+ReadRequestLen {
			return fmt.Errorf("rdmap: terminate: RDMAP header: need %d octets, have %d: %w",
				off+ReadRequestLen, len(b), ErrShort)
		}
		t.RDMAPHeader = b[off : off+ReadRequestLen : off+ReadRequestLen]
		off += ReadRequestLen
	}
	if off != len(b) {
		return fmt.Errorf("rdmap: terminate: %d octets after the %d that hdrct announces: %w",
			len(b)-off, off, ErrMalformed)
	}
	return nil
}

// String returns a one-line summary of t, decoding the copied headers.
func (t Terminate) String() string {
	var sb strings.Builder
	sb.WriteString("terminate ")
	sb.WriteString(t.Code.String())
	if t.HasSegLen || t.HasDDPHeader || t.HasRDMAPHeader {
		sb.WriteString(" hdrct ")
		if t.HasSegLen {
			sb.WriteByte('M')
		}
		if t.HasDDPHeader {
			sb.WriteByte('D')
		}
		if t.HasRDMAPHeader {
			sb.WriteByte('R')
		}
	}
	if t.HasSegLen {
		fmt.Fprintf(&sb, " seglen %d", t.DDPSegLen)
	}
	if t.HasDDPHeader {
		var h ddp.Header
		if _, err := h.Unmarshal(t.DDPHeader); err != nil {
			fmt.Fprintf(&sb, " [ddp %x]", t.DDPHeader)
		} else {
			v, op := ParseCtrl(h.ULPCtrl)
			fmt.Fprintf(&sb, " [%v] [rdmap v%d %v]", h, v, op)
		}
	}
	if t.HasRDMAPHeader {
		var r ReadRequest
		if err := r.Unmarshal(t.RDMAPHeader); err != nil {
			fmt.Fprintf(&sb, " [rdmap %x]", t.RDMAPHeader)
		} else {
			fmt.Fprintf(&sb, " [%v]", r)
		}
	}
	return sb.String()
}

// NewTerminate builds the Terminate header that reports code for a failed
// inbound DDP segment, deciding which parts of it to copy the way RFC 5040
// §4.8 and Linux siw (siw_send_terminate) do:
//
//   - LLP errors, and RDMAP Local Catastrophic errors: nothing is copied.
//   - DDP errors: M and D, with ddpSegLen and the DDP header, except for
//     the two Invalid DDP version errors, where the layout is unknown.
//   - RDMAP Remote Operation errors: M and D, except for Invalid RDMAP
//     version and Unexpected OpCode (layout unknown).
//   - RDMAP Remote Protection errors: M and D, plus R with the Read Request
//     header when rdmapHdr is given and the failed segment is an RDMA Read
//     Request.
//
// ddpHdr is the failed segment from its first DDP octet on; it may be
// longer than the header (e.g. the whole ULPDU) and is cut to the header
// length its T bit gives. rdmapHdr is the failed Read Request header (the
// ReadRequestLen octets after the untagged DDP header), or nil. A part whose
// slice is nil or too short is left out together with its hdrct bit(s), so
// the result always marshals to a well-formed Terminate. The returned value
// aliases ddpHdr and rdmapHdr; NewTerminate does not allocate.
//
// ddpSegLen is the length of the failed DDP segment (RFC 5041: DDP header
// plus payload, i.e. the MPA ULPDU_Length). Linux siw reports the payload
// length instead (ULPDU_Length minus the DDP and RDMAP headers); the caller
// chooses.
//
// Unlike siw, NewTerminate never sets R without including the RDMAP header:
// siw sets R for a protection error on a Send but attaches only the DDP
// header.
func NewTerminate(code Code, ddpSegLen uint16, ddpHdr, rdmapHdr []byte) Terminate {
	t := Terminate{Code: code}
	var copyDDP, copyRDMAP bool
	switch code.Layer() {
	case LayerRDMAP:
		switch code.EType() {
		case ETypeRDMAPRemoteProtection:
			copyDDP, copyRDMAP = true, true
		case ETypeRDMAPRemoteOperation:
			copyDDP = code != TermRDMAPBadVersion && code != TermRDMAPUnexpectedOp
		}
	case LayerDDP:
		copyDDP = code != TermDDPTaggedBadVersion && code != TermDDPUntaggedBadVersion
	}
	haveDDP := len(ddpHdr) > 0 && len(ddpHdr) >= ddp.HeaderLen(ddpHdr[0])
	if copyDDP && haveDDP {
		n := ddp.HeaderLen(ddpHdr[0])
		t.HasSegLen, t.HasDDPHeader = true, true
		t.DDPSegLen = ddpSegLen
		t.DDPHeader = ddpHdr[:n:n]
	}
	if copyRDMAP && len(rdmapHdr) >= ReadRequestLen {
		isRead := true
		if haveDDP {
			_, op := ParseCtrl(ddpHdr[1])
			isRead = ddp.HeaderLen(ddpHdr[0]) == ddp.UntaggedHeaderLen && op == OpReadRequest
		}
		if isRead {
			t.HasRDMAPHeader = true
			t.RDMAPHeader = rdmapHdr[:ReadRequestLen:ReadRequestLen]
		}
	}
	return t
}
