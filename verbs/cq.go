package verbs

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrCQOverflow is returned by Poll once the completions that fitted have
// been polled, after the queue overflowed (IBV_EVENT_CQ_ERR): completions
// were lost, and the consumer must treat its QPs as broken.
var ErrCQOverflow = errors.New("verbs: completion queue overflow")

// CQ is a completion queue: a fixed ring of completions that the engine
// fills and the application polls.
type CQ struct {
	dev *Device
	mu  sync.Mutex
	// ring holds [head, tail) completions.
	ring       []WorkCompletion
	head, tail uint64
	overflow   bool
	armed      bool
	solicited  bool // armed for solicited (and error) completions only
	notify     chan struct{}
	destroyed  bool
	users      int // QPs completing into it, guarded by dev.mu
}

// CreateCQ creates a completion queue of depth entries.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	if depth <= 0 || depth > MaxCQE {
		return nil, fmt.Errorf("create CQ: depth %d: want 1..%d", depth, MaxCQE)
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	cq := &CQ{dev: d, ring: make([]WorkCompletion, depth), notify: make(chan struct{}, 1)}
	d.mu.Lock()
	d.cqs[cq] = struct{}{}
	d.mu.Unlock()
	return cq, nil
}

// MaxCQE is the deepest completion queue.
const MaxCQE = 1 << 20

// Depth is the number of entries.
func (cq *CQ) Depth() int { return len(cq.ring) }

// Push adds a completion; the engine calls it (offload.CompletionQueue).
// A completion that does not fit is lost and the queue is marked
// overflowed; after Destroy completions are dropped.
func (cq *CQ) Push(wc *WorkCompletion, solicited bool) {
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

// Poll moves up to len(wcs) completions into wcs, oldest first, and returns
// how many (ibv_poll_cq). It never blocks and never allocates. On a
// destroyed queue it returns ErrDestroyed.
func (cq *CQ) Poll(wcs []WorkCompletion) (int, error) {
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

// ReqNotify arms the queue (ibv_req_notify_cq): the next completion, or with
// solicitedOnly the next solicited receive or error completion, sends one
// notification on Notify.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.destroyed {
		return fmt.Errorf("req notify: %w", ErrDestroyed)
	}
	cq.armed = true
	cq.solicited = solicitedOnly
	return nil
}

// Notify delivers the notifications requested with ReqNotify (the
// completion channel's ibv_get_cq_event).
func (cq *CQ) Notify() <-chan struct{} { return cq.notify }

// Wait polls into wcs, blocking until at least one completion arrives or
// ctx ends: poll, arm, poll again, wait for the notification.
func (cq *CQ) Wait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	for {
		if n, err := cq.Poll(wcs); n > 0 || err != nil {
			return n, err
		}
		if err := cq.ReqNotify(false); err != nil {
			return 0, err
		}
		if n, err := cq.Poll(wcs); n > 0 || err != nil {
			return n, err
		}
		select {
		case <-cq.notify:
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
	cq.dev.mu.Lock()
	delete(cq.dev.cqs, cq)
	cq.dev.mu.Unlock()
	return nil
}
