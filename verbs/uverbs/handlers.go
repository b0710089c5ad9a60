package uverbs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/ibv"
	"github.com/siwtun/siwtun/verbs/internal/uabi"
)

// handle serves one request (of a known op) and replies.
func (ss *session) handle(ctx context.Context, h uabi.Header, body []byte, fds []int) {
	in, _ := uabi.Lookup(h.Op)
	if len(fds) != in.RequestFDs {
		uabi.CloseFDs(fds)
		ss.reply(h.Seq, h.Op, uabi.Status{Code: uabi.StBadMessage,
			Msg: fmt.Sprintf("%s (op %d) carries %d descriptors, want %d", in.Name, h.Op, len(fds), in.RequestFDs)}, nil)
		return
	}
	req, _ := uabi.NewRequest(h.Op)
	if err := uabi.Decode(body, req); err != nil {
		uabi.CloseFDs(fds)
		ss.reply(h.Seq, h.Op, uabi.Status{Code: uabi.StBadMessage, Msg: fmt.Sprintf("%s request: %v", in.Name, err)}, nil)
		return
	}
	ref := func() uint32 { return req.(*uabi.Ref).Handle }
	var out uabi.Msg
	var outFDs []int
	var err error
	switch h.Op {
	case uabi.OpHello:
		out, err = ss.hello(req.(*uabi.Hello))
	case uabi.OpAllocPD:
		out, err = ss.allocPD()
	case uabi.OpDeallocPD:
		err = ss.deallocPD(ref())
	case uabi.OpRegMR:
		out, err = ss.regMR(req.(*uabi.RegMR), fds[0])
	case uabi.OpDeregMR:
		err = ss.deregMR(ref())
	case uabi.OpAllocMW:
		out, err = ss.allocMW(req.(*uabi.AllocMW))
	case uabi.OpDeallocMW:
		err = ss.deallocMW(ref())
	case uabi.OpCreateCQ:
		out, outFDs, err = ss.createCQ(req.(*uabi.CreateCQ))
	case uabi.OpDestroyCQ:
		err = ss.destroyCQ(ref())
	case uabi.OpCreateQP:
		out, outFDs, err = ss.createQP(req.(*uabi.CreateQP))
	case uabi.OpDestroyQP:
		err = ss.destroyQP(ref())
	case uabi.OpModifyQP:
		err = ss.modifyQP(req.(*uabi.ModifyQP))
	case uabi.OpQueryQP:
		out, err = ss.queryQP(ref())
	case uabi.OpConnect:
		out, err = ss.connect(ctx, req.(*uabi.Connect))
	case uabi.OpDisconnect:
		err = ss.disconnect(ref())
	case uabi.OpListen:
		out, err = ss.listen(req.(*uabi.Listen))
	case uabi.OpCloseListener:
		err = ss.closeListener(ref())
	case uabi.OpGetRequest:
		out, err = ss.getRequest(ctx, ref())
	case uabi.OpAccept:
		out, err = ss.accept(req.(*uabi.Accept))
	case uabi.OpReject:
		err = ss.reject(req.(*uabi.Reject))
	case uabi.OpCreateSRQ:
		out, outFDs, err = ss.createSRQ(req.(*uabi.CreateSRQ))
	case uabi.OpDestroySRQ:
		err = ss.destroySRQ(ref())
	case uabi.OpModifySRQ:
		out, outFDs, err = ss.modifySRQ(req.(*uabi.ModifySRQ))
	case uabi.OpQuerySRQ:
		out, err = ss.querySRQ(ref())
	case uabi.OpReregMR:
		err = ss.reregMR(req.(*uabi.ReregMR), fds[0])
	case uabi.OpReservePort:
		out, err = ss.reservePort(req.(*uabi.ReservePort))
	case uabi.OpReleasePort:
		err = ss.releasePort(ref())
	}
	if err != nil {
		ss.reply(h.Seq, h.Op, statusOf(err), nil)
		return
	}
	ss.reply(h.Seq, h.Op, uabi.Status{}, out, outFDs...)
	uabi.CloseFDs(outFDs) // the client has its copies
}

func (ss *session) hello(req *uabi.Hello) (uabi.Msg, error) {
	if req.Version != uabi.Version {
		return nil, fail(uabi.StNotSupported, "protocol version %d, daemon speaks %d", req.Version, uabi.Version)
	}
	a := ss.srv.dev.Query()
	// The device as this client may use it: its per-client limits cap
	// the device's own.
	l := ss.srv.Limits()
	return &uabi.HelloReply{Version: uabi.Version, Name: ss.srv.dev.Name(), FWVersion: a.FWVersion, NodeGUID: a.NodeGUID,
		VendorID: a.VendorID, VendorPartID: a.VendorPartID, MaxQP: capAttr(a.MaxQP, l.QPs), MaxQPWR: uint32(a.MaxQPWR),
		MaxSGE: uint32(a.MaxSGE), MaxSGERead: uint32(a.MaxSGERead), MaxCQ: capAttr(a.MaxCQ, l.CQs), MaxCQE: capAttr(a.MaxCQE, l.CQEs),
		MaxMR: capAttr(a.MaxMR, l.MRs), MaxPD: capAttr(a.MaxPD, l.PDs), MaxQPRdAtom: uint32(a.MaxQPRdAtom),
		MaxQPInitRdAtom: uint32(a.MaxQPInitRdAtom), MaxInline: uint32(a.MaxInline), MTU: uint32(a.MTU),
		MaxSRQ: capAttr(a.MaxSRQ, l.SRQs), MaxSRQWR: uint32(a.MaxSRQWR), MaxSRQSGE: uint32(a.MaxSRQSGE),
		AtomicCap: uint32(a.AtomicCap), MaxMW: capAttr(a.MaxMW, l.MRs)}, nil
}

func (ss *session) allocPD() (uabi.Msg, error) {
	cost := usage{pds: 1}
	if err := ss.charge(cost); err != nil {
		return nil, err
	}
	pd, err := ss.srv.dev.AllocPD()
	if err != nil {
		ss.uncharge(cost)
		return nil, err
	}
	h, err := ss.add(&sPD{pd: pd})
	if err != nil {
		ss.uncharge(cost)
		pd.Dealloc()
		return nil, err
	}
	return &uabi.AllocPDReply{Handle: h, PDNum: pd.Handle()}, nil
}

func (ss *session) deallocPD(h uint32) error {
	pd, err := takeIf(ss, h, "PD", func(pd *sPD) error {
		if pd.users > 0 {
			return fail(uabi.StBusy, "PD %d still has %d regions and QPs", pd.pd.Handle(), pd.users)
		}
		return nil
	})
	if err != nil {
		return err
	}
	pd.unmapZombies()
	return pd.pd.Dealloc()
}

// reserve charges cost to the session and holds pd (handle h) for a new
// object in it; undo gives both back when making the object fails.
func (ss *session) reserve(cost usage, h uint32, pd *sPD) (undo func(), err error) {
	if err := ss.charge(cost); err != nil {
		return nil, err
	}
	if err := ss.hold(h, pd); err != nil {
		ss.uncharge(cost)
		return nil, err
	}
	return func() {
		ss.mu.Lock()
		ss.unchargeLocked(cost)
		pd.users--
		ss.mu.Unlock()
	}, nil
}

func (ss *session) regMR(req *uabi.RegMR, fd int) (uabi.Msg, error) {
	defer uabi.Close(fd) // the mapping keeps the memory
	pd, err := get[*sPD](ss, req.PD, "PD")
	if err != nil {
		return nil, err
	}
	cost := usage{mrs: 1, mrBytes: req.Length}
	undo, err := ss.reserve(cost, req.PD, pd)
	if err != nil {
		return nil, err
	}
	mapping, buf, err := uabi.MapShared(fd, req.Offset, req.Length)
	if err != nil {
		undo()
		return nil, fail(uabi.StError, "map region memory: %v", err)
	}
	reg, err := ss.srv.eng.Regions().Register(pd.pd.Handle(), buf, req.IOVA, ibv.Access(req.Access))
	if err != nil {
		undo()
		uabi.Unmap(mapping)
		return nil, err
	}
	mr := &sMR{pd: pd, regions: ss.srv.eng.Regions(), stag: reg.STag(), mapping: mapping, length: req.Length}
	h, err := ss.add(mr)
	if err != nil {
		undo()
		mr.dereg()
		return nil, err
	}
	return &uabi.RegMRReply{Handle: h, STag: reg.STag()}, nil
}

func (ss *session) deregMR(h uint32) error {
	// The STag goes first: a region with windows bound stays, and stays
	// the session's (EBUSY).
	mr, err := takeIf(ss, h, "MR", func(mr *sMR) error {
		if err := mr.regions.Deregister(mr.stag); err != nil {
			if errors.Is(err, offload.ErrBusy) {
				return fail(uabi.StBusy, "%v", err)
			}
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	ss.mu.Lock()
	mr.pd.users--
	ss.mu.Unlock()
	mr.release()
	return nil
}

func (ss *session) allocMW(req *uabi.AllocMW) (uabi.Msg, error) {
	pd, err := get[*sPD](ss, req.PD, "PD")
	if err != nil {
		return nil, err
	}
	typ := ibv.MWType(req.Type)
	if typ != ibv.MWType1 && typ != ibv.MWType2 {
		return nil, fail(uabi.StError, "memory window type %d", req.Type)
	}
	cost := usage{mrs: 1} // windows share the region table and the MR limit
	undo, err := ss.reserve(cost, req.PD, pd)
	if err != nil {
		return nil, err
	}
	w, err := ss.srv.eng.Regions().AllocMW(pd.pd.Handle(), typ)
	if err != nil {
		undo()
		return nil, err
	}
	mw := &sMW{pd: pd, regions: ss.srv.eng.Regions(), stag: w.STag()}
	h, err := ss.add(mw)
	if err != nil {
		undo()
		mw.dealloc()
		return nil, err
	}
	return &uabi.AllocMWReply{Handle: h, RKey: w.STag()}, nil
}

func (ss *session) deallocMW(h uint32) error {
	mw, err := take[*sMW](ss, h, "MW")
	if err != nil {
		return err
	}
	ss.mu.Lock()
	mw.pd.users--
	ss.mu.Unlock()
	return mw.dealloc()
}

func (ss *session) createCQ(req *uabi.CreateCQ) (uabi.Msg, []int, error) {
	depth := int(req.Depth)
	if depth <= 0 || depth > verbs.MaxCQE {
		return nil, nil, fail(uabi.StError, "CQ depth %d: want 1..%d", depth, verbs.MaxCQE)
	}
	count := uabi.RingCount(depth)
	cost := usage{cqs: 1, cqes: int(count)}
	if err := ss.charge(cost); err != nil {
		return nil, nil, err
	}
	size := uabi.RingBytes(count, uabi.CQESize)
	memfd, mem, err := uabi.NewShared("siwtun-cq", size, true)
	if err != nil {
		ss.uncharge(cost)
		return nil, nil, err
	}
	ring, err := uabi.InitRing(mem, count, uabi.CQESize)
	nfd := -1
	if err == nil {
		nfd, err = uabi.NewEventfd()
	}
	if err != nil {
		ss.uncharge(cost)
		uabi.Unmap(mem)
		uabi.Close(memfd)
		return nil, nil, err
	}
	cq := &sCQ{ring: ring, mem: mem, notifyFD: nfd}
	h, err := ss.add(cq)
	if err != nil {
		ss.uncharge(cost)
		cq.close()
		uabi.Close(memfd)
		return nil, nil, err
	}
	// The client gets a copy of the notification eventfd; the daemon keeps
	// its own to write.
	cfd, err := dupFD(nfd)
	if err != nil {
		take[*sCQ](ss, h, "CQ")
		cq.close()
		uabi.Close(memfd)
		return nil, nil, err
	}
	return &uabi.CreateCQReply{Handle: h, Count: count, Size: uint32(size)}, []int{memfd, cfd}, nil
}

func (ss *session) destroyCQ(h uint32) error {
	cq, err := takeIf(ss, h, "CQ", func(cq *sCQ) error {
		if cq.users > 0 {
			return fail(uabi.StBusy, "CQ %d: %d QPs use it", h, cq.users)
		}
		return nil
	})
	if err != nil {
		return err
	}
	cq.close()
	return nil
}

func (ss *session) createQP(req *uabi.CreateQP) (uabi.Msg, []int, error) {
	maxSend, maxRecv := int(req.MaxSendWR), int(req.MaxRecvWR)
	pd, err := get[*sPD](ss, req.PD, "PD")
	if err != nil {
		return nil, nil, err
	}
	scq, err := get[*sCQ](ss, req.SendCQ, "CQ")
	if err != nil {
		return nil, nil, err
	}
	rcq, err := get[*sCQ](ss, req.RecvCQ, "CQ")
	if err != nil {
		return nil, nil, err
	}
	var srq *sSRQ
	if req.SRQ != 0 {
		if srq, err = get[*sSRQ](ss, req.SRQ, "SRQ"); err != nil {
			return nil, nil, err
		}
		maxRecv = 1 // an RQ ring of one entry, never read: receives come from the SRQ
	}
	if maxSend <= 0 || maxSend > ibv.MaxQPWR || maxRecv <= 0 || maxRecv > ibv.MaxQPWR {
		return nil, nil, fail(uabi.StError, "queue depths %d/%d: want 1..%d", maxSend, maxRecv, ibv.MaxQPWR)
	}
	sqCount, rqCount := uabi.RingCount(maxSend), uabi.RingCount(maxRecv)
	cost := usage{qps: 1, wrs: int(sqCount + rqCount)}
	if err := ss.charge(cost); err != nil {
		return nil, nil, err
	}
	// The QP holds its PD, CQs and SRQ from now on: they cannot go while
	// it is being created.
	holds := []any{req.PD, pd, req.SendCQ, scq, req.RecvCQ, rcq}
	if srq != nil {
		holds = append(holds, req.SRQ, srq)
	}
	if err := ss.hold(holds...); err != nil {
		ss.uncharge(cost)
		return nil, nil, err
	}
	ok := false
	defer func() {
		if !ok {
			ss.mu.Lock()
			ss.unchargeLocked(cost)
			pd.users--
			scq.users--
			rcq.users--
			if srq != nil {
				srq.users--
			}
			ss.mu.Unlock()
		}
	}()
	sqBytes := uabi.RingSpan(sqCount, uabi.SQESize)
	total := sqBytes + uabi.RingSpan(rqCount, uabi.RQESize)
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
	db, err := ss.srv.doorbell(dbfd)
	if err != nil {
		uabi.Close(cfd)
		uabi.Close(memfd)
		uabi.Unmap(mem)
		return nil, nil, err
	}
	attr := offload.QPAttr{MaxSendWR: maxSend, MaxRecvWR: maxRecv, SignalAll: req.SignalAll}
	if srq != nil {
		attr.SRQ = srq.srq
	}
	eqp, err := ss.srv.eng.CreateQP(pd.pd.Handle(), scq, rcq, attr)
	if err != nil {
		db.Close()
		uabi.Close(cfd)
		uabi.Close(memfd)
		uabi.Unmap(mem)
		return nil, nil, err
	}
	q := &sQP{ss: ss, pd: pd, qp: eqp, scq: scq, rcq: rcq, srq: srq, mem: mem, sq: sq, rq: rq,
		doorbell: db, stop: make(chan struct{}), epoch: time.Now()}
	// A Send that finds no receive takes what the client has published in
	// the RQ ring: receives are taken when data arrives, so the client's
	// PostRecv never waits for the daemon. (A QP on an SRQ takes them
	// from the SRQ's ring: the SRQ's refill.)
	if srq == nil {
		eqp.SetRecvRefill(func() {
			q.rqMu.Lock()
			q.drainRQ()
			q.rqMu.Unlock()
		})
	}
	eqp.SetRxIdle(q.rxIdle)
	pd.mu.Lock()
	pd.qps++
	pd.mu.Unlock()
	if srq != nil && srq.pd != pd {
		// The QP copies into regions of the SRQ's PD too (the lkeys of
		// SRQ receives are the SRQ's PD's): their memory waits for it as
		// for the PD's own QPs before it is unmapped.
		srq.pd.mu.Lock()
		srq.pd.qps++
		srq.pd.mu.Unlock()
	}
	// From here q.destroy releases the holds; the charge goes back when
	// take removes the QP's handle (or below, if adding it fails).
	ok = true
	q.done.Add(1)
	go q.run()
	h, err := ss.add(q)
	q.h = h
	eqp.SetEventHandler(func(e ibv.Event) { ss.queueEvent(h, e, eqp) })
	if err != nil {
		q.destroy()
		ss.uncharge(cost)
		uabi.Close(cfd)
		uabi.Close(memfd)
		return nil, nil, err
	}
	return &uabi.CreateQPReply{Handle: h, Num: eqp.Num(), SQCount: sqCount, RQCount: rqCount,
		SQBytes: uint32(sqBytes), Total: uint32(total)}, []int{memfd, cfd}, nil
}

// hold takes a reference on each of the session's objects given as a
// handle and the object get returned for it (PDs and CQs), after checking
// under the session's lock that each is still there: a PD or CQ destroyed
// by a concurrent request fails the request that wanted it.
func (ss *session) hold(pairs ...any) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for i := 0; i < len(pairs); i += 2 {
		h := pairs[i].(uint32)
		if ss.objs[h] != pairs[i+1] {
			return fail(uabi.StBadHandle, "object %d destroyed meanwhile", h)
		}
	}
	for i := 1; i < len(pairs); i += 2 {
		switch o := pairs[i].(type) {
		case *sPD:
			o.users++
		case *sCQ:
			o.users++
		case *sSRQ:
			o.users++
		}
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func (ss *session) destroyQP(h uint32) error {
	q, err := take[*sQP](ss, h, "QP")
	if err != nil {
		return err
	}
	q.destroy()
	return nil
}

func (ss *session) modifyQP(req *uabi.ModifyQP) error {
	q, err := get[*sQP](ss, req.Handle, "QP")
	if err != nil {
		return err
	}
	return q.qp.Modify(ibv.QPState(req.State))
}

func (ss *session) queryQP(h uint32) (uabi.Msg, error) {
	q, err := get[*sQP](ss, h, "QP")
	if err != nil {
		return nil, err
	}
	rep := uabi.QueryQPReplyOf(q.qp.Info())
	return &rep, nil
}

func (ss *session) connect(ctx context.Context, req *uabi.Connect) (uabi.Msg, error) {
	q, err := get[*sQP](ss, req.Handle, "QP")
	if err != nil {
		return nil, err
	}
	if !req.Remote.IsValid() {
		return nil, fail(uabi.StError, "connect: invalid address")
	}
	if err := q.qp.Connect(ctx, req.Remote, req.Param.Param()); err != nil {
		return nil, err
	}
	return established(q), nil
}

// established is the reply of a Connect or Accept that connected q.
func established(q *sQP) *uabi.Established {
	return &uabi.Established{Ext: uint8(q.qp.Info().Params.Ext)}
}

func (ss *session) disconnect(h uint32) error {
	q, err := get[*sQP](ss, h, "QP")
	if err != nil {
		return err
	}
	q.qp.Disconnect()
	return nil
}

// maxBacklog is the most connection requests a listener queues; a backlog
// of 0 asks for it, as rdma_cm's user-space interface (ucma) turns 0 and
// anything above its max_backlog (1024) into max_backlog, the way
// listen(2) takes 0 for the system's default.
const maxBacklog = 1024

func (ss *session) listen(req *uabi.Listen) (uabi.Msg, error) {
	if err := ss.checkReserved(req.Addr); err != nil {
		return nil, err
	}
	cost := usage{listeners: 1}
	if err := ss.charge(cost); err != nil {
		return nil, err
	}
	backlog := int(req.Backlog)
	if backlog == 0 || backlog > maxBacklog {
		backlog = maxBacklog
	}
	l, err := ss.srv.eng.Listen(req.Addr, backlog)
	if err != nil {
		ss.uncharge(cost)
		return nil, err
	}
	h, err := ss.add(&sListener{l: l})
	if err != nil {
		ss.uncharge(cost)
		l.Close()
		return nil, err
	}
	return &uabi.ListenReply{Handle: h, Addr: l.Addr()}, nil
}

func (ss *session) closeListener(h uint32) error {
	l, err := take[*sListener](ss, h, "listener")
	if err != nil {
		return err
	}
	return l.l.Close()
}

func (ss *session) getRequest(ctx context.Context, h uint32) (uabi.Msg, error) {
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
	return &uabi.ConnRequest{Handle: rh, Remote: r.Remote, PrivateData: r.PrivateData, IRD: r.IRD, ORD: r.ORD}, nil
}

func (ss *session) accept(req *uabi.Accept) (uabi.Msg, error) {
	if _, err := get[*sReq](ss, req.Request, "connection request"); err != nil {
		return nil, err
	}
	q, err := get[*sQP](ss, req.QP, "QP")
	if err != nil {
		return nil, err
	}
	r, err := take[*sReq](ss, req.Request, "connection request")
	if err != nil {
		return nil, err
	}
	if err := r.r.Accept(q.qp, req.Param.Param()); err != nil {
		return nil, err
	}
	return established(q), nil
}

func (ss *session) reject(req *uabi.Reject) error {
	r, err := take[*sReq](ss, req.Request, "connection request")
	if err != nil {
		return err
	}
	return r.r.Reject(req.PrivateData)
}
