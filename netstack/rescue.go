package netstack

import (
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// The tail rescue works around a gVisor sender that stops retransmitting.
//
// gVisor's RACK tail loss probe (TLP) replaces the retransmission timer
// while it is scheduled. When the probe fires and has nothing it may send
// (a probe is already out), or retransmits without counting the segment,
// the retransmission timer is armed again only if the sender's count of
// segments in flight is above zero; after a retransmission timeout that
// count is reset and ACKs of what was sent before bring it to zero early
// (gVisor's own comment in its ACK processing says so), with data still
// unacknowledged. If the tail of a burst is then lost, no timer is left:
// the sender never sends again and the connection waits for ever. make
// soak found it as connections silent for minutes (three in 3 minutes of
// 16 QPs at 2 % loss); TestLossyBurstsRetransmitted reproduces it. Turning
// RACK off instead trades it for far slower recovery (RTOs of seconds on a
// lossy link, a third of the throughput in make soak).
//
// So the link layer keeps the latest data packets of each connection it
// watches (tailKeep, references, not copies) until the peer acknowledges
// them. When a connection has unacknowledged data and neither sent a data
// segment nor seen its ACK advance for rescueAfter, the kept packets the
// peer has not acknowledged are written to the link again, as they were
// (TCP's own retransmission, a duplicate at worst: the peer acknowledges
// it and TCP goes on). The wait doubles while nothing moves, up to
// rescueMax.

// tailKeep is how many of a flow's latest data packets are kept.
const tailKeep = 8

// rescueAfter is how long a connection with unacknowledged data may send
// nothing and see no ACK advance before its tail is written again;
// rescueMax bounds its doubling. A sender in a retransmission timeout's
// backoff also waits that long; its kept packets then go out as well,
// which costs a duplicate.
const (
	rescueAfter = time.Second
	rescueMax   = 30 * time.Second
)

// rescueTick is how often the stack looks for connections to rescue.
const rescueTick = 250 * time.Millisecond

// keptPkt is a data packet a flow sent: its sequence range and a reference
// to it.
type keptPkt struct {
	seq, end uint32
	pkt      *stack.PacketBuffer
}

// tailKeeper is the part of a flow that keeps its latest data packets.
type tailKeeper struct {
	mu      sync.Mutex
	kept    [tailKeep]keptPkt // a ring; guarded by mu
	next    int               // guarded by mu
	wait    time.Duration     // guarded by mu: the quiet time before the next rescue (0: rescueAfter)
	rescued time.Time         // guarded by mu: the last rescue
	// lastOut and lastAck are when a data segment last left and when the
	// peer's ACK last advanced (Unix nanoseconds).
	lastOut, lastAck atomic.Int64
	n                atomic.Int32 // packets kept
}

// keep records a data packet sent with sequence range [seq, end).
func (k *tailKeeper) keep(seq, end uint32, pkt *stack.PacketBuffer) {
	k.lastOut.Store(time.Now().UnixNano())
	c := pkt.Clone()
	k.mu.Lock()
	old := k.kept[k.next]
	k.kept[k.next] = keptPkt{seq: seq, end: end, pkt: c}
	k.next = (k.next + 1) % tailKeep
	k.wait = 0
	if old.pkt == nil {
		k.n.Add(1)
	}
	k.mu.Unlock()
	if old.pkt != nil {
		old.pkt.DecRef()
	}
}

// acked releases the packets the cumulative ACK ack covers.
func (k *tailKeeper) acked(ack uint32) {
	k.lastAck.Store(time.Now().UnixNano())
	if k.n.Load() == 0 {
		return
	}
	var drop [tailKeep]*stack.PacketBuffer
	k.mu.Lock()
	for i := range k.kept {
		if p := k.kept[i]; p.pkt != nil && int32(p.end-ack) <= 0 {
			drop[i] = p.pkt
			k.kept[i] = keptPkt{}
			k.n.Add(-1)
		}
	}
	k.wait = 0
	k.mu.Unlock()
	for _, p := range drop {
		if p != nil {
			p.DecRef()
		}
	}
}

// release drops every kept packet (the flow is gone).
func (k *tailKeeper) release() {
	k.mu.Lock()
	kept := k.kept
	k.kept = [tailKeep]keptPkt{}
	k.n.Store(0)
	k.mu.Unlock()
	for _, p := range kept {
		if p.pkt != nil {
			p.pkt.DecRef()
		}
	}
}

// due returns clones of the kept packets not acknowledged by ack, oldest
// first, if the connection has been quiet long enough with sent ahead of
// ack; the caller writes them and releases them.
func (k *tailKeeper) due(now time.Time, ack, sent uint32) []*stack.PacketBuffer {
	if k.n.Load() == 0 || int32(sent-ack) <= 0 {
		return nil
	}
	last := max(k.lastOut.Load(), k.lastAck.Load())
	k.mu.Lock()
	defer k.mu.Unlock()
	wait := k.wait
	if wait == 0 {
		wait = rescueAfter
	}
	quiet := now.Sub(time.Unix(0, last))
	if q := now.Sub(k.rescued); q < quiet {
		quiet = q
	}
	if quiet < wait {
		return nil
	}
	var out []*stack.PacketBuffer
	for i := range tailKeep {
		p := k.kept[(k.next+i)%tailKeep]
		if p.pkt != nil && int32(p.end-ack) > 0 {
			out = append(out, p.pkt.Clone())
		}
	}
	if len(out) > 0 {
		k.rescued = now
		k.wait = min(2*wait, rescueMax)
	}
	return out
}

// rescueLoop writes the tails of stalled connections again until done is
// closed.
func (s *Stack) rescueLoop(done <-chan struct{}) {
	t := time.NewTicker(rescueTick)
	defer t.Stop()
	var flows []*flow
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			flows = s.flows.kept(flows[:0])
			for _, f := range flows {
				sent, ok1 := f.sentEdge()
				ack, ok2 := f.peerAck()
				if !ok1 || !ok2 {
					continue
				}
				pkts := f.tail.due(now, ack, sent)
				if len(pkts) == 0 {
					continue
				}
				var l stack.PacketBufferList
				for _, p := range pkts {
					l.PushBack(p)
				}
				s.ep.Endpoint.WritePackets(l)
				l.Reset()
				s.tailRescues.Add(uint64(len(pkts)))
			}
			clear(flows)
		}
	}
}

// TailRescues counts the data packets the stack wrote again for
// connections whose TCP sender had stopped with data unacknowledged (see
// the tail rescue in rescue.go).
func (s *Stack) TailRescues() uint64 { return s.tailRescues.Load() }

// kept appends the flows that keep packets to out.
func (t *flowTable) kept(out []*flow) []*flow {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, f := range t.m {
		if f.tail.n.Load() > 0 {
			out = append(out, f)
		}
	}
	return out
}

// releaseAll drops the kept packets of every flow (the stack closed).
func (t *flowTable) releaseAll() {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, f := range t.m {
		f.tail.release()
	}
}
