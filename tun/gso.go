package tun

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Segmentation offload through the TUN device (IFF_VNET_HDR): every packet
// crosses the device behind a 10-byte virtio-net header. Outbound, runs of
// TCP segments that the stack produced back to back (one flow, contiguous
// sequence numbers, equal payload sizes but for the last) are written as
// one super-segment whose gso_size is that payload size, so the kernel (or
// any NIC downstream) cuts it into exactly the segments the stack made:
// FPDU-aligned segments stay aligned on the wire. Inbound, a super-segment
// the kernel did not cut is split here at its gso_size, so the stack and
// the engine's segment hooks see the segments a wire would carry.

// virtio-net header fields (include/uapi/linux/virtio_net.h).
const (
	virtioHdrLen      = 10
	virtioNeedsCsum   = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	virtioDataValid   = 2 // VIRTIO_NET_HDR_F_DATA_VALID
	virtioGSONone     = 0
	virtioGSOTCPv4    = 1
	virtioGSOTCPv6    = 4
	virtioGSOECN      = 0x80
	tcpFlagFIN        = 0x01
	tcpFlagSYN        = 0x02
	tcpFlagRST        = 0x04
	tcpFlagPSH        = 0x08
	tcpFlagACK        = 0x10
	tcpFlagURG        = 0x20
	tcpFlagCWR        = 0x80
	protoTCP          = 6
	protoUDP          = 17
	ipv4HeaderMinLen  = 20
	ipv6HeaderLen     = 40
	tcpHeaderMinLen   = 20
	tcpChecksumOffset = 16
)

// virtioHdr is struct virtio_net_hdr, in the host's (little-endian) order
// as the TUN driver uses it without TUNSETVNETBE.
type virtioHdr struct {
	flags      uint8
	gsoType    uint8
	hdrLen     uint16
	gsoSize    uint16
	csumStart  uint16
	csumOffset uint16
}

func (h *virtioHdr) decode(b []byte) {
	h.flags, h.gsoType = b[0], b[1]
	h.hdrLen = binary.LittleEndian.Uint16(b[2:])
	h.gsoSize = binary.LittleEndian.Uint16(b[4:])
	h.csumStart = binary.LittleEndian.Uint16(b[6:])
	h.csumOffset = binary.LittleEndian.Uint16(b[8:])
}

func (h *virtioHdr) encode(b []byte) {
	b[0], b[1] = h.flags, h.gsoType
	binary.LittleEndian.PutUint16(b[2:], h.hdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.gsoSize)
	binary.LittleEndian.PutUint16(b[6:], h.csumStart)
	binary.LittleEndian.PutUint16(b[8:], h.csumOffset)
}

// tcpPacket locates the headers of an IPv4 or IPv6 TCP packet.
type tcpPacket struct {
	v6      bool
	ipLen   int // IP header length (IPv6: fixed header only; extension headers are not offloaded)
	hdrLen  int // IP + TCP header length
	payload int // TCP payload length
}

// parseTCP reports whether p is a TCP packet this code can segment or
// coalesce (IPv4 without fragmentation, IPv6 without extension headers)
// and where its headers end.
func parseTCP(p []byte) (tcpPacket, bool) {
	var t tcpPacket
	if len(p) < ipv4HeaderMinLen {
		return t, false
	}
	switch p[0] >> 4 {
	case 4:
		t.ipLen = int(p[0]&0xf) * 4
		if t.ipLen < ipv4HeaderMinLen || len(p) < t.ipLen+tcpHeaderMinLen || p[9] != protoTCP {
			return t, false
		}
		if int(binary.BigEndian.Uint16(p[2:])) != len(p) {
			return t, false
		}
		if binary.BigEndian.Uint16(p[6:])&0x3fff != 0 { // MF or a fragment offset
			return t, false
		}
	case 6:
		t.v6, t.ipLen = true, ipv6HeaderLen
		if len(p) < t.ipLen+tcpHeaderMinLen || p[6] != protoTCP {
			return t, false
		}
		if int(binary.BigEndian.Uint16(p[4:]))+ipv6HeaderLen != len(p) {
			return t, false
		}
	default:
		return t, false
	}
	doff := int(p[t.ipLen+12]>>4) * 4
	if doff < tcpHeaderMinLen || len(p) < t.ipLen+doff {
		return t, false
	}
	t.hdrLen = t.ipLen + doff
	t.payload = len(p) - t.hdrLen
	return t, true
}

// checksumAdd adds b (as big-endian 16-bit words, a trailing odd octet as
// the high half of a word) to sum, four octets at a time: a 32-bit word
// hi<<16|lo is congruent to hi+lo in one's-complement arithmetic. The result
// is folded to at most 17 bits, so callers may keep adding small values.
func checksumAdd(sum uint32, b []byte) uint32 {
	s := uint64(sum)
	for len(b) >= 32 {
		s += uint64(binary.BigEndian.Uint32(b)) + uint64(binary.BigEndian.Uint32(b[4:])) +
			uint64(binary.BigEndian.Uint32(b[8:])) + uint64(binary.BigEndian.Uint32(b[12:])) +
			uint64(binary.BigEndian.Uint32(b[16:])) + uint64(binary.BigEndian.Uint32(b[20:])) +
			uint64(binary.BigEndian.Uint32(b[24:])) + uint64(binary.BigEndian.Uint32(b[28:]))
		b = b[32:]
	}
	for len(b) >= 4 {
		s += uint64(binary.BigEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	for s > 0xffffffff {
		s = s&0xffffffff + s>>32
	}
	return checksumFold32(uint32(s))
}

func checksumFold32(sum uint32) uint32 {
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum
}

func checksumFold(sum uint32) uint16 { return uint16(checksumFold32(sum)) }

// pseudoSum is the TCP pseudo-header sum of packet p (headers at t) for a
// TCP segment of tcpLen octets.
func pseudoSum(p []byte, t tcpPacket, tcpLen int) uint32 {
	return pseudoSumProto(p, t, tcpLen, protoTCP)
}

// pseudoSumProto is the pseudo-header sum for a transport segment of n
// octets of protocol proto.
func pseudoSumProto(p []byte, t tcpPacket, n int, proto byte) uint32 {
	var sum uint32
	if t.v6 {
		sum = checksumAdd(sum, p[8:40])
	} else {
		sum = checksumAdd(sum, p[12:20])
	}
	sum += uint32(proto)
	sum += uint32(n >> 16)
	sum += uint32(n & 0xffff)
	return sum
}

// setIPLength writes the IP length fields of a packet of n octets (and
// the IPv4 header checksum).
func setIPLength(p []byte, t tcpPacket, n int) {
	if t.v6 {
		binary.BigEndian.PutUint16(p[4:], uint16(n-ipv6HeaderLen))
		return
	}
	binary.BigEndian.PutUint16(p[2:], uint16(n))
	p[10], p[11] = 0, 0
	binary.BigEndian.PutUint16(p[10:], ^checksumFold(checksumAdd(0, p[:t.ipLen])))
}

// errGSO is the root of the offload errors.
var errGSO = errors.New("tun: segmentation offload")

// ErrChecksum reports a packet whose IPv4 header, TCP or UDP checksum is
// wrong (SuperReader verifies the checksums the kernel did not vouch for).
var ErrChecksum = errors.New("bad checksum")

// checksumsValid verifies p's IPv4 header checksum and, for TCP and UDP
// (IPv4, or IPv6 without extension headers), the transport checksum. Other
// protocols carry their own checks, which the stack makes.
func checksumsValid(p []byte) bool {
	if len(p) < ipv4HeaderMinLen {
		return false
	}
	var t tcpPacket
	var proto byte
	switch p[0] >> 4 {
	case 4:
		t.ipLen = int(p[0]&0xf) * 4
		if t.ipLen < ipv4HeaderMinLen || len(p) < t.ipLen || checksumFold(checksumAdd(0, p[:t.ipLen])) != 0xffff {
			return false
		}
		if n := int(binary.BigEndian.Uint16(p[2:])); n >= t.ipLen && n <= len(p) {
			p = p[:n]
		}
		if binary.BigEndian.Uint16(p[6:])&0x3fff != 0 {
			return true // a fragment: its transport checksum covers the whole datagram
		}
		proto = p[9]
	case 6:
		t.v6, t.ipLen = true, ipv6HeaderLen
		if len(p) < ipv6HeaderLen {
			return false
		}
		if n := int(binary.BigEndian.Uint16(p[4:])) + ipv6HeaderLen; n <= len(p) {
			p = p[:n]
		}
		proto = p[6]
	default:
		return false
	}
	seg := p[t.ipLen:]
	switch proto {
	case protoTCP:
		if len(seg) < tcpHeaderMinLen {
			return false
		}
	case protoUDP:
		if len(seg) < 8 {
			return false
		}
		if !t.v6 && seg[6] == 0 && seg[7] == 0 {
			return true // no checksum (IPv4 only)
		}
	default:
		return true
	}
	sum := pseudoSumProto(p, t, len(seg), proto)
	return checksumFold(checksumAdd(sum, seg)) == 0xffff
}

// completeChecksum fills in the checksum a NEEDS_CSUM packet leaves
// partial: the one's complement of the sum from csumStart on, stored at
// csumStart+csumOffset.
func completeChecksum(p []byte, h *virtioHdr) error {
	start, off := int(h.csumStart), int(h.csumStart)+int(h.csumOffset)
	if start > len(p) || off+2 > len(p) {
		return fmt.Errorf("%w: checksum at %d+%d outside a %d-octet packet", errGSO, h.csumStart, h.csumOffset, len(p))
	}
	// The field holds the pseudo-header sum; the sum over it is the total.
	binary.BigEndian.PutUint16(p[off:], ^checksumFold(checksumAdd(0, p[start:])))
	return nil
}

// splitter cuts one inbound super-segment into its segments, a batch of
// them per call.
type splitter struct {
	pkt  []byte // the super-segment, headers included; nil when done
	t    tcpPacket
	mss  int
	next int // offset of the next segment's payload in pkt
	seq  uint32
	id   uint16
	i    int
}

// start prepares to split pkt (whose virtio header is h) at h.gsoSize.
func (s *splitter) start(pkt []byte, h *virtioHdr) error {
	t, ok := parseTCPGSO(pkt)
	if !ok {
		return fmt.Errorf("%w: gso_type %d on a packet that is not TCP", errGSO, h.gsoType)
	}
	if h.gsoSize == 0 {
		return fmt.Errorf("%w: gso_size 0", errGSO)
	}
	*s = splitter{pkt: pkt, t: t, mss: int(h.gsoSize), next: t.hdrLen,
		seq: binary.BigEndian.Uint32(pkt[t.ipLen+4:])}
	if !t.v6 {
		s.id = binary.BigEndian.Uint16(pkt[4:])
	}
	return nil
}

// parseTCPGSO is parseTCP for a super-segment, whose IPv4 total length
// may be 0 or stale (the kernel leaves it as the first segment's on some
// paths): the length is the buffer's.
func parseTCPGSO(p []byte) (tcpPacket, bool) {
	if len(p) > 0 && p[0]>>4 == 4 && len(p) >= ipv4HeaderMinLen {
		setIPv4TotalLen(p)
	}
	if len(p) >= ipv6HeaderLen && p[0]>>4 == 6 {
		binary.BigEndian.PutUint16(p[4:], uint16(len(p)-ipv6HeaderLen))
	}
	return parseTCP(p)
}

func setIPv4TotalLen(p []byte) {
	n := len(p)
	if n > 0xffff {
		n = 0xffff
	}
	binary.BigEndian.PutUint16(p[2:], uint16(n))
}

// done reports whether every segment was handed out.
func (s *splitter) done() bool { return s.pkt == nil || s.next >= len(s.pkt) }

// fill writes the next segments into bufs[i][offset:], recording sizes,
// and returns how many.
func (s *splitter) fill(bufs [][]byte, sizes []int, offset int) (int, error) {
	n := 0
	for n < len(bufs) && !s.done() {
		end := min(s.next+s.mss, len(s.pkt))
		last := end == len(s.pkt)
		size := s.t.hdrLen + end - s.next
		out := bufs[n][offset:]
		if len(out) < size {
			return n, fmt.Errorf("%w: a %d-octet segment does not fit a %d-octet buffer", errGSO, size, len(out))
		}
		out = out[:size]
		copy(out, s.pkt[:s.t.hdrLen])
		copy(out[s.t.hdrLen:], s.pkt[s.next:end])
		tcp := out[s.t.ipLen:]
		binary.BigEndian.PutUint32(tcp[4:], s.seq)
		if !last {
			tcp[13] &^= tcpFlagFIN | tcpFlagPSH
		}
		if s.i > 0 {
			tcp[13] &^= tcpFlagCWR
		}
		if !s.t.v6 {
			binary.BigEndian.PutUint16(out[4:], s.id+uint16(s.i))
		}
		setIPLength(out, s.t, size)
		tcp[16], tcp[17] = 0, 0
		sum := pseudoSum(out, s.t, size-s.t.ipLen)
		binary.BigEndian.PutUint16(tcp[16:], ^checksumFold(checksumAdd(sum, tcp)))
		sizes[n] = size
		s.seq += uint32(end - s.next)
		s.next = end
		s.i++
		n++
	}
	if s.done() {
		s.pkt = nil
	}
	return n, nil
}

// coalescable reports whether b may follow a (both parsed, a's payload
// non-empty and equal to gso) in one super-segment: same flow and IP
// header but for length, ID and checksum; the next sequence number; the
// same ACK, window and options; only ACK and PSH flags; a payload no
// larger than gso.
func coalescable(a []byte, ta tcpPacket, b []byte, tb tcpPacket, gso int, nextSeq uint32) bool {
	if ta.v6 != tb.v6 || ta.hdrLen != tb.hdrLen || ta.ipLen != tb.ipLen || tb.payload == 0 || tb.payload > gso {
		return false
	}
	if ta.v6 {
		// Version, traffic class, flow label; next header, hop limit;
		// addresses.
		if string(a[:4]) != string(b[:4]) || string(a[6:40]) != string(b[6:40]) {
			return false
		}
	} else {
		// Version/IHL, TOS; flags/fragment, TTL, protocol; addresses and
		// options.
		if a[0] != b[0] || a[1] != b[1] || string(a[6:10]) != string(b[6:10]) || string(a[12:ta.ipLen]) != string(b[12:tb.ipLen]) {
			return false
		}
	}
	at, bt := a[ta.ipLen:ta.hdrLen], b[tb.ipLen:tb.hdrLen]
	if string(at[0:4]) != string(bt[0:4]) || // ports
		binary.BigEndian.Uint32(bt[4:]) != nextSeq ||
		string(at[8:12]) != string(bt[8:12]) || // ACK
		at[12] != bt[12] || // data offset
		string(at[14:16]) != string(bt[14:16]) || // window
		string(at[18:]) != string(bt[18:]) { // urgent pointer, options
		return false
	}
	return at[13]&^(tcpFlagACK|tcpFlagPSH) == 0 && bt[13]&^(tcpFlagACK|tcpFlagPSH) == 0
}

// superHeader turns first's headers, in hdr (a copy), into the headers of
// a super-segment of total octets with the given gso size and fills vh.
// PSH is set if last had it.
func superHeader(hdr []byte, t tcpPacket, total, gso int, psh bool, vh *virtioHdr) {
	setIPLength(hdr, t, total)
	tcp := hdr[t.ipLen:]
	if psh {
		tcp[13] |= tcpFlagPSH
	}
	sum := pseudoSum(hdr, t, total-t.ipLen)
	binary.BigEndian.PutUint16(tcp[16:], checksumFold(sum))
	vh.flags = virtioNeedsCsum
	vh.gsoType = virtioGSOTCPv4
	if t.v6 {
		vh.gsoType = virtioGSOTCPv6
	}
	vh.hdrLen = uint16(t.hdrLen)
	vh.gsoSize = uint16(gso)
	vh.csumStart = uint16(t.ipLen)
	vh.csumOffset = tcpChecksumOffset
}

// run is a run of packets that can travel as one super-segment:
// bufs[start:end] (end = start+1 for a packet that goes alone).
type run struct {
	end   int
	t     tcpPacket // the first packet's headers
	gso   int       // the payload size of every segment but the last
	total int       // the super-segment's length
	psh   bool      // the last segment has PSH
}

// nextRun finds the run that starts at bufs[i][offset:]: the TCP segments
// that follow it in one flow, contiguous, with its payload size (the last
// may be shorter), within maxSuper octets and at most maxHeaders of
// headers.
func nextRun(bufs [][]byte, offset, i int) run {
	r := run{end: i + 1}
	first := bufs[i][offset:]
	ft, ok := parseTCP(first)
	if !ok || ft.payload == 0 || ft.hdrLen > maxHeaders {
		return r
	}
	r.t, r.gso, r.total = ft, ft.payload, len(first)
	seq := tcpSeq(first, ft) + uint32(ft.payload)
	for j := i + 1; j < len(bufs) && offset <= len(bufs[j]); j++ {
		// Every segment but the last is gso octets: a shorter one ends
		// the run.
		if len(bufs[j-1])-offset-ft.hdrLen != r.gso {
			break
		}
		b := bufs[j][offset:]
		bt, ok := parseTCP(b)
		if !ok || !coalescable(first, ft, b, bt, r.gso, seq) || r.total+bt.payload > maxSuper {
			break
		}
		r.total += bt.payload
		seq += uint32(bt.payload)
		r.psh = b[bt.ipLen+13]&tcpFlagPSH != 0
		r.end = j + 1
	}
	return r
}

// maxSuper is the largest super-segment: IPv4's total length.
const maxSuper = 65535

// maxHeaders bounds the IP and TCP headers of a super-segment (IPv4 or
// IPv6 with options and a TCP header with options).
const maxHeaders = 60 + 60

func tcpSeq(p []byte, t tcpPacket) uint32 {
	return binary.BigEndian.Uint32(p[t.ipLen+4:])
}
