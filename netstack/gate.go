package netstack

import (
	"sync"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// GateVerdict is what a Gate does with one inbound TCP segment.
type GateVerdict uint8

// Gate verdicts.
const (
	// GatePass delivers the segment now.
	GatePass GateVerdict = iota
	// GateHold keeps the segment until Gate.Release.
	GateHold
	// GateCorrupt inverts the middle octet of the segment's payload, fixes
	// the TCP checksum (so TCP accepts the damage) and delivers it now.
	GateCorrupt
)

// GateRule decides what a Gate does with an inbound TCP segment. The
// Segment's Payload is set and valid only during the call. It is called
// from the link's delivery goroutine, one segment at a time.
type GateRule func(s *Segment) GateVerdict

// Gate holds back or damages chosen inbound TCP segments of a Link, for
// tests that need one exact reordering (a segment held while its successors
// pass) rather than a random one (Impair). Packets that are not TCP, and
// every packet while no rule is set, pass untouched.
type Gate struct {
	nested.Endpoint

	mu   sync.Mutex
	rule GateRule     // guarded by mu
	held []pipePacket // guarded by mu, in arrival order
}

var _ stack.LinkEndpoint = (*Gate)(nil)
var _ stack.NetworkDispatcher = (*Gate)(nil)

// NewGate returns a Link that delivers l's inbound packets through a Gate,
// and the Gate. The returned Link replaces l: pass it to New (not l);
// closing it closes l and drops what the Gate still holds.
func NewGate(l *Link) (*Link, *Gate) {
	g := &Gate{}
	g.Endpoint.Init(l.ep, g)
	return &Link{
		ep:    g,
		mtu:   l.mtu,
		batch: l.batch,
		stats: l.stats,
		hops:  l.hops,
		shutdown: func() {
			g.drop()
			l.Close()
		},
	}, g
}

// SetRule sets the rule applied to the inbound segments from now on (nil:
// every packet passes).
func (g *Gate) SetRule(r GateRule) {
	g.mu.Lock()
	g.rule = r
	g.mu.Unlock()
}

// Held returns how many packets the Gate holds.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.held)
}

// Release delivers the held packets, in the order they arrived, on the
// caller's goroutine and returns how many it delivered. The rule stays in
// force for later packets.
func (g *Gate) Release() int {
	g.mu.Lock()
	held := g.held
	g.held = nil
	g.mu.Unlock()
	for _, p := range held {
		g.deliver(p)
	}
	return len(held)
}

// drop releases the held packets without delivering them.
func (g *Gate) drop() {
	g.mu.Lock()
	held := g.held
	g.held = nil
	g.mu.Unlock()
	for _, p := range held {
		p.buf.Release()
	}
}

// DeliverNetworkPacket implements stack.NetworkDispatcher: the rule decides.
func (g *Gate) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	g.mu.Lock()
	rule := g.rule
	g.mu.Unlock()
	if rule == nil {
		g.Endpoint.DeliverNetworkPacket(proto, pkt)
		return
	}
	flat := pkt.ToBuffer()
	b := flat.Flatten()
	flat.Release()
	h, ok := parseTCPHeaders(b)
	if !ok || h.total > len(b) {
		g.deliver(pipePacket{proto: proto, buf: buffer.MakeWithData(b)})
		return
	}
	payload := b[h.ipHdrLen+h.tcpLen : h.total]
	seg := Segment{
		Dir: Inbound, Src: h.src, Dst: h.dst, Seq: h.seq, Ack: h.ack,
		Flags: h.flags, Window: h.window, Len: len(payload), Payload: payload,
	}
	switch rule(&seg) {
	case GateHold:
		g.mu.Lock()
		g.held = append(g.held, pipePacket{proto: proto, buf: buffer.MakeWithData(b)})
		g.mu.Unlock()
		return
	case GateCorrupt:
		if len(payload) > 0 {
			tcpSeg := header.TCP(b[h.ipHdrLen:h.total])
			tcpSeg[h.tcpLen+len(payload)/2] ^= 0xff
			tcpSeg.SetChecksum(0)
			src, dst := tcpip.AddrFromSlice(h.src.Addr().AsSlice()), tcpip.AddrFromSlice(h.dst.Addr().AsSlice())
			xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(len(tcpSeg)))
			tcpSeg.SetChecksum(^checksum.Checksum(tcpSeg, xsum))
		}
	}
	g.deliver(pipePacket{proto: proto, buf: buffer.MakeWithData(b)})
}

// deliver hands one packet to the stack above.
func (g *Gate) deliver(p pipePacket) {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: p.buf})
	g.Endpoint.DeliverNetworkPacket(p.proto, pkt)
	pkt.DecRef()
}
