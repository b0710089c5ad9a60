package netstack

import (
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Retransmissions on the FPDU grid. gVisor retransmits its own segment
// objects, and with segmentation offload one of them may hold several
// aligned writes joined (a short FPDU ending one write, then the next
// write's FPDUs). To retransmit, gVisor cuts such a segment one MSS from
// its start (fast retransmit, SACK recovery, and after a timeout with a
// congestion window of one segment), and every piece after the first
// starts where the last was cut: inside an FPDU, on a grid of its own. So
// the link keeps, by reference, the payload gVisor handed it as new data
// until the peer acknowledges it (an RNIC's retransmission buffer), and
// sends a retransmission again along the FPDU grid the writes recorded
// (writeEnds): the FPDUs that start inside what gVisor retransmits, each
// whole, packed into wire segments as first sent (cutRuns). An FPDU that
// starts before the retransmitted range went with the piece that held its
// start; only when no FPDU starts inside the range is the one holding its
// first octet sent. An FPDU not yet sent whole (a held tail) is left to
// the hold. To TCP the peer simply acknowledges what it received.

// sentStore keeps references to the packets that carried a flow's new data
// (in sequence order, contiguous) until the peer acknowledges them.
type sentStore struct {
	used atomic.Bool // the flow records aligned writes (set once)
	mu   sync.Mutex
	pkts []keptPkt // ascending; from head; guarded by mu
	head int       // guarded by mu
	end  uint32    // the end of the data kept; guarded by mu
	ok   bool      // end is set; guarded by mu
	gone bool      // released for good (the flow is gone); guarded by mu
}

// add keeps pkt, which carries [seq, seq+n), when it extends the data
// kept (new data), and reports whether it did.
func (s *sentStore) add(seq uint32, n int, pkt *stack.PacketBuffer) bool {
	end := seq + uint32(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ok && int32(end-s.end) <= 0 {
		return false
	}
	if s.gone {
		return true // new data, not kept: nothing releases it any more
	}
	if s.head > 0 && s.head >= len(s.pkts)/2 {
		k := copy(s.pkts, s.pkts[s.head:])
		clear(s.pkts[k:])
		s.pkts = s.pkts[:k]
		s.head = 0
	}
	s.pkts = append(s.pkts, keptPkt{seq: seq, end: end, pkt: pkt.IncRef()})
	s.end, s.ok = end, true
	return true
}

// edge returns the end of the data kept.
func (s *sentStore) edge() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.end
}

// acked releases the packets the cumulative ACK ack covers.
func (s *sentStore) acked(ack uint32) {
	if !s.used.Load() {
		return
	}
	s.mu.Lock()
	for s.head < len(s.pkts) && int32(s.pkts[s.head].end-ack) <= 0 {
		s.pkts[s.head].pkt.DecRef()
		s.pkts[s.head] = keptPkt{}
		s.head++
	}
	if s.head == len(s.pkts) {
		s.pkts, s.head = s.pkts[:0], 0
	}
	s.mu.Unlock()
}

// release drops every packet (the flow is gone).
func (s *sentStore) release() {
	s.mu.Lock()
	for _, p := range s.pkts[s.head:] {
		p.pkt.DecRef()
	}
	clear(s.pkts)
	s.pkts, s.head, s.gone = nil, 0, true
	s.mu.Unlock()
}

// slice returns the kept payload [x, y), sharing the packets' views, or
// false when part of it is not kept.
func (s *sentStore) slice(x, y uint32) (buffer.Buffer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out buffer.Buffer
	pos := x
	for _, p := range s.pkts[s.head:] {
		if int32(p.end-pos) <= 0 {
			continue
		}
		if int32(p.seq-pos) > 0 {
			break // a gap (not kept)
		}
		to := y
		if int32(p.end-to) < 0 {
			to = p.end
		}
		b := p.pkt.Data().ToBuffer()
		b.TrimFront(int64(pos - p.seq))
		b.Truncate(int64(to - pos))
		out.Merge(&b)
		pos = to
		if pos == y {
			return out, true
		}
	}
	out.Release()
	return buffer.Buffer{}, false
}

// fpduAt returns the FPDU that sequence number p lies in on the grid of
// the aligned writes (each cut every mss octets from its start): its start
// (p itself when p is a boundary) and its end. ok is false when the write
// holding p is not known. At the end of the last write known, end is p.
func (w *writeEnds) fpduAt(p uint32, mss int) (start, end uint32, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fpduAtLocked(p, mss)
}

// fpduAtLocked is fpduAt with w.mu held.
func (w *writeEnds) fpduAtLocked(p uint32, mss int) (start, end uint32, ok bool) {
	ws, wsOK := w.last, w.lastOK
	for _, e := range w.ends[w.head:] {
		if int32(e-p) <= 0 {
			ws, wsOK = e, true
			continue
		}
		if !wsOK || int32(p-ws) < 0 {
			return 0, 0, false
		}
		start = ws + (p-ws)/uint32(mss)*uint32(mss)
		end = start + uint32(mss)
		if int32(end-e) > 0 {
			end = e
		}
		return start, end, true
	}
	if wsOK && ws == p {
		return p, p, true // the end of the last write: a boundary
	}
	return 0, 0, false
}

// resend sends the retransmission pkt of [seq, seq+plen) again along the
// FPDU grid (see the top of this file) and reports whether it could; if
// not, the caller sends pkt as it is. The link reads the peer's ACKs on
// another goroutine, and what they cover is forgotten (the grid behind
// it, the octets kept): when the ACK advanced while resend looked, it
// looks again. f.hold.mu is held.
func (e *hookEndpoint) resend(f *flow, pkt *stack.PacketBuffer, seq uint32, plen, mss int) (bool, tcpip.Error) {
	why := 0
	for range 3 {
		ack, _ := f.peerAck()
		done, w, err := e.resendOnce(f, pkt, seq, plen, mss)
		if done {
			return true, err
		}
		why = w
		if now, _ := f.peerAck(); now == ack {
			break
		}
	}
	e.s.resendAsIs[why].Add(1)
	return false, nil
}

// resendHow is what one try of resend does with a retransmission.
type resendHow int

const (
	resendKept  resendHow = iota // send [x, y) from the octets kept
	resendAcked                  // all acknowledged: a segment without data
	resendProbe                  // only held octets: a window probe
	resendAsIs                   // leave it as TCP cut it (why says why)
)

// resendPlan is where a retransmission goes on the grid.
type resendPlan struct {
	how        resendHow
	why        int // resendAsIs: 0 the grid is not known, 1 the FPDU is not sent whole
	x, y       uint32
	start, end uint32 // the FPDU holding x
	ends       []int  // the writes ending inside (x, y), offsets from x
}

// planResend works out where the retransmission [a, b) goes on the grid.
// It reads the peer's ACK and the grid under one hold of the grid's lock,
// so that an ACK the link reads meanwhile cannot take away part of the
// grid it looked at. f.hold.mu is held.
func (f *flow) planResend(a, b uint32, mss int, scratch []int) resendPlan {
	w := &f.writeEnds
	w.mu.Lock()
	defer w.mu.Unlock()
	ack, ackOK := f.peerAck()
	if ackOK && int32(a-ack) < 0 {
		if int32(b-ack) <= 0 {
			// All acknowledged (gVisor has not yet seen the ACK, or
			// this is a zero window probe, an acknowledged octet
			// sent again).
			return resendPlan{how: resendAcked}
		}
		a = ack
	}
	s0, e0, ok0 := w.fpduAtLocked(a, mss)
	s1, e1, ok1 := w.fpduAtLocked(b, mss)
	if !ok0 || !ok1 {
		return resendPlan{how: resendAsIs, why: 0}
	}
	// Sent whole: what was kept, up to a held tail.
	sent := f.kept.edge()
	if f.hold.pkt != nil {
		sent = f.hold.seq
	}
	x, y := a, b
	switch {
	case s0 != a && ackOK && a == ack:
		// The peer has that FPDU's start and waits for its rest (the
		// start left cut from it: a held start sent alone): the whole
		// FPDU again, or, if its start is no longer kept, the rest.
		x = s0
	case s0 != a:
		x = e0 // that FPDU went with the piece holding its start
	}
	switch {
	case s1 != b && int32(e1-sent) <= 0:
		y = e1
	case s1 != b:
		y = s1 // the FPDU's rest has not been sent
	}
	if int32(y-x) <= 0 {
		// No FPDU starts in [a, b): the one holding a, if sent whole.
		if x, y = s0, e0; int32(y-sent) > 0 {
			if f.hold.pkt != nil && s0 == f.hold.seq {
				// It is the held one: it never left. Ask the
				// peer for the window its rest waits for.
				return resendPlan{how: resendProbe}
			}
			return resendPlan{how: resendAsIs, why: 1}
		}
	}
	// The writes ending inside, from s0 (x may move back to a): the
	// caller takes those past its x.
	_, ends, _, _ := w.aroundLocked(s0, int(y-s0), scratch)
	return resendPlan{how: resendKept, x: x, y: y, start: s0, end: e0, ends: ends}
}

// resendOnce is one try of resend; when it cannot, why says why: 0 the
// grid is not known, 1 the FPDU is not sent whole, 2 its octets are not
// kept.
func (e *hookEndpoint) resendOnce(f *flow, pkt *stack.PacketBuffer, seq uint32, plen, mss int) (done bool, why int, err tcpip.Error) {
	a := seq
	var scratch [32]int
	p := f.planResend(a, seq+uint32(plen), mss, scratch[:0])
	switch p.how {
	case resendAcked:
		// No data, which elicits the same ACK.
		r := runPacket(pkt, 0, 0, 0)
		defer r.DecRef()
		return true, 0, e.emit(r)
	case resendProbe:
		return true, 0, e.probeWindow(f)
	case resendAsIs:
		return false, p.why, nil
	}
	x := p.x
	payload, ok := f.kept.slice(x, p.y)
	if !ok && int32(a-x) > 0 {
		x = a
		payload, ok = f.kept.slice(x, p.y)
	}
	if !ok {
		return false, 2, nil
	}
	lead := 0
	if int32(x-p.start) > 0 && int32(p.end-x) > 0 {
		lead = int(p.end - x) // an FPDU's rest, then the grid
	}
	// The ends, as offsets from x.
	ends := p.ends[:0]
	for _, o := range p.ends {
		if d := o - int(x-p.start); d > 0 {
			ends = append(ends, d)
		}
	}
	e.s.resent.Add(1)
	return true, 0, e.sendKept(pkt, payload, x, lead, mss, ends)
}

// sendKept sends payload, the kept octets from x, behind a copy of pkt's
// headers, in runs along the FPDU grid (lead: octets to the first FPDU
// boundary; ends: the offsets of the writes ending inside). It takes
// payload.
func (e *hookEndpoint) sendKept(pkt *stack.PacketBuffer, payload buffer.Buffer, x uint32, lead, mss int, ends []int) tcpip.Error {
	n := int(payload.Size())
	base := withHeaders(pkt, payload)
	defer base.DecRef()
	header.TCP(base.TransportHeader().Slice()).SetSequenceNumber(x)
	off, segs := 0, 0
	for _, end := range cutRuns(n, mss, lead, MaxAlignedWrite, ends, ends[len(ends):]) {
		r := runPacket(base, off, end, segs)
		err := e.emit(r)
		r.DecRef()
		if err != nil {
			return err
		}
		segs += (end - off + mss - 1) / mss
		off = end
	}
	return nil
}

// Resent counts the retransmissions the stack sent again along the FPDU
// grid (see resend.go).
func (s *Stack) Resent() uint64 { return s.resent.Load() }
