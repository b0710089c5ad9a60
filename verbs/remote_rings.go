package verbs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

func codeOf(c uint16) rdmap.Code { return rdmap.Code(c) }

// remoteCQ polls the completion ring the daemon fills.
type remoteCQ struct {
	dev    *remoteDevice
	h      uint32
	mu     sync.Mutex
	ring   *uabi.Ring
	mem    []byte
	cons   uint32
	nfile  *os.File // the notification eventfd
	notify chan struct{}
	qps    map[uint32]*remoteQP // by QP number: whose shadow queues to pop
	dead   error                // set when destroyed or the session ended
}

func (d *remoteDevice) CreateCQ(depth int) (ProviderCQ, error) {
	var rep uabi.CreateCQReply
	r, err := d.call(context.Background(), uabi.OpCreateCQ, &uabi.CreateCQ{Depth: uint32(depth)}, &rep)
	if err != nil {
		return nil, err
	}
	mapping, mem, err := uabi.MapShared(r.fds[0], 0, uint64(rep.Size))
	uabi.Close(r.fds[0])
	var ring *uabi.Ring
	if err == nil {
		ring, err = uabi.OpenRing(mem, rep.Count, uabi.CQESize)
	}
	if err != nil {
		uabi.Unmap(mapping)
		uabi.Close(r.fds[1])
		return nil, err
	}
	cq := &remoteCQ{dev: d, h: rep.Handle, ring: ring, mem: mapping, nfile: os.NewFile(uintptr(r.fds[1]), "siwtun-cq-notify"),
		notify: make(chan struct{}, 1), qps: make(map[uint32]*remoteQP)}
	go cq.notifier()
	d.mu.Lock()
	d.cqs[cq] = struct{}{}
	d.mu.Unlock()
	return cq, nil
}

// notifier turns eventfd notifications into Notify channel sends.
func (cq *remoteCQ) notifier() {
	var b [8]byte
	for {
		if _, err := cq.nfile.Read(b[:]); err != nil {
			return
		}
		cq.wake()
	}
}

func (cq *remoteCQ) wake() {
	select {
	case cq.notify <- struct{}{}:
	default:
	}
}

var errPollRemoved = fmt.Errorf("poll CQ: %w", ErrDeviceRemoved)

func (cq *remoteCQ) Poll(wcs []WorkCompletion) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead != nil {
		return 0, cq.dead
	}
	n := 0
	for n < len(wcs) {
		if _, ok := cq.ring.Ready(cq.cons); !ok {
			break
		}
		wc := &wcs[n]
		uabi.DecodeCQE(cq.ring.Entry(cq.cons), wc)
		cq.ring.Release(cq.cons)
		cq.cons++
		if q := cq.qps[wc.QPNum]; q != nil {
			q.completed(wc)
		}
		n++
	}
	if n > 0 {
		return n, nil
	}
	if cq.ring.Overflow().Load() != 0 {
		return 0, ErrCQOverflow
	}
	select {
	case <-cq.dev.removed:
		// The daemon is gone: what it had not completed is flushed here.
		for _, q := range cq.qps {
			n += q.flush(cq, wcs[n:])
			if n == len(wcs) {
				break
			}
		}
		if n == 0 {
			return 0, errPollRemoved
		}
	default:
	}
	return n, nil
}

func (cq *remoteCQ) ReqNotify(solicitedOnly bool) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead != nil {
		return fmt.Errorf("req notify: %w", cq.dead)
	}
	v := uint32(uabi.NotifyNext)
	if solicitedOnly {
		v = uabi.NotifySolicited
	}
	select {
	case <-cq.dev.removed:
		cq.wake()
		return fmt.Errorf("req notify: %w", cq.dev.goneErr())
	default:
	}
	cq.ring.Notify().Store(v)
	return nil
}

func (cq *remoteCQ) NotifyChan() <-chan struct{} { return cq.notify }

func (cq *remoteCQ) Destroy() error {
	cq.mu.Lock()
	dead := cq.dead
	cq.mu.Unlock()
	if dead != nil {
		return fmt.Errorf("destroy CQ: %w", ErrDestroyed)
	}
	_, err := cq.dev.call(context.Background(), uabi.OpDestroyCQ, &uabi.Ref{Handle: cq.h}, nil)
	if err != nil && !errors.Is(err, ErrDeviceRemoved) {
		return fmt.Errorf("destroy CQ: %w", err)
	}
	cq.release(errPollDestroyed)
	cq.dev.mu.Lock()
	delete(cq.dev.cqs, cq)
	cq.dev.mu.Unlock()
	return nil
}

// release unmaps the ring; later calls fail with err.
func (cq *remoteCQ) release(err error) {
	cq.mu.Lock()
	if cq.dead == nil {
		cq.dead = err
		uabi.Unmap(cq.mem)
		cq.nfile.Close()
	}
	cq.mu.Unlock()
	cq.wake()
}

// remoteQP posts into the SQ and RQ rings the daemon drains.
type remoteQP struct {
	dev      *remoteDevice
	h, num   uint32
	scq, rcq *remoteCQ
	srq      *remoteSRQ // nil: the QP's own RQ ring
	sigAll   bool
	mem      []byte
	doorbell int
	postOK   atomic.Bool   // connected (or in ERR): sends may be posted
	inited   atomic.Bool   // INIT or later: receives may be posted
	ext      atomic.Uint32 // mpa.Ext the connection negotiated (Established)
	events   chan Event

	smu    sync.Mutex
	sq     *uabi.Ring
	sqProd uint32
	// sent holds the posted send requests not known complete, in order: a
	// completion retires its request and every unsignaled one before it.
	sent         []shadowWR
	sHead, sTail uint64
	rmu          sync.Mutex
	rq           *uabi.Ring
	rqProd       uint32
	recvd        []uint64
	rHead, rTail uint64
	dead         bool // guarded by smu and rmu
}

type shadowWR struct {
	id uint64
	op WROpcode
}

func (pd *remotePD) CreateQP(send, recv ProviderCQ, attr QPInitAttr) (ProviderQP, error) {
	scq, ok1 := send.(*remoteCQ)
	rcq, ok2 := recv.(*remoteCQ)
	if !ok1 || !ok2 || scq.dev != pd.dev || rcq.dev != pd.dev {
		return nil, errors.New("create QP: completion queue of another device")
	}
	if attr.MaxSendWR <= 0 || attr.MaxSendWR > MaxQPWR || attr.MaxRecvWR <= 0 || attr.MaxRecvWR > MaxQPWR {
		return nil, fmt.Errorf("create QP: queue depths %d/%d: want 1..%d", attr.MaxSendWR, attr.MaxRecvWR, MaxQPWR)
	}
	d := pd.dev
	var srq *remoteSRQ
	req := &uabi.CreateQP{PD: pd.h, SendCQ: scq.h, RecvCQ: rcq.h,
		MaxSendWR: uint32(attr.MaxSendWR), MaxRecvWR: uint32(attr.MaxRecvWR), SignalAll: attr.SignalAll}
	if attr.SRQ != nil {
		s, ok := attr.SRQ.Provider().(*remoteSRQ)
		if !ok || s.dev != d {
			return nil, errors.New("create QP: SRQ of another device")
		}
		srq, req.SRQ, req.MaxRecvWR, attr.MaxRecvWR = s, s.h, 1, 1
	}
	var rep uabi.CreateQPReply
	r, err := d.call(context.Background(), uabi.OpCreateQP, req, &rep)
	if err != nil {
		return nil, fmt.Errorf("create QP: %w", err)
	}
	h := rep.Handle
	mapping, mem, err := uabi.MapShared(r.fds[0], 0, uint64(rep.Total))
	uabi.Close(r.fds[0])
	var sq, rq *uabi.Ring
	if err == nil && rep.SQBytes > rep.Total {
		err = fmt.Errorf("%w: SQ of %d bytes in %d", uabi.ErrRing, rep.SQBytes, rep.Total)
	}
	if err == nil {
		sq, err = uabi.OpenRing(mem[:rep.SQBytes], rep.SQCount, uabi.SQESize)
	}
	if err == nil {
		rq, err = uabi.OpenRing(mem[rep.SQBytes:], rep.RQCount, uabi.RQESize)
	}
	if err != nil {
		uabi.Unmap(mapping)
		uabi.Close(r.fds[1])
		d.call(context.Background(), uabi.OpDestroyQP, &uabi.Ref{Handle: h}, nil)
		return nil, fmt.Errorf("create QP: %w", err)
	}
	q := &remoteQP{dev: d, h: h, num: rep.Num, scq: scq, rcq: rcq, srq: srq, sigAll: attr.SignalAll, mem: mapping,
		doorbell: r.fds[1], events: make(chan Event, 32), sq: sq, rq: rq,
		sent: make([]shadowWR, attr.MaxSendWR), recvd: make([]uint64, attr.MaxRecvWR)}
	d.mu.Lock()
	d.qps[h] = q
	d.mu.Unlock()
	for _, c := range []*remoteCQ{scq, rcq} {
		c.mu.Lock()
		c.qps[rep.Num] = q
		c.mu.Unlock()
	}
	return q, nil
}

func (q *remoteQP) Num() uint32 { return q.num }

func (q *remoteQP) emit(e Event) {
	select {
	case q.events <- e:
	default:
	}
}

func (q *remoteQP) Events() <-chan Event { return q.events }

func (q *remoteQP) State() QPState {
	in := q.Info()
	return in.State
}

func (q *remoteQP) Info() Info {
	var rep uabi.QueryQPReply
	if _, err := q.dev.call(context.Background(), uabi.OpQueryQP, &uabi.Ref{Handle: q.h}, &rep); err != nil {
		return Info{Num: q.num, State: QPErr}
	}
	return rep.Info(q.num)
}

func (q *remoteQP) Modify(s QPState) error {
	_, err := q.dev.call(context.Background(), uabi.OpModifyQP, &uabi.ModifyQP{Handle: q.h, State: uint32(s)}, nil)
	if err != nil {
		return err
	}
	switch s {
	case QPInit:
		q.inited.Store(true)
	case QPReset:
		q.postOK.Store(false)
		q.inited.Store(false)
		q.smu.Lock()
		q.sHead = q.sTail
		q.smu.Unlock()
		q.rmu.Lock()
		q.rHead = q.rTail
		q.rmu.Unlock()
	case QPErr:
		q.postOK.Store(true)
		q.inited.Store(true)
	}
	return nil
}

func (q *remoteQP) Connect(ctx context.Context, remote netip.AddrPort, p ConnParam) error {
	var est uabi.Established
	_, err := q.dev.call(ctx, uabi.OpConnect, &uabi.Connect{Handle: q.h, Remote: remote, Param: uabi.ConnParamOf(p)}, &est)
	if err != nil {
		var rej *ibv.RejectedError
		if errors.As(err, &rej) {
			return fmt.Errorf("connect to %v: %w", remote, err)
		}
		return err
	}
	q.ext.Store(uint32(est.Ext))
	q.postOK.Store(true)
	q.inited.Store(true)
	return nil
}

func (q *remoteQP) Disconnect() {
	q.dev.call(context.Background(), uabi.OpDisconnect, &uabi.Ref{Handle: q.h}, nil)
}

func (q *remoteQP) Destroy() error {
	_, err := q.dev.call(context.Background(), uabi.OpDestroyQP, &uabi.Ref{Handle: q.h}, nil)
	if errors.Is(err, ErrDeviceRemoved) || errors.Is(err, ErrDestroyed) {
		err = nil
	}
	q.dev.mu.Lock()
	delete(q.dev.qps, q.h)
	q.dev.mu.Unlock()
	for _, c := range []*remoteCQ{q.scq, q.rcq} {
		c.mu.Lock()
		if c.qps[q.num] == q {
			delete(c.qps, q.num)
		}
		c.mu.Unlock()
	}
	q.release()
	return err
}

// release unmaps the rings and closes the doorbell.
func (q *remoteQP) release() {
	q.smu.Lock()
	q.rmu.Lock()
	if !q.dead {
		q.dead = true
		uabi.Unmap(q.mem)
		uabi.Close(q.doorbell)
	}
	q.rmu.Unlock()
	q.smu.Unlock()
}

var (
	errPostDead   = fmt.Errorf("post: %w", ErrDestroyed)
	errPostState  = fmt.Errorf("%w: post send before the QP is connected", ibv.ErrQPState)
	errRecvState  = fmt.Errorf("%w: post receive in RESET", ibv.ErrQPState)
	errQueueFull  = fmt.Errorf("post: %w", ibv.ErrQueueFull)
	errPostRemove = fmt.Errorf("post: %w", ErrDeviceRemoved)
)

func (q *remoteQP) check() error {
	if q.dead {
		return errPostDead
	}
	select {
	case <-q.dev.removed:
		return errPostRemove
	default:
	}
	return nil
}

// ringFreeWait bounds the wait for a ring entry the accounting says is
// free but the daemon has not handed back yet (uabi.Ring.WaitFree).
const ringFreeWait = 100 * time.Millisecond

// PostSend writes the requests into the send ring and rings the doorbell
// if the daemon sleeps. It never allocates.
func (q *remoteQP) PostSend(wrs []SendWR) (int, error) {
	q.smu.Lock()
	defer q.smu.Unlock()
	if err := q.check(); err != nil {
		return 0, err
	}
	if !q.postOK.Load() {
		return 0, errPostState
	}
	n := 0
	var err error
	for i := range wrs {
		wr := &wrs[i]
		if err = ibv.CheckPostSend(q.num, i, wr); err != nil {
			break
		}
		if err = ibv.CheckPostPeer(q.num, i, wr, mpa.Ext(q.ext.Load())); err != nil {
			break
		}
		if q.sTail-q.sHead == uint64(len(q.sent)) || !q.sq.WaitFree(q.sqProd, ringFreeWait) {
			err = errQueueFull
			break
		}
		uabi.EncodeSQE(q.sq.Entry(q.sqProd), wr)
		q.sq.Publish(q.sqProd, 0)
		q.sqProd++
		q.sent[q.sTail%uint64(len(q.sent))] = shadowWR{id: wr.ID, op: wr.Opcode}
		q.sTail++
		n++
	}
	if n > 0 && q.sq.Notify().Load() != 0 {
		uabi.Signal(q.doorbell)
	}
	return n, err
}

// PostRecv writes the requests into the receive ring.
func (q *remoteQP) PostRecv(wrs []RecvWR) (int, error) {
	if q.srq != nil {
		return 0, fmt.Errorf("QP %d: %w: the QP takes its receives from an SRQ (post them there)", q.num, ibv.ErrInvalidWR)
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if err := q.check(); err != nil {
		return 0, err
	}
	if !q.inited.Load() {
		return 0, errRecvState
	}
	n := 0
	var err error
	for i := range wrs {
		wr := &wrs[i]
		if err = ibv.CheckPostRecv(q.num, i, wr); err != nil {
			break
		}
		if q.rTail-q.rHead == uint64(len(q.recvd)) || !q.rq.WaitFree(q.rqProd, ringFreeWait) {
			err = errQueueFull
			break
		}
		uabi.EncodeRQE(q.rq.Entry(q.rqProd), wr)
		q.rq.Publish(q.rqProd, 0)
		q.rqProd++
		q.recvd[q.rTail%uint64(len(q.recvd))] = wr.ID
		q.rTail++
		n++
	}
	if n > 0 {
		if q.rq.Notify().Load() != 0 {
			uabi.Signal(q.doorbell)
		}
	}
	return n, err
}

// completed retires the shadow entries a completion accounts for (called
// by the CQ's poll with its lock held).
func (q *remoteQP) completed(wc *WorkCompletion) {
	if wc.Opcode.Recv() && q.srq != nil {
		q.srq.done.Add(1) // one of the SRQ's receives
		return
	}
	if wc.Opcode.Recv() {
		q.rmu.Lock()
		if q.rHead < q.rTail {
			q.rHead++
		}
		q.rmu.Unlock()
		return
	}
	q.smu.Lock()
	for p := q.sHead; p < q.sTail; p++ {
		if q.sent[p%uint64(len(q.sent))].id == wc.ID {
			q.sHead = p + 1
			break
		}
	}
	q.smu.Unlock()
}

// flush completes, with flush errors, the requests the daemon never
// completed (it is gone), into wcs for cq; it returns how many.
func (q *remoteQP) flush(cq *remoteCQ, wcs []WorkCompletion) int {
	n := 0
	if q.scq == cq {
		q.smu.Lock()
		for n < len(wcs) && q.sHead < q.sTail {
			w := q.sent[q.sHead%uint64(len(q.sent))]
			wcs[n] = WorkCompletion{ID: w.id, Status: WCFlushErr, Opcode: w.op.WC(), QPNum: q.num}
			q.sHead++
			n++
		}
		q.smu.Unlock()
	}
	if q.rcq == cq {
		q.rmu.Lock()
		for n < len(wcs) && q.rHead < q.rTail {
			wcs[n] = WorkCompletion{ID: q.recvd[q.rHead%uint64(len(q.recvd))], Status: WCFlushErr, Opcode: WCRecv, QPNum: q.num}
			q.rHead++
			n++
		}
		q.rmu.Unlock()
	}
	return n
}
