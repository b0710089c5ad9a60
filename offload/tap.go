package offload

import (
	"bytes"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// DefaultWatchDepth is the event queue of a Watch when Watch is given 0.
const DefaultWatchDepth = 4096

// TapEvent is one thing a Watch saw: exactly one of Segment, Place and
// Completion is set.
type TapEvent struct {
	// Time is when it happened.
	Time time.Time
	// Segment is a TCP segment at the device's link.
	Segment *TapSegment
	// Place is the payload of an FPDU placed into memory.
	Place *Placement
	// Completion is a work completion the engine delivered.
	Completion *ibv.WorkCompletion
}

// TapSegment is a TCP segment at the device's link, as its TCP/IP stack
// sent it (Outbound) or received it before TCP looked at it (Inbound:
// out-of-order, duplicated and retransmitted segments included).
type TapSegment struct {
	Dir      netstack.Direction
	Src, Dst netip.AddrPort
	Seq, Ack uint32
	Flags    uint8  // netstack.FlagSYN, ... (the TCP header's bits)
	Window   uint16 // raw, unscaled
	MSS      uint16 // the MSS option of a SYN
	Payload  []byte // a copy, owned by the event
}

// Placement says where the payload of one received FPDU went.
type Placement struct {
	// QP is the queue pair that received it.
	QP uint32
	// Op is the RDMAP opcode of the FPDU.
	Op rdmap.Opcode
	// STag and TO are the tagged FPDU's sink; Offset is TO's offset in the
	// region STag names.
	STag   uint32
	TO     uint64
	Offset uint64
	// RecvWR is the receive work request a Send is placed into, MSN and MO
	// the Send's; Offset is then the offset in that receive's buffer.
	RecvWR  uint64
	MSN, MO uint32
	// Len is the number of payload octets placed.
	Len int
	// OutOfOrder says the FPDU was placed before the octets in front of
	// it had arrived.
	OutOfOrder bool
}

// tap is the device's segment tap and event fan-out. It costs nothing
// while no Watch is open: the stack has no tap installed, and the engine's
// placement and completion paths test one atomic flag.
type tap struct {
	on      atomic.Bool
	mu      sync.Mutex
	watches map[*Watch]struct{} // guarded by mu
}

// Watch is an open stream of a device's TapEvents (a capture or a trace).
// Events are never waited for: when the queue is full they are dropped and
// counted.
type Watch struct {
	d       *Device
	ch      chan TapEvent
	dropped atomic.Uint64
	once    sync.Once
}

// Watch opens a stream of the device's segments, placements and
// completions with a queue of depth events (0: DefaultWatchDepth). While
// at least one Watch is open, every TCP segment of the device is copied.
// Close it when done.
func (d *Device) Watch(depth int) *Watch {
	if depth <= 0 {
		depth = DefaultWatchDepth
	}
	w := &Watch{d: d, ch: make(chan TapEvent, depth)}
	t := &d.tap
	t.mu.Lock()
	if t.watches == nil {
		t.watches = make(map[*Watch]struct{})
	}
	t.watches[w] = struct{}{}
	if len(t.watches) == 1 {
		t.on.Store(true)
		d.stack.SetTap(netstack.SegmentHookFunc(d.tapSegment))
	}
	t.mu.Unlock()
	return w
}

// Events returns the event stream; it is closed by Close.
func (w *Watch) Events() <-chan TapEvent { return w.ch }

// Dropped returns how many events did not fit in the queue.
func (w *Watch) Dropped() uint64 { return w.dropped.Load() }

// Close ends the watch and closes its event stream. The last Close removes
// the stack's tap.
func (w *Watch) Close() {
	w.once.Do(func() {
		t := &w.d.tap
		t.mu.Lock()
		delete(t.watches, w)
		if len(t.watches) == 0 {
			t.on.Store(false)
			w.d.stack.SetTap(nil)
		}
		close(w.ch)
		t.mu.Unlock()
	})
}

// send offers e to every open Watch.
func (t *tap) send(e TapEvent) {
	t.mu.Lock()
	for w := range t.watches {
		select {
		case w.ch <- e:
		default:
			w.dropped.Add(1)
		}
	}
	t.mu.Unlock()
}

// tapSegment is the stack's tap while a Watch is open.
func (d *Device) tapSegment(s *netstack.Segment) {
	d.tap.send(TapEvent{Time: time.Now(), Segment: &TapSegment{
		Dir: s.Dir, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Ack: s.Ack, Flags: s.Flags,
		Window: s.Window, MSS: s.MSS, Payload: bytes.Clone(s.Payload),
	}})
}

// tapCompletion reports a completion pushed to a CQ.
func (t *tap) tapCompletion(wc *ibv.WorkCompletion) {
	if !t.on.Load() {
		return
	}
	c := *wc
	t.send(TapEvent{Time: time.Now(), Completion: &c})
}

// tapPlace reports the placement of the FPDU the receiver just finished
// (called from EndFPDU before the counters move on).
func (r *rxState) tapPlace() {
	qp := r.qp
	t := &qp.dev.tap
	if !t.on.Load() || r.payload == 0 {
		return
	}
	p := Placement{QP: qp.num, Op: r.op, Len: r.payload}
	switch r.op {
	case rdmap.OpWrite, rdmap.OpReadResponse:
		p.STag, p.TO = r.h.STag, r.h.TO
		if reg, ok := qp.dev.regions.Lookup(r.h.STag); ok && r.h.TO >= reg.Addr() {
			p.Offset = r.h.TO - reg.Addr()
		}
	case rdmap.OpSend, rdmap.OpSendInv, rdmap.OpSendSE, rdmap.OpSendSEInv:
		p.MSN, p.MO, p.Offset = r.h.MSN, r.h.MO, r.sendPlaced
		qp.mu.Lock()
		if qp.rqHead != qp.rqTail {
			p.RecvWR = qp.rq[qp.rqHead%uint64(len(qp.rq))].id
		}
		qp.mu.Unlock()
	default:
		return
	}
	t.send(TapEvent{Time: time.Now(), Place: &p})
}

// Watching returns the number of open Watches.
func (d *Device) Watching() int {
	d.tap.mu.Lock()
	defer d.tap.mu.Unlock()
	return len(d.tap.watches)
}
