package netstack

import (
	"gvisor.dev/gvisor/pkg/buffer"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/siwtun/siwtun/anatomy"
)

// hookEndpoint sits between the NIC and the Link's endpoint (as
// link/sniffer does). It sees every IP packet in both directions, records
// each connection's SYN options and the peer's cumulative ACK, and calls the
// segment hooks. It never drops, so it never has to think about the
// caller's packet references.
type hookEndpoint struct {
	nested.Endpoint
	s   *Stack
	mtu uint32
	gso bool // gVisor builds super-segments (the link takes offloaded frames)
	// lists recycles the one-packet lists of emit (gso.go).
	lists sync.Pool
	// acks holds pure ACKs (ackhold.go); nil without Options.DelayedACK.
	acks *ackHolder
}

var _ stack.LinkEndpoint = (*hookEndpoint)(nil)
var _ stack.NetworkDispatcher = (*hookEndpoint)(nil)

func newHookEndpoint(child stack.LinkEndpoint, s *Stack, mtu uint32, gso bool) *hookEndpoint {
	e := &hookEndpoint{s: s, mtu: mtu, gso: gso}
	e.Endpoint.Init(child, e)
	return e
}

// MTU implements stack.LinkEndpoint.MTU (Options.MTU may be below the
// link's).
func (e *hookEndpoint) MTU() uint32 { return e.mtu }

// GSOMaxSize implements stack.GSOEndpoint: gsoMaxSize on a link with
// segmentation offload, else 0 (gVisor then never builds a segment larger
// than the MSS).
func (e *hookEndpoint) GSOMaxSize() uint32 {
	if e.gso {
		return gsoMaxSize
	}
	return 0
}

// SupportedGSO implements stack.GSOEndpoint: host GSO (the kernel cuts
// super-segments) on a link with segmentation offload.
func (e *hookEndpoint) SupportedGSO() stack.SupportedGSO {
	if e.gso {
		return stack.HostGSOSupported
	}
	return stack.GSONotSupported
}

// DeliverNetworkPacket implements stack.NetworkDispatcher (inbound).
func (e *hookEndpoint) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	e.s.inbound(pkt)
	e.Endpoint.DeliverNetworkPacket(proto, pkt)
}

// WritePackets implements stack.LinkWriter (outbound).
func (e *hookEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if e.s.hops.On() {
		stampOut(e.s.hops, anatomy.TCPOut, pkts.AsSlice())
	}
	if e.acks != nil && !e.acks.filter(pkts) {
		return pkts.Len(), nil // a pure ACK held (ackhold.go)
	}
	return e.writeNow(pkts)
}

// writeNow hands pkts to the hooks and the link.
func (e *hookEndpoint) writeNow(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if e.gso {
		return e.writeGSO(pkts)
	}
	for _, pkt := range pkts.AsSlice() {
		e.s.outbound(pkt)
	}
	return e.Endpoint.WritePackets(pkts)
}

// directQDisc is the NIC's queueing discipline. It does what gVisor's
// default (delegatingQueueingDiscipline, used when NICOptions.QDisc is nil)
// does — hand each packet straight to the link endpoint's WritePackets as a
// one-packet list, ignoring the count — without allocating that list's
// backing array for every packet: the default builds a fresh
// PacketBufferList per packet, and since WritePackets is an interface call
// the one-element slice escapes. Here one-element lists are recycled; no
// link endpoint keeps the list after WritePackets returns.
type directQDisc struct {
	ep    *hookEndpoint
	lists sync.Pool // *stack.PacketBufferList holding one (nil) element
}

var _ stack.QueueingDiscipline = (*directQDisc)(nil)

// WritePacket implements stack.QueueingDiscipline.WritePacket. The caller
// keeps its reference to pkt, as with gVisor's default.
func (q *directQDisc) WritePacket(pkt *stack.PacketBuffer) tcpip.Error {
	l, _ := q.lists.Get().(*stack.PacketBufferList)
	if l == nil {
		l = new(stack.PacketBufferList)
		l.PushBack(nil)
	}
	// AsSlice returns the list's own backing array.
	slot := l.AsSlice()
	slot[0] = pkt
	_, err := q.ep.WritePackets(*l)
	slot[0] = nil
	q.lists.Put(l)
	return err
}

// Close implements stack.QueueingDiscipline.Close.
func (*directQDisc) Close() {}

// inbound inspects a packet before the network layer parses it: the whole IP
// packet is in pkt.Data().
func (s *Stack) inbound(pkt *stack.PacketBuffer) {
	d := pkt.Data()
	size := d.Size()
	if size < 40 {
		return
	}
	// Pull up exactly the IP and TCP headers, step by step, so a packet
	// whose first view holds just the headers is not restructured.
	b, ok := d.PullUp(40)
	if !ok {
		return
	}
	n := ipAndFixedTCPLen(b)
	if n == 0 || n > size {
		return
	}
	if b, ok = d.PullUp(n); !ok {
		return
	}
	doff := int(b[n-20+12]>>4) * 4
	hlen := n - 20 + doff
	if doff < 20 || hlen > size {
		return
	}
	if b, ok = d.PullUp(hlen); !ok {
		return
	}
	h, ok := parseTCPHeaders(b)
	if !ok {
		return
	}
	key := flowKey{local: h.dst, remote: h.src}
	var f *flow
	if h.flags&FlagSYN != 0 {
		f = s.flows.getOrCreate(key)
		opts := header.ParseSynOptions(h.options, h.flags&FlagACK != 0)
		f.setSyn(false, synInfo{mss: opts.MSS, ts: opts.TS, sack: opts.SACKPermitted, ws: opts.WS}, h.seq)
	} else {
		f = s.flows.get(key)
	}
	if f != nil && h.flags&FlagACK != 0 {
		if f.ackSeen(h.ack) {
			f.tail.acked(h.ack)
			f.writeEnds.acked(h.ack)
			f.kept.acked(h.ack)
		}
		if h.flags&FlagSYN == 0 {
			f.windowSeen(h.ack, h.window)
		}
	}
	fh, fhPayload := f.getHook()
	tap := s.tap.Load()
	if s.hook == nil && fh == nil && tap == nil {
		return
	}
	var payload []byte
	plen := min(h.total, size) - hlen
	h.plen = max(plen, 0)
	if plen > 0 && (fhPayload || s.hookPayload || tap.wantsPayload()) {
		full, ok := d.PullUp(hlen + plen)
		if !ok {
			return
		}
		payload = full[hlen:]
	}
	vl, voff := pkt.AsViewList()
	if mss := int(pkt.GSOOptions.MSS); mss > 0 && h.plen > mss {
		s.callHooksWire(fh, fhPayload, tap, Inbound, &h, payload, vl.Front(), voff+hlen, mss)
		return
	}
	s.callHooks(fh, fhPayload, tap, Inbound, &h, payload, vl.Front(), voff+hlen)
}

// callHooksWire calls the hooks once for each wire segment of a
// super-segment (TCP payloads of consecutive segments of mss octets each
// but the last, behind one header): inbound, a device link's whole read;
// outbound, a run gVisor built for segmentation offload. The hooks, and so
// the engine's alignment counts, out-of-order placement, traces and
// captures, see the segments a wire carries (wireSegment). A BatchHook
// that is the only hook takes them all in one call.
func (s *Stack) callHooksWire(fh SegmentHook, fhPayload bool, tap *hookBox, dir Direction, h *tcpHeader, payload []byte, views *buffer.View, viewOff, mss int) {
	if bh, ok := fh.(BatchHook); ok && s.hook == nil && tap == nil {
		run, _ := s.runPool.Get().(*SegmentRun)
		if run == nil {
			run = new(SegmentRun)
		}
		if !fhPayload {
			payload = nil // a HeaderHook's segments carry none
		}
		*run = SegmentRun{dir: dir, whole: *h, payload: payload, views: views, viewOff: viewOff, mss: mss}
		bh.Segments(run)
		*run = SegmentRun{}
		s.runPool.Put(run)
		return
	}
	for off := 0; off < h.plen; off += mss {
		seg := wireSegment(h, off, mss)
		var p []byte
		if payload != nil {
			p = payload[off : off+seg.plen]
		}
		s.callHooks(fh, fhPayload, tap, dir, &seg, p, views, viewOff+off)
	}
}

// outbound inspects a packet TCP and IP have built.
func (s *Stack) outbound(pkt *stack.PacketBuffer) {
	if pkt.TransportProtocolNumber != header.TCPProtocolNumber {
		return
	}
	nh := pkt.NetworkHeader().Slice()
	th := pkt.TransportHeader().Slice()
	if len(nh) == 0 || len(th) < 20 {
		return
	}
	h, ok := parseIPAndTCP(nh, th)
	if !ok {
		return
	}
	key := flowKey{local: h.src, remote: h.dst}
	var f *flow
	if h.flags&FlagSYN != 0 {
		f = s.flows.getOrCreate(key)
		opts := header.ParseSynOptions(h.options, h.flags&FlagACK != 0)
		f.setSyn(true, synInfo{mss: opts.MSS, ts: opts.TS, sack: opts.SACKPermitted, ws: opts.WS, win: h.window}, h.seq)
	} else if s.flows.hooks.Load() > 0 {
		f = s.flows.get(key)
	}
	if f != nil && h.flags&(FlagSYN|FlagRST) == 0 {
		n := uint32(pkt.Data().Size())
		f.sentSeen(h.seq + n)
		if n > 0 && f.claimed.Load() {
			f.tail.keep(h.seq, h.seq+n, pkt)
		}
		if h.flags&FlagACK != 0 {
			f.advertisedSeen(h.ack, h.window)
		}
	}
	fh, fhPayload := f.getHook()
	tap := s.tap.Load()
	if s.hook == nil && fh == nil && tap == nil {
		return
	}
	var payload []byte
	h.plen = pkt.Data().Size()
	if n := h.plen; n > 0 && (fhPayload || s.hookPayload || tap.wantsPayload()) {
		p, ok := pkt.Data().PullUp(n)
		if !ok {
			return
		}
		payload = p
	}
	vl, voff := pkt.AsViewList()
	// A packet built for offload with no more than one segment's payload
	// (a pure ACK, a FIN) is one wire segment as it is.
	if mss, _, ok := tcpGSO(pkt); ok && h.plen > mss {
		s.callHooksWire(fh, fhPayload, tap, Outbound, &h, payload, vl.Front(), voff+pkt.Size()-h.plen, mss)
		return
	}
	s.callHooks(fh, fhPayload, tap, Outbound, &h, payload, vl.Front(), voff+pkt.Size()-h.plen)
}

// callHooks calls the stack-wide hook, the flow's hook fh and the tap on
// one segment.
func (s *Stack) callHooks(fh SegmentHook, fhPayload bool, tap *hookBox, dir Direction, h *tcpHeader, payload []byte, views *buffer.View, viewOff int) {
	seg, _ := s.segPool.Get().(*Segment)
	if seg == nil {
		seg = new(Segment)
	}
	seg.fill(dir, h, payload, views, viewOff)
	if s.hook != nil {
		s.hook.Segment(seg)
	}
	if fh != nil {
		// The stack-wide hook may have scribbled on seg.
		p := payload
		if !fhPayload {
			p = nil
		}
		seg.fill(dir, h, p, views, viewOff)
		fh.Segment(seg)
	}
	if tap != nil {
		s.callTap(tap, seg, dir, h, payload)
	}
	*seg = Segment{}
	s.segPool.Put(seg)
}

// parseIPAndTCP parses an outbound packet's separate IP and TCP headers in
// place (the returned options alias th), without copying them together.
func parseIPAndTCP(nh, th []byte) (h tcpHeader, ok bool) {
	src, dst, ok := parseIPHeader(&h, nh)
	if !ok || h.ipHdrLen != len(nh) {
		return tcpHeader{}, false
	}
	if !parseTCPHeader(&h, src, dst, th) {
		return tcpHeader{}, false
	}
	return h, true
}
