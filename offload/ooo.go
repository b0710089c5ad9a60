package offload

import (
	"sync"
	"sync/atomic"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// oooPlacer places tagged FPDUs that arrive out of order, as an RNIC does:
// when a segment arrives with a gap in front of it (a segment before it
// was lost or reordered) and lies inside the receive window, the whole
// FPDUs it carries are found (by alignment with CRC on, or by a Marker),
// their CRC checked, and the payload of RDMA Writes and Read Responses
// placed into the target memory at once, after the same STag, protection
// domain, access and bounds checks as in order. Nothing else happens out of
// order: when TCP later delivers the same octets in order, the receive
// path checks and places them again (the same octets, so placement is
// idempotent) and does everything else — MSNs, Read progress, completions,
// counters, Terminates — in stream order. An FPDU that fails a check here
// is simply not placed.
//
// Safety rules:
//   - Placement is only into STags valid at the moment of placement, as on
//     an RNIC. A Send with Invalidate still in the gap does not stop a
//     later Write from being placed into the STag it invalidates; the
//     in-order path then Terminates that Write as usual. The invalidation
//     itself takes the placement lock, so no out-of-order copy lands after
//     the application can have seen it.
//   - An FPDU is placed only while the in-order receiver has not begun it
//     (rxAt, checked under the placement lock): octets the receiver has
//     passed may belong to a buffer the application already took back
//     after a later completion, and a duplicate of them must not be written
//     again.
//   - Region memory stays valid as for the in-order path: the verbs
//     socket's daemon unmaps a deregistered region's memory only once no
//     QP of its protection domain runs, and placement stops (stopped, under
//     the placement lock) when the QP's receive goroutine ends.
//
// One oooPlacer serves one connection of a QP.
type oooPlacer struct {
	qp      *QP
	conn    *netstack.Conn
	base    uint32 // sequence number of stream offset 0 (the first FPDU)
	crc     bool
	markers bool

	// rxAt is 1<<32 | the stream offset (32 bits) of the FPDU the
	// in-order receiver began last; 0 before the first.
	rxAt atomic.Uint64

	// mu is the placement lock: every copy of payload into tagged memory,
	// in order or not, and every remote invalidation happen under it.
	mu      sync.Mutex
	stopped bool // guarded by mu: the receive goroutine ended

	// scratchMu guards the buffers of the out-of-order path (the hook may
	// run on more than one goroutine).
	scratchMu sync.Mutex
	seg       []byte
	ulpdu     []byte
	found     []mpa.WholeFPDU
}

func newPlacer(qp *QP, conn *netstack.Conn, base uint32, crc, markers bool) *oooPlacer {
	return &oooPlacer{qp: qp, conn: conn, base: base, crc: crc, markers: markers}
}

// begin records that the in-order receiver began the FPDU at stream
// offset off.
func (pl *oooPlacer) begin(off uint64) { pl.rxAt.Store(1<<32 | uint64(uint32(off))) }

// stop ends placement for good; the receive goroutine calls it as it ends.
func (pl *oooPlacer) stop() {
	pl.mu.Lock()
	pl.stopped = true
	pl.mu.Unlock()
}

// aheadLocked reports whether the FPDU at stream offset at is still ahead
// of the in-order receiver.
func (pl *oooPlacer) aheadLocked(at uint32) bool {
	v := pl.rxAt.Load()
	return v == 0 || int32(at-uint32(v)) > 0
}

// segment looks at an inbound data segment that arrived beyond the
// in-order edge and places the tagged FPDUs it holds whole.
func (pl *oooPlacer) segment(seg *netstack.Segment) {
	qp := pl.qp
	if qp.inErr.Load() {
		return
	}
	ack, edge, ok := pl.conn.ReceiveWindow()
	end := seg.Seq + uint32(seg.Len)
	if !ok || int32(seg.Seq-ack) <= 0 || int32(end-edge) > 0 {
		return // not beyond what we acknowledged, or outside the window
	}
	qp.mu.Lock()
	rts := qp.state == ibv.QPRTS
	qp.mu.Unlock()
	if !rts {
		return
	}
	pl.scratchMu.Lock()
	defer pl.scratchMu.Unlock()
	if cap(pl.seg) < seg.Len {
		pl.seg = make([]byte, seg.Len)
	}
	buf := pl.seg[:seg.Len]
	if seg.ReadPayload(buf, 0) != seg.Len {
		return
	}
	pos := seg.Seq - pl.base
	pl.found = mpa.FindFPDUs(pl.found[:0], buf, pos, pl.markers)
	for _, f := range pl.found {
		if !f.ByMarker && !pl.crc {
			continue // a boundary guessed from alignment needs a CRC to confirm it
		}
		u, ok := f.ULPDU(pl.ulpdu[:0], buf, pos, pl.markers, pl.crc)
		pl.ulpdu = u[:0]
		if ok {
			pl.place(u, pos+uint32(f.Off))
		}
	}
}

// place checks the ULPDU of the whole FPDU at stream offset at and, if it
// is a tagged RDMA Write or Read Response that passes every check, copies
// its payload into place.
func (pl *oooPlacer) place(u []byte, at uint32) {
	if len(u) == 0 || ddp.HeaderLen(u[0]) != ddp.TaggedHeaderLen {
		return // untagged: Send, Read Request, Terminate stay in order
	}
	var h ddp.Header
	n, err := h.Unmarshal(u)
	if err != nil || !h.Tagged {
		return
	}
	op, _, err := checkHeader(&h)
	payload := u[n:]
	if err != nil || len(payload) == 0 {
		return
	}
	qp := pl.qp
	pl.mu.Lock()
	if pl.stopped || qp.inErr.Load() || !pl.aheadLocked(at) {
		pl.mu.Unlock()
		return
	}
	var dst []byte
	var reg *Region
	switch op {
	case rdmap.OpWrite:
		reg, dst, _, err = qp.writeSink(&h, len(payload))
	case rdmap.OpReadResponse:
		dst = pl.readSinkLocked(&h, len(payload))
	}
	if err != nil || dst == nil {
		pl.mu.Unlock()
		return
	}
	if reg != nil {
		if _, ok := reg.placeInto(dst, payload); !ok {
			pl.mu.Unlock()
			return
		}
	} else {
		copy(dst, payload)
	}
	pl.mu.Unlock()
	qp.stats.PlacedOOOFPDUs.Add(1)
	qp.stats.PlacedOOOBytes.Add(uint64(len(payload)))
	pl.tap(op, &h, len(payload))
}

// readSinkLocked returns where a Read Response of n payload octets goes:
// into the sink of the outstanding Read whose sink STag and TO range it
// falls in, or nil.
func (pl *oooPlacer) readSinkLocked(h *ddp.Header, n int) []byte {
	qp := pl.qp
	qp.mu.Lock()
	defer qp.mu.Unlock()
	for i := range qp.orq {
		e := &qp.orq[i]
		if e.sq == rtrSlot || e.size == 0 {
			continue
		}
		if off, _, err := readResponseSink(h, n, e.sinkSTag, e.sinkTO, e.size); err == nil {
			return e.dst[off : off+uint64(n)]
		}
	}
	return nil
}

// tap reports an out-of-order placement to the open Watches.
func (pl *oooPlacer) tap(op rdmap.Opcode, h *ddp.Header, n int) {
	qp := pl.qp
	t := &qp.dev.tap
	if !t.on.Load() {
		return
	}
	p := Placement{QP: qp.num, Op: op, STag: h.STag, TO: h.TO, Len: n, OutOfOrder: true}
	if reg, ok := qp.dev.regions.Lookup(h.STag); ok && h.TO >= reg.Addr() {
		p.Offset = h.TO - reg.Addr()
	}
	t.send(TapEvent{Place: &p})
}
