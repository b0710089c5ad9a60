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
// the segments after it aligned. To gVisor a held tail is in flight a
// little longer.
//
// The rest may be slow to come: on a starved machine (or under the race
// detector) gVisor took over 20 ms to process the ACK. It may also wait for
// a window update that was lost (the peer opened its window, and the ACK
// that said so did not arrive). So a tail not continued within holdProbe
// is not sent alone: a window probe asks the peer for its window — a
// segment without data numbered one below the held start, which the peer
// answers with an ACK carrying its window (as Linux probes a zero window)
// — and again at twice the interval, holdProbes times in all. Only then
// (holdProbe × (2^holdProbes - 1), 300 ms) does the start leave alone: a
// peer whose window stays smaller than the FPDU would never let its rest
// come. A FIN overtaking the tail sends it as it is, too.

// holdProbe is how long a tail is held before the first window probe, and
// holdProbes how many probes are sent, each after twice the wait before.
// Holding costs the peer nothing, as it cannot use an FPDU's start without
// its rest.
const (
	holdProbe  = 20 * time.Millisecond
	holdProbes = 4
)

// heldTail is a flow's held tail.
type heldTail struct {
	mu       sync.Mutex
	pkt      *stack.PacketBuffer // guarded by mu; nil: nothing held
	seq, end uint32              // guarded by mu: the held sequence range
	gen      uint64              // guarded by mu: counts holds, so a late timer flushes nothing newer
	timer    *time.Timer         // guarded by mu
	probes   int                 // guarded by mu: window probes sent for this hold
}

// set holds pkt, the sequence range [seq, end); mu is held and nothing is.
func (t *heldTail) set(e *hookEndpoint, f *flow, pkt *stack.PacketBuffer, seq, end uint32) {
	t.pkt, t.seq, t.end = pkt, seq, end
	t.gen++
	t.probes = 0
	e.s.tailsHeld.Add(1)
	t.arm(e, f, holdProbe)
}

// arm starts the hold's timer for d; mu is held.
func (t *heldTail) arm(e *hookEndpoint, f *flow, d time.Duration) {
	gen := t.gen
	if t.timer != nil {
		t.timer.Stop()
	}
	// A timer per hold (holds are rare): gen keeps a late one from
	// acting on a newer hold.
	t.timer = time.AfterFunc(d, func() { e.heldExpired(f, gen) })
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

// heldExpired probes the peer's window for a tail still held (hold number
// gen), or sends the tail alone after holdProbes probes.
func (e *hookEndpoint) heldExpired(f *flow, gen uint64) {
	f.hold.mu.Lock()
	defer f.hold.mu.Unlock()
	if f.hold.pkt == nil || f.hold.gen != gen || f.removed.Load() {
		return
	}
	if f.hold.probes < holdProbes {
		f.hold.probes++
		e.s.holdProbes.Add(1)
		// A write error is TCP's to recover from, as a loss.
		_ = e.probeWindow(f)
		f.hold.arm(e, f, holdProbe<<f.hold.probes)
		return
	}
	_ = e.flushHeld(f)
}

// probeWindow sends a window probe for the held tail: its headers, no
// data, numbered one below the held start (an octet the peer has), which
// the peer must answer with an ACK carrying its window. f.hold.mu is held.
func (e *hookEndpoint) probeWindow(f *flow) tcpip.Error {
	p := runPacket(f.hold.pkt, 0, 0, 0)
	defer p.DecRef()
	header.TCP(p.TransportHeader().Slice()).SetSequenceNumber(f.hold.seq - 1)
	return e.emit(p)
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
