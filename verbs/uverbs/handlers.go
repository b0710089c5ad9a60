package uverbs

import (
	"context"
	"fmt"
	"time"

	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/ibv"
	"github.com/siwtun/siwtun/verbs/internal/uabi"
)

// wantFDs are the descriptors each op carries.
var wantFDs = map[uint16]int{uabi.OpRegMR: 1}

// handle serves one request and replies.
func (ss *session) handle(ctx context.Context, h uabi.Header, body []byte, fds []int) {
	if want := wantFDs[h.Op]; len(fds) != want {
		uabi.CloseFDs(fds)
		ss.reply(h.Seq, h.Op, uabi.StBadMessage, fmt.Sprintf("op %d carries %d descriptors, want %d", h.Op, len(fds), want), nil)
		return
	}
	d := &uabi.Dec{B: body}
	var out func(*uabi.Enc)
	var outFDs []int
	var err error
	switch h.Op {
	case uabi.OpHello:
		out, err = ss.hello(d)
	case uabi.OpAllocPD:
		out, err = ss.allocPD(d)
	case uabi.OpDeallocPD:
		err = ss.deallocPD(d)
	case uabi.OpRegMR:
		out, err = ss.regMR(d, fds[0])
	case uabi.OpDeregMR:
		err = ss.deregMR(d)
	case uabi.OpCreateCQ:
		out, outFDs, err = ss.createCQ(d)
	case uabi.OpDestroyCQ:
		err = ss.destroyCQ(d)
	case uabi.OpCreateQP:
		out, outFDs, err = ss.createQP(d)
	case uabi.OpDestroyQP:
		err = ss.destroyQP(d)
	case uabi.OpModifyQP:
		err = ss.modifyQP(d)
	case uabi.OpQueryQP:
		out, err = ss.queryQP(d)
	case uabi.OpConnect:
		err = ss.connect(ctx, d)
	case uabi.OpDisconnect:
		err = ss.disconnect(d)
	case uabi.OpListen:
		out, err = ss.listen(d)
	case uabi.OpCloseListener:
		err = ss.closeListener(d)
	case uabi.OpGetRequest:
		out, err = ss.getRequest(ctx, d)
	case uabi.OpAccept:
		err = ss.accept(d)
	case uabi.OpReject:
		err = ss.reject(d)
	}
	if err != nil {
		st, msg, extra := statusOf(err)
		var eb func(*uabi.Enc)
		if extra != nil {
			eb = func(e *uabi.Enc) { e.Bytes(extra) }
		}
		ss.reply(h.Seq, h.Op, st, fmt.Sprintf("%s", msg), eb)
		return
	}
	ss.reply(h.Seq, h.Op, uabi.StOK, "", out, outFDs...)
	uabi.CloseFDs(outFDs) // the client has its copies
}

// end checks that the request was read whole.
func end(d *uabi.Dec) error {
	if err := d.End(); err != nil {
		return fail(uabi.StBadMessage, "%v", err)
	}
	return nil
}

func (ss *session) hello(d *uabi.Dec) (func(*uabi.Enc), error) {
	v := d.U32()
	if err := end(d); err != nil {
		return nil, err
	}
	if v != uabi.Version {
		return nil, fail(uabi.StNotSupported, "protocol version %d, daemon speaks %d", v, uabi.Version)
	}
	a := ss.srv.dev.Query()
	return func(e *uabi.Enc) {
		e.U32(uabi.Version)
		e.String(ss.srv.dev.Name())
		e.String(a.FWVersion)
		e.U64(a.NodeGUID)
		for _, v := range []int{int(a.VendorID), int(a.VendorPartID), a.MaxQP, a.MaxQPWR, a.MaxSGE, a.MaxSGERead,
			a.MaxCQ, a.MaxCQE, a.MaxMR, a.MaxPD, a.MaxQPRdAtom, a.MaxQPInitRdAtom, a.MaxInline, a.MTU} {
			e.U32(uint32(v))
		}
	}, nil
}

func (ss *session) allocPD(d *uabi.Dec) (func(*uabi.Enc), error) {
	if err := end(d); err != nil {
		return nil, err
	}
	pd, err := ss.srv.dev.AllocPD()
	if err != nil {
		return nil, err
	}
	h, err := ss.add(&sPD{pd: pd})
	if err != nil {
		pd.Dealloc()
		return nil, err
	}
	return func(e *uabi.Enc) { e.U32(h); e.U32(pd.Handle()) }, nil
}

func (ss *session) deallocPD(d *uabi.Dec) error {
	h := d.U32()
	if err := end(d); err != nil {
		return err
	}
	pd, err := get[*sPD](ss, h, "PD")
	if err != nil {
		return err
	}
	ss.mu.Lock()
	for _, o := range ss.objs {
		switch o := o.(type) {
		case *sMR:
			if o.pd == pd {
				ss.mu.Unlock()
				return fail(uabi.StBusy, "PD %d still has regions", pd.pd.Handle())
			}
		case *sQP:
			if o.pd == pd {
				ss.mu.Unlock()
				return fail(uabi.StBusy, "PD %d still has QPs", pd.pd.Handle())
			}
		}
	}
	delete(ss.objs, h)
	ss.mu.Unlock()
	ss.srv.release(h)
	pd.unmapZombies()
	return pd.pd.Dealloc()
}

func (ss *session) regMR(d *uabi.Dec, fd int) (func(*uabi.Enc), error) {
	defer uabi.Close(fd) // the mapping keeps the memory
	pdh, off, n, iova, access := d.U32(), d.U64(), d.U64(), d.U64(), ibv.Access(d.U32())
	if err := end(d); err != nil {
		return nil, err
	}
	pd, err := get[*sPD](ss, pdh, "PD")
	if err != nil {
		return nil, err
	}
	mapping, buf, err := uabi.MapShared(fd, off, n)
	if err != nil {
		return nil, fail(uabi.StError, "map region memory: %v", err)
	}
	reg, err := ss.srv.eng.Regions().Register(pd.pd.Handle(), buf, iova, access)
	if err != nil {
		uabi.Unmap(mapping)
		return nil, err
	}
	mr := &sMR{pd: pd, regions: ss.srv.eng.Regions(), stag: reg.STag(), mapping: mapping}
	h, err := ss.add(mr)
	if err != nil {
		mr.dereg()
		return nil, err
	}
	return func(e *uabi.Enc) { e.U32(h); e.U32(reg.STag()) }, nil
}

func (ss *session) deregMR(d *uabi.Dec) error {
	h := d.U32()
	if err := end(d); err != nil {
		return err
	}
	mr, err := get[*sMR](ss, h, "MR")
	if err != nil {
		return err
	}
	ss.remove(h)
	return mr.dereg()
}

func (ss *session) createCQ(d *uabi.Dec) (func(*uabi.Enc), []int, error) {
	depth := int(d.U32())
	if err := end(d); err != nil {
		return nil, nil, err
	}
	if depth <= 0 || depth > verbs.MaxCQE {
		return nil, nil, fail(uabi.StError, "CQ depth %d: want 1..%d", depth, verbs.MaxCQE)
	}
	count := uabi.RingCount(depth)
	size := uabi.RingBytes(count, uabi.CQESize)
	memfd, mem, err := uabi.NewShared("siwtun-cq", size, true)
	if err != nil {
		return nil, nil, err
	}
	ring, err := uabi.InitRing(mem, count, uabi.CQESize)
	nfd := -1
	if err == nil {
		nfd, err = uabi.NewEventfd()
	}
	if err != nil {
		uabi.Unmap(mem)
		uabi.Close(memfd)
		return nil, nil, err
	}
	cq := &sCQ{ring: ring, mem: mem, notifyFD: nfd}
	h, err := ss.add(cq)
	if err != nil {
		cq.close()
		uabi.Close(memfd)
		return nil, nil, err
	}
	// The client gets a copy of the notification eventfd; the daemon keeps
	// its own to write.
	cfd, err := dupFD(nfd)
	if err != nil {
		ss.remove(h)
		cq.close()
		uabi.Close(memfd)
		return nil, nil, err
	}
	return func(e *uabi.Enc) { e.U32(h); e.U32(count); e.U32(uint32(size)) }, []int{memfd, cfd}, nil
}

func (ss *session) destroyCQ(d *uabi.Dec) error {
	h := d.U32()
	if err := end(d); err != nil {
		return err
	}
	cq, err := get[*sCQ](ss, h, "CQ")
	if err != nil {
		return err
	}
	ss.mu.Lock()
	if cq.users > 0 {
		ss.mu.Unlock()
		return fail(uabi.StBusy, "CQ %d: %d QPs use it", h, cq.users)
	}
	delete(ss.objs, h)
	ss.mu.Unlock()
	ss.srv.release(h)
	cq.close()
	return nil
}

func (ss *session) createQP(d *uabi.Dec) (func(*uabi.Enc), []int, error) {
	pdh, scqh, rcqh := d.U32(), d.U32(), d.U32()
	maxSend, maxRecv, sigAll := int(d.U32()), int(d.U32()), d.U8() != 0
	if err := end(d); err != nil {
		return nil, nil, err
	}
	pd, err := get[*sPD](ss, pdh, "PD")
	if err != nil {
		return nil, nil, err
	}
	scq, err := get[*sCQ](ss, scqh, "CQ")
	if err != nil {
		return nil, nil, err
	}
	rcq, err := get[*sCQ](ss, rcqh, "CQ")
	if err != nil {
		return nil, nil, err
	}
	if maxSend <= 0 || maxSend > ibv.MaxQPWR || maxRecv <= 0 || maxRecv > ibv.MaxQPWR {
		return nil, nil, fail(uabi.StError, "queue depths %d/%d: want 1..%d", maxSend, maxRecv, ibv.MaxQPWR)
	}
	sqCount, rqCount := uabi.RingCount(maxSend), uabi.RingCount(maxRecv)
	sqBytes := uabi.RingBytes(sqCount, uabi.SQESize)
	total := sqBytes + uabi.RingBytes(rqCount, uabi.RQESize)
	memfd, mem, err := uabi.NewShared("siwtun-qp", total, true)
	if err != nil {
		return nil, nil, err
	}
	sq, err1 := uabi.InitRing(mem[:sqBytes], sqCount, uabi.SQESize)
	rq, err2 := uabi.InitRing(mem[sqBytes:], rqCount, uabi.RQESize)
	dbfd, err3 := uabi.NewEventfd()
	if err := firstErr(err1, err2, err3); err != nil {
		uabi.Close(dbfd)
		uabi.Close(memfd)
		uabi.Unmap(mem)
		return nil, nil, err
	}
	cfd, err := dupFD(dbfd)
	if err != nil {
		uabi.Close(dbfd)
		uabi.Close(memfd)
		uabi.Unmap(mem)
		return nil, nil, err
	}
	eqp, err := ss.srv.eng.CreateQP(pd.pd.Handle(), scq, rcq, offload.QPAttr{MaxSendWR: maxSend, MaxRecvWR: maxRecv, SignalAll: sigAll})
	if err != nil {
		uabi.Close(dbfd)
		uabi.Close(cfd)
		uabi.Close(memfd)
		uabi.Unmap(mem)
		return nil, nil, err
	}
	q := &sQP{ss: ss, pd: pd, qp: eqp, scq: scq, rcq: rcq, mem: mem, sq: sq, rq: rq,
		doorbell: dbfd, stop: make(chan struct{}), epoch: time.Now()}
	// A Send that finds no receive takes what the client has published in
	// the RQ ring: receives are taken when data arrives, so the client's
	// PostRecv never waits for the daemon.
	eqp.SetRecvRefill(func() {
		q.rqMu.Lock()
		q.drainRQ()
		q.rqMu.Unlock()
	})
	eqp.SetRxIdle(q.rxIdle)
	pd.mu.Lock()
	pd.qps++
	pd.mu.Unlock()
	ss.mu.Lock()
	scq.users++
	rcq.users++
	ss.mu.Unlock()
	q.done.Add(2)
	go q.run()
	h, err := ss.add(q)
	q.h = h
	go q.events()
	if err != nil {
		q.destroy()
		uabi.Close(cfd)
		uabi.Close(memfd)
		return nil, nil, err
	}
	return func(e *uabi.Enc) {
		e.U32(h)
		e.U32(eqp.Num())
		e.U32(sqCount)
		e.U32(rqCount)
		e.U32(uint32(sqBytes))
		e.U32(uint32(total))
	}, []int{memfd, cfd}, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func (ss *session) destroyQP(d *uabi.Dec) error {
	h := d.U32()
	if err := end(d); err != nil {
		return err
	}
	q, err := get[*sQP](ss, h, "QP")
	if err != nil {
		return err
	}
	ss.remove(h)
	q.destroy()
	return nil
}

func (ss *session) modifyQP(d *uabi.Dec) error {
	h, st := d.U32(), ibv.QPState(d.U32())
	if err := end(d); err != nil {
		return err
	}
	q, err := get[*sQP](ss, h, "QP")
	if err != nil {
		return err
	}
	return q.qp.Modify(st)
}

func (ss *session) queryQP(d *uabi.Dec) (func(*uabi.Enc), error) {
	h := d.U32()
	if err := end(d); err != nil {
		return nil, err
	}
	q, err := get[*sQP](ss, h, "QP")
	if err != nil {
		return nil, err
	}
	in := q.qp.Info()
	return func(e *uabi.Enc) {
		e.U32(uint32(in.State))
		e.AddrPort(in.Local)
		e.AddrPort(in.Remote)
		e.U8(in.Params.Rev)
		e.U8(b2u(in.Params.CRC))
		e.U8(b2u(in.Params.MarkersTx))
		e.U8(b2u(in.Params.MarkersRx))
		for _, v := range []int{in.IRD, in.ORD, in.SQDepth, in.SQUse, in.RQDepth, in.RQUse, in.EMSS} {
			e.U32(uint32(v))
		}
	}, nil
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func decParam(d *uabi.Dec) ibv.ConnParam {
	p := ibv.ConnParam{PrivateData: d.Bytes(), ResponderResources: d.U16(), InitiatorDepth: d.U16()}
	if len(p.PrivateData) == 0 {
		p.PrivateData = nil
	}
	return p
}

func (ss *session) connect(ctx context.Context, d *uabi.Dec) error {
	h, addr := d.U32(), d.AddrPort()
	p := decParam(d)
	if err := end(d); err != nil {
		return err
	}
	q, err := get[*sQP](ss, h, "QP")
	if err != nil {
		return err
	}
	if !addr.IsValid() {
		return fail(uabi.StError, "connect: invalid address")
	}
	return q.qp.Connect(ctx, addr, p)
}

func (ss *session) disconnect(d *uabi.Dec) error {
	h := d.U32()
	if err := end(d); err != nil {
		return err
	}
	q, err := get[*sQP](ss, h, "QP")
	if err != nil {
		return err
	}
	q.qp.Disconnect()
	return nil
}

func (ss *session) listen(d *uabi.Dec) (func(*uabi.Enc), error) {
	addr, backlog := d.AddrPort(), int(d.U32())
	if err := end(d); err != nil {
		return nil, err
	}
	if backlog > 1024 {
		backlog = 1024
	}
	l, err := ss.srv.eng.Listen(addr, backlog)
	if err != nil {
		return nil, err
	}
	h, err := ss.add(&sListener{l: l})
	if err != nil {
		l.Close()
		return nil, err
	}
	return func(e *uabi.Enc) { e.U32(h); e.AddrPort(l.Addr()) }, nil
}

func (ss *session) closeListener(d *uabi.Dec) error {
	h := d.U32()
	if err := end(d); err != nil {
		return err
	}
	l, err := get[*sListener](ss, h, "listener")
	if err != nil {
		return err
	}
	ss.remove(h)
	return l.l.Close()
}

func (ss *session) getRequest(ctx context.Context, d *uabi.Dec) (func(*uabi.Enc), error) {
	h := d.U32()
	if err := end(d); err != nil {
		return nil, err
	}
	l, err := get[*sListener](ss, h, "listener")
	if err != nil {
		return nil, err
	}
	r, err := l.l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	rh, err := ss.add(&sReq{r: r})
	if err != nil {
		r.Reject(nil)
		return nil, err
	}
	return func(e *uabi.Enc) {
		e.U32(rh)
		e.AddrPort(r.Remote)
		e.Bytes(r.PrivateData)
		e.U16(r.IRD)
		e.U16(r.ORD)
	}, nil
}

func (ss *session) accept(d *uabi.Dec) error {
	rh, qh := d.U32(), d.U32()
	p := decParam(d)
	if err := end(d); err != nil {
		return err
	}
	r, err := get[*sReq](ss, rh, "connection request")
	if err != nil {
		return err
	}
	q, err := get[*sQP](ss, qh, "QP")
	if err != nil {
		return err
	}
	ss.remove(rh)
	return r.r.Accept(q.qp, p)
}

func (ss *session) reject(d *uabi.Dec) error {
	rh := d.U32()
	pdata := d.Bytes()
	if err := end(d); err != nil {
		return err
	}
	r, err := get[*sReq](ss, rh, "connection request")
	if err != nil {
		return err
	}
	ss.remove(rh)
	return r.r.Reject(pdata)
}
