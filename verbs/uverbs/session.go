package uverbs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/ibv"
	"github.com/siwtun/siwtun/verbs/internal/uabi"
)

// maxInFlight bounds the requests of one session handled at once; more
// wait for a slot, in their own goroutines, so the session's reader reads
// on (a Cancel, the client's close). maxQueued bounds those handled and
// waiting together: a request past it is refused (StBusy).
const (
	maxInFlight = 32
	maxQueued   = 1024
)

type session struct {
	srv  *Server
	uc   *net.UnixConn
	conn *uabi.Conn
	log  *slog.Logger

	wmu       sync.Mutex // one writer at a time
	enc       uabi.Enc   // guarded by wmu
	stuckOnce sync.Once  // the client stopped reading (send)

	ctx    context.Context
	cancel context.CancelFunc
	sem    chan struct{}
	queued atomic.Int32 // requests handled or waiting for a slot in sem
	wg     sync.WaitGroup

	mu      sync.Mutex
	objs    map[uint32]any
	calls   map[uint32]context.CancelFunc
	closing bool
	used    usage // what objs hold, against the server's Limits

	// The queue pairs' connection events wait in evQueue for the event
	// goroutine (forwardEvents, started with the first), which sends them
	// in order: the engine hands them over without waiting for the
	// client's socket.
	evMu      sync.Mutex
	evQueue   []uabi.Msg // *uabi.QPEvent, *uabi.SRQEvent
	evRunning bool
	evDone    chan struct{} // closed by the event goroutine when it ends
	evDrops   int
}

// maxQueuedEvents bounds a session's waiting events; more are dropped, as
// the engine drops a queue pair's events when nobody reads them.
const maxQueuedEvents = 4096

// queueEvent queues the event e of queue pair h (the engine's qp) for the
// client; EventEstablished carries the RDMAP extensions the connection
// negotiated. The engine never emits it under the QP's lock.
func (ss *session) queueEvent(h uint32, e ibv.Event, qp *offload.QP) {
	ev := &uabi.QPEvent{QP: h, Type: uint32(e.Type), Code: uint16(e.Code), PrivateData: e.PrivateData}
	if e.Type == ibv.EventEstablished {
		ev.Ext = uint8(qp.Info().Params.Ext)
	}
	if e.Err != nil {
		ev.Err = e.Err.Error()
	}
	ss.queueMsg(ev)
}

// queueMsg queues the event body ev (a *uabi.QPEvent or *uabi.SRQEvent)
// for the event goroutine.
func (ss *session) queueMsg(ev uabi.Msg) {
	ss.evMu.Lock()
	defer ss.evMu.Unlock()
	if len(ss.evQueue) >= maxQueuedEvents {
		ss.evDrops++
		return
	}
	ss.evQueue = append(ss.evQueue, ev)
	if !ss.evRunning {
		ss.evRunning = true
		ss.evDone = make(chan struct{})
		go ss.forwardEvents(ss.evDone)
	}
}

// forwardEvents sends the queued events until the queue is empty, then
// ends (queueEvent starts it again).
func (ss *session) forwardEvents(done chan struct{}) {
	defer close(done)
	for {
		ss.evMu.Lock()
		q := ss.evQueue
		ss.evQueue = nil
		if len(q) == 0 {
			ss.evRunning = false
			if ss.evDrops > 0 {
				ss.log.Warn("verbs client too slow: queue pair events dropped", "events", ss.evDrops)
				ss.evDrops = 0
			}
		}
		ss.evMu.Unlock()
		if len(q) == 0 {
			return
		}
		for _, ev := range q {
			switch ev.(type) {
			case *uabi.SRQEvent:
				ss.event(uabi.EvSRQ, ev)
			default:
				ss.event(uabi.EvQP, ev)
			}
		}
	}
}

// flushEvents waits until the events queued so far have been sent.
func (ss *session) flushEvents() {
	ss.evMu.Lock()
	done := ss.evDone
	ss.evMu.Unlock()
	if done != nil {
		<-done
	}
}

func newSession(s *Server, c *net.UnixConn) *session {
	ctx, cancel := context.WithCancel(context.Background())
	ss := &session{srv: s, uc: c, conn: uabi.NewConn(c), ctx: ctx, cancel: cancel,
		sem: make(chan struct{}, maxInFlight), objs: make(map[uint32]any), calls: make(map[uint32]context.CancelFunc)}
	ss.log = s.log
	if cred, err := peerCred(c); err == nil {
		ss.log = s.log.With("pid", cred.Pid, "uid", cred.Uid, "gid", cred.Gid)
	} else {
		ss.log = s.log.With("cred", err)
	}
	return ss
}

// serve reads requests until the client goes, then destroys its objects.
func (ss *session) serve() {
	ss.log.Info("verbs client connected")
	defer ss.teardown()
	for {
		h, body, fds, err := ss.conn.Recv()
		if err != nil && !errors.Is(err, uabi.ErrBadMessage) {
			if !uabi.IsEOF(err) && ss.ctx.Err() == nil {
				ss.log.Debug("verbs client read", "err", err)
			}
			return
		}
		if err != nil {
			uabi.CloseFDs(fds)
			ss.log.Warn("bad verbs message", "err", err)
			ss.reply(h.Seq, h.Op, uabi.Status{Code: uabi.StBadMessage, Msg: err.Error()}, nil)
			continue
		}
		if h.Op == uabi.OpCancel {
			uabi.CloseFDs(fds)
			var m uabi.Cancel
			err := uabi.Decode(body, &m)
			ss.mu.Lock()
			if c := ss.calls[m.Seq]; c != nil && err == nil {
				c()
			}
			ss.mu.Unlock()
			continue
		}
		if _, known := uabi.Lookup(h.Op); !known {
			uabi.CloseFDs(fds)
			ss.reply(h.Seq, h.Op, uabi.Status{Code: uabi.StUnknownOp, Msg: fmt.Sprintf("unknown op %d", h.Op)}, nil)
			continue
		}
		if ss.queued.Add(1) > maxQueued {
			ss.queued.Add(-1)
			uabi.CloseFDs(fds)
			ss.reply(h.Seq, h.Op, uabi.Status{Code: uabi.StBusy,
				Msg: fmt.Sprintf("%s: more than %d requests of this client in flight", uabi.OpName(h.Op), maxQueued)}, nil)
			continue
		}
		body = append([]byte(nil), body...) // the receive buffer is reused
		ctx, cancel := context.WithCancel(ss.ctx)
		ss.mu.Lock()
		ss.calls[h.Seq] = cancel
		ss.mu.Unlock()
		ss.wg.Add(1)
		go func() {
			defer ss.wg.Done()
			defer ss.queued.Add(-1)
			defer func() {
				cancel()
				ss.mu.Lock()
				delete(ss.calls, h.Seq)
				ss.mu.Unlock()
			}()
			select {
			case ss.sem <- struct{}{}:
			case <-ctx.Done():
				// Canceled, or the session ends, before a slot was free.
				uabi.CloseFDs(fds)
				ss.reply(h.Seq, h.Op, uabi.Status{Code: uabi.StCanceled, Msg: uabi.OpName(h.Op) + " canceled"}, nil)
				return
			}
			defer func() { <-ss.sem }()
			ss.handle(ctx, h, body, fds)
		}()
	}
}

// removed tells the client the device is gone and ends the session.
func (ss *session) removed(reason string) {
	ss.event(uabi.EvDeviceRemoved, &uabi.DeviceRemoved{Reason: reason})
	// Stop reading; the session's teardown destroys every object (so the
	// flush completions are in the client's rings) before it closes the
	// socket, which the client sees as the device's removal.
	ss.cancel()
	if err := ss.uc.CloseRead(); err != nil {
		ss.uc.Close()
	}
}

// reply sends the reply to request seq of op: st, and if st is StOK,
// body and fds.
func (ss *session) reply(seq uint32, op uint16, st uabi.Status, body uabi.Msg, fds ...int) {
	ss.wmu.Lock()
	defer ss.wmu.Unlock()
	if err := ss.send(ss.enc.Reply(op, seq, st, body, len(fds)), fds...); err != nil {
		ss.log.Debug("verbs reply", "err", err)
		if len(fds) > 0 && !errors.Is(err, os.ErrDeadlineExceeded) {
			// Never leave the client waiting: reply with the failure.
			st := uabi.Status{Code: uabi.StError, Msg: "sending the reply's descriptors: " + err.Error()}
			ss.send(ss.enc.Reply(op, seq, st, nil, 0))
		}
	}
}

// event sends an event of kind.
func (ss *session) event(kind uint32, body uabi.Msg) {
	ss.wmu.Lock()
	defer ss.wmu.Unlock()
	ss.send(ss.enc.Event(kind, body))
}

// send writes one message (ss.wmu held). A client that leaves its socket
// unread until the message has waited the server's sendTimeout is cut
// off: its session ends and its objects are destroyed. Without that, the
// session's requests, its QPs' events and the server's Close would wait
// for it for ever.
func (ss *session) send(msg []byte, fds ...int) error {
	timeout := time.Duration(ss.srv.sendTimeout.Load())
	ss.uc.SetWriteDeadline(time.Now().Add(timeout))
	err := ss.conn.Send(msg, fds...)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		ss.stuckOnce.Do(func() {
			ss.log.Warn("verbs client does not read its socket; closing the session", "timeout", timeout)
			ss.cancel()
			ss.uc.Close()
		})
	}
	return err
}

// add records a new object under a fresh handle; after teardown began it
// fails (the caller destroys the object).
func (ss *session) add(obj any) (uint32, error) {
	h := ss.srv.handle(ss)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closing {
		ss.srv.release(h)
		return 0, fail(uabi.StRemoved, "session closing")
	}
	ss.objs[h] = obj
	return h, nil
}

// take removes the session's object h of type T and returns it: of two
// requests destroying one object, one gets it and the other an error, so
// an object is never destroyed twice. Its cost goes back to the session.
func take[T any](ss *session, h uint32, what string) (T, error) {
	return takeIf[T](ss, h, what, nil)
}

// takeIf is take, when check (called with ss.mu held) returns nil.
func takeIf[T any](ss *session, h uint32, what string, check func(T) error) (T, error) {
	var zero T
	ss.mu.Lock()
	o, ok := ss.objs[h]
	t, isT := o.(T)
	var err error
	if ok && isT && check != nil {
		err = check(t)
	}
	if ok && isT && err == nil {
		delete(ss.objs, h)
		ss.unchargeLocked(costOf(o))
	}
	ss.mu.Unlock()
	switch {
	case !ok:
		return zero, missing(ss, h, what)
	case !isT:
		return zero, fail(uabi.StBadHandle, "handle %d is not a %s", h, what)
	case err != nil:
		return zero, err
	}
	ss.srv.release(h)
	return t, nil
}

// missing is the error for a handle h the session does not have.
func missing(ss *session, h uint32, what string) error {
	if other := ss.srv.owner(h); other != nil && other != ss {
		return fail(uabi.StForeign, "%s handle %d belongs to another client", what, h)
	}
	return fail(uabi.StBadHandle, "no %s with handle %d", what, h)
}

// get returns the session's object h of type T.
func get[T any](ss *session, h uint32, what string) (T, error) {
	var zero T
	ss.mu.Lock()
	o, ok := ss.objs[h]
	ss.mu.Unlock()
	if !ok {
		return zero, missing(ss, h, what)
	}
	t, ok := o.(T)
	if !ok {
		return zero, fail(uabi.StBadHandle, "handle %d is not a %s", h, what)
	}
	return t, nil
}

// teardown destroys everything the client left: QPs first (their peers see
// the disconnect), then listeners and requests, CQs, regions and PDs.
func (ss *session) teardown() {
	ss.mu.Lock()
	ss.closing = true
	ss.mu.Unlock()
	ss.cancel()
	defer ss.uc.Close()
	ss.wg.Wait()
	ss.mu.Lock()
	objs := ss.objs
	ss.objs = make(map[uint32]any)
	ss.mu.Unlock()
	var nqp, nmr int
	for _, o := range objs {
		switch o := o.(type) {
		case *sQP:
			o.destroy()
			nqp++
		case *sListener:
			o.l.Close()
		case *sPort:
			o.r.Close()
		case *sReq:
			o.r.Reject(nil)
		}
	}
	for _, o := range objs {
		if mw, ok := o.(*sMW); ok {
			mw.dealloc() // before the regions the windows are bound to
		}
	}
	for _, o := range objs {
		switch o := o.(type) {
		case *sSRQ:
			o.close()
		case *sCQ:
			o.close()
		case *sMR:
			o.dereg()
			nmr++
		}
	}
	for _, o := range objs {
		if pd, ok := o.(*sPD); ok {
			pd.unmapZombies()
			pd.pd.Dealloc()
		}
	}
	for h := range objs {
		ss.srv.release(h)
	}
	ss.flushEvents()
	ss.log.Info("verbs client gone", "qps", nqp, "mrs", nmr, "objects", len(objs))
}

// Objects of a session.

type sPD struct {
	pd *verbs.PD
	// users counts the session's regions and QPs in the PD, those being
	// created included (session.hold; guarded by the session's mu): a
	// PD with users cannot be deallocated.
	users   int
	mu      sync.Mutex
	qps     int
	zombies [][]byte // mappings of deregistered regions, unmapped once no QP of the PD runs
}

func (pd *sPD) qpGone() {
	pd.mu.Lock()
	pd.qps--
	var z [][]byte
	if pd.qps == 0 {
		z, pd.zombies = pd.zombies, nil
	}
	pd.mu.Unlock()
	for _, m := range z {
		uabi.Unmap(m)
	}
}

func (pd *sPD) unmapZombies() {
	pd.mu.Lock()
	z := pd.zombies
	pd.zombies = nil
	pd.mu.Unlock()
	for _, m := range z {
		uabi.Unmap(m)
	}
}

type sMR struct {
	pd      *sPD
	regions *offload.Regions
	stag    uint32
	mapping []byte
	length  uint64 // the registered bytes (the mapping is whole pages)
}

// dereg invalidates the STag at once; the memory is unmapped only when no
// QP of the PD can be in the middle of a copy from or to it.
func (mr *sMR) dereg() error {
	err := mr.regions.Deregister(mr.stag)
	mr.release()
	return err
}

// release unmaps the deregistered region's memory, once no QP of the PD
// can be in the middle of a copy from or to it.
func (mr *sMR) release() {
	mr.pd.mu.Lock()
	if mr.pd.qps > 0 {
		mr.pd.zombies = append(mr.pd.zombies, mr.mapping)
		mr.pd.mu.Unlock()
		return
	}
	mr.pd.mu.Unlock()
	uabi.Unmap(mr.mapping)
}

// sMW is a memory window, named by its STag's index.
type sMW struct {
	pd      *sPD
	regions *offload.Regions
	stag    uint32
}

// dealloc invalidates the window and frees its STag.
func (mw *sMW) dealloc() error { return mw.regions.DeallocMW(mw.stag) }

type sListener struct{ l *offload.Listener }

type sReq struct{ r *offload.ConnRequest }
