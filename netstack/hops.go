package netstack

import (
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/siwtun/siwtun/anatomy"
)

// The stack's stamps of a round trip's anatomy (package anatomy): TCP's
// segments on their way out (TCPOut), the device's writes and reads
// (TUNWrite, TUNRead; on a Pipe, the stack's hand-over to the pipe and
// the pipe's delivery to the peer's stack), TCP's queueing of received data (Queued) and its
// hand-over to the reader (Handover),
// each keyed by the data's ports and TCP sequence numbers. Only segments
// that carry data are stamped. Every stamp site first asks the Recorder
// whether it is on: one atomic load while it is off.

// Anatomy returns the stack's recorder of hop stamps: the stack, its link
// and the engine on it stamp into it while it is on.
func (s *Stack) Anatomy() *anatomy.Recorder { return s.hops }

// stampOut stamps hop h of each TCP data segment of pkts, built by TCP.
func stampOut(r *anatomy.Recorder, h anatomy.Hop, pkts []*stack.PacketBuffer) {
	t := anatomy.Now()
	for _, pkt := range pkts {
		stampPacket(r, h, pkt, t)
	}
}

// stampPacket stamps hop h of pkt, an outbound packet with its headers
// parsed, if it is a TCP segment with data.
func stampPacket(r *anatomy.Recorder, h anatomy.Hop, pkt *stack.PacketBuffer, t int64) {
	n := pkt.Data().Size()
	if n == 0 {
		return
	}
	hdr, ok := parseIPAndTCP(pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice())
	if !ok {
		return
	}
	r.Stamp(h, hdr.src.Port(), hdr.dst.Port(), hdr.seq, uint32(n), t)
}

// stampRead stamps a device read that returned buf at t (TUNRead), if it
// is a TCP segment with data. The device link reads a TCP packet with
// payload into two views, its headers in the first (withHeaderView).
func stampRead(r *anatomy.Recorder, buf buffer.Buffer, t int64) {
	vl := buf.AsViewList()
	front := vl.Front()
	if front == nil {
		return
	}
	b := front.AsSlice()
	n := 0
	if len(b) >= 40 {
		n = ipAndFixedTCPLen(b)
	}
	if n == 0 || n > len(b) {
		return
	}
	tcp := b[n-20:]
	hlen := n - 20 + int(tcp[12]>>4)*4
	size := int(buf.Size())
	if hlen > len(b) || size <= hlen {
		return
	}
	sport := uint16(tcp[0])<<8 | uint16(tcp[1])
	dport := uint16(tcp[2])<<8 | uint16(tcp[3])
	seq := uint32(tcp[4])<<24 | uint32(tcp[5])<<16 | uint32(tcp[6])<<8 | uint32(tcp[7])
	r.Stamp(anatomy.TUNRead, sport, dport, seq, uint32(size-hlen), t)
}

// stampQueued stamps gVisor's TCP queueing received data for the reader
// (Queued): a readable event of the endpoint, on the goroutine that ran
// TCP's receive path. It carries no sequence numbers (the reader's count
// is not the notifier's to read); the assembly takes a message's first
// after its TUN read.
func (c *Conn) stampQueued(waiter.EventMask) {
	if c.s.hops.On() {
		c.s.hops.Stamp(anatomy.Queued, c.remote.Port(), c.local.Port(), 0, 0, anatomy.Now())
	}
}

// stampHandover stamps TCP's hand-over of p, the next octets of a
// ReadTo that has handed over done octets before it (Handover).
func (c *Conn) stampHandover(p []byte, done uint32) {
	iss, ok := c.flow.peerInitialSeq()
	if !ok {
		return
	}
	seq := iss + 1 + uint32(c.readN) + done
	c.s.hops.Stamp(anatomy.Handover, c.remote.Port(), c.local.Port(), seq, uint32(len(p)), anatomy.Now())
}
