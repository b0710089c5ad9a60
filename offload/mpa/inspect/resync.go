package inspect

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
)

// Octets the checker never saw. A live watch that fell behind leaves out
// whole windows of segments and says so (NotObserved); the checker then
// neither takes the octets it missed for a hole in the TCP stream (which
// would flag every later segment out of order) nor walks on as if they
// were there. It skips them and picks the FPDU stream up again at the next
// FPDU boundary it can trust: one whose CRC matches (CRC on), one a Marker
// points at, or, with neither, an FPDU header whose length leads to the
// end of the segment or to another valid header.

// Unobserved is a range of one direction's sequence numbers that may have
// passed without being observed: every octet in [Seq, End) (modulo 2^32).
type Unobserved struct {
	Src, Dst netip.AddrPort
	Seq, End uint32
}

// seqRange is a range [seq, end) of sequence numbers.
type seqRange struct{ seq, end uint32 }

// maxUnseen bounds the ranges a direction keeps; past it the oldest go.
const maxUnseen = 64

// anyAhead is how far ahead of the next expected octet NotObserved's all
// makes every octet unsure.
const anyAhead = 64 << 20

// NotObserved tells the Analyzer that segments in the given ranges may have
// passed unseen (a watch's gap). all says segments of any direction may
// have: every direction's next anyAhead octets are then unsure. A segment
// that arrives later ahead of octets not seen is then out of order only if
// some of those octets lie outside every such range; if all of them may
// have passed unseen, they are counted as not observed and the FPDU stream
// is picked up again at the next boundary the checker can verify.
func (a *Analyzer) NotObserved(rs []Unobserved, all bool) {
	for _, r := range rs {
		if c := a.conns[keyOf(r.Src, r.Dst)]; c != nil {
			d := a.dirOf(r.Src, r.Dst)
			d.addUnseen(seqRange{r.Seq, r.End})
		}
	}
	if all {
		for _, c := range a.list {
			for _, d := range c.dirs {
				d.addUnseen(seqRange{d.next, d.next + anyAhead})
			}
		}
	}
}

// addUnseen records r, dropping what lies before next.
func (d *dir) addUnseen(r seqRange) {
	if !d.baseKnown || int32(r.end-r.seq) <= 0 {
		return
	}
	d.unseen = append(d.unseen, r)
	if len(d.unseen) > maxUnseen {
		d.unseen = d.unseen[len(d.unseen)-maxUnseen:]
	}
	d.trimUnseen()
}

// trimUnseen drops the ranges that end at or before next.
func (d *dir) trimUnseen() {
	keep := d.unseen[:0]
	for _, r := range d.unseen {
		if int32(r.end-d.next) > 0 {
			keep = append(keep, r)
		}
	}
	d.unseen = keep
}

// unseenCovers reports whether every octet of [from, to) lies in a range
// that may have passed unseen.
func (d *dir) unseenCovers(from, to uint32) bool {
	pos := from
	for int32(to-pos) > 0 {
		moved := false
		for _, r := range d.unseen {
			if int32(pos-r.seq) >= 0 && int32(r.end-pos) > 0 {
				pos, moved = r.end, true
			}
		}
		if !moved {
			return false
		}
	}
	return true
}

// missingBefore reports whether an octet in front of seq is known not to
// have arrived: not seen, not held, and not in a range that may have passed
// unobserved. Only then is a segment at seq out of order.
func (d *dir) missingBefore(seq uint32) bool {
	pos, i := d.next, 0
	for int32(seq-pos) > 0 {
		moved := false
		// held is sorted by sequence number and pos only grows: each
		// held segment is looked at once.
		for ; i < len(d.held) && int32(d.held[i].seg.Seq-pos) <= 0; i++ {
			if end := d.held[i].seg.Seq + uint32(len(d.held[i].seg.Payload)); int32(end-pos) > 0 {
				pos, moved = end, true
			}
		}
		for _, r := range d.unseen {
			if int32(pos-r.seq) >= 0 && int32(r.end-pos) > 0 {
				pos, moved = r.end, true
			}
		}
		if !moved {
			return true
		}
	}
	return false
}

// skipUnseen moves next over octets not observed in front of the held
// segments, as long as they may have passed unseen, and analyses what
// that lets through. It returns the Reports.
func (d *dir) skipUnseen() []Report {
	var out []Report
	for len(d.held) > 0 && d.phase != phaseLost && d.phase != phaseOther {
		to := d.held[0].seg.Seq
		if int32(to-d.next) <= 0 || !d.unseenCovers(d.next, to) {
			break
		}
		d.skip(to - d.next)
		out = append(out, d.release()...)
	}
	return out
}

// skip moves next over n octets that were not observed.
func (d *dir) skip(n uint32) {
	d.next += n
	d.sum.NotObserved += uint64(n)
	d.missed += uint64(n)
	d.trimUnseen()
	switch d.phase {
	case phaseFPDU, phaseWait:
		d.fpos += uint64(n)
		d.resync = true
	case phaseFrame:
		d.lose(fmt.Sprintf("%d octets of the MPA frame were not observed", n))
	}
}

// errProbeDone stops a probe's Receiver after the FPDU it checks.
var errProbeDone = errors.New("probe done")

// probe is the Handler of a scratch Receiver that checks one candidate
// FPDU: its ULPDU_Length, its header, its Markers and its CRC.
type probe struct {
	limit  int // the most ULPDU octets the FPDU may have
	ulpdu  int
	hdr    [ddp.UntaggedHeaderLen]byte
	nhdr   int
	ended  bool
	crcOK  bool
	badMrk bool
}

func (p *probe) BeginFPDU(n int) error {
	if n < ddp.TaggedHeaderLen || n > p.limit {
		return errProbeDone
	}
	p.ulpdu = n
	return nil
}

func (p *probe) ULPDU(b []byte) error {
	p.nhdr += copy(p.hdr[p.nhdr:], b)
	return nil
}

func (p *probe) EndFPDU(ok bool) error {
	p.ended, p.crcOK = true, ok
	return errProbeDone
}

func (p *probe) Marker(m mpa.Marker) error {
	if !m.OK {
		p.badMrk = true
		return errProbeDone
	}
	return nil
}

// plausibleHeader reports whether b starts with a DDP and RDMAP header
// siwtun or any RNIC could have sent: versions 1, reserved bits clear, an
// RDMAP opcode that exists, tagged exactly for Write and Read Response, and
// an untagged queue number that fits the opcode.
func plausibleHeader(b []byte) bool {
	var h ddp.Header
	if len(b) < 2 || len(b) < ddp.HeaderLen(b[0]) {
		return false
	}
	if _, err := h.Unmarshal(b); err != nil || h.Version != ddp.Version || h.Reserved != 0 {
		return false
	}
	ver, op := rdmap.ParseCtrl(h.ULPCtrl)
	if ver != rdmap.Version || op > rdmap.OpAtomicResponse {
		return false
	}
	tagged := op == rdmap.OpWrite || op == rdmap.OpReadResponse
	if h.Tagged != tagged {
		return false
	}
	return h.Tagged || h.QN == op.QN()
}

// checkFPDU checks the FPDU that would start at stream offset off + k,
// p being the octets from stream offset off, with at most limit octets of
// ULPDU. It reports its length, whether it is whole in p, whether its
// header is plausible, and its CRC verdict.
func (d *dir) checkFPDU(p []byte, off uint64, k, limit int) (wireLen int, whole, header, crcOK bool) {
	var pr probe
	pr.limit = limit
	var rx mpa.Receiver
	rx.Init(d.crc, d.markers, &pr)
	rx.Resume(off + uint64(k))
	rx.Write(p[k:])
	if pr.badMrk || pr.ulpdu == 0 {
		return 0, false, false, false
	}
	wireLen = mpa.FPDUWireLen(off+uint64(k), pr.ulpdu, d.markers)
	header = pr.nhdr >= 2 && plausibleHeader(pr.hdr[:pr.nhdr])
	return wireLen, pr.ended, header, pr.ended && pr.crcOK
}

// boundary finds in p, the FPDU stream octets from stream offset off, the
// first FPDU boundary the checker can trust. It returns its position in p
// and how it was verified.
func (d *dir) boundary(p []byte, off uint64) (int, string, bool) {
	try := func(k int, marker bool) (string, bool) {
		limit := len(p) - k
		if marker {
			limit = 1<<16 - 1 // the Marker vouches for it: it may go on past p
		}
		wireLen, whole, header, crcOK := d.checkFPDU(p, off, k, limit)
		switch {
		case !header:
			return "", false
		case d.crc && crcOK:
			if marker {
				return "a Marker points at it and its CRC matches", true
			}
			return "its CRC matches", true
		case d.crc && whole:
			return "", false // a CRC that does not match
		case marker:
			return "a Marker points at it", true
		case d.crc:
			return "", false // CRC on: only a CRC or a Marker is trusted
		case k+wireLen == len(p):
			return "its header is valid and its length ends the segment", true
		case whole && k+wireLen+2+ddp.TaggedHeaderLen <= len(p):
			if _, _, next, _ := d.checkFPDU(p, off, k+wireLen, 1<<16-1); next {
				return "its header is valid and its length leads to another valid header", true
			}
		}
		return "", false
	}
	for _, k := range d.markerCandidates(p, off) {
		if how, ok := try(k, true); ok {
			return k, how, true
		}
	}
	if how, ok := try(0, false); ok {
		return 0, how, true
	}
	if d.crc {
		for k := 1; k+2+ddp.TaggedHeaderLen <= len(p); k++ {
			if how, ok := try(k, false); ok {
				return k, how, true
			}
		}
	}
	return 0, "", false
}

// markerCandidates returns the positions in p of the FPDUs that the
// Markers in p point at (either reading of FPDUPTR, see package mpa).
func (d *dir) markerCandidates(p []byte, off uint64) []int {
	if !d.markers {
		return nil
	}
	var out []int
	first := (off + mpa.MarkerInterval - 1) / mpa.MarkerInterval * mpa.MarkerInterval
	for m := first; m+mpa.MarkerLen <= off+uint64(len(p)); m += mpa.MarkerInterval {
		ptr := uint64(binary.BigEndian.Uint16(p[m-off+2:]) &^ 3)
		if ptr > m {
			continue
		}
		if c := m - ptr; c >= off {
			out = append(out, int(c-off))
		}
		// A later Marker of an FPDU that began with one may count from its
		// ULPDU_Length.
		if c := m - ptr - mpa.MarkerLen; ptr+mpa.MarkerLen <= m && c%mpa.MarkerInterval == 0 && c >= off {
			out = append(out, int(c-off))
		}
	}
	return out
}

// resyncWalk is walk for a direction looking for an FPDU boundary after
// octets it did not observe: p are the segment's FPDU stream octets from
// stream offset off. It reports whether the walk goes on from k.
func (d *dir) resyncWalk(rep *Report, p []byte, off uint64) (int, bool) {
	if d.missed > 0 {
		rep.NotObserved = int(min(d.missed, 1<<31))
		d.missed = 0
	}
	k, how, ok := d.boundary(p, off)
	if !ok {
		d.sum.Unsynced++
		rep.Kind = KindUnsynced
		rep.Note = "octets before this segment were not observed: looking for an FPDU boundary the checker can trust"
		return 0, false
	}
	d.resync = false
	d.sum.Resyncs++
	d.rx.Resume(off + uint64(k))
	d.lastEnd = off + uint64(k)
	d.cur = nil
	rep.Resync = fmt.Sprintf("FPDU stream picked up at stream offset %d: %s", off+uint64(k), how)
	return k, true
}
