package inspect

import (
	"net/netip"
	"strings"
	"time"
)

// TCP header flag bits, as in Segment.Flags.
const (
	FlagFIN uint8 = 1 << iota // FlagFIN: no more data from the sender.
	FlagSYN                   // FlagSYN: synchronise sequence numbers.
	FlagRST                   // FlagRST: reset the connection.
	FlagPSH                   // FlagPSH: push.
	FlagACK                   // FlagACK: acknowledgement field valid.
)

// FlagString returns the TCP flags as tcpdump-like names joined by ","
// ("SYN,ACK"), or "" when none of FIN, SYN, RST, PSH, ACK is set.
func FlagString(f uint8) string {
	var parts []string
	for _, n := range []struct {
		bit  uint8
		name string
	}{{FlagSYN, "SYN"}, {FlagFIN, "FIN"}, {FlagRST, "RST"}, {FlagPSH, "PSH"}, {FlagACK, "ACK"}} {
		if f&n.bit != 0 {
			parts = append(parts, n.name)
		}
	}
	return strings.Join(parts, ",")
}

// Segment is one TCP segment as captured.
type Segment struct {
	// Time is when it was seen.
	Time time.Time
	// Src and Dst are its source and destination.
	Src, Dst netip.AddrPort
	// Seq is its sequence number.
	Seq uint32
	// Flags are its TCP flags (FlagSYN, ...).
	Flags uint8
	// Payload is its TCP payload. The Analyzer copies what it keeps.
	Payload []byte
}

// Kind says what a segment's payload is.
type Kind string

// Kinds of Report.
const (
	// KindControl: no payload (SYN, ACK, FIN, RST).
	KindControl Kind = "control"
	// KindRequest and KindReply: the MPA Request or Reply frame (any
	// FPDU octets after it in the same segment are reported too).
	KindRequest Kind = "mpa-request"
	KindReply   Kind = "mpa-reply"
	// KindFPDU: FPDU stream octets.
	KindFPDU Kind = "fpdu"
	// KindRetransmission: octets already seen (not analysed again).
	KindRetransmission Kind = "retransmission"
	// KindHeld: arrived ahead of a gap (or before the MPA exchange was
	// complete); analysed later, in a Report of KindFPDU with Held set.
	KindHeld Kind = "held"
	// KindOther: the connection does not speak MPA.
	KindOther Kind = "not-iwarp"
	// KindUnsynced: FPDU stream octets after octets that were not
	// observed (a live watch's gap), before the checker found an FPDU
	// boundary it can trust; not analysed.
	KindUnsynced Kind = "unsynced"
	// KindUndecoded: the direction cannot be decoded (its start was not
	// captured, or the capture lost octets); Note says why.
	KindUndecoded Kind = "undecoded"
)

// Report is what the Analyzer found in one segment.
type Report struct {
	// Time, Src, Dst, Seq and Flags are the segment's.
	Time  time.Time      `json:"time"`
	Src   netip.AddrPort `json:"src"`
	Dst   netip.AddrPort `json:"dst"`
	Seq   uint32         `json:"seq"`
	Flags string         `json:"flags,omitempty"`
	// Len is the payload length.
	Len int `json:"len"`
	// Role is the sender's MPA role, "initiator" or "responder", once the
	// MPA Request has been seen.
	Role string `json:"role,omitempty"`
	// Kind says what the payload is.
	Kind Kind `json:"kind"`
	// Frame is the MPA Request or Reply (KindRequest, KindReply).
	Frame string `json:"frame,omitempty"`
	// Offset is the FPDU stream offset of the first FPDU octet in the
	// segment (KindFPDU, and frames followed by FPDU octets).
	Offset uint64 `json:"offset"`
	// Aligned says whether the FPDU octets of the segment are exactly
	// whole FPDUs (KindFPDU only).
	Aligned *bool `json:"aligned,omitempty"`
	// SplitStart describes the FPDU the segment starts inside of, and
	// SplitEnd the one it ends inside of (not aligned only).
	SplitStart *Split `json:"split_start,omitempty"`
	SplitEnd   *Split `json:"split_end,omitempty"`
	// FPDUs are the FPDUs with octets in the segment, in order.
	FPDUs []FPDU `json:"fpdus,omitempty"`
	// Markers are the Markers completed in the segment.
	Markers []Marker `json:"markers,omitempty"`
	// Held says the segment had been held (out of order) and is analysed
	// now, after the octets before it arrived.
	Held bool `json:"held,omitempty"`
	// NotObserved counts the octets in front of this segment that were
	// not observed (a live watch left them out) and were skipped.
	NotObserved int `json:"not_observed,omitempty"`
	// Resync says where and how the checker picked the FPDU stream up
	// again after octets not observed.
	Resync string `json:"resync,omitempty"`
	// Note explains KindRetransmission, KindHeld and KindUndecoded, or a
	// partial overlap.
	Note string `json:"note,omitempty"`
}

// Split describes an FPDU cut by a segment boundary.
type Split struct {
	// FPDU is the FPDU's number in its direction (1 = first).
	FPDU uint64 `json:"fpdu"`
	// Before and After are its octets before and after the boundary; Len
	// its total (0 while its ULPDU_Length is not yet seen).
	Before int `json:"before"`
	After  int `json:"after"`
	Len    int `json:"len"`
}

// FPDU describes an FPDU, or the part of it in one segment.
type FPDU struct {
	// Index is the FPDU's number in its direction (1 = first).
	Index uint64 `json:"index"`
	// Offset is the stream offset of its first octet (its leading Marker,
	// if it has one).
	Offset uint64 `json:"offset"`
	// Len is its length on the wire (Markers, pad and CRC included); 0
	// while its ULPDU_Length is not yet seen. ULPDULen is ULPDU_Length.
	Len      int `json:"len"`
	ULPDULen int `json:"ulpdu_len"`
	// At is where in the segment's payload its octets begin and Here how
	// many there are.
	At   int `json:"at"`
	Here int `json:"here"`
	// Begins and Ends say whether its first and last octets are in this
	// segment.
	Begins bool `json:"begins"`
	Ends   bool `json:"ends"`
	// Header is its DDP/RDMAP header, once the octets are in.
	Header *Header `json:"header,omitempty"`
	// CRC is the verdict when Ends: "good", "bad" or "off" (no CRC
	// negotiated).
	CRC string `json:"crc,omitempty"`
}

// Header is an FPDU's DDP and RDMAP header.
type Header struct {
	// Op is the RDMAP opcode's name ("RDMA Write", "Send", ...).
	Op string `json:"op"`
	// Tagged and Last are the DDP T and L bits.
	Tagged bool `json:"tagged"`
	Last   bool `json:"last"`
	// STag and TO (tagged).
	STag uint32 `json:"stag,omitempty"`
	TO   uint64 `json:"to,omitempty"`
	// QN, MSN and MO (untagged).
	QN  uint32 `json:"qn,omitempty"`
	MSN uint32 `json:"msn,omitempty"`
	MO  uint32 `json:"mo,omitempty"`
	// Payload is the number of payload octets after the headers.
	Payload int `json:"payload"`
	// Detail is a one-line rendering of a Read Request or Terminate
	// header, of an Immediate Data message's Immediate Data or of an
	// Atomic Request or Response header (RFC 7306), or what is wrong with
	// the header.
	Detail string `json:"detail,omitempty"`
}

// Marker describes one Marker.
type Marker struct {
	// Offset is its stream offset (a multiple of 512) and At its position
	// in the segment's payload (negative when it began in the previous
	// segment).
	Offset uint64 `json:"offset"`
	At     int    `json:"at"`
	// FPDUPTR is the field as sent; Want the value that points at the
	// FPDU it belongs to (counted from that FPDU's first octet).
	FPDUPTR uint16 `json:"fpduptr"`
	Want    uint16 `json:"want"`
	// FPDU is the number of the FPDU it belongs to.
	FPDU uint64 `json:"fpdu"`
	// OK says whether FPDUPTR points at that FPDU's header (either reading
	// of RFC 5044, see package mpa).
	OK bool `json:"ok"`
}
