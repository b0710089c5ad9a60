package offload

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
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
	defer qp.loopDone()
	if pl := qp.rx.place; pl != nil {
		defer pl.stop() // before loopDone: no placement once the QP stopped
	}
	qp.mu.Lock()
	idle := qp.rxIdle
	qp.mu.Unlock()
	w := fpduWatch{qp: qp, gap: qp.dev.cfg.FPDUTimeout}
	if w.gap == 0 {
		w.gap = DefaultFPDUTimeout
	}
	for {
		_, err := qp.conn.ReadTo(&qp.rx.mpa)
		if err == nil {
			err = qp.rx.readDone()
		}
		if err == nil {
			w.read(time.Now())
			if idle != nil {
				idle()
			}
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && w.armed {
			if w.waitOn() {
				continue
			}
			qp.fpduTimedOut(w.gap)
			return
		}
		qp.rxEnd(err)
		return
	}
}

// fpduWatch keeps a read deadline on a half-received FPDU
// (Config.FPDUTimeout): armed when the stream first stopped in the middle
// of one; last is when its latest octets came. A deadline that finds later
// octets is moved on rather than set at every read.
type fpduWatch struct {
	qp    *QP
	gap   time.Duration
	armed bool
	last  time.Time
}

// read notes what a successful read left: the time, and whether an FPDU
// is now half received.
func (w *fpduWatch) read(now time.Time) {
	qp := w.qp
	qp.rxLast.Store(now.UnixNano())
	aw := qp.rx.mpa.Awaiting()
	qp.rxAwaiting.Store(int64(aw))
	switch {
	case aw > 0 && w.gap > 0:
		w.last = now
		if !w.armed {
			w.armed = true
			qp.conn.SetReadDeadline(now.Add(w.gap))
		}
	case w.armed:
		w.armed = false
		qp.conn.SetReadDeadline(time.Time{})
	}
}

// waitOn runs at the deadline: it reports whether octets came since it was
// set (the deadline is then moved on); otherwise it disarms.
func (w *fpduWatch) waitOn() bool {
	if more := time.Until(w.last.Add(w.gap)); more > 0 {
		w.qp.conn.SetReadDeadline(time.Now().Add(more))
		return true
	}
	w.armed = false
	w.qp.conn.SetReadDeadline(time.Time{})
	return false
}

// fpduTimedOut ends the connection of an FPDU whose rest did not come
// within gap. A peer writes every FPDU whole, so the stream stopped in
// the middle of one: the peer stalled (or its ULPDU_Length was damaged
// upwards on the wire and announces octets it will never send). The
// Terminate says so with RFC 5044 §8's first error, LLP / MPA 0x01 "TCP
// connection closed, terminated or lost" in IANA's RDDP registry: the
// stream this end was reading is given up in mid-FPDU. IANA's registry
// has no code for an FPDU left incomplete; the FPDU's CRC never arrived,
// so it is not the CRC error (0x02), nothing failed here, so not the
// local catastrophic error (0x05), and no Marker disagreed, so not 0x03.
func (qp *QP) fpduTimedOut(gap time.Duration) {
	qp.stats.FPDUTimeouts.Add(1)
	qp.rx.inFPDU, qp.rx.deferred = false, nil
	_ = qp.rx.fail(rdmap.TermLLPConnLost, ibv.WCLocQPOpErr, fmt.Errorf("an FPDU of ULPDU_Length %d still lacks %d octets after %v without one: the peer stopped in its middle",
		qp.rx.ulpduLen, qp.rx.mpa.Awaiting(), gap))
	qp.drain()
}

// rxEnd ends the receive side on err, the error that stopped rxLoop's read.
func (qp *QP) rxEnd(err error) {
	var te *terminateError
	var me *mpa.Error
	switch {
	case errors.As(err, &te):
		qp.drain()
	case errors.Is(err, errTerminated):
	case errors.As(err, &me):
		// A framing error found by the MPA layer (a bad Marker: with CRC
		// on, its FPDU's CRC has proved good, see mpa.Receiver.Pending):
		// nothing more to wait for.
		qp.rx.inFPDU = false
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
// (Atomic Requests, which are no longer, fit as well).
const rxHdrMax = max(ddp.UntaggedHeaderLen+rdmap.TerminateHeaderLen+2+ddp.UntaggedHeaderLen+rdmap.ReadRequestLen,
	ddp.UntaggedHeaderLen+rdmap.AtomicRequestLen)

// rxPhase is where the receive engine stands in the current FPDU's ULPDU,
// as mpa.Receiver's states say where it stands in the FPDU. The header
// phases collect octets into hdr until have == need; once the header is
// whole, the opcode's begin (rxOps) picks the payload phase, which says
// where the rest of the ULPDU goes.
//
//	BeginFPDU → rxDDPLen → rxDDPHdr ─┬──────────────┬→ rxPlace   → EndFPDU
//	                                 └→ rxRDMAPHdr ─┼→ rxScatter
//	                                                └→ rxDiscard
type rxPhase uint8

const (
	rxDDPLen   rxPhase = iota // the first 2 octets: they tell the DDP header's length (tagged or not)
	rxDDPHdr                  // the rest of the DDP header
	rxRDMAPHdr                // the RDMAP header after an untagged DDP header (Read Request, Terminate)
	rxPlace                   // payload into tagged memory, dst: a Write's region or a Read's sink
	rxScatter                 // payload across the SGEs of the receive the Send message took
	rxDiscard                 // payload with nowhere to go: none (Read Request, RTR) or a Terminate's tail
)

// rxState is the receive engine of a QP: the mpa.Handler that the MPA
// receiver drives from inside the netstack's TCP Read, segment by segment.
// It collects each DDP segment's header (at most rxHdrMax bytes), checks it,
// and then copies the payload once, straight into the target region. It is
// owned by the QP's RX goroutine (rxLoop); what it shares with the QP's
// queues it reads and writes under the QP lock.
type rxState struct {
	qp  *QP
	mpa mpa.Receiver

	// Current FPDU.
	phase    rxPhase
	hdr      [rxHdrMax]byte
	have     int // header bytes collected
	need     int // header bytes the header phase waits for
	ulpduLen int
	h        ddp.Header
	op       rdmap.Opcode
	aborted  bool    // the FPDU arrived in ERR: dropped (headerDone)
	payload  int     // payload bytes of this segment
	dst      []byte  // rxPlace: where the payload goes
	dstReg   *Region // rxPlace: the region or window an RDMA Write places into (nil: a Read Response's sink)
	dstGone  bool    // dstReg was invalidated while the segment was being placed
	dstOff   int

	// The Send message in progress (QN 0), kept across FPDUs: sendActive
	// once its first segment took the receive at the RQ head (resolved
	// into sendBufs), until its last segment completes it; an error in
	// between completes that receive with the error (fail).
	sendActive bool
	sendBufs   [ibv.MaxSGE][]byte
	sendN      int
	sendCap    uint64
	sendPlaced uint64
	sgi, sgo   int

	// Expected MSNs (readMSN: Read and Atomic Requests, QN 1;
	// atomicRespMSN: Atomic Responses, QN 3).
	sendMSN, readMSN, termMSN, atomicRespMSN uint32

	// ext is the RDMAP extensions the connection negotiated.
	ext mpa.Ext
	// immPending holds imm, the value of an Immediate Data message of a
	// Send with Immediate Data, for the Send that follows it.
	immPending bool
	imm        uint32
	// writeLen counts the payload of the RDMA Write message in progress;
	// lastWrite is the length of the last one that ended, for the
	// Immediate Data message of a Write with Immediate Data (reset by
	// every other untagged message).
	writeLen, lastWrite uint64

	// awaitRTR is the RTR type a P2P responder waits for: every FPDU is
	// checked against it until it arrives (then 0). awaitFirst: a
	// responder without P2P holds its sends until the first FPDU.
	awaitRTR   mpa.RTR
	awaitFirst bool

	// place is the connection's out-of-order placer (nil when the stream
	// start is not known): payload copies into tagged memory and remote
	// invalidations take its lock.
	place *oooPlacer

	// crc: the connection checks MPA CRCs. inFPDU: between BeginFPDU and
	// EndFPDU, before the FPDU's CRC is known. An error found there (in
	// the FPDU's DDP or RDMAP header) is deferred (see readDone for how
	// long): the rest of the FPDU is dropped, and EndFPDU sends the MPA
	// CRC Terminate if the CRC is bad, else the deferred error's.
	crc, inFPDU bool
	deferred    *deferredFail
}

// deferredFail is an error of the current FPDU's header held for its CRC.
type deferredFail struct {
	code  rdmap.Code
	local ibv.WCStatus
	cause error
}

func (r *rxState) init(qp *QP, p *mpa.Params, awaitRTR mpa.RTR, place *oooPlacer) {
	crc, markers := p.CRC, p.MarkersRx
	*r = rxState{qp: qp, place: place, ext: p.Ext, crc: crc}
	r.mpa.Init(crc, markers, r)
	r.sendMSN, r.readMSN, r.termMSN, r.atomicRespMSN = 1, 1, 1, 1
	r.awaitRTR = awaitRTR
}

// BeginFPDU implements mpa.Handler.
func (r *rxState) BeginFPDU(ulpduLen int) error {
	r.ulpduLen = ulpduLen
	r.inFPDU, r.deferred = true, nil
	r.phase, r.have, r.need = rxDDPLen, 0, 2
	r.dst, r.dstOff, r.payload = nil, 0, 0
	r.dstReg, r.dstGone = nil, false
	if r.place != nil {
		r.place.begin(r.mpa.FPDUStart())
	}
	if ulpduLen < 2 {
		return deferredOK(r.fail(rdmap.TermDDPLocalCatastrophic, 0, fmt.Errorf("ULPDU of %d bytes holds no DDP header", ulpduLen)))
	}
	return nil
}

// errDeferred is fail's answer when it defers the error to the FPDU's CRC:
// the header's processing stops there, the rest of the FPDU is dropped.
var errDeferred = errors.New("offload: error deferred to the FPDU's CRC")

// deferredOK maps errDeferred to nil at the mpa.Handler boundary: the MPA
// receiver goes on to the FPDU's CRC.
func deferredOK(err error) error {
	if err == errDeferred {
		return nil
	}
	return err
}

// ULPDU implements mpa.Handler: header bytes are collected, payload bytes are
// placed where the header says.
func (r *rxState) ULPDU(p []byte) error {
	for len(p) > 0 {
		switch r.phase {
		case rxDDPLen, rxDDPHdr, rxRDMAPHdr:
			n := copy(r.hdr[r.have:r.need], p)
			r.have += n
			p = p[n:]
			if r.have == r.need {
				if err := r.headerStep(); err != nil {
					return deferredOK(err)
				}
			}
			continue
		case rxPlace:
			if pl := r.place; pl != nil {
				pl.mu.Lock()
				r.placeChunk(p)
				pl.mu.Unlock()
			} else {
				r.placeChunk(p)
			}
		case rxScatter:
			r.scatter(p)
		}
		return nil // rxDiscard drops it
	}
	return nil
}

// placeChunk copies payload octets to where the segment's header says:
// an RDMA Write's through its region's gate (dstReg), dropping them once
// the region was invalidated (dstGone: the Write is refused at the end of
// the segment), a Read Response's into the Read's sink.
func (r *rxState) placeChunk(p []byte) {
	if r.dstReg == nil {
		r.dstOff += copy(r.dst[r.dstOff:], p)
		return
	}
	if r.dstGone {
		return
	}
	n, ok := r.dstReg.placeInto(r.dst[r.dstOff:], p)
	r.dstOff += n
	r.dstGone = !ok
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

// headerStep runs each time the header bytes a header phase waits for have
// arrived.
func (r *rxState) headerStep() error {
	switch r.phase {
	case rxDDPLen:
		r.need = ddp.HeaderLen(r.hdr[0])
		if r.ulpduLen < r.need {
			return r.fail(rdmap.TermDDPLocalCatastrophic, 0, fmt.Errorf("ULPDU of %d bytes is shorter than its DDP header (%d)", r.ulpduLen, r.need))
		}
		r.phase = rxDDPHdr
		return nil
	case rxDDPHdr:
		if _, err := r.h.Unmarshal(r.hdr[:r.have]); err != nil {
			return r.fail(rdmap.TermDDPLocalCatastrophic, 0, err)
		}
		_, r.op = rdmap.ParseCtrl(r.h.ULPCtrl)
		// An RDMAP header follows only where the DDP header is one we
		// read (a bad version is reported by headerDone).
		if o := &rxOps[r.op]; o.hdr > 0 && !r.h.Tagged && r.h.Version == ddp.Version && r.negotiated(r.op) {
			r.need += o.hdr
			if o.varHdr {
				r.need = min(r.need, r.ulpduLen)
			}
			if r.need > r.have {
				if r.ulpduLen < r.need {
					return r.fail(rdmap.TermDDPLocalCatastrophic, 0, fmt.Errorf("%v ULPDU of %d bytes is shorter than its header (%d)", r.op, r.ulpduLen, r.need))
				}
				r.phase = rxRDMAPHdr
				return nil
			}
		}
	}
	return r.headerDone()
}

// headerDone checks a complete header, then the opcode's begin checks the
// rest and picks the payload phase.
func (r *rxState) headerDone() error {
	h := &r.h
	r.payload = r.ulpduLen - r.need
	r.phase = rxDiscard
	op, code, err := checkHeader(h)
	if err != nil {
		return r.fail(code, 0, err)
	}
	if r.qp.aborted() && op != rdmap.OpTerminate {
		// In ERR (after a failed transmit) only a Terminate still
		// counts: the rest is dropped.
		r.aborted = true
		return nil
	}
	if r.awaitRTR != 0 && !r.isRTR(op) {
		return r.fail(rdmap.TermLLPNoMatchingRTR, 0, fmt.Errorf("expected a %v RTR, got %v with %d bytes", r.awaitRTR, op, r.payload))
	}
	if err := r.checkImmPending(op); err != nil {
		return err
	}
	if !h.Tagged && h.QN != op.QN() {
		return r.fail(rdmap.TermDDPInvalidQN, 0, fmt.Errorf("%v on QN %d", op, h.QN))
	}
	if begin := rxOps[op].begin; begin != nil {
		return begin(r)
	}
	return r.fail(rdmap.TermRDMAPUnexpectedOp, 0, fmt.Errorf("opcode %v", op))
}

// isRTR reports whether a segment with opcode op is the RTR a P2P
// responder waits for (RFC 6581: a zero-length Write or Send, or a Read
// Request).
func (r *rxState) isRTR(op rdmap.Opcode) bool {
	switch r.awaitRTR {
	case mpa.RTRWrite:
		return op == rdmap.OpWrite && r.payload == 0
	case mpa.RTRRead:
		return op == rdmap.OpReadRequest
	case mpa.RTRSend:
		return op == rdmap.OpSend && r.payload == 0
	}
	return false
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

// EndFPDU implements mpa.Handler: the FPDU's CRC is known; the opcode's end
// finishes the segment and, on its last segment, the message.
func (r *rxState) EndFPDU(crcOK bool) error {
	qp := r.qp
	r.inFPDU = false
	d := r.deferred
	r.deferred = nil
	if !crcOK {
		qp.stats.CRCErrors.Add(1)
		if d != nil {
			return r.fail(rdmap.TermLLPCRC, ibv.WCLocQPOpErr, fmt.Errorf("MPA CRC error (the FPDU's header also failed: %v: %w)", d.code, d.cause))
		}
		return r.fail(rdmap.TermLLPCRC, ibv.WCLocQPOpErr, errors.New("MPA CRC error"))
	}
	if d != nil {
		return r.fail(d.code, d.local, d.cause)
	}
	qp.stats.FPDUsRx.Add(1)
	qp.stats.BytesRx.Add(uint64(r.ulpduLen))
	if r.awaitFirst {
		r.firstFPDU()
	}
	if r.aborted {
		r.aborted = false
		return nil
	}
	if r.awaitRTR != 0 {
		return r.rtrArrived()
	}
	if qp.dev.hops.On() {
		r.stampPlaced()
	}
	r.tapPlace()
	return rxOps[r.op].end(r)
}

// terminate builds the Terminate of code for the segment that failed,
// copying its headers as RFC 5040 §4.8 and §7.1 have them copied
// (rdmap.NewTerminate). An RFC 7306 message of an extension the connection
// negotiated has been Delivered when its RDMAP layer finds it wrong (an
// Atomic Request of an operation the RNIC does not support, an Atomic
// Response that answers no request): RFC 7306 §8.1 item 2 has its DDP
// header copied, under the Unexpected OpCode that copies none for an
// opcode the receiver does not know.
func (r *rxState) terminate(code rdmap.Code) rdmap.Terminate {
	var ddpHdr, rdmapHdr []byte
	if n := ddp.HeaderLen(r.hdr[0]); r.have >= n && r.have > 0 {
		ddpHdr = r.hdr[:n:n]
		if !r.h.Tagged && r.op == rdmap.OpReadRequest && r.have >= n+rdmap.ReadRequestLen {
			rdmapHdr = r.hdr[n : n+rdmap.ReadRequestLen]
		}
	}
	t := rdmap.NewTerminate(code, uint16(r.ulpduLen), ddpHdr, rdmapHdr)
	if code == rdmap.TermRDMAPUnexpectedOp && ddpHdr != nil && !r.h.Tagged && r.op.Extended() && r.negotiated(r.op) {
		t.HasSegLen, t.HasDDPHeader = true, true
		t.DDPSegLen, t.DDPHeader = uint16(r.ulpduLen), ddpHdr
	}
	return t
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
	if r.inFPDU && r.crc {
		if r.deferred == nil {
			r.deferred = &deferredFail{code: code, local: local, cause: cause}
		}
		r.phase = rxDiscard
		return errDeferred
	}
	t := r.terminate(code)
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
		qp.term, qp.termDone = &t, make(chan struct{})
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
