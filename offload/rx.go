package offload

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// errAborted stops a transfer whose QP entered the error state.
var errAborted = errors.New("offload: queue pair in error state")

// drainTimeout bounds the orderly close after a Terminate: reading (and
// discarding) until the peer closes its side too.
const drainTimeout = 3 * time.Second

// rxLoop is the QP's receive goroutine: it runs the TCP endpoint's Read with
// the MPA receiver as the writer, so every in-order segment's payload is
// parsed and placed as it is handed over.
func (qp *QP) rxLoop() {
	defer qp.running.Done()
	if pl := qp.rx.place; pl != nil {
		defer pl.stop() // before running.Done: no placement once the QP stopped
	}
	qp.mu.Lock()
	idle := qp.rxIdle
	qp.mu.Unlock()
	for {
		_, err := qp.conn.ReadTo(&qp.rx.mpa)
		if err == nil {
			if idle != nil {
				idle()
			}
			continue
		}
		var te *terminateError
		var me *mpa.Error
		switch {
		case errors.As(err, &te):
			qp.drain()
		case errors.Is(err, errTerminated):
		case errors.As(err, &me):
			// A framing error found by the MPA layer (bad marker).
			_ = qp.rx.fail(rdmapCodeForMPA(me.Code), ibv.WCLocQPOpErr, err)
			qp.drain()
		case err == io.EOF:
			qp.mu.Lock()
			if qp.state != ibv.QPErr {
				qp.dev.logf("QP %d: peer closed the connection", qp.num)
			}
			qp.errorLocked(ibv.WCSuccess)
			qp.mu.Unlock()
		default:
			qp.mu.Lock()
			if qp.state != ibv.QPErr && !qp.closing {
				qp.dev.logf("QP %d: receive: %v", qp.num, err)
			}
			qp.errorLocked(ibv.WCSuccess)
			qp.mu.Unlock()
		}
		return
	}
}

// drain discards incoming bytes until the peer closes or drainTimeout.
func (qp *QP) drain() {
	qp.conn.SetReadDeadline(time.Now().Add(drainTimeout))
	for {
		if _, err := qp.conn.ReadTo(io.Discard); err != nil {
			return
		}
	}
}

// aborted reports whether the QP entered ERR (checked between FPDUs).
func (qp *QP) aborted() bool { return qp.inErr.Load() }

// rxHdrMax holds the longest header the receiver needs whole: an untagged
// DDP header and a Terminate with both copied headers.
const rxHdrMax = ddp.UntaggedHeaderLen + rdmap.TerminateHeaderLen + 2 + ddp.UntaggedHeaderLen + rdmap.ReadRequestLen

// rxState is the receive engine of a QP: the mpa.Handler that the MPA
// receiver drives from inside the netstack's TCP Read, segment by segment.
// It collects each DDP segment's header (at most rxHdrMax bytes), checks it,
// and then copies the payload once, straight into the target region.
type rxState struct {
	qp  *QP
	mpa mpa.Receiver

	// Current FPDU.
	hdr      [rxHdrMax]byte
	have     int // header bytes collected
	need     int // header bytes needed
	ulpduLen int
	h        ddp.Header
	op       rdmap.Opcode
	payload  int    // payload bytes of this segment
	dst      []byte // where the payload goes (tagged, Read Response)
	dstOff   int

	// Send message in progress (QN 0): the head of the RQ.
	sendActive bool
	sendBufs   [ibv.MaxSGE][]byte
	sendN      int
	sendCap    uint64
	sendPlaced uint64
	sgi, sgo   int

	// Expected MSNs.
	sendMSN, readMSN, termMSN uint32

	// awaitRTR is the RTR type a P2P responder waits for.
	awaitRTR mpa.RTR

	// place is the connection's out-of-order placer (nil when the stream
	// start is not known): payload copies into tagged memory and remote
	// invalidations take its lock.
	place *oooPlacer
}

func (r *rxState) init(qp *QP, crc, markers bool, awaitRTR mpa.RTR, place *oooPlacer) {
	*r = rxState{qp: qp, place: place}
	r.mpa.Init(crc, markers, r)
	r.sendMSN, r.readMSN, r.termMSN = 1, 1, 1
	r.awaitRTR = awaitRTR
}

// BeginFPDU implements mpa.Handler.
func (r *rxState) BeginFPDU(ulpduLen int) error {
	r.ulpduLen = ulpduLen
	r.have, r.need = 0, 2
	r.dst, r.dstOff, r.payload = nil, 0, 0
	if r.place != nil {
		r.place.begin(r.mpa.FPDUStart())
	}
	if ulpduLen < 2 {
		return r.fail(rdmap.TermDDPLocalCatastrophic, 0, fmt.Errorf("ULPDU of %d bytes holds no DDP header", ulpduLen))
	}
	return nil
}

// ULPDU implements mpa.Handler: header bytes are collected, payload bytes are
// placed where the header says.
func (r *rxState) ULPDU(p []byte) error {
	for len(p) > 0 {
		if r.have < r.need {
			n := copy(r.hdr[r.have:r.need], p)
			r.have += n
			p = p[n:]
			if r.have == r.need {
				if err := r.headerStep(); err != nil {
					return err
				}
			}
			continue
		}
		switch {
		case r.dst != nil && r.place != nil:
			r.place.mu.Lock()
			r.dstOff += copy(r.dst[r.dstOff:], p)
			r.place.mu.Unlock()
		case r.dst != nil:
			r.dstOff += copy(r.dst[r.dstOff:], p)
		case r.sendActive:
			r.scatter(p)
		}
		p = nil
	}
	return nil
}

// scatter places Send payload across the receive's SGEs.
func (r *rxState) scatter(p []byte) {
	for len(p) > 0 && r.sgi < r.sendN {
		n := copy(r.sendBufs[r.sgi][r.sgo:], p)
		p = p[n:]
		r.sgo += n
		if r.sgo == len(r.sendBufs[r.sgi]) {
			r.sgi, r.sgo = r.sgi+1, 0
		}
	}
}

// headerStep runs each time the header bytes asked for have arrived.
func (r *rxState) headerStep() error {
	if r.have == 2 {
		r.need = ddp.HeaderLen(r.hdr[0])
		if r.ulpduLen < r.need {
			return r.fail(rdmap.TermDDPLocalCatastrophic, 0, fmt.Errorf("ULPDU of %d bytes is shorter than its DDP header (%d)", r.ulpduLen, r.need))
		}
		return nil
	}
	if r.have == ddp.HeaderLen(r.hdr[0]) { // the DDP header is complete
		if _, err := r.h.Unmarshal(r.hdr[:r.have]); err != nil {
			return r.fail(rdmap.TermDDPLocalCatastrophic, 0, err)
		}
		_, r.op = rdmap.ParseCtrl(r.h.ULPCtrl)
		if !r.h.Tagged && r.h.Version == ddp.Version {
			switch r.op {
			case rdmap.OpReadRequest:
				r.need += rdmap.ReadRequestLen
			case rdmap.OpTerminate:
				r.need = min(r.ulpduLen, rxHdrMax)
			}
			if r.need > r.have {
				if r.ulpduLen < r.need {
					return r.fail(rdmap.TermDDPLocalCatastrophic, 0, fmt.Errorf("%v ULPDU of %d bytes is shorter than its header (%d)", r.op, r.ulpduLen, r.need))
				}
				return nil
			}
		}
	}
	return r.headerDone()
}

// headerDone checks a complete header and sets the payload's target.
func (r *rxState) headerDone() error {
	qp := r.qp
	h := &r.h
	r.payload = r.ulpduLen - r.need
	op, code, err := checkHeader(h)
	if err != nil {
		return r.fail(code, 0, err)
	}
	if r.awaitRTR != 0 {
		ok := false
		switch r.awaitRTR {
		case mpa.RTRWrite:
			ok = op == rdmap.OpWrite && r.payload == 0
		case mpa.RTRRead:
			ok = op == rdmap.OpReadRequest
		case mpa.RTRSend:
			ok = op == rdmap.OpSend && r.payload == 0
		}
		if !ok {
			return r.fail(rdmap.TermLLPNoMatchingRTR, 0, fmt.Errorf("expected a %v RTR, got %v with %d bytes", r.awaitRTR, op, r.payload))
		}
	}
	if !h.Tagged {
		if h.QN != op.QN() {
			return r.fail(rdmap.TermDDPInvalidQN, 0, fmt.Errorf("%v on QN %d", op, h.QN))
		}
	}
	switch op {
	case rdmap.OpWrite:
		if r.payload == 0 {
			return nil // a zero-length Write references no memory (and is the RTR)
		}
		dst, code, err := qp.writeSink(h, r.payload)
		if err != nil {
			return r.fail(code, 0, err)
		}
		r.dst = dst
		return nil

	case rdmap.OpReadResponse:
		qp.mu.Lock()
		if len(qp.orq) == 0 {
			qp.mu.Unlock()
			return r.fail(rdmap.TermDDPLocalCatastrophic, 0, errors.New("RDMA Read Response with no Read outstanding"))
		}
		e := &qp.orq[0]
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
		r.dst = dst[placed : placed+uint32(r.payload)]
		return nil

	case rdmap.OpSend, rdmap.OpSendInv, rdmap.OpSendSE, rdmap.OpSendSEInv:
		if h.MSN != r.sendMSN {
			return r.fail(rdmap.TermDDPInvalidMSN, 0, fmt.Errorf("Send MSN %d, expected %d", h.MSN, r.sendMSN))
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
			qp.stats.RecvTooLong.Add(1)
			return r.fail(rdmap.TermDDPTooLong, ibv.WCLocLenErr, fmt.Errorf("Send MSN %d longer than the %d-byte receive buffer", h.MSN, r.sendCap))
		}
		return nil

	case rdmap.OpReadRequest:
		if h.MSN != r.readMSN {
			return r.fail(rdmap.TermDDPInvalidMSN, 0, fmt.Errorf("Read Request MSN %d, expected %d", h.MSN, r.readMSN))
		}
		if h.MO != 0 || !h.Last {
			return r.fail(rdmap.TermDDPInvalidMO, 0, fmt.Errorf("Read Request with MO %d, last=%v", h.MO, h.Last))
		}
		return nil

	case rdmap.OpTerminate:
		if h.MSN != r.termMSN || h.MO != 0 {
			// Still a Terminate: act on it, the stream ends either way.
			qp.dev.logf("QP %d: Terminate with MSN %d MO %d", qp.num, h.MSN, h.MO)
		}
		return nil
	}
	return r.fail(rdmap.TermRDMAPUnexpectedOp, 0, fmt.Errorf("opcode %v", op))
}

// checkHeader checks the versions and opcode of a DDP/RDMAP header and
// returns the opcode, or the Terminate code and the reason.
func checkHeader(h *ddp.Header) (rdmap.Opcode, rdmap.Code, error) {
	ver, op := rdmap.ParseCtrl(h.ULPCtrl)
	switch {
	case h.Version != ddp.Version && h.Tagged:
		return op, rdmap.TermDDPTaggedBadVersion, fmt.Errorf("DDP version %d", h.Version)
	case h.Version != ddp.Version:
		return op, rdmap.TermDDPUntaggedBadVersion, fmt.Errorf("DDP version %d", h.Version)
	case ver != rdmap.Version:
		return op, rdmap.TermRDMAPBadVersion, fmt.Errorf("RDMAP version %d", ver)
	case !op.Valid() || op.Tagged() != h.Tagged:
		return op, rdmap.TermRDMAPUnexpectedOp, fmt.Errorf("unexpected opcode %d (tagged=%v)", uint8(op), h.Tagged)
	}
	return op, 0, nil
}

// EndFPDU implements mpa.Handler: the FPDU's CRC is known; finish the
// segment and, on its last segment, the message.
func (r *rxState) EndFPDU(crcOK bool) error {
	qp := r.qp
	if !crcOK {
		qp.stats.CRCErrors.Add(1)
		return r.fail(rdmap.TermLLPCRC, ibv.WCLocQPOpErr, errors.New("MPA CRC error"))
	}
	qp.stats.FPDUsRx.Add(1)
	qp.stats.BytesRx.Add(uint64(r.ulpduLen))
	h := &r.h
	if r.awaitRTR != 0 {
		return r.rtrArrived()
	}
	r.tapPlace()
	switch r.op {
	case rdmap.OpWrite:
		qp.stats.PlacedBytes.Add(uint64(r.payload))
		if h.Last {
			qp.stats.WritesRx.Add(1)
		}
	case rdmap.OpReadResponse:
		qp.stats.PlacedBytes.Add(uint64(r.payload))
		qp.mu.Lock()
		if len(qp.orq) == 0 || qp.state == ibv.QPErr {
			qp.mu.Unlock()
			return errAborted
		}
		e := &qp.orq[0]
		e.placed += uint32(r.payload)
		if h.Last {
			if e.placed != e.size {
				qp.mu.Unlock()
				return r.fail(rdmap.TermDDPTaggedBaseBounds, ibv.WCLocQPOpErr, fmt.Errorf("Read Response ended after %d of %d bytes", e.placed, e.size))
			}
			if e.sq != rtrSlot {
				w := &qp.sq[e.sq%uint64(len(qp.sq))]
				w.state, w.status, w.byteLen = wqeDone, ibv.WCSuccess, e.size
			}
			copy(qp.orq, qp.orq[1:])
			qp.orq = qp.orq[:len(qp.orq)-1]
			qp.stats.ReadsCompleted.Add(1)
			qp.retireLocked()
			qp.txCond.Signal() // an ORD slot is free
		}
		qp.mu.Unlock()
	case rdmap.OpSend, rdmap.OpSendInv, rdmap.OpSendSE, rdmap.OpSendSEInv:
		qp.stats.PlacedBytes.Add(uint64(r.payload))
		r.sendPlaced += uint64(r.payload)
		if !h.Last {
			return nil
		}
		r.sendMSN++
		r.sendActive = false
		var inv uint32
		if r.op.Invalidates() {
			if err := r.invalidate(h.ULPData); err != nil {
				r.sendActive = true // the receive completes with the error
				return r.fail(rdmap.TermRDMAPCannotInvalidate, ibv.WCRemInvReqErr, fmt.Errorf("Send with Invalidate: %w", err))
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
		qp.completeRecvLocked(ibv.WCSuccess, uint32(r.sendPlaced), inv, r.op.Solicited())
		qp.mu.Unlock()
	case rdmap.OpReadRequest:
		return r.readRequest()
	case rdmap.OpTerminate:
		return r.terminateArrived()
	}
	return nil
}

// fail reports an error found in the receive path: the QP enters ERR, the
// request the error hit completes with status local (if not success), the
// rest is flushed, and a Terminate carrying code and the offending headers is
// queued for the TX goroutine, which sends it and closes the stream.
//
// A QP already in ERR (destroyed, disconnected, or after an earlier error)
// sends no Terminate: what still arrives is dropped quietly.
func (r *rxState) fail(code rdmap.Code, local ibv.WCStatus, cause error) error {
	qp := r.qp
	if qp.aborted() {
		r.sendActive = false
		return errAborted
	}
	var ddpHdr, rdmapHdr []byte
	if n := ddp.HeaderLen(r.hdr[0]); r.have >= n && r.have > 0 {
		ddpHdr = r.hdr[:n]
		if !r.h.Tagged && r.op == rdmap.OpReadRequest && r.have >= n+rdmap.ReadRequestLen {
			rdmapHdr = r.hdr[n : n+rdmap.ReadRequestLen]
		}
	}
	t := rdmap.NewTerminate(code, uint16(r.ulpduLen), ddpHdr, rdmapHdr)
	// Keep our own copy of the headers: r.hdr is reused.
	t.DDPHeader = append([]byte(nil), t.DDPHeader...)
	t.RDMAPHeader = append([]byte(nil), t.RDMAPHeader...)
	qp.stats.countTerminate(code)
	qp.mu.Lock()
	if qp.state != ibv.QPErr {
		if local != ibv.WCSuccess {
			switch {
			case r.sendActive && qp.rqHead < qp.rqTail:
				qp.completeRecvLocked(local, uint32(r.sendPlaced), 0, false)
			case r.op == rdmap.OpReadResponse && len(qp.orq) > 0 && qp.orq[0].sq != rtrSlot:
				w := &qp.sq[qp.orq[0].sq%uint64(len(qp.sq))]
				w.state, w.status = wqeDone, local
			}
		}
		qp.term = &t
		qp.errorLocked(ibv.WCSuccess)
	}
	qp.mu.Unlock()
	r.sendActive = false
	err := fmt.Errorf("QP %d: %v: %w", qp.num, code, cause)
	qp.dev.logf("%v (Terminate sent)", err)
	qp.emit(ibv.Event{Type: ibv.EventTerminateSent, Code: code, Err: cause})
	return &terminateError{err: err}
}

// terminateError ends the receive loop after the engine sent a Terminate.
type terminateError struct{ err error }

func (e *terminateError) Error() string { return e.err.Error() }
func (e *terminateError) Unwrap() error { return e.err }
