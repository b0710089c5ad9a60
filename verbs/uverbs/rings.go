package uverbs

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs/ibv"
	"github.com/siwtun/siwtun/verbs/internal/uabi"
)

// sCQ is the daemon side of a completion queue: the engine pushes into it,
// it writes CQEs into the ring shared with the client.
type sCQ struct {
	mu       sync.Mutex
	ring     *uabi.Ring
	mem      []byte
	notifyFD int
	prod     uint32
	users    int // guarded by the session's mu (create/destroy QP)
	dead     bool
}

var _ ibv.CompletionQueue = (*sCQ)(nil)

// Push writes one completion into the shared ring (called by the engine
// under its QP lock: never blocks). A full ring marks the overflow.
func (c *sCQ) Push(wc *ibv.WorkCompletion, solicited bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	fire := false
	arm := c.ring.Notify().Load()
	if !c.ring.Free(c.prod) {
		c.ring.Overflow().Store(1)
		fire = arm != uabi.NotifyNone
	} else {
		uabi.EncodeCQE(c.ring.Entry(c.prod), wc)
		var bits uint32
		if solicited {
			bits = uabi.Solicited
		}
		c.ring.Publish(c.prod, bits)
		c.prod++
		// Reload after publishing: the client arms, then polls again.
		arm = c.ring.Notify().Load()
		fire = arm == uabi.NotifyNext || arm == uabi.NotifySolicited && (solicited || wc.Status != ibv.WCSuccess)
	}
	if fire && c.ring.Notify().CompareAndSwap(arm, uabi.NotifyNone) {
		uabi.Signal(c.notifyFD)
	}
}

func (c *sCQ) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	c.dead = true
	uabi.Close(c.notifyFD)
	uabi.Unmap(c.mem)
}

// sQP is the daemon side of a queue pair: the engine's QP, the SQ and RQ
// rings the client fills, and the goroutine that moves requests from the
// rings to the engine when the doorbell rings.
type sQP struct {
	ss       *session
	h        uint32
	pd       *sPD
	qp       *offload.QP
	scq, rcq *sCQ
	mem      []byte
	sq, rq   *uabi.Ring
	// sqMu serialises draining the SQ ring and rqMu the RQ ring: the
	// ring goroutine and the engine's receive goroutine (SetRecvRefill,
	// SetRxIdle) both do it.
	sqMu sync.Mutex
	rqMu sync.Mutex
	// doorbell is the eventfd the client signals after publishing to a
	// ring whose Notify flag is set. The ring goroutine sleeps on it in
	// poll(2) (uabi.Wait); destroy signals it too, after closing stop.
	doorbell int
	stop     chan struct{}
	done     sync.WaitGroup
	once     sync.Once

	sqCons uint32 // guarded by sqMu, as are sbatch and sbufs
	rqCons uint32 // guarded by rqMu, as are rbatch and rsgl
	// rxSkip and rxMisses pace rxIdle's spinning; only the engine's
	// receive goroutine uses them.
	rxSkip, rxMisses int
	// lastRx is when rxIdle last ran (nanoseconds since epoch); rxRearm
	// is set by the ring goroutine when the doorbell rang soon after it,
	// for a request a watch would have caught: rxIdle then stops backing
	// off.
	epoch   time.Time
	lastRx  atomic.Int64
	rxRearm atomic.Bool

	sbatch [16]ibv.SendWR
	sbufs  [16]uabi.SQEBuf
	rbatch [16]ibv.RecvWR
	rsgl   [16][ibv.MaxSGE]ibv.SGE
}

// spinFor is how long the ring goroutine keeps polling the rings after the
// last request before it sleeps on the doorbell: a client posting at once
// again costs no system call and no wake-up. It is short because spinning
// takes the processor from the other daemon and the applications: on the
// 2-core machine, `siwtun bench --quick --mtu 9000` measured 4-byte RDMA
// WRITE round trips of 119–135 µs with 10 µs, 180–284 µs with 50 µs and
// 1.1 ms with 500 µs, side by side.
const spinFor = 10 * time.Microsecond

func (q *sQP) run() {
	defer q.done.Done()
	backoff := time.Duration(0)
	for {
		select {
		case <-q.stop:
			return
		default:
		}
		progress, blocked := q.drain()
		if blocked {
			// The engine's queue is full: retry as it drains.
			q.ss.srv.ringFull.Add(1)
			backoff = min(max(2*backoff, 20*time.Microsecond), time.Millisecond)
			select {
			case <-q.stop:
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		if progress {
			continue
		}
		if q.spin() {
			continue
		}
		q.sq.Notify().Store(1)
		q.rq.Notify().Store(1)
		if q.pending() {
			q.sq.Notify().Store(0)
			q.rq.Notify().Store(0)
			continue
		}
		err := uabi.Wait(q.doorbell)
		q.sq.Notify().Store(0)
		q.rq.Notify().Store(0)
		if time.Since(q.epoch)-time.Duration(q.lastRx.Load()) < 2*time.Duration(q.ss.srv.rxSpin.Load()) {
			q.rxRearm.Store(true)
		}
		if err != nil {
			return
		}
	}
}

func (q *sQP) pending() bool {
	q.sqMu.Lock()
	_, s := q.sq.Ready(q.sqCons)
	q.sqMu.Unlock()
	q.rqMu.Lock()
	_, r := q.rq.Ready(q.rqCons)
	q.rqMu.Unlock()
	return s || r
}

func (q *sQP) spin() bool {
	start := time.Now()
	for i := 0; ; i++ {
		if q.pending() {
			return true
		}
		if i%16 == 15 && time.Since(start) > spinFor {
			return false
		}
		runtime.Gosched()
	}
}

// rxSpinFor is how long the engine's receive goroutine, having placed
// incoming data, watches the rings of a QP whose ring goroutine sleeps
// (rxIdle). An application answering what arrived (a ping-pong, rping,
// perftest's latency tests) posts within a few microseconds; caught there,
// its request costs no doorbell and no thread wake-up in the daemon.
const rxSpinFor = 20 * time.Microsecond

// rxMaxBackoff bounds rxIdle's backoff: after n fruitless watches in a row
// it skips the next 2^n-1 arrivals, up to 2^rxMaxBackoff-1, so a QP that
// only receives (an RDMA WRITE sink) costs almost nothing. A doorbell soon
// after an arrival (within twice rxSpinFor: an answer a watch would have
// caught) ends the backoff.
const rxMaxBackoff = 10

// rxIdle is the engine's receive-idle hook (offload.QP.SetRxIdle): it runs
// on the QP's receive goroutine after incoming data was handed to the MPA
// receiver, and watches the rings for up to rxSpinFor while the ring
// goroutine sleeps, moving whatever the client posts to the engine itself.
func (q *sQP) rxIdle() {
	q.lastRx.Store(int64(time.Since(q.epoch)))
	if q.rxRearm.Load() && q.rxRearm.Swap(false) {
		q.rxMisses, q.rxSkip = 0, 0
	}
	if q.rxSkip > 0 {
		q.rxSkip--
		return
	}
	if q.sq.Notify().Load() == 0 {
		return // the ring goroutine is awake and takes it
	}
	// Clear the flags so the client does not ring the doorbell for what
	// this watch takes; set them again, then look once more, before
	// leaving (the ring goroutine's own protocol).
	q.sq.Notify().Store(0)
	q.rq.Notify().Store(0)
	srv := q.ss.srv
	srv.rxWatches.Add(1)
	hit := false
	spin := time.Duration(srv.rxSpin.Load())
	start := time.Now()
	for i := 0; ; i++ {
		if q.pending() {
			hit = true
			srv.rxTaken.Add(1)
			break
		}
		if i%16 == 15 && time.Since(start) > spin {
			break
		}
		runtime.Gosched()
	}
	q.sq.Notify().Store(1)
	q.rq.Notify().Store(1)
	if q.pending() {
		if _, blocked := q.drain(); blocked {
			uabi.Signal(q.doorbell) // the ring goroutine retries as the engine drains
		}
	}
	if hit {
		q.rxMisses = 0
		return
	}
	q.rxMisses = min(q.rxMisses+1, rxMaxBackoff)
	q.rxSkip = 1<<q.rxMisses - 1
}

// drain moves what the client published to the engine.
func (q *sQP) drain() (progress, blocked bool) {
	for {
		// Receives first: one posted before a send is in the engine
		// before that send goes out.
		q.rqMu.Lock()
		r, rb := q.drainRQ()
		q.rqMu.Unlock()
		q.sqMu.Lock()
		p, b := q.drainSQ()
		q.sqMu.Unlock()
		progress = progress || p || r
		if b || rb {
			return progress, true
		}
		if !p && !r {
			return progress, false
		}
	}
}

func (q *sQP) drainSQ() (progress, blocked bool) {
	n := 0
	bad := false
	// At most one lap of the ring: past it, the cursor would reach the
	// entries of this batch again (still valid until released), and the
	// engine, full with the real ones, would refuse the copy (a spurious
	// queue-full, and the backoff with the doorbell off).
	for n < min(len(q.sbatch), int(q.sq.Count())) {
		pos := q.sqCons + uint32(n)
		if _, ok := q.sq.Ready(pos); !ok {
			break
		}
		if err := uabi.DecodeSQE(q.sq.Entry(pos), &q.sbatch[n], &q.sbufs[n]); err != nil {
			bad = true
			break
		}
		n++
	}
	posted := 0
	var err error
	if n > 0 {
		posted, err = q.qp.PostSend(q.sbatch[:n])
		for i := 0; i < posted; i++ {
			q.sq.Release(q.sqCons)
			q.sqCons++
		}
	}
	if errors.Is(err, ibv.ErrQueueFull) {
		return posted > 0, true
	}
	if err != nil || (bad && posted == n) {
		// A request the engine refused (or could not decode): complete it
		// with an error, in place of the call error a local post returns.
		wc := ibv.WorkCompletion{Status: ibv.WCLocQPOpErr, Opcode: ibv.WCSend, QPNum: q.qp.Num(), VendorErr: 1}
		if err != nil {
			wc.ID = q.sbatch[posted].ID
			switch q.sbatch[posted].Opcode {
			case ibv.WRWrite:
				wc.Opcode = ibv.WCWrite
			case ibv.WRRead:
				wc.Opcode = ibv.WCRead
			}
		} else {
			var wr ibv.SendWR
			uabi.DecodeSQE(q.sq.Entry(q.sqCons), &wr, &q.sbufs[0]) // the id, if readable
			wc.ID = wr.ID
		}
		q.scq.Push(&wc, false)
		q.sq.Release(q.sqCons)
		q.sqCons++
		return true, false
	}
	return posted > 0, false
}

func (q *sQP) drainRQ() (progress, blocked bool) {
	n := 0
	for n < min(len(q.rbatch), int(q.rq.Count())) { // one lap at most, as drainSQ
		pos := q.rqCons + uint32(n)
		if _, ok := q.rq.Ready(pos); !ok {
			break
		}
		if err := uabi.DecodeRQE(q.rq.Entry(pos), &q.rbatch[n], &q.rsgl[n]); err != nil {
			q.rbatch[n] = ibv.RecvWR{ID: q.rbatch[n].ID}
		}
		n++
	}
	if n == 0 {
		return false, false
	}
	posted, err := q.qp.PostRecv(q.rbatch[:n])
	for i := 0; i < posted; i++ {
		q.rq.Release(q.rqCons)
		q.rqCons++
	}
	if err != nil && !errors.Is(err, ibv.ErrQueueFull) {
		wc := ibv.WorkCompletion{ID: q.rbatch[posted].ID, Status: ibv.WCLocQPOpErr, Opcode: ibv.WCRecv, QPNum: q.qp.Num(), VendorErr: 1}
		q.rcq.Push(&wc, false)
		q.rq.Release(q.rqCons)
		q.rqCons++
		return true, false
	}
	return posted > 0, err != nil
}

// events forwards the engine's connection events to the client.
func (q *sQP) events() {
	defer q.done.Done()
	for {
		select {
		case <-q.stop:
			return
		case e := <-q.qp.Events():
			ev := &uabi.QPEvent{QP: q.h, Type: uint32(e.Type), Code: uint16(e.Code), PrivateData: e.PrivateData}
			if e.Err != nil {
				ev.Err = e.Err.Error()
			}
			q.ss.event(uabi.EvQP, ev)
		}
	}
}

// destroy disconnects the engine's QP, stops the ring goroutine and frees
// the rings.
func (q *sQP) destroy() {
	q.once.Do(func() {
		q.qp.Destroy()
		close(q.stop)
		uabi.Signal(q.doorbell) // wakes the ring goroutine to see stop
		q.done.Wait()
		uabi.Close(q.doorbell)
		uabi.Unmap(q.mem)
		q.ss.mu.Lock()
		q.scq.users--
		q.rcq.users--
		q.ss.mu.Unlock()
		q.pd.qpGone()
	})
}
