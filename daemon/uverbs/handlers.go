package uverbs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/ibv"
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
	out, outFDs, err := ss.dispatch(ctx, h.Op, req, fds)
	if err != nil {
		ss.reply(h.Seq, h.Op, statusOf(err), nil)
		return
	}
	ss.reply(h.Seq, h.Op, uabi.Status{}, out, outFDs...)
	uabi.CloseFDs(outFDs) // the client has its copies
}

// dispatch runs a decoded request of op, with the descriptors it carried,
// and returns the reply's message and descriptors.
func (ss *session) dispatch(ctx context.Context, op uint16, req uabi.Msg, fds []int) (out uabi.Msg, outFDs []int, err error) {
	ref := func() uint32 { return req.(*uabi.Ref).Handle }
	switch op {
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
	return out, outFDs, err
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

// qpParts are what a new QP is made from: its PD, CQs and SRQ (from their
// handles), its queue depths and what it costs the session.
type qpParts struct {
	pd               *sPD
	scq, rcq         *sCQ
	srq              *sSRQ // nil: the QP's own RQ ring
	maxSend, maxRecv int
	sqCount, rqCount uint32
	cost             usage
}

// qpParts looks up and checks a CreateQP request's objects and depths;
// it takes nothing.
func (ss *session) qpParts(req *uabi.CreateQP) (qpParts, error) {
	p := qpParts{maxSend: int(req.MaxSendWR), maxRecv: int(req.MaxRecvWR)}
	var err error
	if p.pd, err = get[*sPD](ss, req.PD, "PD"); err != nil {
		return p, err
	}
	if p.scq, err = get[*sCQ](ss, req.SendCQ, "CQ"); err != nil {
		return p, err
	}
	if p.rcq, err = get[*sCQ](ss, req.RecvCQ, "CQ"); err != nil {
		return p, err
	}
	if req.SRQ != 0 {
		if p.srq, err = get[*sSRQ](ss, req.SRQ, "SRQ"); err != nil {
			return p, err
		}
		p.maxRecv = 1 // an RQ ring of one entry, never read: receives come from the SRQ
	}
	if p.maxSend <= 0 || p.maxSend > ibv.MaxQPWR || p.maxRecv <= 0 || p.maxRecv > ibv.MaxQPWR {
		return p, fail(uabi.StError, "queue depths %d/%d: want 1..%d", p.maxSend, p.maxRecv, ibv.MaxQPWR)
	}
	p.sqCount, p.rqCount = uabi.RingCount(p.maxSend), uabi.RingCount(p.maxRecv)
	p.cost = usage{qps: 1, wrs: int(p.sqCount + p.rqCount)}
	return p, nil
}

// reserveQP charges the QP's cost to the session and holds its PD, CQs
// and SRQ (they cannot go while it is being created): both, or neither.
func (ss *session) reserveQP(req *uabi.CreateQP, p *qpParts) error {
	if err := ss.charge(p.cost); err != nil {
		return err
	}
	holds := []any{req.PD, p.pd, req.SendCQ, p.scq, req.RecvCQ, p.rcq}
	if p.srq != nil {
		holds = append(holds, req.SRQ, p.srq)
	}
	if err := ss.hold(holds...); err != nil {
		ss.uncharge(p.cost)
		return err
	}
	return nil
}

// createQP makes a QP whose rings live in memory shared with the client,
// with a doorbell the client rings and the engine's QP behind them. The
// QP exists from the start, holding its PD, CQs and SRQ, and takes each
// part as it is made; if a step fails, the one unwind path gives
// everything back: the QP its parts (q.destroy), the descriptors meant
// for the client, and the charge.
func (ss *session) createQP(req *uabi.CreateQP) (uabi.Msg, []int, error) {
	p, err := ss.qpParts(req)
	if err != nil {
		return nil, nil, err
	}
	if err := ss.reserveQP(req, &p); err != nil {
		return nil, nil, err
	}
	q := &sQP{ss: ss, pd: p.pd, scq: p.scq, rcq: p.rcq, srq: p.srq, stop: make(chan struct{}), epoch: time.Now()}
	q.pd.qpMade()
	if q.srq != nil && q.srq.pd != q.pd {
		// The QP copies into regions of the SRQ's PD too (the lkeys of
		// SRQ receives are the SRQ's PD's): their memory waits for it as
		// for the PD's own QPs before it is unmapped.
		q.srq.pd.qpMade()
	}
	memfd, cfd := -1, -1
	reply, err := ss.buildQP(q, &p, req.SignalAll, &memfd, &cfd)
	if err != nil {
		q.destroy()
		uabi.Close(cfd)
		uabi.Close(memfd)
		ss.uncharge(p.cost)
		return nil, nil, err
	}
	// The charge goes back when take removes the QP's handle.
	return reply, []int{memfd, cfd}, nil
}

// buildQP gives q its rings, its doorbell and its engine QP, starts its
// ring goroutine and gives it a handle. The descriptors for the client
// (the rings' memory, a copy of the doorbell) are left in memfd and cfd,
// also when a step fails.
func (ss *session) buildQP(q *sQP, p *qpParts, signalAll bool, memfd, cfd *int) (*uabi.CreateQPReply, error) {
	sqBytes := uabi.RingSpan(p.sqCount, uabi.SQESize)
	total := sqBytes + uabi.RingSpan(p.rqCount, uabi.RQESize)
	var err error
	if *memfd, q.mem, err = uabi.NewShared("siwtun-qp", total, true); err != nil {
		return nil, err
	}
	sq, err1 := uabi.InitRing(q.mem[:sqBytes], p.sqCount, uabi.SQESize)
	rq, err2 := uabi.InitRing(q.mem[sqBytes:], p.rqCount, uabi.RQESize)
	if err := firstErr(err1, err2); err != nil {
		return nil, err
	}
	q.sq, q.rq = sq, rq
	if q.doorbell, *cfd, err = ss.newDoorbell(); err != nil {
		return nil, err
	}
	attr := offload.QPAttr{MaxSendWR: p.maxSend, MaxRecvWR: p.maxRecv, SignalAll: signalAll}
	if q.srq != nil {
		attr.SRQ = q.srq.srq
	}
	if q.qp, err = ss.srv.eng.CreateQP(q.pd.pd.Handle(), q.scq, q.rcq, attr); err != nil {
		return nil, err
	}
	// A Send that finds no receive takes what the client has published in
	// the RQ ring: receives are taken when data arrives, so the client's
	// PostRecv never waits for the daemon. (A QP on an SRQ takes them
	// from the SRQ's ring: the SRQ's refill.)
	if q.srq == nil {
		q.qp.SetRecvRefill(func() {
			q.rqMu.Lock()
			q.drainRQ()
			q.rqMu.Unlock()
		})
	}
	q.qp.SetRxIdle(q.rxIdle)
	q.done.Add(1)
	go q.run()
	h, err := ss.add(q)
	if err != nil {
		return nil, err
	}
	q.h = h
	eqp := q.qp
	eqp.SetEventHandler(func(e ibv.Event) { ss.queueEvent(h, e, eqp) })
	return &uabi.CreateQPReply{Handle: h, Num: eqp.Num(), SQCount: p.sqCount, RQCount: p.rqCount,
		SQBytes: uint32(sqBytes), Total: uint32(total)}, nil
}

// newDoorbell makes a QP's doorbell: an eventfd the daemon waits on, and
// a copy of it (cfd) for the client to ring.
func (ss *session) newDoorbell() (db *uabi.Doorbell, cfd int, err error) {
	dbfd, err := uabi.NewEventfd()
	if err != nil {
		return nil, -1, err
	}
	if cfd, err = dupFD(dbfd); err != nil {
		uabi.Close(dbfd)
		return nil, -1, err
	}
	// The doorbell owns dbfd from here, also when making it fails.
	if db, err = ss.srv.doorbell(dbfd); err != nil {
		uabi.Close(cfd)
		return nil, -1, err
	}
	return db, cfd, nil
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
