package netstack

import (
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// A held tail. gVisor cuts a queued write at the edge of the peer's window
// as it knows it, which lags the link by the ACKs it has not yet
// processed: the super-segment then ends inside an FPDU, and the next one
// starts inside it. Sent like that, the FPDU would straddle two wire
// segments. So the tail from the FPDU's start is held back until gVisor
// sends the rest (within microseconds, once it has processed the ACK that
// opened the window), and leaves joined with it: the FPDU in one segment,
// the segments after it aligned. A tail not continued within holdMax
// leaves as it is; so does one that a retransmission or a FIN overtakes.
// To gVisor a held tail is in flight a little longer.

// holdMax bounds how long a tail is held. Its rest normally comes within
// microseconds; on a starved machine (or under the race detector) it took
// over 5 ms. Holding costs the peer nothing, as it cannot use an FPDU's
// start without its rest; to TCP the held octets are in flight longer.
const holdMax = 20 * time.Millisecond

// heldTail is a flow's held tail.
type heldTail struct {
	mu       sync.Mutex
	pkt      *stack.PacketBuffer // guarded by mu; nil: nothing held
	seq, end uint32              // guarded by mu: the held sequence range
	gen      uint64              // guarded by mu: counts holds, so a late timer flushes nothing newer
	timer    *time.Timer         // guarded by mu
}

// set holds pkt, the sequence range [seq, end); mu is held and nothing is.
func (t *heldTail) set(e *hookEndpoint, f *flow, pkt *stack.PacketBuffer, seq, end uint32) {
	t.pkt, t.seq, t.end = pkt, seq, end
	t.gen++
	e.s.tailsHeld.Add(1)
	gen := t.gen
	if t.timer != nil {
		t.timer.Stop()
	}
	// A timer per hold (holds are rare): gen keeps a late one from
	// flushing a newer hold.
	t.timer = time.AfterFunc(holdMax, func() { e.heldExpired(f, gen) })
}

// drop forgets the held tail (its packet released); mu is held.
func (t *heldTail) drop() {
	if t.pkt != nil {
		t.pkt.DecRef()
		t.pkt = nil
	}
	if t.timer != nil {
		t.timer.Stop()
	}
}

// release drops a held tail (the flow is gone).
func (t *heldTail) release() {
	t.mu.Lock()
	t.drop()
	t.mu.Unlock()
}

// flushHeld sends the held tail as it is; f.hold.mu is held.
func (e *hookEndpoint) flushHeld(f *flow) tcpip.Error {
	pkt := f.hold.pkt
	f.hold.pkt = nil
	if f.hold.timer != nil {
		f.hold.timer.Stop()
	}
	if pkt == nil {
		return nil
	}
	e.s.tailsAlone.Add(1)
	err := e.emit(pkt)
	pkt.DecRef()
	return err
}

// heldExpired sends a tail still held holdMax after hold number gen.
func (e *hookEndpoint) heldExpired(f *flow, gen uint64) {
	f.hold.mu.Lock()
	defer f.hold.mu.Unlock()
	if f.hold.pkt == nil || f.hold.gen != gen || f.removed.Load() {
		return
	}
	_ = e.flushHeld(f) // a write error is TCP's to recover from, as a loss
}

// joinPackets builds one packet of held's payload followed by pkt's, with
// pkt's headers (its ACK and window are the newer) but held's sequence
// number. Its IP length is not set: it only carries runs (runPacket sets
// theirs).
func joinPackets(held, pkt *stack.PacketBuffer) *stack.PacketBuffer {
	payload := held.Data().ToBuffer()
	rest := pkt.Data().ToBuffer()
	payload.Merge(&rest)
	r := withHeaders(pkt, payload)
	header.TCP(r.TransportHeader().Slice()).SetSequenceNumber(header.TCP(held.TransportHeader().Slice()).SequenceNumber())
	return r
}
