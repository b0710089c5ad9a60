package rnic

import (
	"fmt"
	"sync"

	"github.com/siwtun/siwtun/verbs"
)

// errPollDestroyed is Poll's error on a destroyed queue (preallocated: Poll
// never allocates).
var errPollDestroyed = fmt.Errorf("poll CQ: %w", verbs.ErrDestroyed)

// cqRing is the in-process completion ring.
type cqRing struct {
	mu sync.Mutex
	// ring holds [head, tail) completions.
	ring       []verbs.WorkCompletion
	head, tail uint64
	overflow   bool
	armed      bool
	solicited  bool // armed for solicited (and error) completions only
	notify     chan struct{}
	destroyed  bool
}

func newCQ(depth int) *cqRing {
	return &cqRing{ring: make([]verbs.WorkCompletion, depth), notify: make(chan struct{}, 1)}
}

// Push implements ibv.CompletionQueue.
func (cq *cqRing) Push(wc *verbs.WorkCompletion, solicited bool) {
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
	fire := cq.armed && (!cq.solicited || solicited || wc.Status != verbs.WCSuccess)
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

func (cq *cqRing) Poll(wcs []verbs.WorkCompletion) (int, error) {
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
		return 0, verbs.ErrCQOverflow
	}
	return n, nil
}

func (cq *cqRing) ReqNotify(solicitedOnly bool) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.destroyed {
		return fmt.Errorf("req notify: %w", verbs.ErrDestroyed)
	}
	cq.armed = true
	cq.solicited = solicitedOnly
	return nil
}

func (cq *cqRing) NotifyChan() <-chan struct{} { return cq.notify }

func (cq *cqRing) Destroy() error {
	cq.mu.Lock()
	if cq.destroyed {
		cq.mu.Unlock()
		return fmt.Errorf("destroy CQ: %w", verbs.ErrDestroyed)
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
