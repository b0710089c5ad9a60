package inspect

import (
	"bytes"
	"fmt"
	"net/netip"
	"sort"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// Limits of what an Analyzer holds per connection direction.
const (
	// MaxHeldBytes bounds the octets held ahead of a gap. Past it the
	// capture is taken to have lost octets and the direction is no longer
	// analysed.
	MaxHeldBytes = 64 << 20
	// maxHdr is how many ULPDU octets of each FPDU are kept for its
	// header: an untagged DDP header and a Terminate with both copied
	// headers fit.
	maxHdr = ddp.UntaggedHeaderLen + rdmap.TerminateHeaderLen + 2 + ddp.UntaggedHeaderLen + rdmap.ReadRequestLen
)

// phase is where a direction's analysis stands.
type phase uint8

const (
	phaseStart phase = iota // stream start not seen
	phaseFrame              // reading the MPA Request or Reply
	phaseWait               // frame read; waiting for the peer's frame
	phaseFPDU               // walking FPDUs
	phaseOther              // not MPA
	phaseLost               // octets missing from the capture
)

// Analyzer checks the iWARP traffic of the TCP connections it is fed. The
// zero value is not usable; call New. An Analyzer is not safe for
// concurrent use.
type Analyzer struct {
	conns map[connKey]*conn
	list  []*conn
}

// New returns an empty Analyzer.
func New() *Analyzer {
	return &Analyzer{conns: make(map[connKey]*conn)}
}

// connKey names a connection independently of the direction.
type connKey struct{ lo, hi netip.AddrPort }

func keyOf(a, b netip.AddrPort) connKey {
	if a.Compare(b) > 0 {
		a, b = b, a
	}
	return connKey{a, b}
}

// conn is one TCP connection.
type conn struct {
	dirs     [2]*dir // [0] sent by the first endpoint seen
	req, rep *mpa.Frame
	ready    bool // both frames seen: the FPDU streams can be walked
}

// held is a segment kept for later: ahead of a gap, or waiting for the MPA
// exchange to complete.
type held struct {
	seg     Segment // Payload is a private copy
	partial int     // octets at the front of Payload already seen
	ooo     bool    // it arrived ahead of octets that had not arrived
}

// dir is one direction of a connection.
type dir struct {
	c        *conn
	src, dst netip.AddrPort
	role     string

	phase     phase
	baseKnown bool
	base      uint32 // sequence number of stream octet 0
	next      uint32 // next expected sequence number
	held      []held // ahead of next, by sequence number
	heldBytes int
	unseen    []seqRange // octets ahead of next that may have passed unobserved
	resync    bool       // looking for an FPDU boundary after octets not observed
	missed    uint64     // octets skipped since the last Report that said so
	pend      []held     // in order, waiting for the peer's MPA frame

	fr       mpa.FrameReader
	frameLen uint32 // stream octets of the MPA frame
	frame    string
	crc      bool
	markers  bool
	rx       mpa.Receiver

	// The FPDU walk.
	n       uint64   // FPDUs begun
	cur     *curFPDU // the FPDU in progress after its ULPDU_Length, or nil
	lastEnd uint64   // FPDU stream offset after the last complete FPDU
	fpos    uint64   // FPDU stream octets walked
	// ends are the FPDU stream offsets where the latest FPDUs ended
	// (ascending, at most maxEnds), for judging retransmissions.
	ends   []uint64
	rep    *Report // the Report the walk is filling
	segOff uint64  // FPDU stream offset of rep's first FPDU octet
	curBuf curFPDU // storage for cur
	sum    DirSummary
}

// curFPDU is the FPDU being walked.
type curFPDU struct {
	index    uint64
	start    uint64
	ulpduLen int
	wireLen  int
	hdr      [maxHdr]byte
	nhdr     int
}

// Add analyses one segment and returns its Report, preceded or followed
// by the Reports of held segments it allowed to be analysed, in stream
// order.
func (a *Analyzer) Add(s Segment) []Report {
	d := a.dirOf(s.Src, s.Dst)
	d.sum.Segments++
	rep := Report{Time: s.Time, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Flags: FlagString(s.Flags), Len: len(s.Payload), Role: d.role}
	if s.Flags&FlagSYN != 0 {
		d.base, d.next, d.baseKnown = s.Seq+1, s.Seq+1, true
		if d.phase == phaseStart {
			d.phase = phaseFrame
		}
		rep.Kind = KindControl
		return []Report{rep}
	}
	if len(s.Payload) == 0 {
		rep.Kind = KindControl
		return []Report{rep}
	}
	d.sum.DataSegments++
	if !d.baseKnown {
		if !looksLikeFrame(s.Payload) {
			d.sum.Undecoded++
			rep.Kind, rep.Note = KindUndecoded, "the start of this direction (SYN or MPA frame) was not captured"
			return []Report{rep}
		}
		d.base, d.next, d.baseKnown = s.Seq, s.Seq, true
		d.phase = phaseFrame
	}
	switch d.phase {
	case phaseOther:
		rep.Kind = KindOther
		return []Report{rep}
	case phaseLost:
		d.sum.Undecoded++
		rep.Kind, rep.Note = KindUndecoded, d.sum.Note
		return []Report{rep}
	}
	rel := int32(s.Seq - d.next)
	switch {
	case int(rel)+len(s.Payload) <= 0:
		d.sum.Retransmissions++
		rep.Kind, rep.Note = KindRetransmission, "all octets already seen"
		d.judgeRetransmission(&rep, s.Seq, len(s.Payload))
		return []Report{rep}
	case rel > 0 && !d.missingBefore(s.Seq):
		// Ahead only of octets that may have passed unobserved: not out
		// of order as far as anyone can tell.
		d.hold(s, false)
		return d.skipUnseen()
	case rel > 0:
		d.sum.Held++
		if d.heldBytes+len(s.Payload) > MaxHeldBytes {
			d.lose(fmt.Sprintf("the capture lacks octets at seq %d: more than %d octets arrived after the gap", d.next, MaxHeldBytes))
			rep.Kind, rep.Note = KindUndecoded, d.sum.Note
			return []Report{rep}
		}
		d.hold(s, true)
		rep.Kind, rep.Note = KindHeld, fmt.Sprintf("%d octets ahead of the next expected (seq %d): held until the gap is filled", rel, d.next)
		return []Report{rep}
	}
	out := d.accept(rep, s.Payload, -int(rel), false)
	return append(out, d.release()...)
}

// dirOf returns the direction src → dst, creating its connection.
func (a *Analyzer) dirOf(src, dst netip.AddrPort) *dir {
	k := keyOf(src, dst)
	c := a.conns[k]
	if c == nil {
		c = &conn{}
		c.dirs[0] = &dir{c: c, src: src, dst: dst}
		c.dirs[1] = &dir{c: c, src: dst, dst: src}
		for _, d := range c.dirs {
			d.sum.Src, d.sum.Dst = d.src, d.dst
		}
		a.conns[k] = c
		a.list = append(a.list, c)
	}
	if c.dirs[0].src == src {
		return c.dirs[0]
	}
	return c.dirs[1]
}

// peer returns the other direction of d's connection.
func (d *dir) peer() *dir {
	if d.c.dirs[0] == d {
		return d.c.dirs[1]
	}
	return d.c.dirs[0]
}

// looksLikeFrame reports whether p starts like an MPA Request or Reply.
func looksLikeFrame(p []byte) bool {
	const common = "MPA ID Re"
	return bytes.HasPrefix(p, []byte(common)) || (len(p) < len(common) && bytes.HasPrefix([]byte(common), p))
}

// hold keeps a copy of s, which lies ahead of next; ooo says octets in
// front of it had not arrived.
func (d *dir) hold(s Segment, ooo bool) {
	s.Payload = bytes.Clone(s.Payload)
	i := sort.Search(len(d.held), func(i int) bool { return int32(d.held[i].seg.Seq-s.Seq) > 0 })
	d.held = append(d.held, held{})
	copy(d.held[i+1:], d.held[i:])
	d.held[i] = held{seg: s, ooo: ooo}
	d.heldBytes += len(s.Payload)
}

// release analyses the held segments that the stream has reached.
func (d *dir) release() []Report {
	var out []Report
	for len(d.held) > 0 && d.phase != phaseLost && d.phase != phaseOther {
		h := d.held[0]
		rel := int32(h.seg.Seq - d.next)
		if rel > 0 {
			break
		}
		d.held = d.held[1:]
		d.heldBytes -= len(h.seg.Payload)
		if int(rel)+len(h.seg.Payload) <= 0 {
			continue // wholly covered by what arrived meanwhile
		}
		rep := Report{Time: h.seg.Time, Src: h.seg.Src, Dst: h.seg.Dst, Seq: h.seg.Seq, Flags: FlagString(h.seg.Flags), Len: len(h.seg.Payload)}
		out = append(out, d.accept(rep, h.seg.Payload, -int(rel), h.ooo)...)
	}
	return out
}

// lose stops the analysis of d: octets are missing.
func (d *dir) lose(why string) {
	d.phase = phaseLost
	d.sum.Note = why
	d.held, d.heldBytes, d.pend = nil, 0, nil
}

// accept analyses the in-order payload p of a segment whose first skip
// octets were already seen.
func (d *dir) accept(rep Report, p []byte, skip int, wasHeld bool) []Report {
	rep.Held = wasHeld
	rep.Role = d.role
	if skip > 0 {
		rep.Note = fmt.Sprintf("first %d octets already seen", skip)
		p = p[skip:]
	}
	d.next += uint32(len(p))
	if d.phase == phaseFrame {
		n, done, err := d.fr.Feed(p)
		if err != nil {
			d.phase = phaseOther
			rep.Kind, rep.Note = KindOther, err.Error()
			return []Report{rep}
		}
		p = p[n:]
		d.frameLen += uint32(n)
		if !done {
			rep.Kind, rep.Note = KindUndecoded, "part of an MPA frame"
			return []Report{rep}
		}
		f, err := d.fr.Frame()
		if err != nil {
			d.phase = phaseOther
			rep.Kind, rep.Note = KindOther, err.Error()
			return []Report{rep}
		}
		f.PrivateData = bytes.Clone(f.PrivateData)
		d.frame = f.String()
		d.sum.Frame = d.frame
		rep.Frame = d.frame
		rep.Kind = KindRequest
		if f.Reply {
			rep.Kind = KindReply
			d.c.rep = &f
		} else {
			d.c.req = &f
			d.role, d.peer().role = "initiator", "responder"
			d.sum.Role, d.peer().sum.Role = d.role, d.peer().role
			rep.Role = d.role
		}
		d.phase = phaseWait
		out := d.c.start()
		if len(p) == 0 {
			return append([]Report{rep}, out...)
		}
		if d.phase == phaseWait {
			d.pendTail(rep, p)
			return append([]Report{rep}, out...)
		}
		d.walk(&rep, p)
		return append([]Report{rep}, out...)
	}
	if d.phase == phaseWait {
		d.pendTail(rep, p)
		rep.Kind, rep.Note = KindHeld, "FPDU octets before the peer's MPA frame: held until it arrives"
		d.sum.Held++
		return []Report{rep}
	}
	d.walk(&rep, p)
	return []Report{rep}
}

// pendTail keeps p, the in-order tail of the segment of rep, until the MPA
// exchange is complete.
func (d *dir) pendTail(rep Report, p []byte) {
	s := Segment{Time: rep.Time, Src: rep.Src, Dst: rep.Dst, Seq: d.next - uint32(len(p)), Payload: bytes.Clone(p)}
	d.pend = append(d.pend, held{seg: s})
}

// start sets up both directions' FPDU walks once both MPA frames are known
// and returns the Reports of the octets that waited for it.
func (c *conn) start() []Report {
	if c.ready || c.req == nil || c.rep == nil {
		return nil
	}
	c.ready = true
	crc := c.req.CRC || c.rep.CRC
	var out []Report
	for _, d := range c.dirs {
		// A side inserts Markers when its peer's frame asked for them.
		d.markers = c.req.Markers
		if d.role == "initiator" {
			d.markers = c.rep.Markers
		}
		d.crc = crc
		d.sum.CRC, d.sum.Markers = crc, d.markers
		d.rx.Init(crc, d.markers, d)
		if d.phase == phaseWait {
			d.phase = phaseFPDU
		}
	}
	for _, d := range c.dirs {
		pend := d.pend
		d.pend = nil
		for _, h := range pend {
			rep := Report{Time: h.seg.Time, Src: h.seg.Src, Dst: h.seg.Dst, Seq: h.seg.Seq, Len: len(h.seg.Payload), Role: d.role, Held: true}
			d.walk(&rep, h.seg.Payload)
			out = append(out, rep)
		}
	}
	return out
}

// walk runs the FPDU stream octets p of rep's segment through the MPA
// receiver and fills rep.
func (d *dir) walk(rep *Report, p []byte) {
	if rep.Kind == "" {
		rep.Kind = KindFPDU
	}
	off := d.fpos
	d.fpos += uint64(len(p))
	rep.Offset = off
	k, known := 0, true
	if d.resync {
		if k, known = d.resyncWalk(rep, p, off); !known {
			return
		}
	}
	startAligned := off == d.lastEnd
	if k == 0 {
		d.sum.FPDUSegments++
	}
	d.rep, d.segOff = rep, off
	_, err := d.rx.Write(p[k:])
	d.rep = nil
	if err != nil {
		// Only a Handler error stops the receiver, and ours return none.
		d.lose(fmt.Sprintf("MPA receiver stopped: %v", err))
		rep.Note = d.sum.Note
		return
	}
	end := off + uint64(len(p))
	if d.lastEnd < end {
		// An FPDU is in progress at the end of the segment.
		f := FPDU{Index: d.n + 1, Offset: d.lastEnd}
		if d.cur != nil {
			f.Index, f.Len, f.ULPDULen = d.cur.index, d.cur.wireLen, d.cur.ulpduLen
			f.Header = parseHeader(d.cur.hdr[:d.cur.nhdr], d.cur.ulpduLen)
		}
		f.Begins = f.Offset >= off
		from := max(f.Offset, off)
		f.At, f.Here = int(from-off), int(end-from)
		rep.FPDUs = append(rep.FPDUs, f)
	}
	if k > 0 {
		// It starts inside an FPDU whose start was not observed: no
		// verdict on its alignment.
		return
	}
	aligned := startAligned && d.lastEnd == end
	rep.Aligned = &aligned
	if aligned {
		d.sum.Aligned++
		return
	}
	if !startAligned {
		f := rep.FPDUs[0]
		rep.SplitStart = &Split{FPDU: f.Index, Before: int(off - f.Offset), Len: f.Len}
		if f.Len > 0 {
			rep.SplitStart.After = f.Len - rep.SplitStart.Before
		}
	}
	if d.lastEnd != end {
		f := rep.FPDUs[len(rep.FPDUs)-1]
		rep.SplitEnd = &Split{FPDU: f.Index, Before: int(end - f.Offset), Len: f.Len}
		if f.Len > 0 {
			rep.SplitEnd.After = f.Len - rep.SplitEnd.Before
		}
	}
}

// BeginFPDU implements mpa.Handler.
func (d *dir) BeginFPDU(ulpduLen int) error {
	d.n++
	d.curBuf = curFPDU{index: d.n, start: d.lastEnd, ulpduLen: ulpduLen, wireLen: mpa.FPDUWireLen(d.lastEnd, ulpduLen, d.markers)}
	d.cur = &d.curBuf
	return nil
}

// ULPDU implements mpa.Handler: it keeps the header octets.
func (d *dir) ULPDU(p []byte) error {
	c := d.cur
	c.nhdr += copy(c.hdr[c.nhdr:], p)
	return nil
}

// EndFPDU implements mpa.Handler.
func (d *dir) EndFPDU(crcOK bool) error {
	c := d.cur
	end := d.rx.Stats().Bytes
	f := FPDU{
		Index: c.index, Offset: c.start, Len: int(end - c.start), ULPDULen: c.ulpduLen,
		Begins: c.start >= d.segOff, Ends: true,
		Header: parseHeader(c.hdr[:c.nhdr], c.ulpduLen),
	}
	from := max(c.start, d.segOff)
	f.At, f.Here = int(from-d.segOff), int(end-from)
	switch {
	case !d.crc:
		f.CRC = "off"
	case crcOK:
		f.CRC = "good"
		d.sum.CRCGood++
	default:
		f.CRC = "bad"
		d.sum.CRCBad++
	}
	d.sum.FPDUs++
	d.rep.FPDUs = append(d.rep.FPDUs, f)
	d.lastEnd = end
	if len(d.ends) >= maxEnds {
		d.ends = d.ends[:copy(d.ends, d.ends[maxEnds/2:])]
	}
	d.ends = append(d.ends, end)
	d.cur = nil
	return nil
}

// Marker implements mpa.MarkerObserver: every Marker is reported, good or
// bad, and the walk goes on.
func (d *dir) Marker(m mpa.Marker) error {
	idx := d.n
	if d.cur == nil || m.FPDUStart != d.cur.start {
		idx = d.n + 1 // a leading Marker: its FPDU's ULPDU_Length is next
	}
	if m.OK {
		d.sum.MarkersOK++
	} else {
		d.sum.MarkersBad++
	}
	d.rep.Markers = append(d.rep.Markers, Marker{
		Offset: m.Offset, At: int(int64(m.Offset) - int64(d.segOff)),
		FPDUPTR: m.FPDUPTR, Want: m.Want, FPDU: idx, OK: m.OK,
	})
	return nil
}

// parseHeader decodes the DDP/RDMAP header at the front of b, the first
// ULPDU octets of an FPDU whose ULPDU_Length is ulpduLen; nil while too
// few octets are in.
func parseHeader(b []byte, ulpduLen int) *Header {
	if len(b) == 0 {
		return nil
	}
	need := ddp.HeaderLen(b[0])
	if ulpduLen < need {
		return &Header{Op: "?", Detail: fmt.Sprintf("ULPDU of %d octets is shorter than its DDP header (%d)", ulpduLen, need)}
	}
	if len(b) < need {
		return nil
	}
	var h ddp.Header
	if _, err := h.Unmarshal(b); err != nil {
		return nil
	}
	ver, op := rdmap.ParseCtrl(h.ULPCtrl)
	out := &Header{Op: op.String(), Tagged: h.Tagged, Last: h.Last, Payload: ulpduLen - need}
	if h.Tagged {
		out.STag, out.TO = h.STag, h.TO
	} else {
		out.QN, out.MSN, out.MO = h.QN, h.MSN, h.MO
	}
	rest := b[need:]
	switch {
	case !h.Tagged && op == rdmap.OpReadRequest:
		var rr rdmap.ReadRequest
		if rr.Unmarshal(rest) == nil {
			out.Detail = rr.String()
			out.Payload -= rdmap.ReadRequestLen
		}
	case !h.Tagged && op == rdmap.OpTerminate:
		var t rdmap.Terminate
		if t.Unmarshal(rest) == nil {
			out.Detail = t.String()
		}
		out.Payload = 0
	case !h.Tagged && (op == rdmap.OpImmediate || op == rdmap.OpImmediateSE):
		var m rdmap.Immediate
		if m.Unmarshal(rest) == nil {
			out.Detail = m.String()
			out.Payload -= rdmap.ImmediateDataLen
		}
	case !h.Tagged && op == rdmap.OpAtomicRequest:
		var m rdmap.AtomicRequest
		if m.Unmarshal(rest) == nil {
			out.Detail = m.String()
			out.Payload -= rdmap.AtomicRequestLen
		}
	case !h.Tagged && op == rdmap.OpAtomicResponse:
		var m rdmap.AtomicResponse
		if m.Unmarshal(rest) == nil {
			out.Detail = m.String()
			out.Payload -= rdmap.AtomicResponseLen
		}
	}
	if h.Version != ddp.Version {
		out.Detail += fmt.Sprintf(" (DDP version %d)", h.Version)
	}
	if ver != rdmap.Version {
		out.Detail += fmt.Sprintf(" (RDMAP version %d)", ver)
	}
	return out
}
