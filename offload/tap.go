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
// A queued segment holds a copy of its payload (at most one link MTU), so
// a Watch holds at most depth × MTU octets however far its reader falls
// behind: 36 MiB at the default depth and MTU 9000.
const DefaultWatchDepth = 4096

// TapEvent is one thing a Watch saw: exactly one of Segment, Place,
// Completion and Gap is set, or none (a heartbeat: nothing happened
// between the previous event and Time).
type TapEvent struct {
	// Time is when it happened. The events of one Watch are stamped in
	// the order they are queued, so their times never go back.
	Time time.Time
	// Segment is a TCP segment at the device's link.
	Segment *TapSegment
	// Place is the payload of an FPDU placed into memory.
	Place *Placement
	// Completion is a work completion the engine delivered.
	Completion *ibv.WorkCompletion
	// Gap says which events the Watch left out just before this point.
	Gap *TapGap
}

// TapGap describes a window of events a Watch left out: its reader fell
// behind and the queue filled, so the Watch stopped queueing until the
// reader had taken three quarters of it. Whole windows are left out, never
// single events here and there, and each one is reported, so a reader
// knows what it did not see: the window's times, how many events of each
// kind, and per connection direction the sequence numbers of the segments
// in it.
type TapGap struct {
	// From and To are the times of the first and the last event left out.
	From, To time.Time
	// Segments, Places and Completions count the events left out.
	Segments, Places, Completions uint64
	// Dirs are the connection directions of the segments left out, in the
	// order first left out, at most MaxGapDirs of them.
	Dirs []TapGapDir
	// MoreDirs says segments of more directions than Dirs holds were left
	// out: any direction may have lost some.
	MoreDirs bool
}

// MaxGapDirs bounds TapGap.Dirs.
const MaxGapDirs = 256

// TapGapDir is one connection direction's segments in a TapGap.
type TapGapDir struct {
	Src, Dst netip.AddrPort
	// Seq is the lowest sequence number and End the highest sequence
	// number after a segment (seq plus payload length) among them, in
	// sequence space (modulo 2^32, taking the nearest reading): every
	// octet left out lies in [Seq, End).
	Seq, End uint32
	// Segments counts them.
	Segments int
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
// Events are never waited for: when the queue is full the Watch leaves
// out a whole window of events (see TapGap) and reports it.
type Watch struct {
	d       *Device
	ch      chan TapEvent
	dropped atomic.Uint64
	once    sync.Once

	// Guarded by the tap's mu.
	gap    *TapGap // the window being left out, nil while queueing
	gapDir map[[2]netip.AddrPort]int
	last   time.Time // the time of the last event queued
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

// Dropped returns how many events the Watch left out so far (in gaps).
func (w *Watch) Dropped() uint64 { return w.dropped.Load() }

// Idle queues a heartbeat (an event with only a Time) when the queue is
// empty, and reports a gap whose window has ended: a reader that merges
// several Watches by time learns that nothing older is still to come.
func (w *Watch) Idle() {
	t := &w.d.tap
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, open := t.watches[w]; !open {
		return
	}
	now := time.Now()
	if w.gap != nil {
		w.resume(now)
		return
	}
	if len(w.ch) == 0 {
		w.queue(TapEvent{Time: now})
	}
}

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

// send offers e to every open Watch, stamping it with the time under the
// lock, so each Watch's events are in time order.
func (t *tap) send(e TapEvent) {
	t.mu.Lock()
	e.Time = time.Now()
	for w := range t.watches {
		w.offer(e)
	}
	t.mu.Unlock()
}

// offer queues e, or leaves it out while a gap is open. A gap opens when
// the queue is full and closes once the reader has emptied three quarters
// of it: the gap is queued first, then e. The tap's mu is held.
func (w *Watch) offer(e TapEvent) {
	if w.gap != nil && !w.resume(e.Time) {
		w.leaveOut(e)
		return
	}
	select {
	case w.ch <- e:
		w.last = e.Time
	default:
		w.gap = &TapGap{From: e.Time}
		w.leaveOut(e)
	}
}

// resume closes the open gap when the queue has room again, queueing the
// gap's report; it reports whether it did.
func (w *Watch) resume(now time.Time) bool {
	if len(w.ch) > cap(w.ch)/4 {
		return false
	}
	g := w.gap
	w.gap, w.gapDir = nil, nil
	w.queue(TapEvent{Time: g.To, Gap: g})
	return true
}

// queue puts e in the queue, which the caller knows has room.
func (w *Watch) queue(e TapEvent) {
	if e.Time.Before(w.last) {
		e.Time = w.last
	}
	w.ch <- e
	w.last = e.Time
}

// leaveOut adds e to the open gap.
func (w *Watch) leaveOut(e TapEvent) {
	g := w.gap
	g.To = e.Time
	w.dropped.Add(1)
	switch {
	case e.Segment != nil:
		g.Segments++
		w.gapSegment(e.Segment)
	case e.Place != nil:
		g.Places++
	case e.Completion != nil:
		g.Completions++
	}
}

// gapSegment widens the open gap's sequence range of s's direction.
func (w *Watch) gapSegment(s *TapSegment) {
	g := w.gap
	k := [2]netip.AddrPort{s.Src, s.Dst}
	end := s.Seq + uint32(len(s.Payload))
	if s.Flags&(netstack.FlagSYN|netstack.FlagFIN) != 0 {
		end++ // SYN and FIN take a sequence number
	}
	i, ok := w.gapDir[k]
	if !ok {
		if len(g.Dirs) >= MaxGapDirs {
			g.MoreDirs = true
			return
		}
		if w.gapDir == nil {
			w.gapDir = make(map[[2]netip.AddrPort]int)
		}
		w.gapDir[k] = len(g.Dirs)
		g.Dirs = append(g.Dirs, TapGapDir{Src: s.Src, Dst: s.Dst, Seq: s.Seq, End: end, Segments: 1})
		return
	}
	d := &g.Dirs[i]
	d.Segments++
	if int32(s.Seq-d.Seq) < 0 {
		d.Seq = s.Seq
	}
	if int32(end-d.End) > 0 {
		d.End = end
	}
}

// tapSegment is the stack's tap while a Watch is open.
func (d *Device) tapSegment(s *netstack.Segment) {
	d.tap.send(TapEvent{Segment: &TapSegment{
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
	t.send(TapEvent{Completion: &c})
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
	t.send(TapEvent{Place: &p})
}

// Watching returns the number of open Watches.
func (d *Device) Watching() int {
	d.tap.mu.Lock()
	defer d.tap.mu.Unlock()
	return len(d.tap.watches)
}
