package offload

import (
	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/netstack"
)

// The engine's stamps of a round trip's anatomy (package anatomy): the
// request taken from the application (Pickup, at PostSend), taken up by
// the TX goroutine (TXStart), its FPDUs built in TCP's send buffer
// (Built), and on the other side each FPDU parsed, checked and placed
// (Placed). The stack stamps the hops in between. Stamps are keyed by
// the data's ports and the TCP sequence number of their first octet: the
// MPA stream offset from where the connection's FPDU stream starts.

// qpHops is what a QP's stamps need, fixed when its stream starts: the
// TCP sequence numbers of the first FPDU octet each way, and its ports.
type qpHops struct {
	ok               bool
	txStart, rxStart uint32
	lport, rport     uint16
}

// hopRecorder returns the recorder the engine stamps into: its stack's.
func hopRecorder(s *netstack.Stack) *anatomy.Recorder {
	if s == nil {
		return anatomy.NewRecorder() // engine unit tests without a stack
	}
	return s.Anatomy()
}

// hopNow returns the time of a stamp about to be made, or 0 while the
// recorder is off.
func (d *Device) hopNow() int64 {
	if d.hops.On() {
		return anatomy.Now()
	}
	return 0
}

// initHops records where the connection's FPDU streams start (tx and rx,
// from netstack.Conn.StreamSeqs when the stream starts).
func (qp *QP) initHops(conn *netstack.Conn, tx, rx uint32) {
	qp.hops = qpHops{ok: true, txStart: tx, rxStart: rx, lport: conn.LocalAddr().Port(), rport: conn.RemoteAddr().Port()}
}

// stampSent stamps the first write of a send request's message (a Write
// or a Send), which started at MPA stream offset pos and is now with
// TCP: when the engine took the request, when the TX goroutine took it
// up, when its FPDUs were built. The TX goroutine calls it; a message's
// later writes stamp nothing, and neither do Read Responses (the stamps
// of a Read Request, which sendSQ also takes, stay unused).
func (qp *QP) stampSent(pos uint64, f *fpduPayload) {
	t := &qp.tx
	if qp.hops.ok && qp.dev.hops.On() {
		r, h := qp.dev.hops, &qp.hops
		seq, n := h.txStart+uint32(pos), uint32(f.total)
		if t.hopPick != 0 {
			r.Stamp(anatomy.Pickup, h.lport, h.rport, seq, n, t.hopPick)
		}
		r.Stamp(anatomy.TXStart, h.lport, h.rport, seq, n, t.hopTX)
		if f.builtAt != 0 {
			r.Stamp(anatomy.Built, h.lport, h.rport, seq, n, f.builtAt)
		}
	}
	t.hopPick, t.hopTX = 0, 0
}

// stampPlaced stamps the FPDU just received whole: parsed, its CRC and
// header checked, its payload placed. The RX goroutine calls it.
func (r *rxState) stampPlaced() {
	qp := r.qp
	if !qp.hops.ok {
		return
	}
	start := r.mpa.FPDUStart()
	n := uint32(r.mpa.StreamOffset() - start)
	qp.dev.hops.Stamp(anatomy.Placed, qp.hops.rport, qp.hops.lport, qp.hops.rxStart+uint32(start), n, anatomy.Now())
}
