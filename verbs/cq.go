package verbs

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// waitSpin is how long Wait polls a CQ reached over the verbs socket before
// it arms the CQ and sleeps.
const waitSpin = 20 * time.Microsecond

// ErrCQOverflow is returned by Poll once the completions that fitted have
// been polled, after the queue overflowed (IBV_EVENT_CQ_ERR): completions
// were lost, and the consumer must treat its QPs as broken.
var ErrCQOverflow = errors.New("verbs: completion queue overflow")

// CQ is a completion queue: a fixed ring of completions that the engine
// fills and the application polls. Over the verbs socket the ring is shared
// memory the daemon writes and Poll reads, without a message.
type CQ struct {
	dev   *Device
	be    cqBackend
	local *localCQ // the in-process ring; nil over the socket
	depth int
	users int // QPs completing into it, guarded by dev.mu
}

// CreateCQ creates a completion queue of depth entries.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	if depth <= 0 || depth > MaxCQE {
		return nil, fmt.Errorf("create CQ: depth %d: want 1..%d", depth, MaxCQE)
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	be, err := d.be.createCQ(depth)
	if err != nil {
		return nil, fmt.Errorf("create CQ: %w", err)
	}
	cq := &CQ{dev: d, be: be, depth: depth}
	cq.local, _ = be.(*localCQ)
	d.mu.Lock()
	d.cqs[cq] = struct{}{}
	d.mu.Unlock()
	return cq, nil
}

// MaxCQE is the deepest completion queue.
const MaxCQE = 1 << 20

// Depth is the number of entries.
func (cq *CQ) Depth() int { return cq.depth }

// Push adds a completion; the in-process engine calls it
// (offload.CompletionQueue). A completion that does not fit is lost and the
// queue is marked overflowed; after Destroy completions are dropped. On a
// CQ reached over the verbs socket it does nothing (the daemon fills the
// shared ring).
func (cq *CQ) Push(wc *WorkCompletion, solicited bool) {
	if cq.local != nil {
		cq.local.Push(wc, solicited)
	}
}

// Poll moves up to len(wcs) completions into wcs, oldest first, and returns
// how many (ibv_poll_cq). It never blocks and never allocates. On a
// destroyed queue it returns ErrDestroyed.
func (cq *CQ) Poll(wcs []WorkCompletion) (int, error) { return cq.be.poll(wcs) }

// ReqNotify arms the queue (ibv_req_notify_cq): the next completion, or with
// solicitedOnly the next solicited receive or error completion, sends one
// notification on Notify.
func (cq *CQ) ReqNotify(solicitedOnly bool) error { return cq.be.reqNotify(solicitedOnly) }

// Notify delivers the notifications requested with ReqNotify (the
// completion channel's ibv_get_cq_event).
func (cq *CQ) Notify() <-chan struct{} { return cq.be.notifyChan() }

// Wait polls into wcs, blocking until at least one completion arrives or
// ctx ends: poll, arm, poll again, wait for the notification.
func (cq *CQ) Wait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	notify := cq.be.notifyChan()
	if cq.local == nil {
		// Over the verbs socket a notification is an eventfd write and a
		// wake-up on each side: poll a little first.
		start := time.Now()
		for i := 0; ; i++ {
			if n, err := cq.be.poll(wcs); n > 0 || err != nil {
				return n, err
			}
			if i%16 == 15 && time.Since(start) > waitSpin {
				break
			}
			runtime.Gosched()
		}
	}
	for {
		if n, err := cq.be.poll(wcs); n > 0 || err != nil {
			return n, err
		}
		if err := cq.be.reqNotify(false); err != nil {
			return 0, err
		}
		if n, err := cq.be.poll(wcs); n > 0 || err != nil {
			return n, err
		}
		select {
		case <-notify:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// errPollDestroyed is Poll's error on a destroyed queue (preallocated: Poll
// never allocates).
var errPollDestroyed = fmt.Errorf("poll CQ: %w", ErrDestroyed)

// Destroy releases the queue: completions pushed afterwards are dropped,
// Poll and ReqNotify fail with ErrDestroyed, and a Wait in progress returns.
// Destroying it again fails with ErrDestroyed.
func (cq *CQ) Destroy() error {
	cq.dev.mu.Lock()
	users := cq.users
	cq.dev.mu.Unlock()
	if users > 0 {
		return fmt.Errorf("destroy CQ: %w (%d QPs use it)", ErrBusy, users)
	}
	if err := cq.be.destroy(); err != nil {
		return err
	}
	cq.dev.mu.Lock()
	delete(cq.dev.cqs, cq)
	cq.dev.mu.Unlock()
	return nil
}

// localCQ is the in-process completion ring.
type localCQ struct {
	mu sync.Mutex
	// ring holds [head, tail) completions.
	ring       []WorkCompletion
	head, tail uint64
	overflow   bool
	armed      bool
	solicited  bool // armed for solicited (and error) completions only
	notify     chan struct{}
	destroyed  bool
}

func newLocalCQ(depth int) *localCQ {
	return &localCQ{ring: make([]WorkCompletion, depth), notify: make(chan struct{}, 1)}
}

// Push implements offload.CompletionQueue.
func (cq *localCQ) Push(wc *WorkCompletion, solicited bool) {
	cq.mu.Lock()
	if cq.destroyed {
		cq.mu.Unlock()
		return
	}
	if cq.tail-cq.head == uint64(len(cq.ring)) {
		cq.overflow = true
		cq.mu.Unlock()
		return
	}
	cq.ring[cq.tail%uint64(len(cq.ring))] = *wc
	cq.tail++
	fire := cq.armed && (!cq.solicited || solicited || wc.Status != WCSuccess)
	if fire {
		cq.armed = false
	}
	cq.mu.Unlock()
	if fire {
		select {
		case cq.notify <- struct{}{}:
		default:
		}
	}
}

func (cq *localCQ) poll(wcs []WorkCompletion) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.destroyed {
		return 0, errPollDestroyed
	}
	n := 0
	for n < len(wcs) && cq.head < cq.tail {
		wcs[n] = cq.ring[cq.head%uint64(len(cq.ring))]
		cq.head++
		n++
	}
	if n == 0 && cq.overflow {
		return 0, ErrCQOverflow
	}
	return n, nil
}

func (cq *localCQ) reqNotify(solicitedOnly bool) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.destroyed {
		return fmt.Errorf("req notify: %w", ErrDestroyed)
	}
	cq.armed = true
	cq.solicited = solicitedOnly
	return nil
}

func (cq *localCQ) notifyChan() <-chan struct{} { return cq.notify }

func (cq *localCQ) destroy() error {
	cq.mu.Lock()
	if cq.destroyed {
		cq.mu.Unlock()
		return fmt.Errorf("destroy CQ: %w", ErrDestroyed)
	}
	cq.destroyed = true
	cq.mu.Unlock()
	// Wake a Wait blocked on the notification: its next Poll fails.
	select {
	case cq.notify <- struct{}{}:
	default:
	}
	return nil
}
