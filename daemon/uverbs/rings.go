package uverbs

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// sCQ is the daemon side of a completion queue: the engine pushes into it,
// it writes CQEs into the ring shared with the client.
type sCQ struct {
	mu       sync.Mutex
	ring     *uabi.Ring
	mem      []byte
	notifyFD int
	prod     uint32
	users    int // QPs using it, guarded by the session's mu (session.hold, sQP.destroy)
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
	srq      *sSRQ // nil: the QP's own RQ ring
	mem      []byte
	sq, rq   *uabi.Ring
	// sqMu serialises draining the SQ ring and rqMu the RQ ring: the
	// ring goroutine and the engine's receive goroutine (SetRecvRefill,
	// SetRxIdle) both do it.
	sqMu sync.Mutex
	rqMu sync.Mutex
	// doorbell is the eventfd the client signals after publishing to a
	// ring whose Notify flag is set. The ring goroutine sleeps on it, in
	// poll(2) for up to holdThread, then parked on the server's Sleepers;
	// destroy signals it too, after closing stop.
	doorbell *uabi.Doorbell
	stop     chan struct{}
	done     sync.WaitGroup
	once     sync.Once

	sqCons uint32 // guarded by sqMu
	rqCons uint32 // guarded by rqMu
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
}

// sqBatch is what drainSQ decodes one batch of SQ entries into, rqBatch
// the same for drainRQ (9 KB together, lent by the server's pools).
type sqBatch struct {
	wr  [16]ibv.SendWR
	buf [16]uabi.SQEBuf
}

type rqBatch struct {
	wr  [16]ibv.RecvWR
	sgl [16][ibv.MaxSGE]ibv.SGE
}

// spinFor is how long the ring goroutine keeps polling the rings after the
// last request before it sleeps on the doorbell: a client posting at once
// again costs no system call and no wake-up. It is short because spinning
// takes the processor from the other daemon and the applications: on the
// 2-core machine, `siwtun bench --quick --mtu 9000` measured 4-byte RDMA
// WRITE round trips of 119–135 µs with 10 µs, 180–284 µs with 50 µs and
// 1.1 ms with 500 µs, side by side.
const spinFor = 10 * time.Microsecond

// holdThread is how long after its last request (or the last data that
// arrived, after which an application often answers) the ring goroutine
// sleeps on the doorbell in poll(2), holding its thread, before it parks
// on the server's Sleepers, one epoll instance for all idle QPs
// (uabi.Doorbell.Wait). A client that posts again within it (a
// ping-pong, a bandwidth test's next batch) wakes the thread directly; a
// queue pair that has been idle that long, or never posted, holds no
// thread: with one thread per sleeping QP, 1,000 idle QPs held 1,007
// threads and 67 KiB of memory each in their daemon, Go stops a program
// at 10,000 threads, and new QPs sleeping in poll(2) at once slowed
// connection set-up (a QP created and connected every 1.0-2.2 ms against
// 0.7-0.9 ms parked, side by side).
const holdThread = 5 * time.Millisecond

func (q *sQP) run() {
	defer q.done.Done()
	backoff := time.Duration(0)
	var lastWork time.Time // when a request was last moved to the engine
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
			lastWork = time.Now()
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
		err := q.doorbell.Wait(q.hold(lastWork))
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

// hold is how long the ring goroutine may hold its thread in poll(2):
// until holdThread after the QP's last request, moved by the ring
// goroutine at lastWork or taken by the receive goroutine's watch
// (rxIdle), which runs when data arrives.
func (q *sQP) hold(lastWork time.Time) time.Duration {
	if rx := q.lastRx.Load(); rx != 0 {
		if t := q.epoch.Add(time.Duration(rx)); t.After(lastWork) {
			lastWork = t
		}
	}
	return max(holdThread-time.Since(lastWork), 0)
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
			q.doorbell.Signal() // the ring goroutine retries as the engine drains
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
	if _, ok := q.sq.Ready(q.sqCons); !ok {
		return false, false
	}
	b := q.ss.srv.sqScratch.Get().(*sqBatch)
	defer q.ss.srv.sqScratch.Put(b)
	n := 0
	bad := false
	// At most one lap of the ring: past it, the cursor would reach the
	// entries of this batch again (still valid until released), and the
	// engine, full with the real ones, would refuse the copy (a spurious
	// queue-full, and the backoff with the doorbell off).
	for n < min(len(b.wr), int(q.sq.Count())) {
		pos := q.sqCons + uint32(n)
		if _, ok := q.sq.Ready(pos); !ok {
			break
		}
		if err := uabi.DecodeSQE(q.sq.Entry(pos), &b.wr[n], &b.buf[n]); err != nil {
			bad = true
			break
		}
		n++
	}
	posted := 0
	var err error
	if n > 0 {
		posted, err = q.qp.PostSend(b.wr[:n])
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
			wc.ID = b.wr[posted].ID
			wc.Opcode = b.wr[posted].Opcode.WC()
		} else {
			var wr ibv.SendWR
			uabi.DecodeSQE(q.sq.Entry(q.sqCons), &wr, &b.buf[0]) // the id, if readable
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
	if _, ok := q.rq.Ready(q.rqCons); !ok {
		return false, false
	}
	b := q.ss.srv.rqScratch.Get().(*rqBatch)
	defer q.ss.srv.rqScratch.Put(b)
	n := 0
	for n < min(len(b.wr), int(q.rq.Count())) { // one lap at most, as drainSQ
		pos := q.rqCons + uint32(n)
		if _, ok := q.rq.Ready(pos); !ok {
			break
		}
		if err := uabi.DecodeRQE(q.rq.Entry(pos), &b.wr[n], &b.sgl[n]); err != nil {
			b.wr[n] = ibv.RecvWR{ID: b.wr[n].ID}
		}
		n++
	}
	posted, err := q.qp.PostRecv(b.wr[:n])
	for i := 0; i < posted; i++ {
		q.rq.Release(q.rqCons)
		q.rqCons++
	}
	if err != nil && !errors.Is(err, ibv.ErrQueueFull) {
		wc := ibv.WorkCompletion{ID: b.wr[posted].ID, Status: ibv.WCLocQPOpErr, Opcode: ibv.WCRecv, QPNum: q.qp.Num(), VendorErr: 1}
		q.rcq.Push(&wc, false)
		q.rq.Release(q.rqCons)
		q.rqCons++
		return true, false
	}
	return posted > 0, err != nil
}

// destroy disconnects the engine's QP, stops the ring goroutine and frees
// the rings.
func (q *sQP) destroy() {
	q.once.Do(func() {
		// A QP whose creation failed lacks the parts made after the step
		// that failed (createQP).
		if q.qp != nil {
			q.qp.Destroy()
		}
		close(q.stop)
		if q.doorbell != nil {
			q.doorbell.Signal() // wakes the ring goroutine to see stop
		}
		q.done.Wait()
		if q.doorbell != nil {
			q.doorbell.Close()
		}
		uabi.Unmap(q.mem)
		q.ss.mu.Lock()
		q.scq.users--
		q.rcq.users--
		q.pd.users--
		if q.srq != nil {
			q.srq.users--
		}
		q.ss.mu.Unlock()
		q.pd.qpGone()
		if q.srq != nil && q.srq.pd != q.pd {
			q.srq.pd.qpGone()
		}
	})
}
