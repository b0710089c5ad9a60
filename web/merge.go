package web

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/siwtun/siwtun/ctl"
)

// Merger feeds a Builder the events of several watch streams (the local
// device's, index 0, and the peer's) in the order of their CLOCK_MONOTONIC
// times, the one clock the daemons of a host share. Each stream is in time
// order by itself; an event is passed on once every other stream has
// reached its time (an event or a heartbeat at least as late), so the
// ladder's rows come in time order across the devices however the streams
// interleave on their way here.
//
// Events waiting for a slower stream are bounded (maxWait): past that, Add
// waits, so the faster stream's reader stops reading and its daemon leaves
// out a window, which it reports, rather than an event being passed on out
// of order. A stream whose reader has said nothing for stallAge (its daemon
// wedged) no longer holds the others back; an event it sends later than
// one already passed on is passed on at once.
type Merger struct {
	b        *Builder
	mu       sync.Mutex
	cond     *sync.Cond // signalled when events are passed on, and by Tick
	streams  []mergeStream
	held     int // events queued in all streams
	stallAge time.Duration
}

type mergeStream struct {
	q     []ctl.WatchEvent
	mark  int64 // the time this stream has reached
	ended bool
	// heard is when the stream's reader last brought an event (Unix ns),
	// and adding counts its calls of Add under way: a reader waiting for
	// the lock is not silent.
	heard  atomic.Int64
	adding atomic.Int32
}

// maxWait bounds the events a Merger holds for a slower stream.
const maxWait = 1 << 16

// NewMerger returns a Merger of n streams into b; stream 0 is b's local
// device, the others its peer.
func NewMerger(b *Builder, n int, stallAge time.Duration) *Merger {
	m := &Merger{b: b, streams: make([]mergeStream, n), stallAge: stallAge}
	m.cond = sync.NewCond(&m.mu)
	now := time.Now().UnixNano()
	for i := range m.streams {
		m.streams[i].heard.Store(now)
	}
	return m
}

// Add takes stream i's next event (heartbeats included: they tell the
// Builder, and the other streams' events, how far the stream has got).
func (m *Merger) Add(i int, e ctl.WatchEvent) {
	s := &m.streams[i]
	s.heard.Store(time.Now().UnixNano())
	s.adding.Add(1)
	defer s.adding.Add(-1)
	m.mu.Lock()
	defer m.mu.Unlock()
	// Only a stream ahead of the others (events of its own queued) waits:
	// the one behind must come in.
	for m.held >= maxWait && len(s.q) > 0 && m.waitingFor(i) {
		m.cond.Wait()
	}
	if t := e.MonoTime(); t > s.mark {
		s.mark = t
	}
	s.q = append(s.q, e)
	m.held++
	m.release(false)
}

// waitingFor reports whether a stream other than i holds events back: one
// with nothing queued that has neither ended nor stalled.
func (m *Merger) waitingFor(i int) bool {
	now := time.Now()
	for j := range m.streams {
		if j != i && len(m.streams[j].q) == 0 && !m.streams[j].ended && !m.stalled(j, now) {
			return true
		}
	}
	return false
}

// stalled reports whether stream j's reader has been silent for stallAge.
func (m *Merger) stalled(j int, now time.Time) bool {
	s := &m.streams[j]
	return s.adding.Load() == 0 && now.UnixNano()-s.heard.Load() >= int64(m.stallAge)
}

// End says stream i has ended: it holds nothing back any more.
func (m *Merger) End(i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.streams[i].ended = true
	m.release(false)
}

// Tick passes on what streams that went silent were holding back; call it
// now and then.
func (m *Merger) Tick() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.release(false)
	m.cond.Broadcast()
}

// Flush passes on every event held.
func (m *Merger) Flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.release(true)
}

// release passes on, oldest first, the events no live stream can still
// precede (all of them when all is set).
func (m *Merger) release(all bool) {
	now := time.Now()
	passed := false
	defer func() {
		if passed {
			m.cond.Broadcast()
		}
	}()
	for {
		next := -1
		for i := range m.streams {
			s := &m.streams[i]
			if len(s.q) > 0 && (next < 0 || s.q[0].MonoTime() < m.streams[next].q[0].MonoTime()) {
				next = i
			}
		}
		if next < 0 {
			return
		}
		t := m.streams[next].q[0].MonoTime()
		if !all {
			for i := range m.streams {
				s := &m.streams[i]
				if i == next || s.ended || len(s.q) > 0 || m.stalled(i, now) {
					continue // a stream with events queued has reached their times
				}
				if s.mark < t {
					return // it may still send something older
				}
			}
		}
		s := &m.streams[next]
		e := s.q[0]
		s.q = s.q[1:]
		if len(s.q) == 0 {
			s.q = nil
		}
		m.held--
		passed = true
		m.b.Event(next == 0, e)
	}
}
