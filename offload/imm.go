package offload

import (
	"fmt"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// RFC 7306 Immediate Data, both ways.
//
// RDMA Write with Immediate Data is the RFC's pair: the RDMA Write (always
// sent, even of zero length), then an Immediate Data message on QN 0. The
// Data Sink places the Write as any other (out of order too), and the
// Immediate Data message, in stream order behind it, takes the receive at
// the head of the receive queue and completes it as
// IBV_WC_RECV_RDMA_WITH_IMM: the immediate value, and as its length the
// length of the Write right before it (libibverbs' byte_len, as rxe gives
// it), nothing written into the receive's buffers.
//
// Send with Immediate Data has no opcode in RFC 7306; siwtun sends an
// Immediate Data message with rdmap.ImmSendFollows, which consumes no
// receive, then the Send, which completes its receive as IBV_WC_RECV with
// the immediate value. Immediate Data with SE carries the solicited event
// of a Write with Immediate Data; a Send with Immediate Data carries it on
// the Send (Send with SE).
//
// Only a connection that negotiated mpa.ExtImmediate carries them: PostSend
// refuses the requests toward any other peer, and an Immediate Data message
// from a peer that did not negotiate it is an unexpected opcode.

// sendWriteImmediate sends the Immediate Data message of an RDMA Write with
// Immediate Data, after its Write.
func (qp *QP) sendWriteImmediate(w *sendWQE) error {
	op := rdmap.OpImmediate
	if w.flags&ibv.FlagSolicited != 0 {
		op = rdmap.OpImmediateSE
	}
	return qp.sendImmediate(op, rdmap.Immediate{Data: w.imm})
}

// sendSendImmediate sends the Immediate Data message of a Send with
// Immediate Data, before its Send.
func (qp *QP) sendSendImmediate(w *sendWQE) error {
	return qp.sendImmediate(rdmap.OpImmediate, rdmap.Immediate{Data: w.imm, Flags: rdmap.ImmSendFollows})
}

// sendImmediate sends one Immediate Data message (QN 0, the next Send MSN).
func (qp *QP) sendImmediate(op rdmap.Opcode, m rdmap.Immediate) error {
	if qp.aborted() {
		return errAborted
	}
	var body [rdmap.ImmediateDataLen]byte
	m.Marshal(body[:])
	msn := qp.sendMSN
	qp.sendMSN++
	if err := qp.sendUntaggedControl(op, ddp.QNSend, msn, body[:]); err != nil {
		return err
	}
	qp.stats.ImmediatesTx.Add(1)
	return nil
}

// rxImmediate is the handling of the two Immediate Data opcodes.
var rxImmediate = rxOp{hdr: rdmap.ImmediateDataLen, begin: (*rxState).beginImmediate, end: (*rxState).endImmediate}

// beginImmediate checks an Immediate Data message: negotiated, the next
// MSN of QN 0, one segment of exactly its 8 octets, not inside a Send.
func (r *rxState) beginImmediate() error {
	if !r.negotiated(r.op) {
		return r.fail(rdmap.TermRDMAPUnexpectedOp, 0, fmt.Errorf("%v on a connection that did not negotiate RFC 7306 Immediate Data", r.op))
	}
	if err := r.checkMSN(r.op.String(), r.sendMSN); err != nil {
		return err
	}
	h := &r.h
	switch {
	case r.sendActive:
		return r.fail(rdmap.TermDDPInvalidMO, ibv.WCLocQPOpErr, fmt.Errorf("%v inside Send MSN %d", r.op, h.MSN))
	case h.MO != 0 || !h.Last:
		return r.fail(rdmap.TermDDPInvalidMO, 0, fmt.Errorf("%v with MO %d, last=%v", r.op, h.MO, h.Last))
	case r.payload != 0:
		return r.fail(rdmap.TermDDPTooLong, 0, fmt.Errorf("%v of %d octets, %d past its %d octets of Immediate Data", r.op, rdmap.ImmediateDataLen+r.payload, r.payload, rdmap.ImmediateDataLen))
	}
	return nil
}

// endImmediate delivers an Immediate Data message: held for the Send that
// follows it, or completing the receive at the head of the receive queue.
func (r *rxState) endImmediate() error {
	qp := r.qp
	var m rdmap.Immediate
	if err := m.Unmarshal(r.hdr[ddp.UntaggedHeaderLen:r.need]); err != nil {
		return r.fail(rdmap.TermDDPLocalCatastrophic, 0, err)
	}
	r.sendMSN++
	qp.stats.ImmediatesRx.Add(1)
	if m.SendFollows() {
		r.immPending, r.imm = true, m.Data
		return nil
	}
	if err := r.takeRecv(); err != nil {
		return err
	}
	n := r.lastWrite
	r.lastWrite = 0
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.state == ibv.QPErr {
		return errAborted
	}
	wc := qp.recvWCLocked(ibv.WCSuccess, uint32(n))
	wc.Opcode, wc.Flags, wc.ImmData = ibv.WCRecvRDMAWithImm, ibv.WCWithImm, m.Data
	qp.pushRecvLocked(r.op.Solicited())
	return nil
}

// takeRecv makes sure a receive is posted for the untagged message that
// starts (a Send, an Immediate Data message) to take, asking the refill for
// one, or fails with DDP's "no buffer".
func (r *rxState) takeRecv() error {
	qp := r.qp
	if qp.srq != nil {
		qp.mu.Lock()
		empty := qp.rqHead == qp.rqTail
		qp.mu.Unlock()
		if empty {
			qp.takeSRQ()
		}
	}
	qp.mu.Lock()
	if qp.rqHead == qp.rqTail && qp.refill != nil {
		refill := qp.refill
		qp.mu.Unlock()
		refill()
		qp.mu.Lock()
	}
	empty, inErr := qp.rqHead == qp.rqTail, qp.state == ibv.QPErr
	qp.mu.Unlock()
	switch {
	case inErr:
		return errAborted
	case empty:
		qp.stats.RecvNoBuffer.Add(1)
		return r.fail(rdmap.TermDDPNoBuffer, 0, fmt.Errorf("%v MSN %d with no receive posted", r.op.String(), r.h.MSN))
	}
	return nil
}

// checkImmPending checks that the message after the Immediate Data of a
// Send with Immediate Data is that Send (a Terminate always may come).
func (r *rxState) checkImmPending(op rdmap.Opcode) error {
	if !r.immPending || op == rdmap.OpSend || op == rdmap.OpSendSE || op == rdmap.OpTerminate {
		return nil
	}
	return r.fail(rdmap.TermRDMAPUnexpectedOp, 0, fmt.Errorf("%v after the Immediate Data of a Send with Immediate Data", op))
}
