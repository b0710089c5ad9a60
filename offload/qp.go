package offload

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// QPAttr sizes a queue pair.
type QPAttr struct {
	// MaxSendWR and MaxRecvWR are the queue depths.
	MaxSendWR, MaxRecvWR int
	// SignalAll completes every send request, signaled or not.
	SignalAll bool
	// SRQ, if set, is the shared receive queue the QP takes its receives
	// from; MaxRecvWR is then ignored and PostRecv refused.
	SRQ *SRQ
}

type wqeState uint8

const (
	wqePending  wqeState = iota // posted, not yet transmitted
	wqeInFlight                 // RDMA Read Request sent, waiting for the response
	wqeSending                  // being handed to TCP by the TX goroutine, which completes it
	wqeDone                     // finished (status set); completes when it reaches the head
)

// sendWQE is a send work request as the engine holds it: copied at post time
// into a preallocated slot, so posting allocates nothing.
type sendWQE struct {
	id        uint64
	op        ibv.WROpcode
	flags     ibv.SendFlags
	nsge      int
	sgl       [ibv.MaxSGE]ibv.SGE
	inline    [ibv.MaxInline]byte
	inlineLen int
	raddr     uint64
	rkey      uint32
	invRKey   uint32
	imm       uint32
	bind      ibv.MWBind // a WRBindMW's binding
	cmpAdd    uint64     // an atomic's compare_add
	swap      uint64     // an atomic's swap
	reqID     uint32     // an atomic's Request Identifier (set when it enters the ORQ)
	picked    int64      // when it was posted, for the hop stamps (0: not stamped)
	state     wqeState
	status    ibv.WCStatus
	byteLen   uint32
}

// length is the request's total payload.
func (w *sendWQE) length() uint64 {
	if w.flags&ibv.FlagInline != 0 {
		return uint64(w.inlineLen)
	}
	var n uint64
	for _, s := range w.sgl[:w.nsge] {
		n += uint64(s.Length)
	}
	return n
}

// recvWQE is a posted receive.
type recvWQE struct {
	id   uint64
	nsge int
	sgl  [ibv.MaxSGE]ibv.SGE
}

// orqEntry is an outstanding outbound RDMA Read (ORQ): its sink and
// progress; or an atomic (atomic set): its Request Identifier and its
// 8-byte result buffer (dst).
type orqEntry struct {
	atomic   bool
	reqID    uint32
	sq       uint64 // SQ position of the Read WR; rtrSlot for the RTR read
	sinkSTag uint32
	sinkTO   uint64
	size     uint32
	dst      []byte
	placed   uint32
}

// rtrSlot marks the ORQ entry of a zero-length RTR Read (no work request).
const rtrSlot = ^uint64(0)

// irqEntry is an inbound RDMA Read to answer (IRQ), or with atomic the
// response of an inbound atomic.
type irqEntry struct {
	sinkSTag uint32
	sinkTO   uint64
	src      []byte
	// atomic marks the response of an atomic: the request's identifier
	// and the word's original value.
	atomic bool
	reqID  uint32
	value  uint64
}

// responded reports whether the request completes when the peer's response
// arrives (an RDMA Read or an atomic: it takes an ORD slot).
func (w *sendWQE) responded() bool { return w.op == ibv.WRRead || w.op.Atomic() }

// QP is a reliable-connected iWARP queue pair: its work queues, the RDMAP
// stream state of its connection, and the goroutines that move its data.
//
// Once connected, two goroutines run it: the RX goroutine (rxLoop: the
// MPA receiver and rxState inside the TCP Read) and the TX goroutine
// (txLoop: send requests, Read Responses, the RTR and a Terminate into
// FPDUs); the second of them to end runs supervise, which ends the
// connection. Each field says
// who owns it: "mu" (read and written under the QP lock), "TX" or "RX"
// (that goroutine only), "atomic", or "fixed" (set before anyone else can
// see it: at creation, or by start before the goroutines run).
//
// The states (state, under mu), and the flags that say how a QP got into
// ERR and how far its way out has come:
//
//	RESET ──Modify(INIT)──→ INIT ──Modify(RESET)──→ RESET
//	  │                      │
//	  └──────────┬───────────┘
//	             │ Connect, ConnRequest.Accept: claim sets connected, the
//	             │ state is INIT; a failed set-up clears connected (unclaim)
//	             ↓ start (MPA done)
//	            RTR ── a P2P responder, until the peer's RTR arrives
//	             │     (rtrArrived); every other QP goes straight to RTS
//	             ↓
//	            RTS
//	             │ errorLocked, from any state (inErr follows state), when:
//	             │  - RX finds an error (fail): term set; TX sends it,
//	             │    sets termSent, then FIN; RX drains until the peer closes
//	             │  - the peer's Terminate arrives: termSent set (never answered)
//	             │  - Disconnect, Modify(ERR), Destroy: closing set (later
//	             │    errors of the dying stream are not logged); a
//	             │    Terminate already queued goes out first (termDone)
//	             │  - the stream ends: FIN, reset, a failed write
//	             ↓
//	            ERR ── supervise, once RX and TX have ended: the TCP
//	             │     connection closed, connected cleared, done closed
//	             ↓ Modify(RESET), refused while connected: closing, term,
//	           RESET           termSent and p2pRTR cleared, the queues emptied
type QP struct {
	dev    *Device             // fixed
	num    uint32              // fixed
	pd     uint32              // fixed
	sendCQ ibv.CompletionQueue // fixed
	recvCQ ibv.CompletionQueue // fixed
	sigAll bool                // fixed
	srq    *SRQ                // fixed; nil: the QP's own receive queue

	mu     sync.Mutex
	txCond *sync.Cond // on mu; signalled when the TX goroutine may have work
	state  ibv.QPState

	// Send queue (mu): [sqHead, sqTail) are posted; [sqHead, sqNext)
	// transmitted (done or in flight); retired in order from sqHead. A
	// slot in wqeSending belongs to TX until it marks it done.
	sq                     []sendWQE
	sqHead, sqNext, sqTail uint64
	// Receive queue (mu): [rqHead, rqTail).
	rq             []recvWQE
	rqHead, rqTail uint64
	// Outstanding outbound Reads, in order; bounded by ord (mu).
	orq []orqEntry
	// Inbound Reads to answer, in order; bounded by ird (mu).
	irq      []irqEntry
	irqBurst int // mu; TX: Read Responses sent in a row (see irqMaxBurst)

	ird, ord int     // mu; set by start
	p2pRTR   mpa.RTR // mu; RTR still to send (initiator)
	// placer (mu): the out-of-order placer observeLocked made, until
	// start takes it.
	placer *oooPlacer
	// startupHold (mu): a responder's send queue waits for the
	// initiator's first FPDU (see startup.go).
	startupHold bool
	term        *rdmap.Terminate                // mu; the Terminate RX queued for TX to send
	termSent    bool                            // mu; no (further) Terminate goes out
	termDone    chan struct{}                   // mu; closed by TX once term is on the wire (or failed to go)
	closing     bool                            // mu; the local side ends the connection
	connected   bool                            // mu; a connection is set up or runs (claim to supervise)
	conn        *netstack.Conn                  // fixed by start; Close is safe from any goroutine
	params      mpa.Params                      // mu; set by start
	local       netip.AddrPort                  // mu; set by start
	remote      netip.AddrPort                  // mu; set by start
	done        chan struct{}                   // mu; closed by supervise when both goroutines have ended
	live        atomic.Int32                    // atomic; RX and TX goroutines still running
	events      chan ibv.Event                  // any goroutine (emit never blocks); nil with onEvent
	onEvent     atomic.Pointer[func(ibv.Event)] // atomic; replaces events (SetEventHandler)
	evDrops     atomic.Uint64                   // atomic
	inErr       atomic.Bool                     // atomic, written under mu: state == QPErr, read between FPDUs
	stats       QPStats                         // atomic counters
	wc          ibv.WorkCompletion              // mu; scratch for pushing completions
	flushErr    ibv.WCStatus                    // mu

	// hops keys the QP's hop stamps (hops.go); fixed.
	hops qpHops

	// rxAwaiting and rxLast are what the receive goroutine saw after its
	// latest read, for RxProgress: the octets the FPDU being received
	// still lacked (0: between FPDUs), and when (Unix nanoseconds).
	rxAwaiting, rxLast atomic.Int64

	// alignTx and alignRx classify the connection's data segments by FPDU
	// alignment (segmentObserver, on the packet path; each has its own
	// lock).
	alignTx, alignRx mpa.Aligner
	tx               txState // TX
	rx               rxState // RX
	sendMSN          uint32  // TX; next MSN on QN 0
	readMSN          uint32  // TX; next MSN on QN 1 (Read and Atomic Requests)
	atomicRespMSN    uint32  // TX; next MSN on QN 3 (Atomic Responses)
	atomicID         uint32  // mu; the last Atomic Request Identifier
	// refill (mu), if set, is asked for receives when a Send finds none
	// (the verbs socket's daemon moves them from the client's ring).
	refill func()
	// rxIdle (mu; RX reads it once), if set, is called by the receive
	// goroutine after each batch of incoming data (the verbs socket's
	// daemon watches its rings).
	rxIdle func()
}

// SetRecvRefill sets f to be called from the receive path, with no QP lock
// held, when an incoming Send finds the receive queue empty; f may post
// receives (PostRecv), which the Send then takes. It lets receives posted
// into a ring shared with another process be taken when data arrives, as
// an RNIC reads its receive queue, instead of at post time.
func (qp *QP) SetRecvRefill(f func()) {
	qp.mu.Lock()
	qp.refill = f
	qp.mu.Unlock()
}

// SetRxIdle sets f to be called by the QP's receive goroutine, with no lock
// held, each time it has handed the data TCP had ready to the MPA receiver
// and before it waits for more. An application that answers what arrives
// posts its next request about then; the verbs socket's daemon uses f to
// catch that request without a doorbell. f must return soon: the QP
// receives nothing while it runs. Set it before the QP connects.
func (qp *QP) SetRxIdle(f func()) {
	qp.mu.Lock()
	qp.rxIdle = f
	qp.mu.Unlock()
}

// Num is the queue pair number.
func (qp *QP) Num() uint32 { return qp.num }

// PD is the protection domain of the queue pair.
func (qp *QP) PD() uint32 { return qp.pd }

// Events delivers connection events; it is never closed. Events are dropped
// (and counted) when nobody reads them.
func (qp *QP) Events() <-chan ibv.Event { return qp.events }

// Stats returns the queue pair's counters.
func (qp *QP) Stats() *QPStats { return &qp.stats }

// State returns the current state.
func (qp *QP) State() ibv.QPState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.state
}

// Info returns a snapshot of the queue pair.
func (qp *QP) Info() ibv.Info {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return ibv.Info{
		Num: qp.num, State: qp.state, Local: qp.local, Remote: qp.remote,
		Params: qp.params, IRD: qp.ird, ORD: qp.ord,
		SQDepth: len(qp.sq), SQUse: int(qp.sqTail - qp.sqHead),
		RQDepth: len(qp.rq), RQUse: int(qp.rqTail - qp.rqHead),
		EMSS: qp.tx.emss,
	}
}

// RxProgress says where the receive side stands, for diagnosing a
// connection that went quiet: the octets the FPDU being received still
// lacks (0 between FPDUs; see mpa.Receiver.Awaiting) and when octets were
// last read from the connection (zero before the first).
func (qp *QP) RxProgress() (awaiting int, last time.Time) {
	if ns := qp.rxLast.Load(); ns != 0 {
		last = time.Unix(0, ns)
	}
	return int(qp.rxAwaiting.Load()), last
}

// SendState describes the connection's send side (netstack.Conn.SendState)
// for diagnosing a connection that went quiet; empty before it connects.
func (qp *QP) SendState() string {
	qp.mu.Lock()
	c := qp.conn
	qp.mu.Unlock()
	if c == nil {
		return ""
	}
	return c.SendState()
}

// SetEventHandler makes the queue pair hand its connection events to f
// instead of queueing them for Events, whose channel it drops (an idle QP
// then holds no queue). f runs on the engine's goroutines, outside the
// QP's lock; it must not block. Set it before the QP connects.
func (qp *QP) SetEventHandler(f func(ibv.Event)) {
	qp.onEvent.Store(&f)
	qp.mu.Lock()
	qp.events = nil
	qp.mu.Unlock()
}

func (qp *QP) emit(e ibv.Event) {
	if f := qp.onEvent.Load(); f != nil {
		(*f)(e)
		return
	}
	select {
	case qp.events <- e:
	default:
		qp.evDrops.Add(1)
	}
}

// Modify moves the queue pair to state s. Allowed by hand: RESET→INIT,
// any→ERR (flushes outstanding work and closes the connection), ERR→RESET
// (empties the queues for reuse) and INIT→RESET. RTR and RTS are entered by
// connection management only.
func (qp *QP) Modify(s ibv.QPState) error {
	qp.mu.Lock()
	cur := qp.state
	switch {
	case s == ibv.QPErr:
		qp.mu.Unlock()
		qp.Disconnect()
		return nil
	case s == ibv.QPInit && cur == ibv.QPReset, s == ibv.QPInit && cur == ibv.QPInit:
		qp.state = ibv.QPInit
	case s == ibv.QPReset && (cur == ibv.QPErr || cur == ibv.QPInit || cur == ibv.QPReset):
		if qp.connected {
			qp.mu.Unlock()
			return fmt.Errorf("%w: QP %d still closing its connection", ibv.ErrQPState, qp.num)
		}
		qp.state = ibv.QPReset
		qp.inErr.Store(false)
		qp.closing, qp.term, qp.termSent, qp.termDone, qp.p2pRTR = false, nil, false, nil, 0
		qp.startupHold = false
		qp.sqHead, qp.sqNext, qp.sqTail = 0, 0, 0
		qp.rqHead, qp.rqTail = 0, 0
		qp.orq, qp.irq = qp.orq[:0], qp.irq[:0]
	default:
		qp.mu.Unlock()
		return fmt.Errorf("%w: QP %d cannot go from %v to %v", ibv.ErrQPState, qp.num, cur, s)
	}
	qp.mu.Unlock()
	return nil
}

// PostSend queues send work requests. It returns how many were queued; on a
// malformed request or a full queue it stops there with an error (like
// ibv_post_send's bad_wr). Requests may be posted in RTR (held until the
// stream is up) and RTS; in ERR they complete at once as flushed.
func (qp *QP) PostSend(wrs []ibv.SendWR) (int, error) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	// Whatever was queued before a bad request goes out too.
	defer qp.txCond.Signal()
	switch qp.state {
	case ibv.QPRTR, ibv.QPRTS, ibv.QPErr:
	default:
		return 0, fmt.Errorf("%w: post send in %v on QP %d", ibv.ErrQPState, qp.state, qp.num)
	}
	for i := range wrs {
		wr := &wrs[i]
		if err := ibv.CheckPostSend(qp.num, i, wr); err != nil {
			return i, err
		}
		if err := ibv.CheckPostPeer(qp.num, i, wr, qp.params.Ext); err != nil {
			return i, err
		}
		if qp.sqTail-qp.sqHead == uint64(len(qp.sq)) {
			return i, fmt.Errorf("QP %d: %w (%d entries)", qp.num, ibv.ErrQueueFull, len(qp.sq))
		}
		w := &qp.sq[qp.sqTail%uint64(len(qp.sq))]
		w.id, w.op, w.flags = wr.ID, wr.Opcode, wr.Flags
		w.raddr, w.rkey, w.invRKey, w.imm = wr.RemoteAddr, wr.RKey, wr.InvalidateRKey, wr.ImmData
		w.cmpAdd, w.swap, w.bind = wr.CompareAdd, wr.Swap, wr.Bind
		w.state, w.status, w.byteLen = wqePending, ibv.WCSuccess, 0
		w.picked = qp.dev.hopNow()
		if wr.Flags&ibv.FlagInline != 0 {
			w.nsge = 0
			w.inlineLen = copy(w.inline[:], wr.Inline)
		} else {
			w.inlineLen = 0
			w.nsge = copy(w.sgl[:], wr.SGL)
		}
		qp.sqTail++
		qp.stats.SQPosted.Add(1)
		if qp.state == ibv.QPErr {
			qp.flushLocked()
		}
	}
	return len(wrs), nil
}

// PostRecv queues receive work requests (allowed from INIT on). It returns
// how many were queued, stopping at the first bad one with an error.
func (qp *QP) PostRecv(wrs []ibv.RecvWR) (int, error) {
	if qp.srq != nil {
		return 0, fmt.Errorf("QP %d: %w: the QP takes its receives from an SRQ (post them there)", qp.num, ibv.ErrInvalidWR)
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.state == ibv.QPReset {
		return 0, fmt.Errorf("%w: post receive in RESET on QP %d", ibv.ErrQPState, qp.num)
	}
	for i := range wrs {
		wr := &wrs[i]
		if err := ibv.CheckPostRecv(qp.num, i, wr); err != nil {
			return i, err
		}
		if qp.rqTail-qp.rqHead == uint64(len(qp.rq)) {
			return i, fmt.Errorf("QP %d: %w (%d entries)", qp.num, ibv.ErrQueueFull, len(qp.rq))
		}
		r := &qp.rq[qp.rqTail%uint64(len(qp.rq))]
		r.id = wr.ID
		r.nsge = copy(r.sgl[:], wr.SGL)
		qp.rqTail++
		qp.stats.RQPosted.Add(1)
	}
	if qp.state == ibv.QPErr {
		qp.flushLocked()
	}
	return len(wrs), nil
}

// retireLocked completes finished send requests in posting order.
func (qp *QP) retireLocked() {
	for qp.sqHead < qp.sqNext {
		w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
		if w.state != wqeDone {
			return
		}
		// Counted before its completion is pushed: whoever polls the
		// completion finds the request counted.
		if w.status == ibv.WCSuccess {
			qp.stats.SQCompleted.Add(1)
		} else {
			qp.stats.SQErrors.Add(1)
		}
		if w.status != ibv.WCSuccess || w.flags&ibv.FlagSignaled != 0 || qp.sigAll {
			wc := &qp.wc
			*wc = ibv.WorkCompletion{ID: w.id, Status: w.status, Opcode: w.op.WC(), QPNum: qp.num, ByteLen: w.byteLen}
			qp.dev.tap.tapCompletion(wc)
			qp.sendCQ.Push(wc, false)
		}
		qp.sqHead++
	}
}

// completeRecvLocked completes the receive at the head of the RQ with
// status st (and, for a Send with Invalidate, the invalidated STag).
func (qp *QP) completeRecvLocked(st ibv.WCStatus, byteLen uint32, inv uint32, solicited bool) {
	wc := qp.recvWCLocked(st, byteLen)
	if inv != 0 {
		wc.Flags = ibv.WCWithInv
		wc.InvalidatedRKey = inv
	}
	qp.pushRecvLocked(solicited)
}

// recvWCLocked starts the completion of the receive at the head of the RQ
// in qp.wc (a WCRecv of byteLen octets with status st) for the caller to
// finish and pushRecvLocked to deliver.
func (qp *QP) recvWCLocked(st ibv.WCStatus, byteLen uint32) *ibv.WorkCompletion {
	wc := &qp.wc
	*wc = ibv.WorkCompletion{ID: qp.rq[qp.rqHead%uint64(len(qp.rq))].id, Status: st, Opcode: ibv.WCRecv, QPNum: qp.num, ByteLen: byteLen}
	return wc
}

// pushRecvLocked retires the receive at the head of the RQ and delivers
// its completion, qp.wc.
func (qp *QP) pushRecvLocked(solicited bool) {
	wc := &qp.wc
	qp.rqHead++
	if wc.Status == ibv.WCSuccess {
		qp.stats.RQCompleted.Add(1)
	} else {
		qp.stats.RQErrors.Add(1)
	}
	qp.dev.tap.tapCompletion(wc)
	qp.recvCQ.Push(wc, solicited)
}

// flushLocked completes every outstanding request with a flush error (or
// the status already recorded for it) after the QP entered ERR. The request
// the TX goroutine is handing to TCP is left to it: it completes with
// success if all of it reached TCP, else with a flush error, and the
// requests behind it complete after it, in order.
func (qp *QP) flushLocked() {
	for p := qp.sqHead; p < qp.sqTail; p++ {
		w := &qp.sq[p%uint64(len(qp.sq))]
		if w.state != wqeDone && w.state != wqeSending {
			w.state = wqeDone
			w.status = qp.flushErr
			if w.status == ibv.WCSuccess {
				w.status = ibv.WCFlushErr
			}
			qp.flushErr = ibv.WCFlushErr
		}
	}
	qp.flushErr = ibv.WCFlushErr
	qp.sqNext = qp.sqTail
	qp.orq = qp.orq[:0]
	qp.retireLocked()
	for qp.rqHead < qp.rqTail {
		qp.completeRecvLocked(ibv.WCFlushErr, 0, 0, false)
	}
	qp.irq = qp.irq[:0]
}

// errorLocked moves the QP to ERR and flushes its work. firstStatus, if not
// success, is given to the oldest outstanding send request instead of a
// flush error (the request the error hit).
func (qp *QP) errorLocked(firstStatus ibv.WCStatus) {
	if qp.state == ibv.QPErr {
		return
	}
	qp.state = ibv.QPErr
	qp.inErr.Store(true)
	qp.flushErr = firstStatus
	qp.flushLocked()
	qp.txCond.Broadcast()
}
