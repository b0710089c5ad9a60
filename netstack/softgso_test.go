package netstack

import (
	"bytes"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// TestWireSegments: a super-segment built for host GSO comes out as the
// wire segments a NIC cuts (every MSS octets of payload, the last
// shorter), each a complete IPv4 packet: its own total length, IP ID and
// header checksum, sequence number, PSH only on the last, and a complete,
// valid TCP checksum; the payloads in order are the super-segment's.
func TestWireSegments(t *testing.T) {
	src := netip.MustParseAddrPort("10.9.0.1:1000")
	dst := netip.MustParseAddrPort("10.9.0.2:2000")
	const mss, plen, seq = 100, 350, 7000
	pkt := gsoPacket(src, dst, seq, plen, mss)
	defer pkt.DecRef()
	payload := make([]byte, plen)
	fillPattern(payload, 0)
	pkt.Data().TrimFront(plen) // gsoPacket's payload is zeros: a pattern instead
	pkt.Data().AppendView(buffer.NewViewWithData(payload))
	th := header.TCP(pkt.TransportHeader().Slice())
	th.SetFlags(uint8(header.TCPFlagAck | header.TCPFlagPsh))
	nh := header.IPv4(pkt.NetworkHeader().Slice())
	th.SetChecksum(header.PseudoHeaderChecksum(header.TCPProtocolNumber, nh.SourceAddress(), nh.DestinationAddress(), uint16(header.TCPMinimumSize+plen)))
	var got []byte
	n := 0
	wireSegments(pkt, func(b buffer.Buffer) {
		defer b.Release()
		p := b.Flatten()
		ip := header.IPv4(p)
		if !ip.IsValid(len(p)) || ip.CalculateChecksum() != 0xffff {
			t.Fatalf("segment %d: bad IPv4 header", n)
		}
		tcp := header.TCP(ip.Payload())
		data := tcp.Payload()
		wantLen := min(mss, plen-n*mss)
		if len(data) != wantLen || tcp.SequenceNumber() != seq+uint32(n*mss) || ip.ID() != uint16(n) {
			t.Errorf("segment %d: %d octets at seq %d, IP ID %d; want %d at %d, ID %d", n, len(data), tcp.SequenceNumber(), ip.ID(), wantLen, seq+n*mss, n)
		}
		last := n*mss+len(data) == plen
		if psh := tcp.Flags()&header.TCPFlagPsh != 0; psh != last {
			t.Errorf("segment %d: PSH %v, want %v", n, psh, last)
		}
		xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(tcp)))
		if checksum.Checksum(tcp, xsum) != 0xffff {
			t.Errorf("segment %d: bad TCP checksum", n)
		}
		got = append(got, data...)
		n++
	})
	if n != 4 || !bytes.Equal(got, payload) {
		t.Errorf("%d segments, payload intact %v; want 4, true", n, bytes.Equal(got, payload))
	}
}
