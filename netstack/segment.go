package netstack

import (
	"encoding/binary"
	"gvisor.dev/gvisor/pkg/buffer"
	"net/netip"
	"strconv"
)

// Direction tells which way a segment crossed the link.
type Direction uint8

const (
	// Inbound segments arrived from the link and have not yet been accepted
	// by TCP: they may be out of order, duplicated, retransmitted, outside
	// the window or carry a bad checksum.
	Inbound Direction = iota
	// Outbound segments were built by TCP and are about to enter the link;
	// retransmissions are seen again.
	Outbound
)

// String returns "inbound" or "outbound".
func (d Direction) String() string {
	switch d {
	case Inbound:
		return "inbound"
	case Outbound:
		return "outbound"
	default:
		return "direction(" + strconv.Itoa(int(d)) + ")"
	}
}

// TCP header flag bits, as found in Segment.Flags.
const (
	FlagFIN uint8 = 1 << iota // FlagFIN is the FIN flag (no more data from the sender).
	FlagSYN                   // FlagSYN is the SYN flag (synchronise sequence numbers).
	FlagRST                   // FlagRST is the RST flag (reset the connection).
	FlagPSH                   // FlagPSH is the PSH flag (push).
	FlagACK                   // FlagACK is the ACK flag (acknowledgement field valid).
	FlagURG                   // FlagURG is the URG flag (urgent pointer valid).
	FlagECE                   // FlagECE is the ECN-Echo flag.
	FlagCWR                   // FlagCWR is the Congestion Window Reduced flag.
)

// Segment describes one TCP segment seen at the link.
type Segment struct {
	// Dir is the direction the segment travelled.
	Dir Direction
	// Src and Dst are the segment's source and destination (IPv4 addresses
	// are always in their 4-byte form).
	Src, Dst netip.AddrPort
	// Seq and Ack are the sequence and acknowledgement numbers.
	Seq, Ack uint32
	// Flags is the TCP flags byte (FlagFIN, FlagSYN, ...).
	Flags uint8
	// Window is the raw (unscaled) window field.
	Window uint16
	// MSS is the MSS option of a SYN segment, 0 otherwise or if absent.
	MSS uint16
	// Len is the TCP payload length.
	Len int
	// Payload is the TCP payload, valid only during the hook call; nil for
	// a HeaderHook. It is always contiguous: when the packet's payload spans
	// several buffer views it is pulled up into one, which costs one copy of
	// the packet (and leaves the packet with a single view). This only
	// happens when a hook that reads payloads wants the segment.
	Payload []byte

	// views and viewOff locate the payload in the packet's buffer views
	// for ReadPayload (views nil: no payload).
	views   *buffer.View
	viewOff int
}

// ReadPayload copies payload bytes starting at offset off into p and returns
// how many it copied (fewer than len(p) at the end of the payload). It works
// for every hook, a HeaderHook included, and never restructures or copies the
// packet: it reads the packet's buffer views in place, so reading the few
// header bytes of each FPDU costs no more than those bytes. Valid only during
// the hook call.
func (s *Segment) ReadPayload(p []byte, off int) int {
	if off < 0 || off >= s.Len {
		return 0
	}
	if s.Payload != nil {
		return copy(p, s.Payload[off:])
	}
	n := min(len(p), s.Len-off)
	skip := s.viewOff + off
	done := 0
	for v := s.views; v != nil && done < n; v = v.Next() {
		b := v.AsSlice()
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		done += copy(p[done:n], b[skip:])
		skip = 0
	}
	return done
}

// HeaderHook is a SegmentHook that never reads Segment.Payload (counters,
// sequence tracking): the stack passes Payload nil and never pulls a
// packet's payload together for it, so it costs a header parse per packet.
type HeaderHook interface {
	SegmentHook
	// HeadersOnly marks the hook; it is never called.
	HeadersOnly()
}

// HeaderHookFunc adapts a function to HeaderHook.
type HeaderHookFunc func(s *Segment)

// Segment calls f(s).
func (f HeaderHookFunc) Segment(s *Segment) { f(s) }

// HeadersOnly implements HeaderHook.
func (HeaderHookFunc) HeadersOnly() {}

// wantsPayload reports whether h reads payloads.
func wantsPayload(h SegmentHook) bool {
	if h == nil {
		return false
	}
	_, headersOnly := h.(HeaderHook)
	return !headersOnly
}

// SegmentHook observes TCP segments at the link. Segment must not retain s or
// s.Payload after it returns and must not block for long: it runs on the
// packet path. It may be called concurrently from both directions.
type SegmentHook interface {
	Segment(s *Segment)
}

// SegmentHookFunc adapts a function to SegmentHook.
type SegmentHookFunc func(s *Segment)

// Segment calls f(s).
func (f SegmentHookFunc) Segment(s *Segment) { f(s) }

// tcpHeader holds the parsed fixed fields of a TCP header plus the IP
// addresses. It is the zero-allocation form used on the packet path.
type tcpHeader struct {
	src, dst netip.AddrPort
	seq, ack uint32
	flags    uint8
	window   uint16
	plen     int // TCP payload length
	ipHdrLen int // length of the IP header
	tcpLen   int // length of the TCP header including options
	total    int // total IP packet length as declared by the IP header
	options  []byte
}

// protoTCP is TCP's IP protocol number.
const protoTCP = 6

// parseTCPHeaders parses an IP packet whose IP and TCP headers are in hdr
// (hdr may be longer). It returns ok=false when the packet is not TCP or the
// headers are truncated. IPv6 extension headers are not followed.
func parseTCPHeaders(hdr []byte) (h tcpHeader, ok bool) {
	src, dst, ok := parseIPHeader(&h, hdr)
	if !ok {
		return h, false
	}
	return h, parseTCPHeader(&h, src, dst, hdr[h.ipHdrLen:])
}

// parseIPHeader parses the IP header at the start of hdr into h (ipHdrLen,
// total) and returns the addresses; ok=false when the packet is not TCP (or
// not a first fragment) or the IP header is truncated.
func parseIPHeader(h *tcpHeader, hdr []byte) (src, dst netip.Addr, ok bool) {
	if len(hdr) < 1 {
		return src, dst, false
	}
	switch hdr[0] >> 4 {
	case 4:
		if len(hdr) < 20 {
			return src, dst, false
		}
		ihl := int(hdr[0]&0x0f) * 4
		if ihl < 20 || len(hdr) < ihl || hdr[9] != protoTCP {
			return src, dst, false
		}
		// Only the first fragment carries the TCP header.
		if binary.BigEndian.Uint16(hdr[6:8])&0x1fff != 0 {
			return src, dst, false
		}
		src = netip.AddrFrom4([4]byte(hdr[12:16]))
		dst = netip.AddrFrom4([4]byte(hdr[16:20]))
		h.ipHdrLen = ihl
		h.total = int(binary.BigEndian.Uint16(hdr[2:4]))
	case 6:
		if len(hdr) < 40 || hdr[6] != protoTCP {
			return src, dst, false
		}
		src = netip.AddrFrom16([16]byte(hdr[8:24]))
		dst = netip.AddrFrom16([16]byte(hdr[24:40]))
		h.ipHdrLen = 40
		h.total = 40 + int(binary.BigEndian.Uint16(hdr[4:6]))
	default:
		return src, dst, false
	}
	return src, dst, true
}

// parseTCPHeader parses the TCP header at the start of t into h (options
// alias t).
func parseTCPHeader(h *tcpHeader, src, dst netip.Addr, t []byte) bool {
	if len(t) < 20 {
		return false
	}
	doff := int(t[12]>>4) * 4
	if doff < 20 || len(t) < doff {
		return false
	}
	h.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(t[0:2]))
	h.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(t[2:4]))
	h.seq = binary.BigEndian.Uint32(t[4:8])
	h.ack = binary.BigEndian.Uint32(t[8:12])
	h.flags = t[13]
	h.window = binary.BigEndian.Uint16(t[14:16])
	h.tcpLen = doff
	h.options = t[20:doff]
	return true
}

// tcpHeaderLenNeeded returns how many bytes from the start of the IP packet
// are needed to hold the IP header plus the fixed TCP header (step 1) given
// the first bytes b, or 0 if the packet is not a candidate.
func ipAndFixedTCPLen(b []byte) int {
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 || b[9] != protoTCP {
			return 0
		}
		return int(b[0]&0x0f)*4 + 20
	case 6:
		if len(b) < 40 || b[6] != protoTCP {
			return 0
		}
		return 60
	}
	return 0
}

// mssOption returns the MSS option value in a SYN's options, or 0.
func mssOption(opts []byte) uint16 {
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0: // EOL
			return 0
		case 1: // NOP
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 || i+int(opts[i+1]) > len(opts) {
			return 0
		}
		if opts[i] == 2 && opts[i+1] == 4 {
			return binary.BigEndian.Uint16(opts[i+2 : i+4])
		}
		i += int(opts[i+1])
	}
	return 0
}
