package offload

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// RFC 7306 atomics, both ways.
//
// Requester: an atomic work request (Fetch-and-Add, Compare-and-Swap)
// takes an ORD slot as an RDMA Read does (ORD bounds Reads and atomics
// together, and a fenced request waits for both), is entered in the ORQ
// with its Request Identifier and its 8-byte local result buffer, and goes
// out as an Atomic Request on QN 1 with the next Read Request MSN. The
// Atomic Response (QN 3, its own MSNs) must answer the ORQ's head: its
// Original Remote Data Value is written to the result buffer in host byte
// order (the word as the application's memory holds it) and the request
// completes as IBV_WC_FETCH_ADD or IBV_WC_COMP_SWAP with byte_len 8.
//
// Responder: an Atomic Request is checked in stream order (MSN of QN 1,
// one segment of exactly its header) and against its target: a valid STag
// of the QP's protection domain with REMOTE_ATOMIC, an 8-byte aligned TO,
// the word inside the region. The operation runs on the mapped word with
// sync/atomic (a compare-and-swap loop for the masked forms), so atomics
// from any number of queue pairs on one word are atomic with respect to
// each other. The result takes an IRD slot, shared with Read Requests, and
// the Atomic Response leaves in request order with the Read Responses.
//
// A connection carries atomics only if both ends announced mpa.ExtAtomic:
// PostSend refuses them toward any other peer (ErrNotSupportedByPeer) and
// an Atomic Request or Response from a peer that did not announce it is
// an unexpected opcode.

// prepareAtomicLocked validates the 8-byte result buffer of an atomic
// request and enters it in the ORQ before the request goes out.
func (qp *QP) prepareAtomicLocked(w *sendWQE, pos uint64) ibv.WCStatus {
	s := w.sgl[0]
	r, ok := qp.dev.regions.LookupMR(s.LKey)
	if !ok || r.pd != qp.pd {
		return ibv.WCLocProtErr
	}
	if r.access&ibv.AccessLocalWrite == 0 {
		return ibv.WCLocAccessErr
	}
	dst, ok := r.slice(s.Addr, ibv.AtomicLen)
	if !ok {
		return ibv.WCLocProtErr
	}
	qp.atomicID++
	w.reqID = qp.atomicID
	w.state = wqeInFlight
	qp.orq = append(qp.orq, orqEntry{sq: pos, atomic: true, reqID: w.reqID, dst: dst, size: ibv.AtomicLen})
	return ibv.WCSuccess
}

// sendAtomicRequest sends the Atomic Request of w (QN 1, the next Read
// Request MSN).
func (qp *QP) sendAtomicRequest(w *sendWQE) error {
	// The verbs' atomics are the unmasked forms: a FetchAdd with Add
	// Mask 0, a CmpSwap with both masks all ones (RFC 7306 §5.2.1).
	m := rdmap.FetchAdd(w.reqID, w.rkey, w.raddr, w.cmpAdd, 0)
	if w.op == ibv.WRAtomicCmpSwap {
		m = rdmap.CmpSwap(w.reqID, w.rkey, w.raddr, w.cmpAdd, ^uint64(0), w.swap, ^uint64(0))
	}
	var body [rdmap.AtomicRequestLen]byte
	m.Marshal(body[:])
	msn := qp.readMSN
	qp.readMSN++
	// Counted before it goes (see uncount).
	qp.stats.AtomicsTx.Add(1)
	if err := qp.sendUntaggedControl(rdmap.OpAtomicRequest, ddp.QNReadRequest, msn, body[:]); err != nil {
		uncount(&qp.stats.AtomicsTx, 1)
		return err
	}
	return nil
}

// sendAtomicResponse answers one Atomic Request (QN 3, the next Atomic
// Response MSN). Its IRQ slot is released before it goes out, as a Read
// Response's is before its last FPDU.
func (qp *QP) sendAtomicResponse(e *irqEntry) error {
	var body [rdmap.AtomicResponseLen]byte
	m := rdmap.AtomicResponse{ReqID: e.reqID, Value: e.value}
	m.Marshal(body[:])
	msn := qp.atomicRespMSN
	qp.atomicRespMSN++
	qp.releaseIRQ()
	if qp.aborted() {
		return errAborted
	}
	// Counted before it goes (see uncount).
	qp.stats.AtomicResponsesTx.Add(1)
	if err := qp.sendUntaggedControl(rdmap.OpAtomicResponse, ddp.QNAtomicResponse, msn, body[:]); err != nil {
		uncount(&qp.stats.AtomicResponsesTx, 1)
		return err
	}
	return nil
}

// rxAtomicRequest and rxAtomicResponse are the handling of the two atomic
// opcodes.
var (
	rxAtomicRequest  = rxOp{hdr: rdmap.AtomicRequestLen, begin: (*rxState).beginAtomicRequest, end: (*rxState).atomicRequest}
	rxAtomicResponse = rxOp{hdr: rdmap.AtomicResponseLen, begin: (*rxState).beginAtomicResponse, end: (*rxState).atomicResponse}
)

// beginAtomic checks what both atomic messages need: negotiated, the next
// MSN of their queue (want), one segment of exactly their header.
func (r *rxState) beginAtomic(want uint32, hdrLen int) error {
	if !r.negotiated(r.op) {
		return r.fail(rdmap.TermRDMAPUnexpectedOp, 0, fmt.Errorf("%v on a connection that did not negotiate RFC 7306 atomics", r.op))
	}
	if err := r.checkMSN(r.op.String(), want); err != nil {
		return err
	}
	h := &r.h
	switch {
	case h.MO != 0 || !h.Last:
		return r.fail(rdmap.TermDDPInvalidMO, 0, fmt.Errorf("%v with MO %d, last=%v", r.op, h.MO, h.Last))
	case r.payload != 0:
		return r.fail(rdmap.TermDDPTooLong, 0, fmt.Errorf("%v of %d octets, %d past its %d-octet header", r.op, hdrLen+r.payload, r.payload, hdrLen))
	}
	return nil
}

func (r *rxState) beginAtomicRequest() error {
	return r.beginAtomic(r.readMSN, rdmap.AtomicRequestLen)
}

func (r *rxState) beginAtomicResponse() error {
	return r.beginAtomic(r.atomicRespMSN, rdmap.AtomicResponseLen)
}

// atomicRequest performs an inbound atomic and queues its response.
func (r *rxState) atomicRequest() error {
	qp := r.qp
	var m rdmap.AtomicRequest
	if err := m.Unmarshal(r.hdr[ddp.UntaggedHeaderLen:r.need]); err != nil {
		return r.fail(rdmap.TermDDPLocalCatastrophic, 0, err)
	}
	r.readMSN++
	r.lastWrite = 0
	reg, word, code, err := qp.atomicTarget(&m)
	if err != nil {
		return r.fail(code, 0, err)
	}
	qp.mu.Lock()
	if len(qp.irq) >= qp.ird {
		ird := qp.ird
		qp.mu.Unlock()
		qp.stats.IRDOverflows.Add(1)
		return r.fail(rdmap.TermRDMAPCatastrophicStream, 0, fmt.Errorf("Atomic Request beyond IRD %d (shared with RDMA Reads)", ird))
	}
	qp.mu.Unlock()
	// Under the region's gate, as a Write's placement: no atomic
	// changes a region or window once its invalidation has returned.
	reg.gate.RLock()
	valid := reg.valid
	var old uint64
	if valid {
		old = applyAtomic(word, &m)
	}
	reg.gate.RUnlock()
	if !valid {
		return r.fail(rdmap.TermRDMAPInvalidSTag, 0, fmt.Errorf("atomic %v on STag 0x%08x, invalidated meanwhile", m.Op, m.STag))
	}
	qp.stats.AtomicsRx.Add(1)
	qp.mu.Lock()
	if qp.state == ibv.QPErr {
		qp.mu.Unlock()
		return errAborted
	}
	qp.irq = append(qp.irq, irqEntry{atomic: true, reqID: m.ReqID, value: old})
	qp.txCond.Signal()
	qp.mu.Unlock()
	return nil
}

// atomicTarget checks an Atomic Request's target and returns the word it
// operates on, or the Terminate code and the reason. The STag is checked as
// an RDMA Read's source is (RFC 7306 §5: the same remote addressing); a
// word not 64-bit aligned earns the code RFC 7306 §8.2 names, Remote
// Operation Error / Catastrophic error, localized to RDMAP Stream; an
// AOpCode RFC 7306 does not define (0x1 is Reserved, §10.1) is an
// operation the RNIC does not support (§5.2.1 item 4), reported as an
// unexpected opcode (§1.1).
func (qp *QP) atomicTarget(m *rdmap.AtomicRequest) (*Region, *uint64, rdmap.Code, error) {
	if !m.Op.Valid() {
		return nil, nil, rdmap.TermRDMAPUnexpectedOp, fmt.Errorf("Atomic Request with unsupported %v", m.Op)
	}
	reg, ok := qp.dev.regions.Lookup(m.STag)
	switch {
	case !ok:
		return nil, nil, rdmap.TermRDMAPInvalidSTag, fmt.Errorf("atomic %v on invalid STag 0x%08x", m.Op, m.STag)
	case reg.pd != qp.pd:
		return nil, nil, rdmap.TermRDMAPStagNotAssoc, fmt.Errorf("atomic %v on STag 0x%08x of another protection domain", m.Op, m.STag)
	case reg.qpn != 0 && reg.qpn != qp.num:
		return nil, nil, rdmap.TermRDMAPStagNotAssoc, fmt.Errorf("atomic %v on type 2 window 0x%08x bound to QP %d", m.Op, m.STag, reg.qpn)
	case reg.access&ibv.AccessRemoteAtomic == 0:
		return nil, nil, rdmap.TermRDMAPAccess, fmt.Errorf("atomic %v on STag 0x%08x without REMOTE_ATOMIC (%v)", m.Op, m.STag, reg.access)
	case m.TO%rdmap.AtomicAlign != 0:
		return nil, nil, rdmap.TermRDMAPCatastrophicStream, fmt.Errorf("atomic %v at TO 0x%x: not %d-byte aligned", m.Op, m.TO, rdmap.AtomicAlign)
	}
	b, ok := reg.slice(m.TO, rdmap.AtomicAlign)
	if !ok {
		return nil, nil, rdmap.TermRDMAPBaseBounds, fmt.Errorf("atomic %v at TO 0x%x outside STag 0x%08x [0x%x, +%d)", m.Op, m.TO, m.STag, reg.addr, len(reg.buf))
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%rdmap.AtomicAlign != 0 {
		// The region's memory is not mapped 8-byte aligned to its
		// addresses (a region registered at an odd offset of its
		// buffer): the ULP Buffer address is not 64-bit aligned, the
		// error of RFC 7306 §8.2 as for a misaligned TO.
		return nil, nil, rdmap.TermRDMAPCatastrophicStream, fmt.Errorf("atomic %v at TO 0x%x: the region's memory is not 8-byte aligned there", m.Op, m.TO)
	}
	return reg, (*uint64)(p), 0, nil
}

// applyAtomic performs m on the word and returns its original value. The
// word is application memory, read and written here only through
// sync/atomic: atomics of every queue pair on it are atomic with respect
// to each other.
func applyAtomic(word *uint64, m *rdmap.AtomicRequest) uint64 {
	if m.Op == rdmap.AtomicFetchAdd && m.AddSwapMask == 0 {
		return atomic.AddUint64(word, m.AddSwap) - m.AddSwap
	}
	for {
		old := atomic.LoadUint64(word)
		v, changed := m.Apply(old)
		if !changed || atomic.CompareAndSwapUint64(word, old, v) {
			return old
		}
	}
}

// atomicResponse completes the atomic at the head of the ORQ with the
// value its Atomic Response carries.
func (r *rxState) atomicResponse() error {
	qp := r.qp
	var m rdmap.AtomicResponse
	if err := m.Unmarshal(r.hdr[ddp.UntaggedHeaderLen:r.need]); err != nil {
		return r.fail(rdmap.TermDDPLocalCatastrophic, 0, err)
	}
	r.atomicRespMSN++
	qp.mu.Lock()
	if qp.state == ibv.QPErr {
		qp.mu.Unlock()
		return errAborted
	}
	if len(qp.orq) == 0 || !qp.orq[0].atomic || qp.orq[0].reqID != m.ReqID {
		// An Atomic Response with no atomic due (none outstanding, or a
		// Read Response due first) is unexpected (RFC 5040 §7.1: Remote
		// Operation Error, Unexpected OpCode); one that names another
		// request than the one due is an RDMAP error the registry has no
		// code for (Remote Operation Error, Unspecified).
		code, what := rdmap.TermRDMAPUnexpectedOp, "no request outstanding"
		if len(qp.orq) > 0 && !qp.orq[0].atomic {
			what = "an RDMA Read outstanding first"
		} else if len(qp.orq) > 0 {
			code, what = rdmap.TermRDMAPUnspecified, fmt.Sprintf("request %d outstanding first", qp.orq[0].reqID)
		}
		qp.mu.Unlock()
		return r.fail(code, 0, fmt.Errorf("Atomic Response for request %d with %s", m.ReqID, what))
	}
	binary.NativeEndian.PutUint64(qp.orq[0].dst, m.Value)
	qp.stats.AtomicsCompleted.Add(1)
	qp.completeORQHeadLocked(ibv.AtomicLen)
	qp.mu.Unlock()
	return nil
}

// negotiated reports whether the connection may carry opcode op: an
// extended one only if it negotiated it. The header of one it may not is
// not collected: the opcode is unexpected, whatever follows it.
func (r *rxState) negotiated(op rdmap.Opcode) bool {
	switch {
	case !op.Extended():
		return true
	case op.Atomic():
		return r.ext&mpa.ExtAtomic != 0
	}
	return r.ext&mpa.ExtImmediate != 0
}
