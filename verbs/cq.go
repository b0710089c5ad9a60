package verbs

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
	be    ProviderCQ
	push  CompletionQueue // the in-process ring the engine fills; nil over the socket
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
	be, err := d.be.CreateCQ(depth)
	if err != nil {
		return nil, fmt.Errorf("create CQ: %w", err)
	}
	cq := &CQ{dev: d, be: be, depth: depth}
	cq.push, _ = be.(CompletionQueue)
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
// (ibv.CompletionQueue). A completion that does not fit is lost and the
// queue is marked overflowed; after Destroy completions are dropped. On a
// CQ reached over the verbs socket it does nothing (the daemon fills the
// shared ring).
func (cq *CQ) Push(wc *WorkCompletion, solicited bool) {
	if cq.push != nil {
		cq.push.Push(wc, solicited)
	}
}

// Poll moves up to len(wcs) completions into wcs, oldest first, and returns
// how many (ibv_poll_cq). It never blocks and never allocates. On a
// destroyed queue it returns ErrDestroyed.
func (cq *CQ) Poll(wcs []WorkCompletion) (int, error) { return cq.be.Poll(wcs) }

// ReqNotify arms the queue (ibv_req_notify_cq): the next completion, or with
// solicitedOnly the next solicited receive or error completion, sends one
// notification on Notify.
func (cq *CQ) ReqNotify(solicitedOnly bool) error { return cq.be.ReqNotify(solicitedOnly) }

// Notify delivers the notifications requested with ReqNotify (the
// completion channel's ibv_get_cq_event).
func (cq *CQ) Notify() <-chan struct{} { return cq.be.NotifyChan() }

// Wait polls into wcs, blocking until at least one completion arrives or
// ctx ends: poll, arm, poll again, wait for the notification.
func (cq *CQ) Wait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	notify := cq.be.NotifyChan()
	if cq.push == nil {
		// Over the verbs socket a notification is an eventfd write and a
		// wake-up on each side: poll a little first.
		start := time.Now()
		for i := 0; ; i++ {
			if n, err := cq.be.Poll(wcs); n > 0 || err != nil {
				return n, err
			}
			if i%16 == 15 && time.Since(start) > waitSpin {
				break
			}
			runtime.Gosched()
		}
	}
	for {
		if n, err := cq.be.Poll(wcs); n > 0 || err != nil {
			return n, err
		}
		if err := cq.be.ReqNotify(false); err != nil {
			return 0, err
		}
		if n, err := cq.be.Poll(wcs); n > 0 || err != nil {
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
	if err := cq.be.Destroy(); err != nil {
		return err
	}
	cq.dev.mu.Lock()
	delete(cq.dev.cqs, cq)
	cq.dev.mu.Unlock()
	return nil
}
