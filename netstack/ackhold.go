package netstack

import (
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Delayed ACKs at the link. gVisor's TCP acknowledges every data segment
// it receives at once, with a segment of its own: in a ping-pong every
// message costs each side a second packet — a TUN write for the one that
// sends it, a TUN read, a pass of gVisor's receive path and its
// processor goroutine's wake-up for the other — although the answer,
// which follows within microseconds, carries the same acknowledgement.
// Linux delays such ACKs (RFC 1122 §4.2.3.2, RFC 9293 §3.8.6.3); gVisor
// does not, so the link does: a pure ACK that acknowledges new data is
// held up to ackHoldMax, and dropped when any later segment of its
// connection leaves first (every segment carries the current ACK and
// window), sent when a second such ACK of the connection comes (an ACK at
// least every second segment, as RFC 1122 asks) or when the time is up.
// ACKs that say more than "received up to here" — duplicate ACKs, window
// updates, SACK blocks, any other flag — leave at once.

// ackHoldMax is how long a pure ACK may be held. Far below TCP's timers
// (gVisor's minimum retransmission timeout is 200 ms and its tail loss
// probe allows 200 ms for a delayed ACK), long enough for an application
// to answer on a busy host.
const ackHoldMax = time.Millisecond

// ackHolder holds at most one pure ACK per connection.
type ackHolder struct {
	e  *hookEndpoint
	mu sync.Mutex
	// held maps a connection to its held ACK; last to the ACK number its
	// latest ACK carried (sent or held). Guarded by mu.
	held map[flowKey]*heldAck
	last map[flowKey]uint32
	// pool recycles heldAck values.
	pool sync.Pool
	// held counts the ACKs held; carried those a later segment carried
	// (dropped), expired those sent when their time was up.
	nHeld, nCarried, nExpired atomic.Uint64
}

type heldAck struct {
	pkt   *stack.PacketBuffer
	timer *time.Timer
	key   flowKey
	h     *ackHolder
}

func newAckHolder(e *hookEndpoint) *ackHolder {
	return &ackHolder{e: e, held: map[flowKey]*heldAck{}, last: map[flowKey]uint32{}}
}

// filter runs before pkts, built by TCP, go to the link: it returns false
// when it took the only packet, a pure ACK, to hold it; for any other
// packet it drops or sends the ACK held for the packet's connection.
func (a *ackHolder) filter(pkts stack.PacketBufferList) bool {
	all := pkts.AsSlice()
	if len(all) == 1 {
		if key, ack, ok := holdable(all[0]); ok {
			return a.hold(all[0], key, ack)
		}
	}
	for _, pkt := range all {
		key, h, ok := tcpHeaderOf(pkt)
		if !ok {
			continue
		}
		a.mu.Lock()
		switch {
		case h.flags&(FlagFIN|FlagRST) != 0:
			// The connection ends: its ACK leaves with this segment.
			if held := a.held[key]; held != nil {
				a.dropLocked(held)
			}
			delete(a.last, key)
		case h.flags&FlagACK != 0:
			if held := a.held[key]; held != nil && seqAtLeast(h.ack, a.last[key]) {
				a.dropLocked(held) // this segment carries the same ACK or a later one
				a.nCarried.Add(1)
			}
			if a.e.s.flows.get(key) != nil {
				a.last[key] = h.ack // a connection of the stack's, not yet released
			}
		}
		a.mu.Unlock()
	}
	return true
}

// hold takes pkt, a pure ACK of ack on connection key, unless it
// acknowledges nothing new; with an ACK already held, that one is dropped
// and pkt goes out now. It reports whether pkt must still be written.
func (a *ackHolder) hold(pkt *stack.PacketBuffer, key flowKey, ack uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	last, seen := a.last[key]
	if !seen {
		if a.e.s.flows.get(key) != nil {
			a.last[key] = ack
		}
		return true // the connection's first ACK, or one of a released connection
	}
	a.last[key] = ack
	if !seqAfter(ack, last) {
		return true // a duplicate ACK or a window update: at once
	}
	if h := a.held[key]; h != nil {
		a.dropLocked(h)
		return true // every second ACK goes out
	}
	h, _ := a.pool.Get().(*heldAck)
	if h == nil {
		h = &heldAck{h: a}
		h.timer = time.AfterFunc(ackHoldMax, h.expire)
	} else {
		h.timer.Reset(ackHoldMax)
	}
	pkt.IncRef()
	h.pkt, h.key = pkt, key
	a.held[key] = h
	a.nHeld.Add(1)
	return false
}

// dropLocked forgets the held ACK h. a.mu is held.
func (a *ackHolder) dropLocked(h *heldAck) {
	if !h.timer.Stop() {
		// expire runs or ran: it finds h gone and lets it be.
		delete(a.held, h.key)
		return
	}
	delete(a.held, h.key)
	h.pkt.DecRef()
	h.pkt = nil
	a.pool.Put(h)
}

// expire sends a held ACK whose time is up.
func (h *heldAck) expire() {
	a := h.h
	a.mu.Lock()
	pkt := h.pkt
	if pkt == nil || a.held[h.key] != h {
		// Dropped while the timer fired.
		if pkt != nil {
			pkt.DecRef()
			h.pkt = nil
		}
		a.mu.Unlock()
		return
	}
	delete(a.held, h.key)
	h.pkt = nil
	a.mu.Unlock()
	a.nExpired.Add(1)
	var l stack.PacketBufferList
	l.PushBack(pkt)
	a.e.writeNow(l)
	pkt.DecRef()
}

// forget drops what is kept for connection key, which its owner
// released: a FIN or RST it sends later leaves at once anyway.
func (a *ackHolder) forget(key flowKey) {
	a.mu.Lock()
	if h := a.held[key]; h != nil {
		a.dropLocked(h)
	}
	delete(a.last, key)
	a.mu.Unlock()
}

// holdable reports whether pkt is a pure ACK that may be held: TCP, no
// payload, the ACK flag alone, no options but timestamps (no SACK
// blocks), and returns its connection and ACK number.
func holdable(pkt *stack.PacketBuffer) (flowKey, uint32, bool) {
	if pkt.Data().Size() != 0 || pkt.TransportProtocolNumber != header.TCPProtocolNumber {
		return flowKey{}, 0, false
	}
	h, ok := parseIPAndTCP(pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice())
	if !ok || h.flags != FlagACK || !onlyTimestamps(h.options) {
		return flowKey{}, 0, false
	}
	return flowKey{local: h.src, remote: h.dst}, h.ack, true
}

// tcpHeaderOf returns the connection and headers of an outbound TCP
// segment.
func tcpHeaderOf(pkt *stack.PacketBuffer) (flowKey, tcpHeader, bool) {
	if pkt.TransportProtocolNumber != header.TCPProtocolNumber {
		return flowKey{}, tcpHeader{}, false
	}
	h, ok := parseIPAndTCP(pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice())
	if !ok {
		return flowKey{}, tcpHeader{}, false
	}
	return flowKey{local: h.src, remote: h.dst}, h, true
}

// onlyTimestamps reports whether TCP options hold nothing but NOPs, an
// end-of-options and the timestamps option.
func onlyTimestamps(opts []byte) bool {
	for i := 0; i < len(opts); {
		switch opts[i] {
		case header.TCPOptionEOL:
			return true
		case header.TCPOptionNOP:
			i++
		case header.TCPOptionTS:
			if i+1 >= len(opts) || opts[i+1] != header.TCPOptionTSLength {
				return false
			}
			i += header.TCPOptionTSLength
		default:
			return false
		}
	}
	return true
}

func seqAfter(a, b uint32) bool   { return int32(a-b) > 0 }
func seqAtLeast(a, b uint32) bool { return int32(a-b) >= 0 }
