package netstack

import (
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Impair returns a Link that applies imp to l's traffic in both directions:
// what the stack sends is impaired before it reaches l, what l receives is
// impaired before it reaches the stack. Each direction has its own queue,
// forwarding goroutine and PRNG (outbound seeded with imp.Seed, inbound with
// imp.Seed+1), exactly as in Pipe, so a run is reproducible from the seed for
// a given packet sequence. With a zero imp it returns l itself.
//
// The returned Link replaces l: pass it to New (not l), and closing it closes
// l. Its Stats are l's, with the impairment counters (Dropped, Reordered,
// Duplicated, Corrupted, and QueueFull for the impairment queues) added.
func Impair(l *Link, imp Impairments) *Link {
	if !imp.Active() {
		return l
	}
	// A link with segmentation offload keeps it: the stack still builds
	// super-segments, which are cut into wire segments here (as a NIC
	// would) before they are impaired.
	gso := l.gso != nil && l.gso()
	if l.splitSuper != nil {
		// Loss, reordering and corruption act on wire segments, and
		// corruption relies on the stack verifying checksums.
		l.splitSuper()
	}
	e := &impairEndpoint{
		imp:  imp,
		outQ: make(chan pipePacket, pipeQueueLen),
		inQ:  make(chan pipePacket, pipeQueueLen),
		done: make(chan struct{}),
	}
	e.Endpoint.Init(l.ep, e)
	e.wg.Add(2)
	go e.forward(e.outQ, imp.Seed, &e.tx, e.writeOut)
	go e.forward(e.inQ, imp.Seed+1, &e.rx, e.deliverIn)
	return &Link{
		ep:   e,
		mtu:  l.mtu,
		hops: l.hops,
		stats: func() LinkStats {
			s := l.Stats()
			addImpairments(&s.Tx, e.tx.snapshot())
			addImpairments(&s.Rx, e.rx.snapshot())
			return s
		},
		shutdown: func() {
			e.stop()
			l.Close()
		},
		gso: func() bool { return gso },
	}
}

// addImpairments adds the impairment counters of imp to d.
func addImpairments(d *DirectionStats, imp DirectionStats) {
	d.Dropped += imp.Dropped
	d.QueueFull += imp.QueueFull
	d.Reordered += imp.Reordered
	d.Duplicated += imp.Duplicated
	d.Corrupted += imp.Corrupted
}

// impairEndpoint sits between the stack (above) and a Link's endpoint
// (below) and runs each direction through a forwarder.
type impairEndpoint struct {
	nested.Endpoint
	imp Impairments

	outQ, inQ chan pipePacket
	tx, rx    dirCounters

	stopped  atomic.Bool
	done     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once

	// writeMu serialises writes into the child (the outbound forwarder
	// and the final flush).
	writeMu sync.Mutex
}

var _ stack.LinkEndpoint = (*impairEndpoint)(nil)
var _ stack.NetworkDispatcher = (*impairEndpoint)(nil)

// WritePackets implements stack.LinkWriter: packets are queued for the
// outbound forwarder (dropped when its queue is full, as a real link does).
func (e *impairEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if e.stopped.Load() {
		return 0, &tcpip.ErrClosedForSend{}
	}
	n := 0
	for _, pkt := range pkts.AsSlice() {
		proto := pkt.NetworkProtocolNumber
		wireSegments(pkt, func(b buffer.Buffer) {
			select {
			case e.outQ <- pipePacket{proto: proto, buf: b}:
			default:
				b.Release()
				e.tx.sent.Add(1)
				e.tx.queueFull.Add(1)
			}
		})
		n++
	}
	return n, nil
}

// DeliverNetworkPacket implements stack.NetworkDispatcher: packets from the
// child are queued for the inbound forwarder.
func (e *impairEndpoint) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if e.stopped.Load() {
		return
	}
	p := pipePacket{proto: proto, buf: pkt.ToBuffer()}
	select {
	case e.inQ <- p:
	default:
		p.buf.Release()
		e.rx.sent.Add(1)
		e.rx.queueFull.Add(1)
	}
}

// writeOut hands one impaired outbound packet to the child endpoint.
func (e *impairEndpoint) writeOut(p pipePacket) {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: p.buf})
	pkt.NetworkProtocolNumber = p.proto
	var l stack.PacketBufferList
	l.PushBack(pkt)
	e.writeMu.Lock()
	if _, err := e.Endpoint.WritePackets(l); err == nil {
		e.tx.delivered.Add(1)
	}
	e.writeMu.Unlock()
	l.DecRef()
}

// deliverIn hands one impaired inbound packet to the stack.
func (e *impairEndpoint) deliverIn(p pipePacket) {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: p.buf})
	e.rx.delivered.Add(1)
	e.Endpoint.DeliverNetworkPacket(p.proto, pkt)
	pkt.DecRef()
}

// forward drains q through a forwarder into out until stop, which discards
// what is still queued or held.
func (e *impairEndpoint) forward(q chan pipePacket, seed int64, c *dirCounters, out func(pipePacket)) {
	defer e.wg.Done()
	newForwarder(e.imp, seed, c, out).run(q, e.done, false)
}

// stop ends both forwarders, discarding what they hold.
func (e *impairEndpoint) stop() {
	e.stopOnce.Do(func() {
		e.stopped.Store(true)
		close(e.done)
		e.wg.Wait()
	})
}

// Close implements stack.LinkEndpoint.Close.
func (e *impairEndpoint) Close() {
	e.stop()
	e.Endpoint.Close()
}
