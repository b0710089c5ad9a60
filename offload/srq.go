package offload

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// SRQAttr sizes and arms a shared receive queue (ibv.SRQAttr).
type SRQAttr = ibv.SRQAttr

// SRQAttrMask says which fields of an SRQAttr Modify changes.
type SRQAttrMask = ibv.SRQAttrMask

// SRQ attribute mask bits.
const (
	SRQMaxWR = ibv.SRQMaxWR
	SRQLimit = ibv.SRQLimit
)

// SRQ is a shared receive queue: receives posted once, taken by whichever
// attached queue pair a Send (or an Immediate Data message) arrives on.
//
// The lkeys of the SRQ's receives belong to the SRQ's protection domain,
// whichever QP takes them (as Linux siw checks them).
//
// A queue pair created with QPAttr.SRQ has no receive queue of its own:
// when an untagged message needs a receive, its receive path moves the
// oldest receive of the SRQ into the QP (takeSRQ), where it completes as
// any receive does, into the QP's receive CQ with the QP's number. An
// empty SRQ fails the message as an empty receive queue does (DDP's
// untagged "no buffer" Terminate). A receive taken by a QP belongs to it:
// if the QP fails before the message completes, it is flushed there, and
// the SRQ's other receives stay for the other QPs.
type SRQ struct {
	dev *Device // fixed
	pd  uint32  // fixed

	mu         sync.Mutex
	q          []recvWQE // [head, tail) posted, in order
	head, tail uint64
	limit      int  // armed when not 0
	users      int  // attached QPs
	destroyed  bool // no more QPs attach
	refill     func()

	events  chan ibv.Event
	onEvent atomic.Pointer[func(ibv.Event)]
	evDrops atomic.Uint64

	posted, taken, limitEvents atomic.Uint64
}

// CreateSRQ creates a shared receive queue in protection domain pd.
func (d *Device) CreateSRQ(pd uint32, attr SRQAttr) (*SRQ, error) {
	if attr.MaxWR <= 0 || attr.MaxWR > ibv.MaxQPWR {
		return nil, fmt.Errorf("create SRQ: depth %d: want 1..%d", attr.MaxWR, ibv.MaxQPWR)
	}
	if attr.Limit < 0 || attr.Limit > attr.MaxWR {
		return nil, fmt.Errorf("create SRQ: limit %d: want 0..%d", attr.Limit, attr.MaxWR)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrDeviceClosed
	}
	if d.srqs >= d.cfg.MaxQP {
		return nil, fmt.Errorf("create SRQ: device %s has its maximum of %d SRQs", d.cfg.Name, d.cfg.MaxQP)
	}
	d.srqs++
	return &SRQ{dev: d, pd: pd, q: make([]recvWQE, attr.MaxWR), limit: attr.Limit, events: make(chan ibv.Event, 8)}, nil
}

// PD is the protection domain of the SRQ.
func (s *SRQ) PD() uint32 { return s.pd }

// PostRecv queues receive work requests. It returns how many were queued,
// stopping at the first bad one, or when the queue is full, with an error
// (ibv_post_srq_recv's bad_wr).
func (s *SRQ) PostRecv(wrs []ibv.RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return 0, fmt.Errorf("post SRQ receive: %w: SRQ destroyed", ibv.ErrQPState)
	}
	for i := range wrs {
		wr := &wrs[i]
		if err := ibv.CheckRecvWR(wr); err != nil {
			return i, fmt.Errorf("SRQ recv WR %d (id %d): %w", i, wr.ID, err)
		}
		if s.tail-s.head == uint64(len(s.q)) {
			return i, fmt.Errorf("SRQ: %w (%d entries)", ibv.ErrQueueFull, len(s.q))
		}
		r := &s.q[s.tail%uint64(len(s.q))]
		r.id = wr.ID
		r.nsge = copy(r.sgl[:], wr.SGL)
		s.tail++
		s.posted.Add(1)
	}
	return len(wrs), nil
}

// Modify changes what mask names (ibv_modify_srq): SRQMaxWR resizes the
// queue (not below the receives it holds), SRQLimit arms the limit event
// (0 disarms). A limit above the queue's depth is refused.
func (s *SRQ) Modify(attr SRQAttr, mask SRQAttrMask) error {
	if mask&^(SRQMaxWR|SRQLimit) != 0 {
		return fmt.Errorf("modify SRQ: %w: mask 0x%x", ibv.ErrInvalidWR, int(mask))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	depth := len(s.q)
	if mask&SRQMaxWR != 0 {
		n := s.tail - s.head
		if attr.MaxWR <= 0 || attr.MaxWR > ibv.MaxQPWR || uint64(attr.MaxWR) < n {
			return fmt.Errorf("modify SRQ: %w: depth %d (it holds %d receives; at most %d)", ibv.ErrInvalidWR, attr.MaxWR, n, ibv.MaxQPWR)
		}
		depth = attr.MaxWR
	}
	if mask&SRQLimit != 0 && (attr.Limit < 0 || attr.Limit > depth) {
		return fmt.Errorf("modify SRQ: %w: limit %d above the depth %d", ibv.ErrInvalidWR, attr.Limit, depth)
	}
	if depth != len(s.q) {
		q := make([]recvWQE, depth)
		for i, p := 0, s.head; p < s.tail; i, p = i+1, p+1 {
			q[i] = s.q[p%uint64(len(s.q))]
		}
		s.q, s.tail, s.head = q, s.tail-s.head, 0
	}
	if mask&SRQLimit != 0 {
		s.limit = attr.Limit
	}
	return nil
}

// Query returns the SRQ's depth and armed limit (0: disarmed).
func (s *SRQ) Query() SRQAttr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SRQAttr{MaxWR: len(s.q), MaxSGE: ibv.MaxSGE, Limit: s.limit}
}

// Count is the number of receives posted and not yet taken.
func (s *SRQ) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.tail - s.head)
}

// SRQStats are an SRQ's counters.
type SRQStats struct {
	// Posted and Taken count receives posted and taken by a QP;
	// LimitEvents the limit events emitted; EventDrops events nobody read.
	Posted, Taken, LimitEvents, EventDrops uint64
}

// Stats returns the SRQ's counters.
func (s *SRQ) Stats() SRQStats {
	return SRQStats{Posted: s.posted.Load(), Taken: s.taken.Load(), LimitEvents: s.limitEvents.Load(), EventDrops: s.evDrops.Load()}
}

// SetRecvRefill sets f to be called, with no lock held, when a QP finds
// the SRQ empty and when the count of receives drops below the armed
// limit: f may post receives (PostRecv), which are counted before the
// limit event fires. The verbs socket's daemon moves the receives its
// client published in the SRQ's ring.
func (s *SRQ) SetRecvRefill(f func()) {
	s.mu.Lock()
	s.refill = f
	s.mu.Unlock()
}

// Events delivers the SRQ's limit events; it is never closed, and events
// are dropped (and counted) when nobody reads them.
func (s *SRQ) Events() <-chan ibv.Event { return s.events }

// SetEventHandler makes the SRQ hand its events to f instead of queueing
// them for Events. f runs on a QP's receive goroutine with no lock held;
// it must not block.
func (s *SRQ) SetEventHandler(f func(ibv.Event)) { s.onEvent.Store(&f) }

func (s *SRQ) emit(e ibv.Event) {
	if f := s.onEvent.Load(); f != nil {
		(*f)(e)
		return
	}
	select {
	case s.events <- e:
	default:
		s.evDrops.Add(1)
	}
}

// Destroy frees the SRQ; it fails, wrapping ibv.ErrBusy, while queue pairs
// are attached. Receives still posted are dropped, as a provider's
// destroy drops them.
func (s *SRQ) Destroy() error {
	s.mu.Lock()
	if s.users > 0 {
		s.mu.Unlock()
		return fmt.Errorf("destroy SRQ: %w: %d QPs are attached", ibv.ErrBusy, s.users)
	}
	first := !s.destroyed
	s.destroyed = true
	s.head = s.tail
	s.mu.Unlock()
	if first {
		s.dev.mu.Lock()
		s.dev.srqs--
		s.dev.mu.Unlock()
	}
	return nil
}

// MaxSRQ is the most SRQs the device holds at once (Config.MaxQP).
func (d *Device) MaxSRQ() int { return d.cfg.MaxQP }

// attach counts a QP created on the SRQ.
func (s *SRQ) attach() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("create QP: %w: SRQ destroyed", ibv.ErrQPState)
	}
	s.users++
	return nil
}

func (s *SRQ) detach() {
	s.mu.Lock()
	s.users--
	s.mu.Unlock()
}

// pop takes the oldest receive into w. It reports whether there was one,
// and whether the count then dropped below the armed limit (then the
// limit is disarmed, and the caller emits the event). refilled says the
// caller already refilled: a count below the limit is final.
func (s *SRQ) pop(w *recvWQE, refilled bool) (ok, fire, refill bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head == s.tail {
		return false, false, !refilled && s.refill != nil
	}
	*w = s.q[s.head%uint64(len(s.q))]
	s.head++
	s.taken.Add(1)
	if s.limit != 0 && s.tail-s.head < uint64(s.limit) {
		if !refilled && s.refill != nil {
			return true, false, true // count what the refill brings first
		}
		s.limit = 0
		return true, true, false
	}
	return true, false, false
}

// checkLimit fires the limit event if the count is below the armed limit
// (after a refill).
func (s *SRQ) checkLimit() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit != 0 && s.tail-s.head < uint64(s.limit) {
		s.limit = 0
		return true
	}
	return false
}

func (s *SRQ) callRefill() {
	s.mu.Lock()
	f := s.refill
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

// takeSRQ moves the oldest receive of the QP's SRQ into the QP's own
// receive queue (called by the receive path with no lock held, when that
// queue is empty), refilling the SRQ first if it is empty, and emits the
// limit event when the take brought the count below the armed limit.
func (qp *QP) takeSRQ() {
	s := qp.srq
	var w recvWQE
	ok, fire, refill := s.pop(&w, false)
	if refill {
		s.callRefill()
		if !ok {
			ok, fire, _ = s.pop(&w, true)
		} else {
			fire = s.checkLimit()
		}
	}
	if ok {
		qp.mu.Lock()
		if qp.rqTail-qp.rqHead < uint64(len(qp.rq)) {
			qp.rq[qp.rqTail%uint64(len(qp.rq))] = w
			qp.rqTail++
			qp.stats.RQPosted.Add(1)
			if qp.state == ibv.QPErr {
				qp.flushLocked() // the QP failed meanwhile: the receive completes there, flushed
			}
		}
		qp.mu.Unlock()
	}
	if fire {
		s.limitEvents.Add(1)
		qp.dev.logf("SRQ of QP %d: limit reached", qp.num)
		s.emit(ibv.Event{Type: ibv.EventSRQLimitReached})
	}
}

// SRQ is the shared receive queue the QP takes its receives from, or nil.
func (qp *QP) SRQ() *SRQ { return qp.srq }

// recvPD is the protection domain a receive's lkeys must belong to: the
// SRQ's, for a QP on an SRQ (the receive was posted there), else the QP's.
func (qp *QP) recvPD() uint32 {
	if qp.srq != nil {
		return qp.srq.pd
	}
	return qp.pd
}
