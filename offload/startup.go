package offload

import (
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// The start of a responder's connection: RFC 5044 §7.1.2 (rule 4) has a
// Responder-mode MPA "receive and validate at least one FPDU before
// sending any FPDUs or Markers", so that the initiator's receive path owns
// the stream before anything but the Reply comes: an initiator reads the
// Reply with its connection manager and hands the socket over only then.
// Linux siw's initiator shows why (siw_recv_mpa_rr): it reads the Reply's
// private data with room for 4 octets more, and an FPDU already behind
// the Reply is "peer sent extra data", EPROTO, the connection reset.
//
// In peer-to-peer mode (RFC 6581) the initiator's first FPDU is its RTR:
// the responder's QP stays in RTR until it arrives (rtrArrived), which
// holds every send. Without it the first FPDU is the initiator
// application's, which a server that speaks first never gets: the QP
// enters RTS at once (the server sees ESTABLISHED and may post), but its
// send queue is held (startupHold) until the initiator's first FPDU has
// been received and validated (firstFPDU). The work waits; it does not
// fail.
//
// A strict hold would deadlock such a server against an initiator that
// never offers peer-to-peer mode (Linux siw's default), where two siws
// work because siw's responder does not hold and its timing usually wins
// the race. So the hold is bounded (Config.StartupHold): it also ends
// once TCP has seen the Reply acknowledged and StartupHold has passed
// after that. The acknowledgement says the Reply is in the initiator's
// socket; the time after it is for the initiator's connection manager to
// read it and hand the socket to its receive path, which siw does from a
// work queue woken by the Reply's arrival. A siwtun initiator offers
// peer-to-peer mode to every peer (DefaultConfig), so between two
// siwtuns the hold ends with the RTR, without any timer.

// beginStartupHold holds a responder's send queue after its MPA Reply
// (without peer-to-peer mode: in it the RTR state holds it). It is called
// by start with qp.mu held, once qp.done is set.
func (qp *QP) beginStartupHold(conn *netstack.Conn) {
	qp.startupHold = true
	qp.rx.awaitFirst = true
	if hold := qp.dev.cfg.StartupHold; hold >= 0 {
		go qp.boundStartupHold(conn, hold, qp.done)
	}
}

// boundStartupHold ends the startup hold when the Reply has been
// acknowledged and hold has passed, unless the initiator's first FPDU
// ended it before or the connection ended (done).
func (qp *QP) boundStartupHold(conn *netstack.Conn, hold time.Duration, done <-chan struct{}) {
	// Only the Reply is in flight: the send queue is held. A Reply not
	// acknowledged within the connect timeout belongs to an initiator
	// that has given up (siw waits 10 s for it); the hold ends anyway.
	conn.WaitAcked(qp.dev.cfg.ConnectTimeout)
	t := time.NewTimer(hold)
	defer t.Stop()
	select {
	case <-t.C:
		qp.endStartupHold(true)
	case <-done:
	}
}

// endStartupHold lets the held send queue go: the initiator's first FPDU
// arrived (bounded false) or the bound passed (bounded true).
func (qp *QP) endStartupHold(bounded bool) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if !qp.startupHold {
		return
	}
	qp.startupHold = false
	if bounded && qp.sqNext < qp.sqTail {
		qp.stats.StartupHoldsBounded.Add(1)
	}
	qp.txCond.Broadcast()
}

// firstFPDU is called by the receive path for every validated FPDU while
// the responder waits for the initiator's first one.
func (r *rxState) firstFPDU() {
	r.awaitFirst = false
	r.qp.endStartupHold(false)
}

// peerToPeer is the RFC 6581 peer-to-peer set-up of a started connection:
// the QP state it starts in, whether it is established at once, and the
// RTR type a responder waits for.
func (qp *QP) peerToPeer(p *mpa.Params, initiator bool) (await mpa.RTR, established bool) {
	switch {
	case p.P2P && initiator:
		qp.p2pRTR = p.RTR
		if p.RTR == mpa.RTRRead {
			qp.orq = append(qp.orq, orqEntry{sq: rtrSlot, sinkSTag: rtrSTag})
		}
		qp.state = ibv.QPRTS
	case p.P2P:
		qp.state = ibv.QPRTR
		return p.RTR, false
	default:
		qp.state = ibv.QPRTS
	}
	return 0, true
}
