package offload

import (
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// The end of a queue pair's connection: its Terminate first, then the FIN.

// termFlushTimeout bounds how long Disconnect waits for a queued Terminate
// to reach TCP and then the peer (the peer's window may stay shut).
const termFlushTimeout = 2 * time.Second

// awaitTerminate waits, within termFlushTimeout, until the TX goroutine has
// written the queued Terminate (termDone) and the peer has acknowledged it.
// Only then may the connection close: closing with unread received data
// (the peer still sending into an errored stream) resets the connection,
// and the reset would drop a Terminate still in the send queue.
func (qp *QP) awaitTerminate(termDone <-chan struct{}, conn *netstack.Conn) {
	deadline := time.Now().Add(termFlushTimeout)
	t := time.NewTimer(termFlushTimeout)
	defer t.Stop()
	select {
	case <-termDone:
	case <-t.C:
		qp.dev.logf("QP %d: Terminate not sent within %v; closing", qp.num, termFlushTimeout)
		return
	}
	if conn != nil && !conn.WaitAcked(time.Until(deadline)) {
		qp.dev.logf("QP %d: Terminate not acknowledged within %v; closing", qp.num, termFlushTimeout)
	}
}

// Disconnect ends the connection as rdma_disconnect does on iWARP: the QP
// enters ERR, outstanding work is flushed, and the TCP connection is closed
// with a FIN (Config.FINDelay later to a peer not known to be siwtun). It
// returns once the engine's goroutines have stopped.
//
// A Terminate the engine has queued goes out first (RFC 5040 §7: the
// Terminate precedes the close), however soon after the error completion
// the application disconnects or destroys the QP.
func (qp *QP) Disconnect() {
	qp.mu.Lock()
	qp.errorLocked(ibv.WCSuccess)
	qp.closing = true
	conn := qp.conn
	done := qp.done
	termDone := qp.termDone
	siwtunPeer := peerIsSiwtun(qp.params)
	qp.txCond.Broadcast()
	qp.mu.Unlock()
	switch {
	case conn == nil:
	case termDone != nil:
		qp.awaitTerminate(termDone, conn)
		conn.Close()
	case qp.dev.cfg.FINDelay > 0 && !siwtunPeer:
		if conn.CloseAfter(qp.dev.cfg.FINDelay) {
			qp.stats.FINDelays.Add(1)
		}
	default:
		conn.Close()
	}
	if done != nil {
		<-done
	}
}

// peerIsSiwtun reports whether the peer of a connection made with p said
// it is siwtun: as responder in its Reply (Ready), as initiator by the
// extension block of its Request (which the negotiated Ext reflects).
func peerIsSiwtun(p mpa.Params) bool { return p.PeerReady || p.Ext != 0 }

// Destroy disconnects the queue pair and removes it from its device; the
// type 2 memory windows bound to it are invalidated.
func (qp *QP) Destroy() error {
	qp.Disconnect()
	if qp.dev.removeQP(qp) {
		if qp.srq != nil {
			qp.srq.detach()
		}
		qp.dev.regions.invalidateQP(qp.num)
	}
	return nil
}
