package netstack

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/siwtun/siwtun/anatomy"
)

const (
	// pipeQueueLen is the outbound queue length of a Pipe direction. Like
	// link/channel (and tailscale's linkEndpoint) a full queue drops instead
	// of blocking the stack; 4096 packets is > 2 send windows of 4 MiB at
	// MTU 1500, so drops only happen when the receiver stalls.
	pipeQueueLen = 4096
	// reorderTimeout bounds how long a packet held back for reordering
	// waits for a successor before it is released anyway.
	reorderTimeout = time.Millisecond
)

// Pipe returns two links joined back to back in memory: what a's stack sends
// arrives at b's stack and vice versa. No root, no TUN. Each direction has a
// bounded queue and one forwarding goroutine (modelled on tailscale's
// throughput_test forwardPackets) that applies imp. The directions are
// impaired independently with their own PRNG, seeded from imp.Seed (a→b with
// the seed, b→a with the seed+1), so a run is deterministic for a given seed
// and packet sequence.
//
// Packets are forwarded without copying (the sender's buffer views are
// shared), except corrupted ones, which are copied before the flip. The
// receiving stack therefore sees one view for the IP and TCP headers and the
// sender's write buffers for the payload: one view per segment when the
// sender writes segment-sized chunks (WriteAligned).
//
// mtu values below 1280 are raised to 1280 so IPv6 works; 0 means 1500.
func Pipe(mtu int, imp Impairments) (a, b *Link) {
	if mtu == 0 {
		mtu = DefaultMTU
	}
	mtu = max(mtu, 1280)
	mtu = min(mtu, 65535)
	ab, ba := new(dirCounters), new(dirCounters)
	ea := newPipeEndpoint(uint32(mtu), imp, imp.Seed, ab, ba)
	eb := newPipeEndpoint(uint32(mtu), imp, imp.Seed+1, ba, ab)
	ea.peer, eb.peer = eb, ea
	ea.start()
	eb.start()
	mk := func(e *pipeEndpoint) *Link {
		return &Link{
			ep:       e,
			mtu:      mtu,
			stats:    func() LinkStats { return LinkStats{Tx: e.tx.snapshot(), Rx: e.rx.snapshot()} },
			shutdown: e.shutdown,
			hops:     e.hops,
		}
	}
	return mk(ea), mk(eb)
}

// pipePacket is one queued IP packet.
type pipePacket struct {
	proto tcpip.NetworkProtocolNumber
	buf   buffer.Buffer
	at    time.Time // release time in the delay queue
}

// pipeEndpoint is a link/channel-style stack.LinkEndpoint: outbound packets
// go to a bounded queue drained by the forwarding goroutine, which injects
// them into the peer.
type pipeEndpoint struct {
	mtu  uint32
	imp  Impairments
	seed int64
	peer *pipeEndpoint
	tx   *dirCounters
	rx   *dirCounters
	// hops stamps the packets the stack hands to the pipe (TUNWrite) and
	// those the pipe hands to the stack (TUNRead), as a device link stamps
	// its writes and reads (hops.go).
	hops *anatomy.Recorder

	q        chan pipePacket
	txClosed atomic.Bool
	done     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once

	// deliverMu serialises delivery into this endpoint's stack against
	// Attach and shutdown. WritePackets never takes it, so a stack that
	// answers synchronously while a packet is delivered cannot deadlock.
	deliverMu  sync.RWMutex
	dispatcher stack.NetworkDispatcher // guarded by deliverMu
	rxClosed   bool                    // guarded by deliverMu
}

var _ stack.LinkEndpoint = (*pipeEndpoint)(nil)

func newPipeEndpoint(mtu uint32, imp Impairments, seed int64, tx, rx *dirCounters) *pipeEndpoint {
	return &pipeEndpoint{
		mtu:  mtu,
		imp:  imp,
		seed: seed,
		tx:   tx,
		rx:   rx,
		q:    make(chan pipePacket, pipeQueueLen),
		done: make(chan struct{}),
		hops: anatomy.NewRecorder(),
	}
}

func (e *pipeEndpoint) start() {
	e.wg.Add(1)
	go e.forward()
}

// shutdown stops delivery into this endpoint, flushes and stops its
// forwarding goroutine and waits for it.
func (e *pipeEndpoint) shutdown() {
	e.stopOnce.Do(func() {
		e.txClosed.Store(true)
		e.deliverMu.Lock()
		e.rxClosed = true
		e.dispatcher = nil
		e.deliverMu.Unlock()
		close(e.done)
		e.wg.Wait()
	})
}

// deliver hands buf to this endpoint's stack. It takes ownership of buf.
func (e *pipeEndpoint) deliver(p pipePacket, c *dirCounters) {
	e.deliverMu.RLock()
	defer e.deliverMu.RUnlock()
	if e.rxClosed || e.dispatcher == nil {
		p.buf.Release()
		c.queueFull.Add(1)
		return
	}
	c.delivered.Add(1)
	c.bytes.Add(uint64(p.buf.Size()))
	if e.hops.On() {
		stampRead(e.hops, p.buf, anatomy.Now())
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: p.buf})
	e.dispatcher.DeliverNetworkPacket(p.proto, pkt)
	pkt.DecRef()
}

// forward is the goroutine draining e.q into the peer, applying impairments.
// When the endpoint shuts down, what the stack already sent (e.g. the RSTs of
// a closing stack) is still delivered, ignoring delays.
func (e *pipeEndpoint) forward() {
	defer e.wg.Done()
	f := newForwarder(e.imp, e.seed, e.tx, func(p pipePacket) { e.peer.deliver(p, e.tx) })
	f.run(e.q, e.done, true)
}

// forwarder holds one direction's impairment state. It is owned by the
// forwarding goroutine (or a test).
type forwarder struct {
	imp     Impairments
	rng     *rand.Rand
	out     func(pipePacket)
	c       *dirCounters
	held    pipePacket // valid when isHeld
	isHeld  bool
	heldAt  time.Time
	pending []pipePacket // FIFO; release times are non-decreasing
	lastAt  time.Time
}

// newForwarder returns a forwarder applying imp with a PRNG seeded from seed,
// counting into c and handing survivors to out.
func newForwarder(imp Impairments, seed int64, c *dirCounters, out func(pipePacket)) *forwarder {
	return &forwarder{
		imp: imp,
		rng: rand.New(rand.NewPCG(uint64(seed), 0x5157_7475_6e00)),
		out: out,
		c:   c,
	}
}

// run drains q through the forwarder until done is closed. Then what is
// queued and held is delivered at once (flush) or released (!flush).
func (f *forwarder) run(q <-chan pipePacket, done <-chan struct{}, flush bool) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if next, ok := f.nextDeadline(); ok {
			timer.Reset(time.Until(next))
		} else {
			timer.Stop()
		}
		select {
		case p := <-q:
			f.handle(p, time.Now())
			// Take whatever else is queued without re-arming the timer.
		drain:
			for range 64 {
				select {
				case p := <-q:
					f.handle(p, time.Now())
				default:
					break drain
				}
			}
		case <-timer.C:
		case <-done:
			for {
				select {
				case p := <-q:
					if flush {
						f.handle(p, time.Now())
					} else {
						p.buf.Release()
					}
					continue
				default:
				}
				break
			}
			if flush {
				f.flush()
			} else {
				f.discard()
			}
			return
		}
		f.release(time.Now())
	}
}

func (f *forwarder) chance(p float64) bool {
	return p > 0 && f.rng.Float64() < p
}

// handle applies loss, corruption, duplication and reordering to p, then
// queues the survivors for delay.
func (f *forwarder) handle(p pipePacket, now time.Time) {
	f.c.sent.Add(1)
	if f.chance(f.imp.Loss) {
		f.c.dropped.Add(1)
		p.buf.Release()
		return
	}
	if f.imp.Corrupt > 0 {
		p = f.maybeCorrupt(p)
	}
	// Values, not pointers: taking p's address would move every packet
	// to the heap.
	var dup pipePacket
	hasDup := false
	if f.chance(f.imp.Duplicate) {
		f.c.duplicated.Add(1)
		dup, hasDup = pipePacket{proto: p.proto, buf: p.buf.Clone()}, true
	}
	if !f.isHeld && f.chance(f.imp.Reorder) {
		f.c.reordered.Add(1)
		f.held, f.isHeld = p, true
		f.heldAt = now.Add(reorderTimeout)
		if hasDup {
			f.delay(dup, now)
		}
		return
	}
	f.delay(p, now)
	if hasDup {
		f.delay(dup, now)
	}
	if f.isHeld {
		f.delay(f.takeHeld(), now)
	}
}

// delay schedules p for release after the one-way delay and jitter. Release
// times never go backwards, so jitter varies spacing but does not reorder.
func (f *forwarder) delay(p pipePacket, now time.Time) {
	if f.imp.Delay <= 0 && f.imp.Jitter <= 0 && len(f.pending) == 0 {
		f.out(p)
		return
	}
	at := now.Add(f.imp.Delay)
	if f.imp.Jitter > 0 {
		at = at.Add(time.Duration(f.rng.Int64N(int64(f.imp.Jitter) + 1)))
	}
	if at.Before(f.lastAt) {
		at = f.lastAt
	}
	f.lastAt = at
	p.at = at
	f.pending = append(f.pending, p)
}

// nextDeadline returns the earliest time something must be released.
func (f *forwarder) nextDeadline() (time.Time, bool) {
	var t time.Time
	ok := false
	if len(f.pending) > 0 {
		t, ok = f.pending[0].at, true
	}
	if f.isHeld && (!ok || f.heldAt.Before(t)) {
		t, ok = f.heldAt, true
	}
	return t, ok
}

// release delivers everything that is due at now.
func (f *forwarder) release(now time.Time) {
	if f.isHeld && !now.Before(f.heldAt) {
		f.delay(f.takeHeld(), now)
	}
	i := 0
	for ; i < len(f.pending) && !now.Before(f.pending[i].at); i++ {
		f.out(f.pending[i])
		f.pending[i] = pipePacket{}
	}
	if i > 0 {
		n := copy(f.pending, f.pending[i:])
		clear(f.pending[n:])
		f.pending = f.pending[:n]
	}
}

// flush delivers everything immediately.
func (f *forwarder) flush() {
	for _, p := range f.pending {
		f.out(p)
	}
	f.pending = nil
	if f.isHeld {
		f.out(f.takeHeld())
	}
}

// discard releases everything held without delivering it.
func (f *forwarder) discard() {
	for _, p := range f.pending {
		p.buf.Release()
	}
	f.pending = nil
	if f.isHeld {
		p := f.takeHeld()
		p.buf.Release()
	}
}

// takeHeld returns the held-back packet and clears the slot.
func (f *forwarder) takeHeld() pipePacket {
	h := f.held
	f.held, f.isHeld = pipePacket{}, false
	return h
}

// maybeCorrupt flips one payload byte of a TCP data segment with probability
// imp.Corrupt and fixes the TCP checksum, so the damage is invisible to TCP.
// The packet is copied first: its views are shared with the sender's
// retransmission queue.
func (f *forwarder) maybeCorrupt(p pipePacket) pipePacket {
	hdr := make([]byte, min(int(p.buf.Size()), 120))
	if _, err := p.buf.ReadAt(hdr, 0); err != nil {
		return p
	}
	h, ok := parseTCPHeaders(hdr)
	if !ok {
		return p
	}
	payload := h.total - h.ipHdrLen - h.tcpLen
	if payload <= 0 || h.total > int(p.buf.Size()) || !f.chance(f.imp.Corrupt) {
		return p
	}
	flat := p.buf.Flatten()
	p.buf.Release()
	tcpSeg := header.TCP(flat[h.ipHdrLen:h.total])
	i := h.tcpLen + f.rng.IntN(payload)
	tcpSeg[i] ^= byte(1 + f.rng.IntN(255))
	tcpSeg.SetChecksum(0)
	src, dst := tcpip.AddrFromSlice(h.src.Addr().AsSlice()), tcpip.AddrFromSlice(h.dst.Addr().AsSlice())
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(len(tcpSeg)))
	xsum = checksum.Checksum(tcpSeg, xsum)
	tcpSeg.SetChecksum(^xsum)
	f.c.corrupted.Add(1)
	return pipePacket{proto: p.proto, buf: buffer.MakeWithData(flat)}
}

// MTU implements stack.LinkEndpoint.MTU.
func (e *pipeEndpoint) MTU() uint32 { return e.mtu }

// SetMTU implements stack.LinkEndpoint.SetMTU. The Pipe MTU is fixed.
func (e *pipeEndpoint) SetMTU(uint32) {}

// MaxHeaderLength implements stack.LinkEndpoint.MaxHeaderLength: raw IP, no
// link header.
func (e *pipeEndpoint) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.LinkEndpoint.LinkAddress.
func (e *pipeEndpoint) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.LinkEndpoint.SetLinkAddress.
func (e *pipeEndpoint) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.LinkEndpoint.Capabilities. None: checksums
// are computed and verified (Corrupt relies on that), no GSO, no resolution.
func (e *pipeEndpoint) Capabilities() stack.LinkEndpointCapabilities { return 0 }

// Attach implements stack.LinkEndpoint.Attach.
func (e *pipeEndpoint) Attach(d stack.NetworkDispatcher) {
	e.deliverMu.Lock()
	defer e.deliverMu.Unlock()
	if e.rxClosed {
		return
	}
	e.dispatcher = d
}

// IsAttached implements stack.LinkEndpoint.IsAttached.
func (e *pipeEndpoint) IsAttached() bool {
	e.deliverMu.RLock()
	defer e.deliverMu.RUnlock()
	return e.dispatcher != nil
}

// Wait implements stack.LinkEndpoint.Wait.
func (e *pipeEndpoint) Wait() {}

// ARPHardwareType implements stack.LinkEndpoint.ARPHardwareType.
func (e *pipeEndpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.LinkEndpoint.AddHeader.
func (e *pipeEndpoint) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.LinkEndpoint.ParseHeader.
func (e *pipeEndpoint) ParseHeader(*stack.PacketBuffer) bool { return true }

// Close implements stack.LinkEndpoint.Close.
func (e *pipeEndpoint) Close() { e.shutdown() }

// SetOnCloseAction implements stack.LinkEndpoint.SetOnCloseAction.
func (e *pipeEndpoint) SetOnCloseAction(func()) {}

// WritePackets implements stack.LinkWriter.WritePackets. It never blocks: a
// full queue drops (and counts) the rest, as link/channel does.
func (e *pipeEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if e.txClosed.Load() {
		return 0, &tcpip.ErrClosedForSend{}
	}
	if e.hops.On() {
		stampOut(e.hops, anatomy.TUNWrite, pkts.AsSlice())
	}
	n := 0
	for _, pkt := range pkts.AsSlice() {
		p := pipePacket{proto: pkt.NetworkProtocolNumber, buf: pkt.ToBuffer()}
		select {
		case e.q <- p:
			n++
		default:
			p.buf.Release()
			e.tx.sent.Add(1)
			e.tx.queueFull.Add(1)
			return n, nil
		}
	}
	return n, nil
}
