package mpa

import (
	"encoding/binary"
	"sync"
)

// PayloadReader gives access to a TCP segment's payload: ReadPayload copies
// the bytes at offset off into p and returns how many it copied.
// netstack.Segment implements it without copying the packet.
type PayloadReader interface {
	ReadPayload(p []byte, off int) int
}

// Alignment is the classification of one data-bearing TCP segment of an
// MPA connection.
type Alignment struct {
	// Known is false when the segment could not be classified: it carries
	// (part of) the MPA Request or Reply, the stream start is not known
	// yet, or the Aligner is not configured.
	Known bool
	// Aligned is true when the segment starts with an FPDU (or a Marker
	// then an FPDU) and holds whole FPDUs only.
	Aligned bool
	// FPDUs is the number of whole FPDUs the segment holds.
	FPDUs int
	// SplitOff is, for a segment that is not aligned, the offset in the
	// segment where the FPDU that does not end in it begins, or -1 when
	// the segment begins inside an FPDU.
	SplitOff int
	// SplitBy is how many octets of that FPDU lie beyond the segment's end
	// (0 when unknown: the segment begins inside an FPDU, or the FPDU's
	// header itself is cut).
	SplitBy int
	// Beyond is true when the segment starts beyond the in-order edge:
	// octets in front of it have not been seen yet (it arrived out of
	// order, or ahead of a lost segment).
	Beyond bool
}

// Aligner classifies the TCP segments of one direction of an MPA
// connection by FPDU alignment, from the sequence numbers and the few
// header octets of each FPDU (read in place through a PayloadReader). It
// learns where the first FPDU starts from the MPA Request or Reply it sees
// at the start of the stream and must be told, once negotiation is done,
// whether Markers are used in this direction (Configure).
//
// It follows FPDU boundaries along the in-order stream, so segments that
// are sent again (retransmitted, duplicated) or arrive out of order are
// classified from remembered boundaries, or else by reading the segment
// itself as a run of FPDUs. It is safe for concurrent use.
type Aligner struct {
	mu         sync.Mutex
	base       uint32 // sequence number of stream offset 0 (first FPDU)
	baseKnown  bool
	configured bool
	markers    bool
	// next is the sequence number of the next FPDU start at or beyond the
	// in-order edge, valid when synced.
	next   uint32
	synced bool
	starts [64]uint32 // recent FPDU starts, a ring
	nstart int
	lenBuf [2]byte // readLen's buffer (a local would escape to the heap)
	// edge is the in-order edge: every octet from base to edge was seen.
	// ahead holds ranges seen beyond it (a few; more are forgotten, which
	// only makes the edge lag until the data is seen again).
	edge   uint32
	ahead  [8]seqRange
	nahead int
}

// seqRange is the sequence numbers [from, to).
type seqRange struct{ from, to uint32 }

// Configure tells the Aligner whether Markers are sent in its direction.
// Segments are classified from then on.
func (a *Aligner) Configure(markers bool) {
	a.mu.Lock()
	a.markers, a.configured = markers, true
	a.mu.Unlock()
}

// SetStart sets the sequence number of the first FPDU directly (when it is
// known from elsewhere than the MPA frame).
func (a *Aligner) SetStart(seq uint32) {
	a.mu.Lock()
	a.setStartLocked(seq)
	a.mu.Unlock()
}

func (a *Aligner) setStartLocked(seq uint32) {
	a.base, a.baseKnown = seq, true
	a.next, a.synced = seq, true
	a.edge, a.nahead = seq, 0
}

// seen records that the octets [seq, end) arrived and reports whether they
// start beyond the in-order edge.
func (a *Aligner) seen(seq, end uint32) (beyond bool) {
	if seqLT(a.edge, seq) {
		a.addAhead(seq, end)
		return true
	}
	if !seqLT(a.edge, end) {
		return false
	}
	a.edge = end
	// Ranges seen earlier may now join the edge.
	for merged := true; merged && a.nahead > 0; {
		merged = false
		for i := 0; i < a.nahead; i++ {
			r := a.ahead[i]
			if seqLT(a.edge, r.from) {
				continue
			}
			if seqLT(a.edge, r.to) {
				a.edge = r.to
			}
			a.nahead--
			a.ahead[i] = a.ahead[a.nahead]
			i--
			merged = true
		}
	}
	return false
}

// addAhead remembers [seq, end) beyond the edge, joining it to a range it
// touches; when all slots are taken it replaces the farthest range.
func (a *Aligner) addAhead(seq, end uint32) {
	for i := 0; i < a.nahead; i++ {
		r := &a.ahead[i]
		if seqLT(end, r.from) || seqLT(r.to, seq) {
			continue
		}
		if seqLT(seq, r.from) {
			r.from = seq
		}
		if seqLT(r.to, end) {
			r.to = end
		}
		return
	}
	if a.nahead < len(a.ahead) {
		a.ahead[a.nahead] = seqRange{seq, end}
		a.nahead++
		return
	}
	far := 0
	for i := range a.ahead {
		if seqLT(a.ahead[far].from, a.ahead[i].from) {
			far = i
		}
	}
	if seqLT(seq, a.ahead[far].from) {
		a.ahead[far] = seqRange{seq, end}
	}
}

// seqLT reports a < b in sequence space.
func seqLT(a, b uint32) bool { return int32(a-b) < 0 }

// Classify classifies the data segment with sequence number seq and n
// payload octets, whose payload r reads.
func (a *Aligner) Classify(seq uint32, n int, r PayloadReader) Alignment {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ClassifyLocked(seq, n, r)
}

// Lock locks a for a run of ClassifyLocked calls (the wire segments of
// one super-segment), so that the run pays for one lock, not one each.
func (a *Aligner) Lock() { a.mu.Lock() }

// Unlock ends what Lock began.
func (a *Aligner) Unlock() { a.mu.Unlock() }

// ClassifyLocked is Classify for a caller that holds the lock (Lock).
func (a *Aligner) ClassifyLocked(seq uint32, n int, r PayloadReader) Alignment {
	if n <= 0 {
		return Alignment{}
	}
	if !a.baseKnown {
		// The first data segment of the direction starts with the MPA
		// Request or Reply.
		var hdr [FrameHeaderLen]byte
		if r.ReadPayload(hdr[:], 0) == FrameHeaderLen {
			if k := string(hdr[:16]); k == keyReq || k == keyRep {
				a.setStartLocked(seq + FrameHeaderLen + uint32(binary.BigEndian.Uint16(hdr[18:20])))
			}
		}
		return Alignment{}
	}
	if !a.configured || seqLT(seq, a.base) {
		return Alignment{}
	}
	end := seq + uint32(n)
	beyond := a.seen(seq, end)
	atNext := a.synced && seq == a.next
	known := atNext || a.isStart(seq)
	var w walkResult
	a.walk(&w, seq, end, r)
	w.result.Beyond = beyond
	if !known && !w.result.Aligned {
		// Not at a known boundary and not a run of whole FPDUs: the
		// segment begins inside an FPDU.
		return Alignment{Known: true, SplitOff: -1, Beyond: beyond}
	}
	// At a known boundary, or reading as whole FPDUs (out of order, sent
	// again, or after sync was lost): remember its boundaries.
	a.remember(&w)
	switch {
	case atNext && w.nextOK:
		a.next = w.nextStart
	case atNext:
		a.synced = false // an FPDU header was cut: find the boundary again
	case !a.synced && w.result.Aligned:
		a.next, a.synced = end, true
	}
	return w.result
}

// isStart reports whether seq is a remembered FPDU start.
func (a *Aligner) isStart(seq uint32) bool {
	for i := range min(a.nstart, len(a.starts)) {
		if a.starts[i] == seq {
			return true
		}
	}
	return false
}

// walkResult is what walking a segment as a run of FPDUs found.
type walkResult struct {
	result Alignment
	// nextStart is the sequence number of the first FPDU start at or after
	// the segment's end, when known.
	nextStart uint32
	nextOK    bool
	starts    [8]uint32 // the first FPDU starts seen (for the ring)
	nstarts   int
}

// walk reads the segment [seq, end) as a run of FPDUs starting at seq into
// w, which is zero.
func (a *Aligner) walk(w *walkResult, seq, end uint32, r PayloadReader) {
	w.result = Alignment{Known: true}
	p := seq
	for {
		if p == end {
			w.result.Aligned = true
			w.nextStart, w.nextOK = p, true
			return
		}
		start := p
		if a.markers && (p-a.base)%MarkerInterval == 0 {
			p += MarkerLen
			if seqLT(end, p) || p == end {
				// A Marker ends the segment: the next FPDU starts after
				// it.
				w.result.Aligned = p == end
				w.nextStart, w.nextOK = p, true
				return
			}
		}
		l, ok := a.readLen(p, seq, end, r)
		if !ok {
			w.result.SplitOff = int(start - seq)
			return
		}
		framed := ulpduLenLen + l + padLen(l) + crcLen
		wire := framed
		if a.markers {
			wire += MarkerLen * markersIn(uint64(p-a.base), framed)
		}
		fpduEnd := p + uint32(wire)
		if seqLT(end, fpduEnd) {
			w.result.SplitOff = int(start - seq)
			w.result.SplitBy = int(fpduEnd - end)
			w.nextStart, w.nextOK = fpduEnd, true
			return
		}
		if w.nstarts < len(w.starts) {
			w.starts[w.nstarts] = start
			w.nstarts++
		}
		w.result.FPDUs++
		p = fpduEnd
	}
}

// readLen reads the ULPDU_Length field at sequence number p (skipping a
// Marker between its two octets), or ok=false if it is not inside [seq,
// end).
func (a *Aligner) readLen(p, seq, end uint32, r PayloadReader) (int, bool) {
	b := &a.lenBuf
	if !a.markers && seqLT(p+1, end) {
		// Both octets in the segment, no Marker between: one read.
		if r.ReadPayload(b[:], int(p-seq)) != 2 {
			return 0, false
		}
		return int(binary.BigEndian.Uint16(b[:])), true
	}
	for i := range 2 {
		if a.markers && (p-a.base)%MarkerInterval == 0 {
			p += MarkerLen
		}
		if !seqLT(p, end) {
			return 0, false
		}
		if r.ReadPayload(b[i:i+1], int(p-seq)) != 1 {
			return 0, false
		}
		p++
	}
	return int(binary.BigEndian.Uint16(b[:])), true
}

// remember records the FPDU starts of a walk and the boundary after it.
func (a *Aligner) remember(w *walkResult) {
	for i := range w.nstarts {
		a.addStart(w.starts[i])
	}
	if w.nextOK {
		a.addStart(w.nextStart)
	}
}

func (a *Aligner) addStart(seq uint32) {
	a.starts[a.nstart%len(a.starts)] = seq
	a.nstart++
}
