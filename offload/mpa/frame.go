package mpa

import (
	"encoding/binary"
	"strconv"
	"strings"
)

// Startup frame sizes and limits (RFC 5044 connection setup, RFC 6581).
const (
	// FrameHeaderLen is the length of the fixed part of an MPA Request or
	// Reply: 16-octet key, flags, revision, PD_Length.
	FrameHeaderLen = 20
	// MaxPrivateDataRecv is the largest PD_Length accepted from a peer
	// (RFC 5044's limit).
	MaxPrivateDataRecv = 512
	// MaxPrivateDataSend is the largest PD_Length we ever send, including
	// the RFC 6581 IRD/ORD block: Linux siw drops a connection whose frame
	// has PD_Length > 256.
	MaxPrivateDataSend = 256
	// IRDORDMax is the largest IRD or ORD an RFC 6581 IRD/ORD block can
	// carry (14 bits). irdma sends it to mean "no IRD/ORD negotiation".
	IRDORDMax = 0x3fff
)

// Wire constants of the startup frames.
const (
	keyReq = "MPA ID Req Frame"
	keyRep = "MPA ID Rep Frame"

	flagMarkers  = 0x80
	flagCRC      = 0x40
	flagReject   = 0x20
	flagEnhanced = 0x10
	// The other bits of the flags octet (0x0f, and 0x10 below revision 2)
	// are reserved: RFC 5044 §7.1 has them sent as zero and not checked
	// on receipt. Append never sets them; ParseFrame ignores them (Linux
	// siw echoes its experimental GSO bit 0x08, for one).

	irdP2P     = 0x8000 // IRD word: peer-to-peer mode
	irdSendRTR = 0x4000 // IRD word: zero-length Send RTR
	ordWrite   = 0x8000 // ORD word: zero-length RDMA Write RTR
	ordRead    = 0x4000 // ORD word: zero-length RDMA Read RTR

	irdOrdBlockLen = 4
)

// RTR is a set of RFC 6581 ready-to-receive (RTR) message types.
type RTR uint8

// RTR types. In a Request they are the types offered, in a Reply the one
// chosen.
const (
	RTRWrite RTR = 1 << iota // zero-length RDMA Write (ORD word bit 15)
	RTRRead                  // zero-length RDMA Read Request (ORD word bit 14)
	RTRSend                  // zero-length Send (IRD word bit 14)
)

// String returns the types joined by "|" ("write|read"), or "none".
func (r RTR) String() string {
	if r == 0 {
		return "none"
	}
	var parts []string
	if r&RTRWrite != 0 {
		parts = append(parts, "write")
	}
	if r&RTRRead != 0 {
		parts = append(parts, "read")
	}
	if r&RTRSend != 0 {
		parts = append(parts, "send")
	}
	if rest := r &^ (RTRWrite | RTRRead | RTRSend); rest != 0 {
		parts = append(parts, "0x"+strconv.FormatUint(uint64(rest), 16))
	}
	return strings.Join(parts, "|")
}

// Frame is an MPA Request or Reply frame.
type Frame struct {
	Reply    bool  // "MPA ID Rep Frame" rather than "MPA ID Req Frame"
	Markers  bool  // M: the sender of this frame wants to receive Markers
	CRC      bool  // C: the sender of this frame wants CRCs
	Reject   bool  // R: the responder refuses the connection (Reply only)
	Enhanced bool  // RFC 6581 enhanced flag: a 4-octet IRD/ORD block leads the private data
	Rev      uint8 // MPA revision: 1 = RFC 5044, 2 = RFC 6581

	// The RFC 6581 IRD/ORD block, only when Enhanced.
	IRD, ORD uint16 // 14-bit values, at most IRDORDMax
	P2P      bool   // IRD word bit 15: peer-to-peer (RTR) mode
	RTR      RTR    // Send = IRD bit 14, Write = ORD bit 15, Read = ORD bit 14

	// PrivateData is the ULP private data after the IRD/ORD block (and
	// before siwtun's extension block). From ParseFrame it aliases the
	// parsed buffer.
	PrivateData []byte

	// Ext is what siwtun's extension block at the end of the private data
	// announces (see Ext); 0: the frame has no block.
	Ext Ext
}

// pdLen returns the PD_Length field f encodes to.
func (f *Frame) pdLen() int {
	n := len(f.PrivateData)
	if f.Enhanced {
		n += irdOrdBlockLen
	}
	if f.Ext != 0 {
		n += ExtBlockLen
	}
	return n
}

// Append appends the wire encoding of f to b. It fails if the PD_Length
// would exceed MaxPrivateDataRecv, if IRD or ORD exceed IRDORDMax, if
// Enhanced is set below Rev 2, or if IRD/ORD/P2P/RTR are set on a frame
// that is not Enhanced (they could not be sent). Callers that talk to Linux siw keep PD_Length ≤
// MaxPrivateDataSend; Config.Request and Respond do.
func (f *Frame) Append(b []byte) ([]byte, error) {
	if n := f.pdLen(); n > MaxPrivateDataRecv {
		return b, newError(CodeLocalCatastrophic, "encoding MPA frame: PD_Length %d exceeds %d", n, MaxPrivateDataRecv)
	}
	if f.IRD > IRDORDMax || f.ORD > IRDORDMax {
		return b, newError(CodeLocalCatastrophic, "encoding MPA frame: IRD %d / ORD %d exceed %d", f.IRD, f.ORD, IRDORDMax)
	}
	if f.Enhanced && f.Rev < 2 {
		return b, newError(CodeLocalCatastrophic, "encoding MPA frame: enhanced flag on a revision %d frame", f.Rev)
	}
	if !f.Enhanced && (f.IRD != 0 || f.ORD != 0 || f.P2P || f.RTR != 0) {
		return b, newError(CodeLocalCatastrophic, "encoding MPA frame: IRD/ORD/P2P/RTR set on a frame without the enhanced flag")
	}
	if f.RTR&^(RTRWrite|RTRRead|RTRSend) != 0 {
		return b, newError(CodeLocalCatastrophic, "encoding MPA frame: unknown RTR bits %#x", uint8(f.RTR))
	}
	if f.Reply {
		b = append(b, keyRep...)
	} else {
		b = append(b, keyReq...)
	}
	var flags byte
	if f.Markers {
		flags |= flagMarkers
	}
	if f.CRC {
		flags |= flagCRC
	}
	if f.Reject {
		flags |= flagReject
	}
	if f.Enhanced {
		flags |= flagEnhanced
	}
	b = append(b, flags, f.Rev)
	b = binary.BigEndian.AppendUint16(b, uint16(f.pdLen()))
	if f.Enhanced {
		ird, ord := f.IRD, f.ORD
		if f.P2P {
			ird |= irdP2P
		}
		if f.RTR&RTRSend != 0 {
			ird |= irdSendRTR
		}
		if f.RTR&RTRWrite != 0 {
			ord |= ordWrite
		}
		if f.RTR&RTRRead != 0 {
			ord |= ordRead
		}
		b = binary.BigEndian.AppendUint16(b, ird)
		b = binary.BigEndian.AppendUint16(b, ord)
	}
	b = append(b, f.PrivateData...)
	if f.Ext != 0 {
		b = appendExtBlock(b, f.Ext)
	}
	return b, nil
}

// checkHeader validates the fixed 20-octet header h and returns PD_Length.
func checkHeader(h []byte) (pdLen int, err error) {
	key := string(h[:16]) // no allocation: compared, not stored
	if key != keyReq && key != keyRep {
		return 0, newError(CodeInvalidFrame, "bad MPA frame key %q", h[:16])
	}
	pdLen = int(binary.BigEndian.Uint16(h[18:20]))
	if pdLen > MaxPrivateDataRecv {
		return 0, newError(CodeInvalidFrame, "MPA frame PD_Length %d exceeds %d", pdLen, MaxPrivateDataRecv)
	}
	return pdLen, nil
}

// ParseFrame parses one whole MPA Request or Reply frame; b must hold
// exactly the frame. PrivateData aliases b.
//
// The enhanced flag is honoured only at Rev ≥ 2; in a Rev 0/1 frame bit
// 0x10 is a reserved bit and is ignored, so the whole private data is ULP
// private data. A Rev 2 frame without the flag is a plain (non-enhanced)
// frame, as Linux siw treats it. siwtun's extension block at the end of
// the private data, if there is one, goes to Ext and not to PrivateData.
// Reserved bits are ignored. Errors are *Error with CodeInvalidFrame.
func ParseFrame(b []byte) (Frame, error) {
	if len(b) < FrameHeaderLen {
		return Frame{}, newError(CodeInvalidFrame, "short MPA frame: %d octets, the header alone is %d", len(b), FrameHeaderLen)
	}
	pdLen, err := checkHeader(b)
	if err != nil {
		return Frame{}, err
	}
	if len(b) != FrameHeaderLen+pdLen {
		if len(b) < FrameHeaderLen+pdLen {
			return Frame{}, newError(CodeInvalidFrame, "short MPA frame: PD_Length %d but only %d octets of private data", pdLen, len(b)-FrameHeaderLen)
		}
		return Frame{}, newError(CodeInvalidFrame, "MPA frame followed by %d extra octets", len(b)-FrameHeaderLen-pdLen)
	}
	flags := b[16]
	f := Frame{
		Reply:   string(b[:16]) == keyRep,
		Markers: flags&flagMarkers != 0,
		CRC:     flags&flagCRC != 0,
		Reject:  flags&flagReject != 0,
		Rev:     b[17],
	}
	pd := b[FrameHeaderLen:]
	if flags&flagEnhanced != 0 && f.Rev >= 2 {
		if pdLen < irdOrdBlockLen {
			return Frame{}, newError(CodeInvalidFrame, "enhanced MPA frame with PD_Length %d, shorter than the IRD/ORD block", pdLen)
		}
		f.Enhanced = true
		ird := binary.BigEndian.Uint16(pd[0:2])
		ord := binary.BigEndian.Uint16(pd[2:4])
		f.IRD = ird & IRDORDMax
		f.ORD = ord & IRDORDMax
		f.P2P = ird&irdP2P != 0
		if ird&irdSendRTR != 0 {
			f.RTR |= RTRSend
		}
		if ord&ordWrite != 0 {
			f.RTR |= RTRWrite
		}
		if ord&ordRead != 0 {
			f.RTR |= RTRRead
		}
		pd = pd[irdOrdBlockLen:]
	}
	pd, f.Ext = SplitExtBlock(pd)
	if len(pd) > 0 {
		f.PrivateData = pd
	}
	return f, nil
}

// String returns a tcpdump-like one-line summary, for example
// "mpa req rev 2 C M enhanced ird 1 ord 1 p2p rtr=write pd 12 ext imm"
// (pd counts the ULP's private data; ext names the extension block's).
func (f Frame) String() string {
	var sb strings.Builder
	if f.Reply {
		sb.WriteString("mpa rep rev ")
	} else {
		sb.WriteString("mpa req rev ")
	}
	sb.WriteString(strconv.Itoa(int(f.Rev)))
	if f.CRC {
		sb.WriteString(" C")
	}
	if f.Markers {
		sb.WriteString(" M")
	}
	if f.Reject {
		sb.WriteString(" R")
	}
	if f.Enhanced {
		sb.WriteString(" enhanced ird ")
		sb.WriteString(strconv.Itoa(int(f.IRD)))
		sb.WriteString(" ord ")
		sb.WriteString(strconv.Itoa(int(f.ORD)))
		if f.P2P {
			sb.WriteString(" p2p")
		}
		if f.RTR != 0 {
			sb.WriteString(" rtr=")
			sb.WriteString(f.RTR.String())
		}
	}
	sb.WriteString(" pd ")
	sb.WriteString(strconv.Itoa(len(f.PrivateData)))
	if f.Ext != 0 {
		sb.WriteString(" ext ")
		sb.WriteString(f.Ext.String())
	}
	return sb.String()
}

// FrameReader accumulates one MPA Request or Reply from a byte stream fed in
// arbitrary chunks. It never consumes past the end of the frame, so the
// octets that follow (FPDUs in P2P mode, or a protocol violation) stay with
// the caller. The zero value is ready to use; it holds the frame in a fixed
// internal buffer and does not allocate.
type FrameReader struct {
	buf  [FrameHeaderLen + MaxPrivateDataRecv]byte
	n    int // octets held
	want int // total frame length once the header is in, else 0
	err  error
}

// Feed consumes octets from p up to at most the end of the frame. It
// returns how many it consumed and whether the frame is complete. Errors
// (bad key, PD_Length > MaxPrivateDataRecv) are reported as soon as the
// header is in and are sticky until Reset.
func (r *FrameReader) Feed(p []byte) (n int, done bool, err error) {
	if r.err != nil {
		return 0, false, r.err
	}
	for len(p) > 0 {
		if r.want != 0 && r.n == r.want {
			break
		}
		limit := FrameHeaderLen
		if r.want != 0 {
			limit = r.want
		}
		c := copy(r.buf[r.n:limit], p)
		r.n += c
		n += c
		p = p[c:]
		if r.want == 0 && r.n == FrameHeaderLen {
			pdLen, err := checkHeader(r.buf[:FrameHeaderLen])
			if err != nil {
				r.err = err
				return n, false, err
			}
			r.want = FrameHeaderLen + pdLen
		}
	}
	return n, r.want != 0 && r.n == r.want, nil
}

// Frame parses the accumulated frame. PrivateData aliases the reader's
// buffer and stays valid until Reset or the reader is discarded.
func (r *FrameReader) Frame() (Frame, error) {
	if r.err != nil {
		return Frame{}, r.err
	}
	if r.want == 0 || r.n != r.want {
		return Frame{}, newError(CodeInvalidFrame, "MPA frame incomplete: %d octets so far", r.n)
	}
	return ParseFrame(r.buf[:r.n])
}

// Reset makes the reader ready for a new frame.
func (r *FrameReader) Reset() {
	r.n, r.want, r.err = 0, 0, nil
}
