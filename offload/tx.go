package offload

import (
	"errors"
	"fmt"
	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/netstack"
	"sync"
	"time"

	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// irqMaxBurst is how many Read Responses are answered in a row while the
// send queue has work, before one send request goes (siw's
// SIW_IRQ_MAXBURST_SQ_ACTIVE): it keeps a flood of Reads from starving the
// local send queue.
const irqMaxBurst = 4

// rtrSTag is the STag on a zero-length RTR Write or Read: never 0, which
// some hardware treats as special (siw uses 1 for the same reason).
const rtrSTag = 1

// txState is owned by the TX goroutine.
type txState struct {
	mpa  mpa.Sender
	emss int // FPDU size limit: the connection's effective MSS, capped
	// ctl holds a control FPDU (Read Request, Terminate, zero-length
	// Send: 80 octets at most, with Markers 88); bufs lends the buffer of
	// a short write (the device's writeBufs).
	ctl  [128]byte
	bufs *sync.Pool
	hdr  [ddp.UntaggedHeaderLen + rdmap.ReadRequestLen]byte
	src  [ibv.MaxSGE][]byte // payload chunks of the message being sent
	nsrc int
	fp   fpduPayload // the FPDUs being written
	msg  ddp.Header  // the DDP header of the message being sent (fp refers to it)
	// perWrite caps the FPDUs of one TCP write (1: one FPDU per write).
	perWrite int
	// hopPick and hopTX are the Pickup and TXStart stamps of the request
	// being sent, until its first write stamps them (hops.go).
	hopPick, hopTX int64
	// hops is the device's recorder of hop stamps.
	hops *anatomy.Recorder
}

// txJob is what the TX goroutine does next.
type txJob int

const (
	jobNone txJob = iota
	jobTerminate
	jobRTR
	jobReadResponse
	jobSQ
	jobExit
)

// nextJobLocked waits for and picks the next transmit job.
func (qp *QP) nextJobLocked() (txJob, *sendWQE) {
	for {
		if qp.term != nil && !qp.termSent {
			return jobTerminate, nil
		}
		if qp.state == ibv.QPErr || qp.closing {
			return jobExit, nil
		}
		if qp.p2pRTR != 0 && qp.state == ibv.QPRTS {
			return jobRTR, nil
		}
		if qp.state == ibv.QPRTS && !qp.startupHold {
			sqReady := false
			var w *sendWQE
			if qp.sqNext < qp.sqTail {
				w = &qp.sq[qp.sqNext%uint64(len(qp.sq))]
				switch {
				case w.responded() && len(qp.orq) >= qp.ord:
					// ORD reached: wait for a Read or Atomic Response.
				case w.flags&ibv.FlagFence != 0 && len(qp.orq) > 0:
					// Fenced behind outstanding Reads.
				default:
					sqReady = true
				}
			}
			if len(qp.irq) > 0 && (qp.irqBurst < irqMaxBurst || !sqReady) {
				return jobReadResponse, nil
			}
			if sqReady {
				return jobSQ, w
			}
		}
		qp.txCond.Wait()
	}
}

// txLoop is the QP's transmit goroutine: it turns send requests, Read
// Responses, the RTR and a Terminate into FPDUs, one FPDU per TCP write.
func (qp *QP) txLoop() {
	defer qp.loopDone()
	for {
		qp.mu.Lock()
		job, w := qp.nextJobLocked()
		switch job {
		case jobExit:
			qp.mu.Unlock()
			return
		case jobTerminate:
			qp.termSent = true
			t := *qp.term
			termDone := qp.termDone
			qp.mu.Unlock()
			if err := qp.sendTerminate(&t); err != nil {
				qp.dev.logf("QP %d: sending Terminate: %v", qp.num, err)
			}
			// Orderly close: FIN after the Terminate; the RX goroutine
			// drains until the peer closes too (within drainTimeout: it
			// may be reading still, when the error was a local one).
			// Disconnect waits for this before it closes the connection.
			qp.conn.CloseWrite()
			qp.conn.SetReadDeadline(time.Now().Add(drainTimeout))
			if termDone != nil {
				close(termDone)
			}
			return
		case jobRTR:
			rtr := qp.p2pRTR
			qp.p2pRTR = 0
			qp.mu.Unlock()
			if err := qp.sendRTR(rtr); err != nil {
				if errors.Is(err, errAborted) {
					continue // the QP entered ERR: send its Terminate, if any
				}
				qp.txFailed(err)
				return
			}
		case jobReadResponse:
			e := qp.irq[0]
			qp.irqBurst++
			qp.mu.Unlock()
			// The IRQ entry is released just before the response's last
			// FPDU goes out (sendMessage), so a requester that sends its
			// next Read as soon as this one completes never finds it taken.
			send := qp.sendReadResponse
			if e.atomic {
				send = qp.sendAtomicResponse
			}
			if err := send(&e); err != nil {
				if errors.Is(err, errAborted) {
					continue // the QP entered ERR: send its Terminate, if any
				}
				qp.txFailed(err)
				return
			}
		case jobSQ:
			if !qp.sendSQ(w) {
				return
			}
		}
	}
}

// sendSQ transmits the send request w, the next of the send queue, and
// completes it. It is called with qp.mu held and returns with it released;
// false ends the TX goroutine (the stream failed, or a local error in the
// request moved the QP to ERR).
func (qp *QP) sendSQ(w *sendWQE) bool {
	qp.irqBurst = 0
	qp.tx.hopPick, qp.tx.hopTX = w.picked, qp.dev.hopNow()
	pos := qp.sqNext
	qp.sqNext++
	if w.op.Local() {
		// A memory operation: done here, in send-queue order, with
		// nothing on the wire. A failed one moves the QP to ERR.
		st := qp.localOp(w)
		w.state, w.status = wqeDone, st
		qp.retireLocked()
		if st != ibv.WCSuccess {
			qp.localError(fmt.Errorf("%v WR %d failed (%v)", w.op, w.id, st))
			return true
		}
		qp.mu.Unlock()
		return true
	}
	if w.responded() {
		prepare := qp.prepareReadLocked
		if w.op.Atomic() {
			prepare = qp.prepareAtomicLocked
		}
		if st := prepare(w, pos); st != ibv.WCSuccess {
			w.state, w.status = wqeDone, st
			qp.retireLocked()
			qp.localError(fmt.Errorf("%v WR %d: bad local sink (%v)", w.op, w.id, st))
			return true
		}
	}
	if !w.responded() {
		// Ours to complete from now on, even if the QP enters ERR meanwhile
		// (flushLocked leaves it alone).
		w.state = wqeSending
	}
	qp.mu.Unlock()
	st, err := qp.sendWQE(w)
	qp.mu.Lock()
	if !w.responded() {
		// A request completes when all of it is with TCP, as in siw; one
		// cut short by the QP's error state is flushed.
		w.state, w.status = wqeDone, ibv.WCSuccess
		switch {
		case err != nil:
			w.status = ibv.WCFlushErr
		case st != ibv.WCSuccess:
			w.status = st
		default:
			w.byteLen = uint32(w.length())
		}
	}
	qp.retireLocked()
	if err == nil && st != ibv.WCSuccess && qp.state != ibv.QPErr {
		qp.localError(fmt.Errorf("%v WR %d: bad local SGE (%v)", w.op, w.id, st))
		return true
	}
	qp.mu.Unlock()
	switch {
	case errors.Is(err, errAborted):
		// The QP entered ERR: the loop sends its Terminate, if any.
	case err != nil:
		qp.txFailed(err)
		return false
	}
	return true
}

// txFailed handles a failed TCP write: the stream is gone.
func (qp *QP) txFailed(err error) {
	qp.mu.Lock()
	if qp.state != ibv.QPErr && !qp.closing {
		qp.dev.logf("QP %d: transmit: %v", qp.num, err)
	}
	qp.errorLocked(ibv.WCSuccess)
	qp.mu.Unlock()
	// The RX goroutine still reads what arrived before the failure (a
	// reset leaves it readable): a Terminate there says why the stream
	// ended. It stops at the end of the stream or the deadline, and
	// supervise closes the connection.
	qp.conn.SetReadDeadline(time.Now().Add(drainTimeout))
}

// localError moves the QP to ERR after a local error on a work request
// (the request completed with its error status) and queues the Terminate
// that ends the stream: RDMAP local catastrophic error (RFC 5040 §7.1),
// the RDMAP stream ended by an error at this end, no header of the peer's
// to copy. The TX loop sends it, then the FIN (the verbs' rule for a
// local error of the send queue: the QP enters the error state and a
// Terminate is sent; Linux siw leaves that to do and only closes). qp.mu
// is held on entry and released.
func (qp *QP) localError(err error) {
	qp.dev.logf("QP %d: %v", qp.num, err)
	queued := qp.term == nil && qp.state != ibv.QPErr
	if queued {
		t := rdmap.NewTerminate(rdmap.TermRDMAPLocalCatastrophic, 0, nil, nil)
		qp.term, qp.termDone = &t, make(chan struct{})
		qp.stats.countTerminate(t.Code)
	}
	qp.errorLocked(ibv.WCSuccess)
	qp.mu.Unlock()
	if queued {
		qp.emit(ibv.Event{Type: ibv.EventTerminateSent, Code: rdmap.TermRDMAPLocalCatastrophic, Err: err})
	}
}

// prepareReadLocked validates the local sink of an RDMA Read and enters it
// in the ORQ before the request goes out (the response may come back at once).
func (qp *QP) prepareReadLocked(w *sendWQE, pos uint64) ibv.WCStatus {
	e := orqEntry{sq: pos}
	if w.nsge == 1 {
		s := w.sgl[0]
		r, ok := qp.dev.regions.LookupMR(s.LKey)
		if !ok || r.pd != qp.pd {
			return ibv.WCLocProtErr
		}
		if r.access&ibv.AccessLocalWrite == 0 {
			return ibv.WCLocAccessErr
		}
		dst, ok := r.slice(s.Addr, uint64(s.Length))
		if !ok {
			return ibv.WCLocProtErr
		}
		e.sinkSTag, e.sinkTO, e.size, e.dst = s.LKey, s.Addr, s.Length, dst
	} else {
		e.sinkSTag = rtrSTag
	}
	w.state = wqeInFlight
	qp.orq = append(qp.orq, e)
	return ibv.WCSuccess
}

// sendWQE transmits one send request. A non-success status is a local error
// in the request (bad SGE); err is a transport error.
func (qp *QP) sendWQE(w *sendWQE) (ibv.WCStatus, error) {
	if w.op == ibv.WRRead {
		var rr rdmap.ReadRequest
		if w.nsge == 1 {
			rr = rdmap.ReadRequest{SinkSTag: w.sgl[0].LKey, SinkTO: w.sgl[0].Addr, Size: w.sgl[0].Length}
		} else {
			rr.SinkSTag = rtrSTag
		}
		rr.SrcSTag, rr.SrcTO = w.rkey, w.raddr
		// Counted before it goes (see uncount).
		qp.stats.ReadsTx.Add(1)
		err := qp.sendReadRequest(&rr)
		if err != nil {
			uncount(&qp.stats.ReadsTx, 1)
		}
		return ibv.WCSuccess, err
	}
	if w.op.Atomic() {
		return ibv.WCSuccess, qp.sendAtomicRequest(w)
	}
	total, st := qp.gather(w)
	if st != ibv.WCSuccess {
		return st, nil
	}
	h := &qp.tx.msg
	*h = ddp.Header{Version: ddp.Version}
	if w.op == ibv.WRWrite || w.op == ibv.WRWriteWithImm {
		h.Tagged = true
		h.ULPCtrl = rdmap.Ctrl(rdmap.OpWrite)
		h.STag = w.rkey
		err := qp.sendMessage(h, w.raddr, total, false)
		if err == nil {
			qp.stats.WritesTx.Add(1)
			qp.stats.WriteBytesTx.Add(total)
		}
		if err == nil && w.op == ibv.WRWriteWithImm {
			err = qp.sendWriteImmediate(w) // after the Write: RFC 7306
		}
		return ibv.WCSuccess, err
	}
	if w.op == ibv.WRSendWithImm {
		if err := qp.sendSendImmediate(w); err != nil { // before the Send it belongs to
			return ibv.WCSuccess, err
		}
	}
	op := rdmap.OpSend
	inv := w.op == ibv.WRSendWithInv
	switch {
	case inv && w.flags&ibv.FlagSolicited != 0:
		op = rdmap.OpSendSEInv
	case inv:
		op = rdmap.OpSendInv
	case w.flags&ibv.FlagSolicited != 0:
		op = rdmap.OpSendSE
	}
	h.ULPCtrl = rdmap.Ctrl(op)
	h.QN = ddp.QNSend
	h.MSN = qp.sendMSN
	if inv {
		h.ULPData = w.invRKey
	}
	qp.sendMSN++
	err := qp.sendMessage(h, 0, total, false)
	if err == nil {
		qp.stats.SendsTx.Add(1)
		qp.stats.SendBytesTx.Add(total)
	}
	return ibv.WCSuccess, err
}

// gather resolves the payload of a Send or Write request into qp.tx.src
// and returns its length, or the local error of a bad SGE.
func (qp *QP) gather(w *sendWQE) (uint64, ibv.WCStatus) {
	t := &qp.tx
	t.nsrc = 0
	if w.flags&ibv.FlagInline != 0 {
		t.src[0] = w.inline[:w.inlineLen]
		t.nsrc = 1
		return uint64(w.inlineLen), ibv.WCSuccess
	}
	var total uint64
	for _, s := range w.sgl[:w.nsge] {
		if s.Length == 0 {
			continue
		}
		r, ok := qp.dev.regions.LookupMR(s.LKey)
		if !ok || r.pd != qp.pd {
			return 0, ibv.WCLocProtErr
		}
		b, ok := r.slice(s.Addr, uint64(s.Length))
		if !ok {
			return 0, ibv.WCLocProtErr
		}
		t.src[t.nsrc] = b
		t.nsrc++
		total += uint64(s.Length)
	}
	return total, ibv.WCSuccess
}

// maxBatch bounds the bytes of one TCP write: within one gVisor buffer
// chunk (64 KiB), so gVisor hands the whole batch to a single Read and the
// FPDUs are built in place, and within the largest write gVisor never cuts
// for size when it builds super-segments (netstack.MaxAlignedWrite: its cut
// there would fall inside an FPDU).
const maxBatch = netstack.MaxAlignedWrite

// sendMessage sends the payload gathered in qp.tx.src (total bytes) as one
// DDP message of FPDUs, each at most one effective MSS: tagged messages
// advance TO from base, untagged ones MO from 0.
//
// FPDUs go to TCP in writes of whole FPDUs. When every FPDU but a write's
// last is exactly one MSS long (markers off towards the peer, EMSS a
// multiple of 4 and not capped), a write carries up to maxBatch bytes of
// FPDUs: TCP cuts it at MSS boundaries, which are FPDU boundaries, so each
// segment still starts with an FPDU and holds whole FPDUs, at a fraction of
// the per-write cost. Otherwise (or with Config.FPDUsPerWrite = 1) each
// write carries one FPDU.
func (qp *QP) sendMessage(h *ddp.Header, base uint64, total uint64, readResponse bool) error {
	t := &qp.tx
	hl := h.Len()
	room := t.mpa.MaxULPDULen(t.emss) - hl
	if room < 4 {
		return fmt.Errorf("effective MSS %d leaves no room for payload", t.emss)
	}
	full := uint64(room) &^ 3 // payload of a full FPDU: 4-aligned, so no pad inside a message
	b := &t.fp
	*b = fpduPayload{t: t, h: h, hl: hl, base: base, msgLen: total, full: full}
	for first := true; first || b.off < total; first = false {
		// Plan the next write: FPDUs from b.off on.
		b.count, b.total, b.done, b.built = 0, 0, 0, nil
		last := false
		for off := b.off; ; {
			pos := t.mpa.StreamOffset() + uint64(b.total)
			n := b.fpduLen(pos, total-off)
			last = off+n == total
			wire := t.mpa.WireLenAt(pos, hl+int(n))
			if b.count > 0 && b.total+wire > maxBatch {
				last = false
				break
			}
			b.count++
			b.total += wire
			off += n
			if last || b.count == t.perWrite || wire != t.emss {
				break
			}
		}
		if readResponse && last {
			qp.releaseIRQ()
		}
		if qp.aborted() {
			return errAborted // the rest of the message is not sent
		}
		pos := t.mpa.StreamOffset()
		if _, err := qp.conn.WriteAlignedPayload(b); err != nil {
			return fmt.Errorf("write FPDU: %w", err)
		}
		if t.hopTX != 0 && !readResponse {
			qp.stampSent(pos, b)
		}
		qp.stats.FPDUsTx.Add(uint64(b.count))
		qp.stats.BytesTx.Add(uint64(b.total))
	}
	return nil
}

// releaseIRQ frees the IRQ slot of the Read being answered.
func (qp *QP) releaseIRQ() {
	qp.mu.Lock()
	if len(qp.irq) > 0 {
		copy(qp.irq, qp.irq[1:])
		qp.irq = qp.irq[:len(qp.irq)-1]
	}
	qp.mu.Unlock()
}

// writeFPDU hands one FPDU to TCP as one write.
func (qp *QP) writeFPDU(fpdu []byte) error {
	if _, err := qp.conn.WriteAligned(fpdu); err != nil {
		return fmt.Errorf("write FPDU: %w", err)
	}
	qp.stats.FPDUsTx.Add(1)
	qp.stats.BytesTx.Add(uint64(len(fpdu)))
	return nil
}

// sendUntaggedControl sends a one-FPDU untagged message whose payload is
// body (Read Request, Terminate, zero-length Send).
func (qp *QP) sendUntaggedControl(op rdmap.Opcode, qn, msn uint32, body []byte) error {
	t := &qp.tx
	h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(op), QN: qn, MSN: msn}
	n := h.Marshal(t.hdr[:])
	t.mpa.Begin(t.ctl[:0], n+len(body))
	t.mpa.Write(t.hdr[:n])
	t.mpa.Write(body)
	return qp.writeFPDU(t.mpa.Finish())
}

func (qp *QP) sendReadRequest(rr *rdmap.ReadRequest) error {
	var body [rdmap.ReadRequestLen]byte
	rr.Marshal(body[:])
	msn := qp.readMSN
	qp.readMSN++
	return qp.sendUntaggedControl(rdmap.OpReadRequest, ddp.QNReadRequest, msn, body[:])
}

// sendReadResponse answers one inbound RDMA Read.
func (qp *QP) sendReadResponse(e *irqEntry) error {
	t := &qp.tx
	t.src[0] = e.src
	t.nsrc = 1
	h := &t.msg
	*h = ddp.Header{Tagged: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpReadResponse), STag: e.sinkSTag}
	// Counted before it goes (see uncount).
	qp.stats.ReadResponsesTx.Add(1)
	qp.stats.ReadBytesTx.Add(uint64(len(e.src)))
	if err := qp.sendMessage(h, e.sinkTO, uint64(len(e.src)), true); err != nil {
		uncount(&qp.stats.ReadResponsesTx, 1)
		uncount(&qp.stats.ReadBytesTx, uint64(len(e.src)))
		return err
	}
	return nil
}

// sendRTR sends the RFC 6581 Ready-to-Receive message the responder waits
// for: a zero-length Write, Read Request or Send.
func (qp *QP) sendRTR(rtr mpa.RTR) error {
	switch rtr {
	case mpa.RTRWrite:
		t := &qp.tx
		t.nsrc = 0
		h := &t.msg
		*h = ddp.Header{Tagged: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpWrite), STag: rtrSTag}
		return qp.sendMessage(h, 0, 0, false)
	case mpa.RTRRead:
		rr := rdmap.ReadRequest{SinkSTag: rtrSTag, SrcSTag: rtrSTag}
		return qp.sendReadRequest(&rr)
	case mpa.RTRSend:
		msn := qp.sendMSN
		qp.sendMSN++
		return qp.sendUntaggedControl(rdmap.OpSend, ddp.QNSend, msn, nil)
	}
	return fmt.Errorf("unknown RTR type %v", rtr)
}

// sendTerminate sends a Terminate message (QN 2, MSN 1: one per stream).
func (qp *QP) sendTerminate(t *rdmap.Terminate) error {
	var body [rdmap.TerminateHeaderLen + 2 + ddp.UntaggedHeaderLen + rdmap.ReadRequestLen]byte
	n := t.Marshal(body[:])
	err := qp.sendUntaggedControl(rdmap.OpTerminate, ddp.QNTerminate, 1, body[:n])
	if err == nil {
		qp.stats.TerminatesTx.Add(1)
	}
	return err
}
