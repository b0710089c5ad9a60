package offload

import (
	"errors"
	"fmt"

	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// rxOp is the receive engine's handling of one RDMAP opcode, in one place,
// as Linux siw's iwarp_pktinfo table holds each opcode's header length and
// handler: how long the RDMAP header after the DDP header is, what a
// segment's complete header starts (begin: the opcode's own checks, and the
// payload phase: where the payload goes), and what the end of the segment
// does once its CRC is good (end: counters, and on a message's last segment
// its completion). An opcode without begin is unexpected: the stream is
// terminated.
type rxOp struct {
	// hdr is the length of the RDMAP header after an untagged DDP
	// header; with varHdr its maximum, the header taking what the ULPDU
	// holds (a Terminate's copied headers are optional).
	hdr    int
	varHdr bool
	begin  func(*rxState) error
	end    func(*rxState) error
}

// rxOps is indexed by the RDMAP opcode (4 bits).
var rxOps = [16]rxOp{
	rdmap.OpWrite:          {begin: (*rxState).beginWrite, end: (*rxState).endWrite},
	rdmap.OpReadRequest:    {hdr: rdmap.ReadRequestLen, begin: (*rxState).beginReadRequest, end: (*rxState).readRequest},
	rdmap.OpReadResponse:   {begin: (*rxState).beginReadResponse, end: (*rxState).endReadResponse},
	rdmap.OpSend:           rxSend,
	rdmap.OpSendInv:        rxSend,
	rdmap.OpSendSE:         rxSend,
	rdmap.OpSendSEInv:      rxSend,
	rdmap.OpTerminate:      {hdr: rxHdrMax - ddp.UntaggedHeaderLen, varHdr: true, begin: (*rxState).beginTerminate, end: (*rxState).terminateArrived},
	rdmap.OpImmediate:      rxImmediate,
	rdmap.OpImmediateSE:    rxImmediate,
	rdmap.OpAtomicRequest:  rxAtomicRequest,
	rdmap.OpAtomicResponse: rxAtomicResponse,
}

// rxSend is the handling of the four Send opcodes.
var rxSend = rxOp{begin: (*rxState).beginSend, end: (*rxState).endSend}

// beginWrite resolves an RDMA Write's target. A zero-length Write
// references no memory (and is the Write RTR).
func (r *rxState) beginWrite() error {
	if r.payload == 0 {
		return nil
	}
	reg, dst, code, err := r.qp.writeSink(&r.h, r.payload)
	if err != nil {
		return r.fail(code, 0, err)
	}
	r.dst, r.dstReg, r.phase = dst, reg, rxPlace
	return nil
}

// endWrite counts a placed Write segment; the last one records the
// message's length for an Immediate Data message behind it.
func (r *rxState) endWrite() error {
	if r.dstGone {
		// The STag was invalidated while the segment was being placed:
		// what arrived after the invalidation was dropped.
		return r.fail(rdmap.TermDDPTaggedInvalidSTag, 0, fmt.Errorf("RDMA Write to STag 0x%08x, invalidated during its placement", r.h.STag))
	}
	r.qp.stats.PlacedBytes.Add(uint64(r.payload))
	r.writeLen += uint64(r.payload)
	if r.h.Last {
		r.qp.stats.WritesRx.Add(1)
		r.lastWrite, r.writeLen = r.writeLen, 0
	}
	return nil
}

// beginReadResponse checks a Read Response segment against the oldest
// outstanding Read: in order, inside its sink.
func (r *rxState) beginReadResponse() error {
	qp, h := r.qp, &r.h
	qp.mu.Lock()
	// A Read Response that answers no Read Request (none outstanding, or
	// an Atomic Response due first: responses come in request order) is
	// an RDMAP message this end did not expect: RFC 5040 §7.1's Remote
	// Operation Error, Unexpected OpCode. (Linux siw reports a DDP local
	// catastrophic error, which names no cause.)
	if len(qp.orq) == 0 {
		qp.mu.Unlock()
		return r.fail(rdmap.TermRDMAPUnexpectedOp, 0, errors.New("RDMA Read Response with no Read outstanding"))
	}
	e := &qp.orq[0]
	if e.atomic {
		qp.mu.Unlock()
		return r.fail(rdmap.TermRDMAPUnexpectedOp, 0, errors.New("RDMA Read Response with an atomic outstanding first"))
	}
	placed, size, dst, stag, to := e.placed, e.size, e.dst, e.sinkSTag, e.sinkTO
	qp.mu.Unlock()
	if size == 0 && r.payload == 0 {
		return nil
	}
	off, code, err := readResponseSink(h, r.payload, stag, to, size)
	if err == nil && off != uint64(placed) {
		code, err = rdmap.TermDDPTaggedBaseBounds, fmt.Errorf("Read Response at TO 0x%x, expected 0x%x (%d of the Read's %d bytes placed)", h.TO, to+uint64(placed), placed, size)
	}
	if err != nil {
		return r.fail(code, ibv.WCLocQPOpErr, err)
	}
	r.dst, r.phase = dst[placed:placed+uint32(r.payload)], rxPlace
	return nil
}

// endReadResponse counts a placed Read Response segment; the last one
// completes the Read and frees its ORD slot.
func (r *rxState) endReadResponse() error {
	qp := r.qp
	qp.stats.PlacedBytes.Add(uint64(r.payload))
	qp.mu.Lock()
	if len(qp.orq) == 0 || qp.state == ibv.QPErr {
		qp.mu.Unlock()
		return errAborted
	}
	e := &qp.orq[0]
	e.placed += uint32(r.payload)
	if r.h.Last {
		if e.placed != e.size {
			qp.mu.Unlock()
			return r.fail(rdmap.TermDDPTaggedBaseBounds, ibv.WCLocQPOpErr, fmt.Errorf("Read Response ended after %d of %d bytes", e.placed, e.size))
		}
		qp.stats.ReadsCompleted.Add(1)
		qp.completeORQHeadLocked(e.size)
	}
	qp.mu.Unlock()
	return nil
}

// beginSend checks a Send segment's MSN and MO; the first segment of a
// message takes the receive at the RQ head.
func (r *rxState) beginSend() error {
	h := &r.h
	if err := r.checkMSN("Send", r.sendMSN); err != nil {
		return err
	}
	if r.awaitRTR != 0 {
		return nil // the zero-length Send RTR consumes no receive
	}
	if !r.sendActive {
		if h.MO != 0 {
			return r.fail(rdmap.TermDDPInvalidMO, 0, fmt.Errorf("Send MSN %d starts at MO %d", h.MSN, h.MO))
		}
		if err := r.startSend(); err != nil {
			return err
		}
	} else if uint64(h.MO) != r.sendPlaced {
		return r.fail(rdmap.TermDDPInvalidMO, ibv.WCLocQPOpErr, fmt.Errorf("Send MSN %d segment at MO %d, expected %d", h.MSN, h.MO, r.sendPlaced))
	}
	if r.sendPlaced+uint64(r.payload) > r.sendCap {
		r.qp.stats.RecvTooLong.Add(1)
		return r.fail(rdmap.TermDDPTooLong, ibv.WCLocLenErr, fmt.Errorf("Send MSN %d longer than the %d-byte receive buffer", h.MSN, r.sendCap))
	}
	r.phase = rxScatter
	return nil
}

// endSend counts a placed Send segment; the last one completes the
// receive (after invalidating the STag a Send with Invalidate names).
func (r *rxState) endSend() error {
	qp, h := r.qp, &r.h
	qp.stats.PlacedBytes.Add(uint64(r.payload))
	r.sendPlaced += uint64(r.payload)
	if !h.Last {
		return nil
	}
	r.sendMSN++
	r.sendActive = false
	r.lastWrite = 0
	var inv uint32
	if r.op.Invalidates() {
		if err := r.invalidate(h.ULPData); err != nil {
			r.sendActive = true // the receive completes with the error
			// As Linux siw: an STag the QP may not invalidate is a
			// remote protection error, an invalid one a remote
			// operation error; both "STag cannot be invalidated".
			code := rdmap.TermRDMAPCannotInvalidate
			if CannotInvalidate(err) {
				code = rdmap.TermRDMAPProtCannotInvalidate
			}
			return r.fail(code, ibv.WCRemInvReqErr, fmt.Errorf("Send with Invalidate: %w", err))
		}
		inv = h.ULPData
		qp.stats.Invalidations.Add(1)
	}
	qp.stats.SendsRx.Add(1)
	qp.mu.Lock()
	if qp.state == ibv.QPErr {
		qp.mu.Unlock()
		return errAborted
	}
	wc := qp.recvWCLocked(ibv.WCSuccess, uint32(r.sendPlaced))
	if inv != 0 {
		wc.Flags, wc.InvalidatedRKey = ibv.WCWithInv, inv
	}
	if r.immPending {
		wc.Flags, wc.ImmData = ibv.WCWithImm, r.imm
		r.immPending = false
	}
	qp.pushRecvLocked(r.op.Solicited())
	qp.mu.Unlock()
	return nil
}

// beginReadRequest checks a Read Request's MSN and MO: a Read Request is
// one segment.
func (r *rxState) beginReadRequest() error {
	if err := r.checkMSN("Read Request", r.readMSN); err != nil {
		return err
	}
	h := &r.h
	if h.MO != 0 || !h.Last {
		return r.fail(rdmap.TermDDPInvalidMO, 0, fmt.Errorf("Read Request with MO %d, last=%v", h.MO, h.Last))
	}
	// A Read Request is exactly its header: a longer DDP message does not
	// fit the Read Request queue's entry (RFC 5041 §7.2: untagged buffer,
	// DDP message too long for available buffer), and is never served.
	if r.payload != 0 {
		return r.fail(rdmap.TermDDPTooLong, 0, fmt.Errorf("Read Request of %d octets, %d past its %d-octet header", rdmap.ReadRequestLen+r.payload, r.payload, rdmap.ReadRequestLen))
	}
	return nil
}

// checkMSN checks an untagged segment's MSN against want, the next its
// queue expects; what names the message in the error.
func (r *rxState) checkMSN(what string, want uint32) error {
	if r.h.MSN != want {
		return r.fail(rdmap.TermDDPInvalidMSN, 0, fmt.Errorf("%s MSN %d, expected %d", what, r.h.MSN, want))
	}
	return nil
}

// beginTerminate accepts any Terminate: the stream ends either way.
func (r *rxState) beginTerminate() error {
	if h := &r.h; h.MSN != r.termMSN || h.MO != 0 {
		r.qp.dev.logf("QP %d: Terminate with MSN %d MO %d", r.qp.num, h.MSN, h.MO)
	}
	return nil
}

// writeSink checks an RDMA Write of n payload octets (n > 0) against the
// region or window its STag names — valid, same protection domain (and,
// for a type 2 window, bound by this QP), REMOTE_WRITE, inside its bounds
// — and returns it and the memory the payload goes to, or the Terminate
// code and the reason. The in-order and the out-of-order paths both place
// through it, and copy through the region's placeInto.
func (qp *QP) writeSink(h *ddp.Header, n int) (*Region, []byte, rdmap.Code, error) {
	reg, ok := qp.dev.regions.Lookup(h.STag)
	switch {
	case !ok:
		return nil, nil, rdmap.TermDDPTaggedInvalidSTag, fmt.Errorf("RDMA Write to invalid STag 0x%08x", h.STag)
	case reg.pd != qp.pd:
		return nil, nil, rdmap.TermDDPTaggedStagNotAssoc, fmt.Errorf("RDMA Write to STag 0x%08x of another protection domain", h.STag)
	case reg.qpn != 0 && reg.qpn != qp.num:
		return nil, nil, rdmap.TermDDPTaggedStagNotAssoc, fmt.Errorf("RDMA Write to type 2 window 0x%08x bound to QP %d", h.STag, reg.qpn)
	case reg.access&ibv.AccessRemoteWrite == 0:
		return nil, nil, rdmap.TermRDMAPAccess, fmt.Errorf("RDMA Write to STag 0x%08x without REMOTE_WRITE (%v)", h.STag, reg.access)
	}
	dst, ok := reg.slice(h.TO, uint64(n))
	if !ok {
		return nil, nil, rdmap.TermDDPTaggedBaseBounds, fmt.Errorf("RDMA Write of %d bytes at TO 0x%x outside STag 0x%08x [0x%x, +%d)", n, h.TO, h.STag, reg.addr, len(reg.buf))
	}
	return reg, dst, 0, nil
}

// readResponseSink checks a Read Response of n payload octets against the
// sink of an outstanding Read (STag stag, TO to, size octets) and returns
// the offset in the sink where the payload goes, or the Terminate code and
// the reason.
func readResponseSink(h *ddp.Header, n int, stag uint32, to uint64, size uint32) (uint64, rdmap.Code, error) {
	if h.STag != stag {
		return 0, rdmap.TermDDPTaggedInvalidSTag, fmt.Errorf("Read Response to STag 0x%08x, the Read's sink is 0x%08x", h.STag, stag)
	}
	off := h.TO - to
	if h.TO < to || off > uint64(size) || uint64(n) > uint64(size)-off {
		return 0, rdmap.TermDDPTaggedBaseBounds, fmt.Errorf("Read Response of %d bytes at TO 0x%x outside the Read's sink [0x%x, +%d)", n, h.TO, to, size)
	}
	return off, 0, nil
}

// startSend takes the head of the receive queue for a new Send message and
// resolves its SGEs to region memory.
func (r *rxState) startSend() error {
	if err := r.takeRecv(); err != nil {
		return err
	}
	qp := r.qp
	qp.mu.Lock()
	if qp.rqHead == qp.rqTail { // flushed meanwhile: the QP entered ERR
		qp.mu.Unlock()
		return errAborted
	}
	wqe := qp.rq[qp.rqHead%uint64(len(qp.rq))]
	qp.mu.Unlock()
	r.sendN, r.sendCap, r.sendPlaced, r.sgi, r.sgo = 0, 0, 0, 0, 0
	r.sendActive = true
	for _, s := range wqe.sgl[:wqe.nsge] {
		if s.Length == 0 {
			continue
		}
		reg, ok := qp.dev.regions.LookupMR(s.LKey)
		if !ok || reg.pd != qp.recvPD() {
			return r.fail(rdmap.TermRDMAPLocalCatastrophic, ibv.WCLocProtErr, fmt.Errorf("receive WR %d: bad lkey 0x%08x", wqe.id, s.LKey))
		}
		if reg.access&ibv.AccessLocalWrite == 0 {
			return r.fail(rdmap.TermRDMAPLocalCatastrophic, ibv.WCLocAccessErr, fmt.Errorf("receive WR %d: lkey 0x%08x lacks LOCAL_WRITE", wqe.id, s.LKey))
		}
		b, ok := reg.slice(s.Addr, uint64(s.Length))
		if !ok {
			return r.fail(rdmap.TermRDMAPLocalCatastrophic, ibv.WCLocProtErr, fmt.Errorf("receive WR %d: SGE outside lkey 0x%08x", wqe.id, s.LKey))
		}
		r.sendBufs[r.sendN] = b
		r.sendN++
		r.sendCap += uint64(s.Length)
	}
	return nil
}

// invalidate invalidates stag for a Send with Invalidate, under the
// placement lock: no out-of-order placement into it lands after this.
func (r *rxState) invalidate(stag uint32) error {
	if pl := r.place; pl != nil {
		pl.mu.Lock()
		defer pl.mu.Unlock()
	}
	return r.qp.dev.regions.InvalidateFrom(stag, r.qp.pd, r.qp.num)
}

// readRequest validates an inbound RDMA Read and queues its response.
func (r *rxState) readRequest() error {
	qp := r.qp
	var rr rdmap.ReadRequest
	if err := rr.Unmarshal(r.hdr[ddp.UntaggedHeaderLen:r.need]); err != nil {
		return r.fail(rdmap.TermDDPLocalCatastrophic, 0, err)
	}
	r.readMSN++
	r.lastWrite = 0
	var src []byte
	if rr.Size > 0 {
		reg, ok := qp.dev.regions.Lookup(rr.SrcSTag)
		switch {
		case !ok:
			return r.fail(rdmap.TermRDMAPInvalidSTag, 0, fmt.Errorf("RDMA Read of invalid STag 0x%08x", rr.SrcSTag))
		case reg.pd != qp.pd:
			return r.fail(rdmap.TermRDMAPStagNotAssoc, 0, fmt.Errorf("RDMA Read of STag 0x%08x of another protection domain", rr.SrcSTag))
		case reg.qpn != 0 && reg.qpn != qp.num:
			return r.fail(rdmap.TermRDMAPStagNotAssoc, 0, fmt.Errorf("RDMA Read of type 2 window 0x%08x bound to QP %d", rr.SrcSTag, reg.qpn))
		case reg.access&ibv.AccessRemoteRead == 0:
			return r.fail(rdmap.TermRDMAPAccess, 0, fmt.Errorf("RDMA Read of STag 0x%08x without REMOTE_READ (%v)", rr.SrcSTag, reg.access))
		}
		var ok2 bool
		src, ok2 = reg.slice(rr.SrcTO, uint64(rr.Size))
		if !ok2 {
			return r.fail(rdmap.TermRDMAPBaseBounds, 0, fmt.Errorf("RDMA Read of %d bytes at TO 0x%x outside STag 0x%08x [0x%x, +%d)", rr.Size, rr.SrcTO, rr.SrcSTag, reg.addr, len(reg.buf)))
		}
	}
	qp.mu.Lock()
	if len(qp.irq) >= qp.ird {
		ird := qp.ird
		qp.mu.Unlock()
		qp.stats.IRDOverflows.Add(1)
		return r.fail(rdmap.TermRDMAPCatastrophicStream, 0, fmt.Errorf("RDMA Read beyond IRD %d", ird))
	}
	qp.irq = append(qp.irq, irqEntry{sinkSTag: rr.SinkSTag, sinkTO: rr.SinkTO, src: src})
	qp.stats.ReadsRx.Add(1)
	qp.txCond.Signal()
	qp.mu.Unlock()
	return nil
}

// rtrArrived completes a P2P responder's connection set-up.
func (r *rxState) rtrArrived() error {
	qp := r.qp
	rtr := r.awaitRTR
	r.awaitRTR = 0
	switch rtr {
	case mpa.RTRSend:
		r.sendMSN++
	case mpa.RTRRead:
		if err := r.readRequest(); err != nil {
			return err
		}
	}
	qp.mu.Lock()
	if qp.state == ibv.QPRTR {
		qp.state = ibv.QPRTS
		qp.txCond.Broadcast()
	}
	qp.mu.Unlock()
	qp.emit(ibv.Event{Type: ibv.EventEstablished})
	return nil
}

// terminateArrived handles the peer's Terminate: the stream is over.
func (r *rxState) terminateArrived() error {
	qp := r.qp
	var t rdmap.Terminate
	body := r.hdr[ddp.UntaggedHeaderLen:r.need]
	if err := t.Unmarshal(body); err != nil {
		qp.dev.logf("QP %d: malformed Terminate: %v", qp.num, err)
	}
	qp.stats.TerminatesRx.Add(1)
	qp.dev.logf("QP %d: peer terminated the stream: %v", qp.num, t.Code)
	qp.mu.Lock()
	qp.errorLocked(statusForTerminate(t.Code))
	qp.termSent = true // never answer a Terminate with one
	qp.mu.Unlock()
	qp.emit(ibv.Event{Type: ibv.EventTerminateReceived, Code: t.Code})
	return errTerminated
}

// errTerminated ends the receive loop after the peer's Terminate.
var errTerminated = errors.New("offload: stream terminated by the peer")

// statusForTerminate maps a received Terminate to the completion status of
// the request it ended.
func statusForTerminate(c rdmap.Code) ibv.WCStatus {
	switch {
	case c.Layer() == rdmap.LayerRDMAP && c.EType() == rdmap.TermRDMAPInvalidSTag.EType(),
		c.Layer() == rdmap.LayerDDP && c.EType() == rdmap.TermDDPTaggedInvalidSTag.EType():
		return ibv.WCRemAccessErr
	case c.Layer() == rdmap.LayerDDP && c.EType() == rdmap.TermDDPNoBuffer.EType():
		return ibv.WCRemInvReqErr
	case c.Layer() == rdmap.LayerRDMAP && c.EType() == rdmap.TermRDMAPUnexpectedOp.EType():
		return ibv.WCRemOpErr
	}
	return ibv.WCRemAbortErr
}

// completeORQHeadLocked ends the oldest outbound request (an RDMA Read whose
// last Read Response was placed, or an atomic whose Atomic Response came):
// its work request completes successfully with byteLen octets (an RTR Read
// has none), the ORQ entry goes, completions retire in order, and a sender
// waiting for an ORD slot wakes. qp.mu is held.
func (qp *QP) completeORQHeadLocked(byteLen uint32) {
	if e := &qp.orq[0]; e.sq != rtrSlot {
		w := &qp.sq[e.sq%uint64(len(qp.sq))]
		w.state, w.status, w.byteLen = wqeDone, ibv.WCSuccess, byteLen
	}
	copy(qp.orq, qp.orq[1:])
	qp.orq = qp.orq[:len(qp.orq)-1]
	qp.retireLocked()
	qp.txCond.Signal() // an ORD slot is free
}
