package netstack

import (
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// wireSegments calls fn with each wire segment of pkt as a complete IP
// packet, as a NIC's segmentation offload puts it on the wire: a TCP
// packet gVisor built for host GSO is cut every GSO MSS octets of payload
// (IP length and ID, sequence number, FIN and PSH on the last, CWR on the
// first; runPacket) and its TCP checksum completed; any other packet goes
// whole. The buffers are fn's to release. An impaired link uses it, so
// that loss and reordering act on wire segments while the stack keeps
// building super-segments.
func wireSegments(pkt *stack.PacketBuffer, fn func(buffer.Buffer)) {
	g := pkt.GSOOptions
	if (g.Type != stack.GSOTCPv4 && g.Type != stack.GSOTCPv6) || pkt.TransportProtocolNumber != header.TCPProtocolNumber {
		fn(pkt.ToBuffer())
		return
	}
	plen := pkt.Data().Size()
	mss := int(g.MSS)
	if mss <= 0 || mss > plen {
		mss = max(plen, 1)
	}
	for off := 0; off < plen || off == 0; off += mss {
		end := min(off+mss, plen)
		r := runPacket(pkt, off, end, off/mss)
		if g.NeedsCsum {
			// The checksum field holds the pseudo-header sum: the sum
			// over the segment completes it.
			t := header.TCP(r.TransportHeader().Slice())
			xsum := checksum.Combine(checksum.Checksum(t, 0), r.Data().Checksum())
			t.SetChecksum(^xsum)
		}
		fn(r.ToBuffer())
		r.DecRef()
		if plen == 0 {
			break
		}
	}
}
