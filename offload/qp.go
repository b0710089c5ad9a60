package offload

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
)

// Device limits (what QueryDevice reports).
const (
	// MaxSGE is the most scatter/gather elements of a Send, Write or receive.
	MaxSGE = 6
	// MaxSGERead is the most elements of an RDMA Read sink: one, an iWARP
	// limitation (a Read Response targets one STag).
	MaxSGERead = 1
	// MaxInline is the most payload bytes of a request posted with FlagInline.
	MaxInline = 256
	// MaxIRDORD is the most outstanding RDMA Reads per direction of a QP.
	MaxIRDORD = 128
	// MaxQPWR is the largest send or receive queue.
	MaxQPWR = 16384
)

// Errors returned by queue-pair calls (not completions: a failed work
// request is reported as a completion).
var (
	// ErrQPState is returned when the QP's state forbids the call.
	ErrQPState = errors.New("offload: invalid queue pair state")
	// ErrQueueFull is returned when a work queue has no free slot.
	ErrQueueFull = errors.New("offload: work queue full")
	// ErrInvalidWR is returned for a malformed work request.
	ErrInvalidWR = errors.New("offload: invalid work request")
)

// QPAttr sizes a queue pair.
type QPAttr struct {
	// MaxSendWR and MaxRecvWR are the queue depths.
	MaxSendWR, MaxRecvWR int
	// SignalAll completes every send request, signaled or not.
	SignalAll bool
}

// EventType says what happened to a queue pair's connection.
type EventType int

// Connection events.
const (
	// EventEstablished: both directions of the iWARP stream are up.
	EventEstablished EventType = iota + 1
	// EventDisconnected: the stream ended (peer closed, local disconnect).
	EventDisconnected
	// EventTerminateSent: the engine detected an error and sent a Terminate.
	EventTerminateSent
	// EventTerminateReceived: the peer sent a Terminate.
	EventTerminateReceived
)

// String names the event as rdma_cm does where it can.
func (e EventType) String() string {
	switch e {
	case EventEstablished:
		return "ESTABLISHED"
	case EventDisconnected:
		return "DISCONNECTED"
	case EventTerminateSent:
		return "TERMINATE_SENT"
	case EventTerminateReceived:
		return "TERMINATE_RECEIVED"
	}
	return fmt.Sprintf("EVENT(%d)", int(e))
}

// Event is one connection event of a queue pair.
type Event struct {
	Type EventType
	// Code is the Terminate's error (TerminateSent/Received).
	Code rdmap.Code
	// Err explains the event in words (for TerminateSent and Disconnected).
	Err error
}

// String formats the event for logs.
func (e Event) String() string {
	switch e.Type {
	case EventTerminateSent, EventTerminateReceived:
		if e.Err != nil {
			return fmt.Sprintf("%v %v: %v", e.Type, e.Code, e.Err)
		}
		return fmt.Sprintf("%v %v", e.Type, e.Code)
	}
	if e.Err != nil {
		return fmt.Sprintf("%v: %v", e.Type, e.Err)
	}
	return e.Type.String()
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
	op        WROpcode
	flags     SendFlags
	nsge      int
	sgl       [MaxSGE]SGE
	inline    [MaxInline]byte
	inlineLen int
	raddr     uint64
	rkey      uint32
	invRKey   uint32
	state     wqeState
	status    WCStatus
	byteLen   uint32
}

// length is the request's total payload.
func (w *sendWQE) length() uint64 {
	if w.flags&FlagInline != 0 {
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
	sgl  [MaxSGE]SGE
}

// orqEntry is an outstanding outbound RDMA Read (ORQ): its sink and progress.
type orqEntry struct {
	sq       uint64 // SQ position of the Read WR; rtrSlot for the RTR read
	sinkSTag uint32
	sinkTO   uint64
	size     uint32
	dst      []byte
	placed   uint32
}

// rtrSlot marks the ORQ entry of a zero-length RTR Read (no work request).
const rtrSlot = ^uint64(0)

// irqEntry is an inbound RDMA Read to answer (IRQ).
type irqEntry struct {
	sinkSTag uint32
	sinkTO   uint64
	src      []byte
}

// QP is a reliable-connected iWARP queue pair: its work queues, the RDMAP
// stream state of its connection, and the goroutines that move its data.
type QP struct {
	dev    *Device
	num    uint32
	pd     uint32
	sendCQ CompletionQueue
	recvCQ CompletionQueue
	sigAll bool

	mu     sync.Mutex
	txCond *sync.Cond // signalled when the TX goroutine may have work
	state  QPState

	// Send queue: [sqHead, sqTail) are posted; [sqHead, sqNext) transmitted
	// (done or in flight); retired in order from sqHead.
	sq                     []sendWQE
	sqHead, sqNext, sqTail uint64
	// Receive queue: [rqHead, rqTail).
	rq             []recvWQE
	rqHead, rqTail uint64
	// Outstanding outbound Reads, in order; bounded by ord.
	orq []orqEntry
	// Inbound Reads to answer, in order; bounded by ird.
	irq      []irqEntry
	irqBurst int

	ird, ord  int
	p2pRTR    mpa.RTR // RTR still to send (initiator) or to receive (responder)
	term      *rdmap.Terminate
	termSent  bool
	closing   bool
	connected bool
	conn      *netstack.Conn
	params    mpa.Params
	local     netip.AddrPort
	remote    netip.AddrPort
	done      chan struct{} // closed when both goroutines have ended
	running   sync.WaitGroup

	events  chan Event
	evDrops atomic.Uint64
	inErr   atomic.Bool // state == QPErr, readable without mu between FPDUs
	stats   QPStats
	// alignTx and alignRx classify the connection's data segments by FPDU
	// alignment (observeSegment, on the packet path).
	alignTx, alignRx mpa.Aligner
	tx               txState
	rx               rxState
	sendMSN          uint32 // next MSN on QN 0 (TX)
	readMSN          uint32 // next MSN on QN 1 (TX)
	flushErr         WCStatus
	wc               WorkCompletion // scratch for pushing completions, guarded by mu
	// refill, if set, is asked for receives when a Send finds none (the
	// verbs socket's daemon moves them from the client's ring).
	refill func()
	// rxIdle, if set, is called by the receive goroutine after each batch
	// of incoming data (the verbs socket's daemon watches its rings).
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
func (qp *QP) Events() <-chan Event { return qp.events }

// Stats returns the queue pair's counters.
func (qp *QP) Stats() *QPStats { return &qp.stats }

// State returns the current state.
func (qp *QP) State() QPState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.state
}

// Info is a snapshot of a queue pair for the control plane.
type Info struct {
	Num            uint32
	State          QPState
	Local, Remote  netip.AddrPort
	Params         mpa.Params
	IRD, ORD       int
	SQDepth, SQUse int
	RQDepth, RQUse int
	EMSS           int
}

// Info returns a snapshot of the queue pair.
func (qp *QP) Info() Info {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return Info{
		Num: qp.num, State: qp.state, Local: qp.local, Remote: qp.remote,
		Params: qp.params, IRD: qp.ird, ORD: qp.ord,
		SQDepth: len(qp.sq), SQUse: int(qp.sqTail - qp.sqHead),
		RQDepth: len(qp.rq), RQUse: int(qp.rqTail - qp.rqHead),
		EMSS: qp.tx.emss,
	}
}

func (qp *QP) emit(e Event) {
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
func (qp *QP) Modify(s QPState) error {
	qp.mu.Lock()
	cur := qp.state
	switch {
	case s == QPErr:
		qp.mu.Unlock()
		qp.Disconnect()
		return nil
	case s == QPInit && cur == QPReset, s == QPInit && cur == QPInit:
		qp.state = QPInit
	case s == QPReset && (cur == QPErr || cur == QPInit || cur == QPReset):
		if qp.connected {
			qp.mu.Unlock()
			return fmt.Errorf("%w: QP %d still closing its connection", ErrQPState, qp.num)
		}
		qp.state = QPReset
		qp.inErr.Store(false)
		qp.closing, qp.term, qp.termSent, qp.p2pRTR = false, nil, false, 0
		qp.sqHead, qp.sqNext, qp.sqTail = 0, 0, 0
		qp.rqHead, qp.rqTail = 0, 0
		qp.orq, qp.irq = qp.orq[:0], qp.irq[:0]
	default:
		qp.mu.Unlock()
		return fmt.Errorf("%w: QP %d cannot go from %v to %v", ErrQPState, qp.num, cur, s)
	}
	qp.mu.Unlock()
	return nil
}

// PostSend queues send work requests. It returns how many were queued; on a
// malformed request or a full queue it stops there with an error (like
// ibv_post_send's bad_wr). Requests may be posted in RTR (held until the
// stream is up) and RTS; in ERR they complete at once as flushed.
func (qp *QP) PostSend(wrs []SendWR) (int, error) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	// Whatever was queued before a bad request goes out too.
	defer qp.txCond.Signal()
	switch qp.state {
	case QPRTR, QPRTS, QPErr:
	default:
		return 0, fmt.Errorf("%w: post send in %v on QP %d", ErrQPState, qp.state, qp.num)
	}
	for i := range wrs {
		wr := &wrs[i]
		if err := checkSendWR(wr); err != nil {
			return i, fmt.Errorf("QP %d send WR %d (id %d): %w", qp.num, i, wr.ID, err)
		}
		if qp.sqTail-qp.sqHead == uint64(len(qp.sq)) {
			return i, fmt.Errorf("QP %d: %w (%d entries)", qp.num, ErrQueueFull, len(qp.sq))
		}
		w := &qp.sq[qp.sqTail%uint64(len(qp.sq))]
		w.id, w.op, w.flags = wr.ID, wr.Opcode, wr.Flags
		w.raddr, w.rkey, w.invRKey = wr.RemoteAddr, wr.RKey, wr.InvalidateRKey
		w.state, w.status, w.byteLen = wqePending, WCSuccess, 0
		if wr.Flags&FlagInline != 0 {
			w.nsge = 0
			w.inlineLen = copy(w.inline[:], wr.Inline)
		} else {
			w.inlineLen = 0
			w.nsge = copy(w.sgl[:], wr.SGL)
		}
		qp.sqTail++
		qp.stats.SQPosted.Add(1)
		if qp.state == QPErr {
			qp.flushLocked()
		}
	}
	return len(wrs), nil
}

func checkSendWR(wr *SendWR) error {
	switch wr.Opcode {
	case WRSend, WRSendWithInv, WRWrite:
		if wr.Flags&FlagInline != 0 {
			if len(wr.Inline) > MaxInline {
				return fmt.Errorf("%w: %d inline bytes, at most %d", ErrInvalidWR, len(wr.Inline), MaxInline)
			}
			return nil
		}
		if len(wr.SGL) > MaxSGE {
			return fmt.Errorf("%w: %d SGEs, at most %d", ErrInvalidWR, len(wr.SGL), MaxSGE)
		}
	case WRRead:
		if wr.Flags&FlagInline != 0 {
			return fmt.Errorf("%w: RDMA Read cannot be inline", ErrInvalidWR)
		}
		if len(wr.SGL) > MaxSGERead {
			return fmt.Errorf("%w: RDMA Read sink has %d SGEs, iWARP allows %d", ErrInvalidWR, len(wr.SGL), MaxSGERead)
		}
	default:
		return fmt.Errorf("%w: opcode %v not supported", ErrInvalidWR, wr.Opcode)
	}
	return nil
}

// PostRecv queues receive work requests (allowed from INIT on). It returns
// how many were queued, stopping at the first bad one with an error.
func (qp *QP) PostRecv(wrs []RecvWR) (int, error) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.state == QPReset {
		return 0, fmt.Errorf("%w: post receive in RESET on QP %d", ErrQPState, qp.num)
	}
	for i := range wrs {
		wr := &wrs[i]
		if len(wr.SGL) > MaxSGE {
			return i, fmt.Errorf("QP %d recv WR %d (id %d): %w: %d SGEs, at most %d", qp.num, i, wr.ID, ErrInvalidWR, len(wr.SGL), MaxSGE)
		}
		if qp.rqTail-qp.rqHead == uint64(len(qp.rq)) {
			return i, fmt.Errorf("QP %d: %w (%d entries)", qp.num, ErrQueueFull, len(qp.rq))
		}
		r := &qp.rq[qp.rqTail%uint64(len(qp.rq))]
		r.id = wr.ID
		r.nsge = copy(r.sgl[:], wr.SGL)
		qp.rqTail++
		qp.stats.RQPosted.Add(1)
	}
	if qp.state == QPErr {
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
		if w.status != WCSuccess || w.flags&FlagSignaled != 0 || qp.sigAll {
			wc := &qp.wc
			*wc = WorkCompletion{ID: w.id, Status: w.status, QPNum: qp.num, ByteLen: w.byteLen}
			switch w.op {
			case WRWrite:
				wc.Opcode = WCWrite
			case WRRead:
				wc.Opcode = WCRead
			default:
				wc.Opcode = WCSend
			}
			qp.dev.tap.tapCompletion(wc)
			qp.sendCQ.Push(wc, false)
		}
		if w.status == WCSuccess {
			qp.stats.SQCompleted.Add(1)
		} else {
			qp.stats.SQErrors.Add(1)
		}
		qp.sqHead++
	}
}

// completeRecvLocked completes the receive at the head of the RQ with
// status st (and, for a Send with Invalidate, the invalidated STag).
func (qp *QP) completeRecvLocked(st WCStatus, byteLen uint32, inv uint32, solicited bool) {
	wc := &qp.wc
	*wc = WorkCompletion{ID: qp.rq[qp.rqHead%uint64(len(qp.rq))].id, Status: st, Opcode: WCRecv, QPNum: qp.num, ByteLen: byteLen}
	if inv != 0 {
		wc.Flags = WCWithInv
		wc.InvalidatedRKey = inv
	}
	qp.rqHead++
	if st == WCSuccess {
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
			if w.status == WCSuccess {
				w.status = WCFlushErr
			}
			qp.flushErr = WCFlushErr
		}
	}
	qp.flushErr = WCFlushErr
	qp.sqNext = qp.sqTail
	qp.orq = qp.orq[:0]
	qp.retireLocked()
	for qp.rqHead < qp.rqTail {
		qp.completeRecvLocked(WCFlushErr, 0, 0, false)
	}
	qp.irq = qp.irq[:0]
}

// errorLocked moves the QP to ERR and flushes its work. firstStatus, if not
// success, is given to the oldest outstanding send request instead of a
// flush error (the request the error hit).
func (qp *QP) errorLocked(firstStatus WCStatus) {
	if qp.state == QPErr {
		return
	}
	qp.state = QPErr
	qp.inErr.Store(true)
	qp.flushErr = firstStatus
	qp.flushLocked()
	qp.txCond.Broadcast()
}

// Disconnect ends the connection as rdma_disconnect does on iWARP: the QP
// enters ERR, outstanding work is flushed, and the TCP connection is closed
// with a FIN. It returns once the engine's goroutines have stopped.
func (qp *QP) Disconnect() {
	qp.mu.Lock()
	qp.errorLocked(WCSuccess)
	qp.closing = true
	conn := qp.conn
	done := qp.done
	qp.txCond.Broadcast()
	qp.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	if done != nil {
		<-done
	}
}

// Destroy disconnects the queue pair and removes it from its device.
func (qp *QP) Destroy() error {
	qp.Disconnect()
	qp.dev.removeQP(qp)
	return nil
}
