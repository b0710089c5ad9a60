package web

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/monoclock"
	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// RegionLookup returns what the engine of device dev knows about the
// region stag (its length, access and protection domain).
type RegionLookup func(dev string, stag uint32) (Region, bool)

// Update is one change to a View, as a live page receives it from
// /events: every object carries its index, and the page stores it there
// (appending or replacing).
type Update struct {
	// Version is the View's version after the update.
	Version int `json:"v"`
	// Seg is a new or changed segment (View.Segments[Seg.N]).
	Seg *Segment `json:"seg,omitempty"`
	// Place is a new or changed placement (View.Places[Place.N]).
	Place *Place `json:"place,omitempty"`
	// Region is a new or changed region, View.Regions[RegionN].
	Region  *Region `json:"region,omitempty"`
	RegionN int     `json:"region_n,omitempty"`
	// Term is a new Terminate, appended to View.Terminates.
	Term *Terminate `json:"term,omitempty"`
	// WC is a new completion, appended to View.WCs.
	WC *WC `json:"wc,omitempty"`
	// Conn is the checker's summary of one connection direction,
	// View.Conns[ConnN], sent with every local segment: the negotiation
	// table counts exactly what the ladder shows, at every update.
	Conn  *inspect.DirSummary `json:"conn,omitempty"`
	ConnN int                 `json:"conn_n,omitempty"`
	// QPs, Stats and Conns replace the View's.
	QPs   []QP                  `json:"qps,omitempty"`
	Stats map[string]*ctl.Stats `json:"stats,omitempty"`
	Conns []inspect.DirSummary  `json:"conns,omitempty"`
	// Step is a new or changed step (View.Steps[Step.N]).
	Step *Step `json:"step,omitempty"`
	// Dropped is View.Dropped when it grew.
	Dropped uint64 `json:"dropped,omitempty"`
	// Gap is a new gap, View.Gaps[Gap.N].
	Gap *Gap `json:"gap,omitempty"`
	// Full is set when the view reached its limit (View.Full).
	Full bool `json:"full,omitempty"`
	// Addr is a new address pair, the AddrN'th of View.Addrs.
	Addr  string `json:"addr,omitempty"`
	AddrN int    `json:"addr_n,omitempty"`
	// Anatomy replaces View.Anatomy.
	Anatomy *Anatomy `json:"anatomy,omitempty"`
}

// Builder builds a View from watch events. The local device's segments
// go through one checker (inspect.Analyzer), exactly as `siwtun trace`
// runs it; a watched peer device's segments only tell when the other end
// sent or received each segment, and which never arrived. A Builder is
// safe for concurrent use.
type Builder struct {
	mu       sync.Mutex
	v        View
	an       *inspect.Analyzer
	lookup   RegionLookup
	peerOn   bool
	markers  map[[2]netip.AddrPort]bool
	conns    map[[2]netip.AddrPort]int
	addrs    map[[2]netip.AddrPort]int
	held     map[heldKey]int
	pending  map[segKey][]pendingSeg
	byKey    map[segKey][]int // every segment by key (both ends watched)
	regions  map[regionKey]int
	qps      map[qpKey]int
	unjoin   []int         // placements not yet joined to a segment
	gaps     [2][]gapSpan  // the windows each device left out: [0] the peer's, [1] the local device's
	dropped  [2]uint64     // the Dropped count each device last reported
	reached  [2]int64      // the time each device's stream has reached (CLOCK_MONOTONIC ns)
	maxSegs  int           // the most segments the view holds (0: no limit)
	fullAt   int64         // when the view reached maxSegs (CLOCK_MONOTONIC ns; 0: not yet)
	sweepAge time.Duration // the age the last Sweep was given
	live     bool
	log      [][]byte // updates logBase+1, logBase+2, ... (live)
	logBase  int
	changed  chan struct{} // closed and replaced on every update (live)
	// anatomyCtl drives the daemons' recorders of hop stamps (anatomy.go).
	anatomyCtl AnatomyControl
}

// maxLog bounds the updates a live Builder keeps for pages that are behind:
// past it the older half is dropped, and a page that still needs them
// loads the page again.
var maxLog = 1 << 16

// heldKey names a local segment waiting for the checker's report of it
// (held ahead of a gap, or behind octets that may have passed unseen).
type heldKey struct {
	src, dst netip.AddrPort
	seq      uint32
}

// gapSpan is a gap: its window [from, to] (CLOCK_MONOTONIC ns) and the
// sequence ranges it left out.
type gapSpan struct {
	from, to int64
	dirs     []ctl.WatchGapDir
	all      bool // segments of any direction may be among them
}

// segKey identifies a segment on the wire, as both ends see it.
type segKey struct {
	src, dst netip.AddrPort
	seq, ack uint32
	n        int
	flags    uint8
}

// pendingSeg is a segment seen by one end only so far.
type pendingSeg struct {
	n     int
	local bool  // seen by the local device (else by the peer)
	at    int64 // when (CLOCK_MONOTONIC ns)
}

type regionKey struct {
	dev  string
	stag uint32
}

type qpKey struct {
	dev string
	n   uint32
}

// maxTransit is how long after one end saw a segment the other end may
// see it: a gap of the other end's events within it leaves the segment's
// fate unknown.
const maxTransit = 2 * time.Second

// maxUnjoined bounds the placements kept while their segment is not known.
const maxUnjoined = 256

// joinBack is how many segments back a placement looks for its FPDU.
const joinBack = 512

// NewBuilder returns a Builder for a trace of device local, titled title.
// peer names a second device whose events are passed with local=false
// (empty: none). lookup, when not nil, describes regions.
func NewBuilder(title, local, peer string, lookup RegionLookup) *Builder {
	b := &Builder{
		an: inspect.New(), lookup: lookup, peerOn: peer != "",
		markers: make(map[[2]netip.AddrPort]bool),
		conns:   make(map[[2]netip.AddrPort]int),
		addrs:   make(map[[2]netip.AddrPort]int),
		held:    make(map[heldKey]int),
		pending: make(map[segKey][]pendingSeg),
		byKey:   make(map[segKey][]int),
		regions: make(map[regionKey]int),
		qps:     make(map[qpKey]int),
		changed: make(chan struct{}),
	}
	b.v = View{Title: title, Local: local, Peer: peer, Fields: Fields[:], Stats: map[string]*ctl.Stats{}}
	return b
}

// SetLive makes the Builder keep every update for Updates (a live page).
func (b *Builder) SetLive() {
	b.mu.Lock()
	b.live = true
	b.v.Live = true
	b.logBase = b.v.Version
	b.mu.Unlock()
}

// us returns t in microseconds since the View's start, which the first
// call sets.
func (b *Builder) us(t time.Time) int64 { return b.usMono(t, monoclock.Nanos(t)) }

// usMono returns mono, the CLOCK_MONOTONIC reading of wall, in
// microseconds since the View's start, which the first call sets.
func (b *Builder) usMono(wall time.Time, mono int64) int64 {
	if b.v.Start.IsZero() {
		b.v.Start, b.v.StartMono = wall, mono
	}
	return (mono - b.v.StartMono) / 1000
}

// SetMaxSegments bounds the segments the view holds (and so its memory):
// once it holds n, later events are left out and View.Full says so.
func (b *Builder) SetMaxSegments(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.maxSegs = n
}

// SetSampling records how the daemons sample what the view cannot take,
// for the page to say.
func (b *Builder) SetSampling(policy string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.v.Sampling = policy
}

// emit records an update.
func (b *Builder) emit(u Update) {
	b.v.Version++
	if !b.live {
		return
	}
	u.Version = b.v.Version
	line, err := json.Marshal(u)
	if err != nil {
		panic(fmt.Sprintf("web: encoding an update: %v", err)) // only our own types: cannot fail
	}
	b.log = append(b.log, line)
	if len(b.log) > maxLog {
		drop := len(b.log) / 2
		b.log = append([][]byte(nil), b.log[drop:]...)
		b.logBase += drop
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

// Updates returns the updates after version from (JSON, one per update)
// and a channel closed at the next update. ok is false when the updates
// after from are no longer kept (or never were): the caller must start
// again from the View as it is now.
func (b *Builder) Updates(from int) (updates [][]byte, changed <-chan struct{}, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := from - b.logBase
	if i < 0 || i > len(b.log) {
		return nil, b.changed, false
	}
	return b.log[i:len(b.log):len(b.log)], b.changed, true
}

// Event adds one watch event of the local device (local) or of the peer.
// Events should come in time order (see Merger).
func (b *Builder) Event(local bool, e ctl.WatchEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	dev := b.v.Local
	if !local {
		dev = b.v.Peer
	}
	if i := side(local); e.Dropped > b.dropped[i] {
		b.v.Dropped += e.Dropped - b.dropped[i]
		b.dropped[i] = e.Dropped
		b.emit(Update{Dropped: b.v.Dropped})
	}
	mono := e.MonoTime()
	if mono > b.reached[side(local)] {
		b.reached[side(local)] = mono
	}
	if b.maxSegs > 0 && len(b.v.Segments) >= b.maxSegs && !e.Heartbeat() {
		if !b.v.Full {
			b.v.Full = true
			b.fullAt = mono
			b.emit(Update{Full: true})
		}
		return
	}
	switch {
	case e.Segment != nil:
		b.segment(local, e.Time, mono, e.Segment)
	case e.Place != nil:
		b.place(local, b.usMono(e.Time, mono), e.Place)
	case e.WC != nil:
		w := WC{T: b.usMono(e.Time, mono), Seg: len(b.v.Segments) - 1, Dev: dev, WatchWC: *e.WC}
		b.v.WCs = append(b.v.WCs, w)
		b.emit(Update{WC: &w})
	case e.Gap != nil:
		b.gap(local, dev, e)
	}
}

// rowTime is a row's time: when the earlier of the two ends saw it.
func rowTime(s *Segment) int64 {
	switch {
	case s.T < 0:
		return s.PT
	case s.PT < 0:
		return s.T
	}
	return min(s.T, s.PT)
}

// side indexes per-device state: 1 for the local device, 0 for the peer.
func side(local bool) int {
	if local {
		return 1
	}
	return 0
}

// gap records a window of events dev's daemon left out. The local
// device's tell the checker which octets passed unseen; the peer's keep
// segments it would have seen from being marked dropped.
func (b *Builder) gap(local bool, dev string, e ctl.WatchEvent) {
	wg := e.Gap
	from, to := wg.FromMono, wg.ToMono
	if from == 0 {
		from, to = monoclock.Nanos(wg.From), monoclock.Nanos(wg.To)
	}
	g := Gap{N: len(b.v.Gaps), Dev: dev, T: b.usMono(wg.From, from), T2: b.usMono(wg.To, to),
		Segments: wg.Segments, Places: wg.Places, WCs: wg.WCs}
	// The window's row goes where it began: before the rows (the other
	// device's) that came while it lasted. The rows are in time order.
	g.Seg = sort.Search(len(b.v.Segments), func(i int) bool { return rowTime(&b.v.Segments[i]) >= g.T })
	b.v.Gaps = append(b.v.Gaps, g)
	b.gaps[side(local)] = append(b.gaps[side(local)], gapSpan{from, to, wg.Dirs, wg.MoreDirs})
	b.emit(Update{Gap: &g})
	if !local {
		return
	}
	rs := make([]inspect.Unobserved, len(wg.Dirs))
	for i, d := range wg.Dirs {
		rs[i] = inspect.Unobserved{Src: d.Src, Dst: d.Dst, Seq: d.Seq, End: d.End}
	}
	b.an.NotObserved(rs, wg.MoreDirs)
}

// unobserved reports whether the device (local or the peer) may have seen
// segment k, sent at sent, in a window of events it left out: one whose
// sequence range of k's direction covers it, or, for a gap that does not
// list every direction, one open within maxTransit of sent.
func (b *Builder) unobserved(local bool, k segKey, sent int64) bool {
	for _, g := range b.gaps[side(local)] {
		if g.all && g.from <= sent+int64(maxTransit) && sent <= g.to {
			return true
		}
		for _, d := range g.dirs {
			if d.Src != k.src || d.Dst != k.dst {
				continue
			}
			if int32(k.seq-d.Seq) >= 0 && int32(d.End-(k.seq+uint32(k.n))) >= 0 {
				return true
			}
		}
	}
	return false
}

// Step starts a step of a demo or lesson.
func (b *Builder) Step(t time.Time, title, text string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := Step{N: len(b.v.Steps), T: b.us(t), Seg: len(b.v.Segments), Title: title, Text: text}
	b.v.Steps = append(b.v.Steps, s)
	b.emit(Update{Step: &s})
}

// StepText adds a line to the text of the last step.
func (b *Builder) StepText(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.v.Steps) == 0 {
		return
	}
	s := &b.v.Steps[len(b.v.Steps)-1]
	if s.Text != "" {
		s.Text += "\n"
	}
	s.Text += line
	c := *s
	b.emit(Update{Step: &c})
}

// SetState records a device's queue pairs (their state history grows when
// a state changes) and counters at time t.
func (b *Builder) SetState(t time.Time, dev string, qps []ctl.QP, st *ctl.Stats) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.us(t)
	for _, q := range qps {
		k := qpKey{dev, q.LQPN}
		i, ok := b.qps[k]
		if !ok {
			i = len(b.v.QPs)
			b.qps[k] = i
			b.v.QPs = append(b.v.QPs, QP{Dev: dev})
		}
		v := &b.v.QPs[i]
		v.QP = q
		if h := v.History; len(h) == 0 || h[len(h)-1].State != q.State {
			v.History = append(v.History, StateAt{State: q.State, T: now})
		}
	}
	if st != nil {
		b.v.Stats[dev] = st
	}
	b.v.Conns = b.an.Summary()
	b.emit(Update{QPs: append([]QP(nil), b.v.QPs...), Stats: copyStats(b.v.Stats), Conns: b.v.Conns})
}

// NewDevices tells the Builder that the watched devices were replaced by
// new ones of the same names (the next part of a lesson, on RNICs set up
// anew): their queue pairs and regions are new ones, kept apart from the
// earlier ones even where queue pair numbers and STags repeat.
func (b *Builder) NewDevices() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.qps = make(map[qpKey]int)
	b.regions = make(map[regionKey]int)
}

func copyStats(m map[string]*ctl.Stats) map[string]*ctl.Stats {
	out := make(map[string]*ctl.Stats, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Sweep marks as dropped the segments one end sent that the other end
// had not received age later, by the time the other end's stream has
// passed that (only while both are watched): until then a window of
// events the other end's daemon left out may yet be reported.
func (b *Builder) Sweep(now time.Time, age time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweepAge = age
	b.sweep(monoclock.Nanos(now), age, false)
}

// sweep marks what has been pending since age before now (all of it when
// final: the streams have ended).
func (b *Builder) sweep(now int64, age time.Duration, final bool) {
	for k, ps := range b.pending {
		keep := ps[:0]
		for _, p := range ps {
			due := p.at + int64(age)
			if !final && (now < due || b.reached[side(!p.local)] < due) {
				keep = append(keep, p)
				continue
			}
			n := p.n
			// Only a segment its sender saw and its receiver did not,
			// and not while the receiver's daemon was leaving events out,
			// nor when its arrival may have come after the view was full
			// (the view itself left that out).
			if b.v.Segments[n].Out != p.local || b.unobserved(!p.local, k, p.at) || b.pastFull(p.at, age) {
				continue
			}
			if j, ok := b.rematch(n, k); ok {
				n = j // the arrival was another copy's: that one was lost
			}
			s := &b.v.Segments[n]
			s.Drop = true
			b.emit(Update{Seg: s})
		}
		if len(keep) == 0 {
			delete(b.pending, k)
		} else {
			b.pending[k] = keep
		}
	}
}

// pastFull reports whether the other end of a segment sent at mono time
// at may have seen it after the view reached its limit: a segment is
// dropped only when its arrival is missing within age (the last Sweep's
// age, at Finish) of its sending, so one sent later than that before the
// view was full may have arrived unrecorded.
func (b *Builder) pastFull(at int64, age time.Duration) bool {
	if b.fullAt == 0 {
		return false
	}
	return at+int64(max(age, b.sweepAge)) > b.fullAt
}

// sendRecv returns when s was sent and received (-1: not seen).
func sendRecv(s *Segment) (send, recv int64) {
	if s.Out {
		return s.T, s.PT
	}
	return s.PT, s.T
}

// rematch handles segment n, sent and never received, when an earlier copy
// of it (the same key: a retransmission of the same octets) was matched to
// an arrival that came after n was sent: the arrival was n's, and the
// earlier copy is the one that was lost. It moves the arrival to n and
// returns the earlier copy's index.
func (b *Builder) rematch(n int, k segKey) (int, bool) {
	sendN, _ := sendRecv(&b.v.Segments[n])
	for _, j := range b.byKey[k] {
		if j == n || b.v.Segments[j].Drop {
			continue
		}
		q := &b.v.Segments[j]
		sendQ, recvQ := sendRecv(q)
		if sendQ < 0 || recvQ < 0 || sendQ >= sendN || sendN > recvQ {
			continue
		}
		s := &b.v.Segments[n]
		if s.Out {
			s.PT, q.PT = q.PT, -1
		} else {
			// The local device received it: the checker's analysis
			// belongs to the copy that arrived.
			*s, *q = *q, *s
			s.N, q.N = n, j
			s.PT, q.PT = q.PT, s.PT
			for _, i := range s.Places {
				b.v.Places[i].Seg = n
			}
			for _, i := range q.Places {
				b.v.Places[i].Seg = j
			}
			for hk, i := range b.held {
				if i == j {
					b.held[hk] = n
				}
			}
		}
		b.emit(Update{Seg: s})
		return j, true
	}
	return 0, false
}

// Finish ends the trace: segments still unmatched are dropped, and the
// connection summaries are brought up to date.
func (b *Builder) Finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweep(monoclock.Now(), 0, true)
	b.v.Conns = b.an.Summary()
	b.emit(Update{Conns: b.v.Conns})
}

// JSON returns the View as JSON.
func (b *Builder) JSON() ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return json.Marshal(&b.v)
}

// Snapshot returns a deep enough copy of the View for reading: its slices
// are not shared with the Builder's.
func (b *Builder) Snapshot() View {
	data, err := b.JSON()
	if err != nil {
		panic(fmt.Sprintf("web: encoding the view: %v", err))
	}
	var v View
	if err := json.Unmarshal(data, &v); err != nil {
		panic(fmt.Sprintf("web: decoding the view: %v", err))
	}
	return v
}

// segment adds one TCP segment seen by the local device or the peer.
func (b *Builder) segment(local bool, wall time.Time, mono int64, ws *ctl.WatchSegment) {
	k := segKey{ws.Src, ws.Dst, ws.Seq, ws.Ack, ws.PayloadLen(), ws.Flags}
	now := b.usMono(wall, mono)
	// The local device's direction of the segment.
	out := ws.Dir == "out"
	if !local {
		out = !out
	}
	n := -1
	if b.peerOn {
		// The latest copy first: a copy sent again after a loss has the
		// same key as the lost one, and it is the one that arrives.
		ps := b.pending[k]
		for i := len(ps) - 1; i >= 0; i-- {
			if p := ps[i]; p.local != local {
				n = p.n
				b.pending[k] = append(ps[:i:i], ps[i+1:]...)
				if len(b.pending[k]) == 0 {
					delete(b.pending, k)
				}
				break
			}
		}
		if n < 0 {
			n = len(b.v.Segments)
			b.pending[k] = append(b.pending[k], pendingSeg{n: n, local: local, at: mono})
			b.byKey[k] = append(b.byKey[k], n)
		}
	} else {
		n = len(b.v.Segments)
	}
	if n == len(b.v.Segments) {
		b.v.Segments = append(b.v.Segments, Segment{
			N: n, Out: out, T: -1, PT: -1, Src: ws.Src.String(), Dst: ws.Dst.String(), A: b.addrOf(ws.Src, ws.Dst),
			Seq: ws.Seq, Ack: ws.Ack, Len: ws.PayloadLen(), Flags: inspect.FlagString(ws.Flags),
		})
		s := &b.v.Segments[n]
		s.Conn = b.connOf(ws.Src, ws.Dst)
		s.Class, s.Label = quickClass(ws.Flags, ws.Payload, ws.PayloadLen())
		s.Kind = "unseen"
	}
	s := &b.v.Segments[n]
	if !local {
		s.PT = now
		b.emit(Update{Seg: s})
		return
	}
	s.T = now
	b.check(n, wall, ws)
	u := Update{Seg: &b.v.Segments[n]}
	if sum, i, ok := b.an.DirSummary(ws.Src, ws.Dst); ok {
		if i >= len(b.v.Conns) {
			b.v.Conns = b.an.Summary()
			b.emit(Update{Conns: b.v.Conns})
		}
		b.v.Conns[i] = sum
		u.Conn, u.ConnN = &b.v.Conns[i], i
	}
	b.emit(u)
}

// check runs segment n, just seen by the local device, through the
// checker, and fills in every segment the checker reports on: n itself,
// or segments it held before (ahead of a gap, or behind octets that may
// have passed unseen) and now lets through. A segment waits in b.held
// for its report.
func (b *Builder) check(n int, wall time.Time, ws *ctl.WatchSegment) {
	self := heldKey{ws.Src, ws.Dst, ws.Seq}
	if len(ws.Payload) > 0 {
		b.held[self] = n
	}
	reports := b.an.Add(inspect.Segment{Time: wall, Src: ws.Src, Dst: ws.Dst, Seq: ws.Seq, Flags: ws.Flags, Payload: ws.Payload})
	for i := range reports {
		r := &reports[i]
		if r.Kind == inspect.KindRequest || r.Kind == inspect.KindReply {
			b.refreshMarkers()
		}
		hk := heldKey{r.Src, r.Dst, r.Seq}
		j, ok := b.held[hk]
		if len(ws.Payload) == 0 && hk == self {
			j, ok = n, true
		}
		if !ok {
			continue // the tail of a frame segment: nothing to show
		}
		target := &b.v.Segments[j]
		payload := ws.Payload
		if j != n || r.Len != len(payload) {
			// A segment held before is all FPDU octets (a frame is never
			// held): ByteMap needs only its length.
			payload = make([]byte, r.Len)
		}
		if r.Kind == inspect.KindHeld {
			// Ahead of octets known not to have arrived: out of order
			// on the wire. Analysed when they come.
			target.OOO = true
		} else {
			delete(b.held, hk)
			target.OOO = target.OOO || r.Held
		}
		b.analysed(target, r, payload)
		if j != n {
			b.emit(Update{Seg: target})
		}
	}
}

// refreshMarkers learns which directions carry Markers.
func (b *Builder) refreshMarkers() {
	sums := b.an.Summary()
	for _, d := range sums {
		b.markers[[2]netip.AddrPort{d.Src, d.Dst}] = d.Markers
	}
	b.v.Conns = sums
	b.emit(Update{Conns: sums})
}

// addrOf returns the index in View.Addrs of "src > dst", adding it.
func (b *Builder) addrOf(src, dst netip.AddrPort) int {
	k := [2]netip.AddrPort{src, dst}
	if i, ok := b.addrs[k]; ok {
		return i
	}
	i := len(b.v.Addrs)
	b.addrs[k] = i
	b.v.Addrs = append(b.v.Addrs, src.String()+" > "+dst.String())
	b.emit(Update{Addr: b.v.Addrs[i], AddrN: i})
	return i
}

// connOf numbers the connection of src and dst as the checker does (in
// the order connections were first seen).
func (b *Builder) connOf(src, dst netip.AddrPort) int {
	k := [2]netip.AddrPort{src, dst}
	if src.Compare(dst) > 0 {
		k = [2]netip.AddrPort{dst, src}
	}
	if c, ok := b.conns[k]; ok {
		return c
	}
	c := len(b.conns) + 1
	b.conns[k] = c
	return c
}

// analysed fills s from the checker's report r of it.
func (b *Builder) analysed(s *Segment, r *inspect.Report, payload []byte) {
	s.Kind = string(r.Kind)
	s.Aligned, s.Stream, s.Frame, s.Note = r.Aligned, r.Offset, r.Frame, r.Note
	s.NotObserved, s.Resync = r.NotObserved, r.Resync
	s.SplitStart, s.SplitEnd = r.SplitStart, r.SplitEnd
	s.FPDUs, s.Markers = fpdusOf(r.FPDUs), markersOf(r.Markers)
	s.MarkersOn = b.markers[[2]netip.AddrPort{r.Src, r.Dst}]
	s.Map = ByteMap(r, payload, s.MarkersOn)
	s.Retx = r.Kind == inspect.KindRetransmission
	s.Class, s.Label = classOf(r, s.Class, s.Label)
	for i := range r.FPDUs {
		f := &r.FPDUs[i]
		if f.Begins && f.Header != nil && f.Header.Op == rdmap.OpTerminate.String() {
			t := Terminate{Seg: s.N, Out: s.Out, Detail: strings.TrimSpace(f.Header.Detail), RFC: termRFC(f.Header.Detail)}
			b.v.Terminates = append(b.v.Terminates, t)
			b.emit(Update{Term: &t})
		}
	}
	b.rejoin(s)
}

// termRFC returns the section defining the error codes of the layer a
// Terminate's detail names.
func termRFC(detail string) string {
	d := strings.TrimPrefix(detail, "terminate ")
	switch {
	case strings.HasPrefix(d, "LLP"):
		return RFCMPAErrors
	case strings.HasPrefix(d, "DDP"):
		return RFCDDPErrors
	}
	return RFCRDMAPErrors
}

// classes of RDMAP opcodes and their arrow labels.
var opClass = map[string][2]string{
	rdmap.OpWrite.String():        {"write", "Write"},
	rdmap.OpReadRequest.String():  {"rreq", "RdReq"},
	rdmap.OpReadResponse.String(): {"rresp", "RdResp"},
	rdmap.OpSend.String():         {"send", "Send"},
	rdmap.OpSendInv.String():      {"send", "SendInv"},
	rdmap.OpSendSE.String():       {"send", "SendSE"},
	rdmap.OpSendSEInv.String():    {"send", "SendSEInv"},
	rdmap.OpTerminate.String():    {"term", "Terminate"},
	// RFC 7306: untagged on QN 0, consuming a receive as a Send does.
	rdmap.OpImmediate.String():   {"send", "Imm"},
	rdmap.OpImmediateSE.String(): {"send", "ImmSE"},
	// RFC 7306 atomics: a request on the Read Request queue, answered
	// on QN 3, as a Read is.
	rdmap.OpAtomicRequest.String():  {"rreq", "AtomicReq"},
	rdmap.OpAtomicResponse.String(): {"rresp", "AtomicResp"},
}

// classOf returns the class and label of a segment from its report; cls
// and label are the quick guesses kept when the report adds nothing.
func classOf(r *inspect.Report, cls, label string) (string, string) {
	switch r.Kind {
	case inspect.KindControl:
		return "ctl", r.Flags
	case inspect.KindRequest:
		return "mpa-req", "MPA Req"
	case inspect.KindReply:
		return "mpa-rep", "MPA Rep"
	case inspect.KindRetransmission:
		return cls, label
	case inspect.KindHeld:
		return cls, label // marked OOO; analysed when the gap fills
	case inspect.KindUnsynced:
		return "fpdu", "FPDU octets, not analysed"
	case inspect.KindOther:
		return "other", "TCP data"
	case inspect.KindUndecoded:
		return "other", "undecoded"
	}
	cls, label = "fpdu", "FPDU part"
	count := 0
	for i := range r.FPDUs {
		f := &r.FPDUs[i]
		if f.Header == nil {
			continue
		}
		c, ok := opClass[f.Header.Op]
		if !ok {
			continue
		}
		if count == 0 {
			cls, label = c[0], c[1]
			if !f.Begins {
				label += " cont."
			}
		} else if c[0] != cls {
			label += "+" + c[1]
		}
		count++
	}
	if count > 1 && !strings.Contains(label, "+") {
		label = fmt.Sprintf("%s ×%d", label, count)
	}
	return cls, label
}

// quickClass guesses what a segment of n payload octets carries before
// (or without) the checker: an MPA frame, or an FPDU at its front (p may
// be nil: a peer's stream without payloads).
func quickClass(flags uint8, p []byte, n int) (string, string) {
	if n == 0 {
		return "ctl", inspect.FlagString(flags)
	}
	if bytes.HasPrefix(p, []byte("MPA ID Req")) {
		return "mpa-req", "MPA Req"
	}
	if bytes.HasPrefix(p, []byte("MPA ID Rep")) {
		return "mpa-rep", "MPA Rep"
	}
	if len(p) >= 2+ddp.TaggedHeaderLen && int(binary.BigEndian.Uint16(p))+2 <= len(p) {
		var h ddp.Header
		if _, err := h.Unmarshal(p[2:]); err == nil {
			_, op := rdmap.ParseCtrl(h.ULPCtrl)
			if c, ok := opClass[op.String()]; ok {
				return c[0], c[1]
			}
		}
	}
	return "fpdu", "data"
}

// place adds a placement made by the local device (local) or the peer.
func (b *Builder) place(local bool, t int64, wp *ctl.WatchPlace) {
	dev := b.v.Local
	if !local {
		dev = b.v.Peer
	}
	p := Place{
		N: len(b.v.Places), T: t, Seg: -1, Region: -1, Dev: dev, QP: wp.QP, Op: wp.Op,
		STag: wp.STag, TO: wp.TO, Offset: wp.Offset, RecvWR: wp.RecvWR, MSN: wp.MSN, MO: wp.MO,
		Len: wp.Len, OOO: wp.OutOfOrder,
	}
	if wp.STag != 0 {
		p.Region = b.region(dev, wp.STag, wp.TO-wp.Offset)
		if !p.OOO {
			for i := len(b.v.Places) - 1; i >= 0 && i >= len(b.v.Places)-4096; i-- {
				q := &b.v.Places[i]
				if q.OOO && q.Dev == dev && q.STag == p.STag && q.TO == p.TO && q.Len == p.Len {
					p.Again = true
					break
				}
			}
		}
		r := &b.v.Regions[p.Region]
		if !r.Known && int(p.Offset)+p.Len > r.Len {
			r.Len = int(p.Offset) + p.Len
			b.emit(Update{Region: r, RegionN: p.Region})
		}
	}
	b.v.Places = append(b.v.Places, p)
	// The receiver of the FPDU placed it: an inbound segment of the
	// local device, or an outbound one when the peer placed it.
	if !b.join(len(b.v.Places) - 1) {
		b.unjoin = append(b.unjoin, p.N)
		if len(b.unjoin) > maxUnjoined {
			b.unjoin = b.unjoin[1:]
		}
	}
	b.emit(Update{Place: &b.v.Places[p.N]})
}

// region returns the index of dev's region stag, adding it.
func (b *Builder) region(dev string, stag uint32, addr uint64) int {
	k := regionKey{dev, stag}
	if i, ok := b.regions[k]; ok {
		return i
	}
	r := Region{Dev: dev, STag: stag, Addr: addr}
	if b.lookup != nil {
		if known, ok := b.lookup(dev, stag); ok {
			r = known
			r.Dev, r.STag, r.Known = dev, stag, true
		}
	}
	i := len(b.v.Regions)
	b.regions[k] = i
	b.v.Regions = append(b.v.Regions, r)
	b.emit(Update{Region: &b.v.Regions[i], RegionN: i})
	return i
}

// join attaches placement i to the segment whose FPDU it placed.
func (b *Builder) join(i int) bool {
	p := &b.v.Places[i]
	out := p.Dev != b.v.Local // the peer placed it: the local device sent it
	for n := len(b.v.Segments) - 1; n >= 0 && n >= len(b.v.Segments)-joinBack; n-- {
		s := &b.v.Segments[n]
		if s.Out != out || !placedBy(s, p) {
			continue
		}
		if p.Seg >= 0 {
			return true
		}
		p.Seg = n
		s.Places = append(s.Places, i)
		b.emit(Update{Seg: s})
		return true
	}
	return false
}

// rejoin joins the waiting placements to segment s, just analysed.
func (b *Builder) rejoin(s *Segment) {
	keep := b.unjoin[:0]
	for _, i := range b.unjoin {
		p := &b.v.Places[i]
		out := p.Dev != b.v.Local
		if s.Out == out && placedBy(s, p) {
			p.Seg = s.N
			s.Places = append(s.Places, i)
			b.emit(Update{Place: p})
			continue
		}
		keep = append(keep, i)
	}
	b.unjoin = keep
}

// placedBy reports whether p placed the payload of an FPDU that ends in s.
func placedBy(s *Segment, p *Place) bool {
	for i := range s.FPDUs {
		f := &s.FPDUs[i]
		h := f.Header
		if !f.Ends || h == nil || h.Payload == 0 {
			continue
		}
		if h.Tagged && p.STag == h.STag && p.TO == h.TO {
			return true
		}
		if !h.Tagged && p.STag == 0 && p.MSN == h.MSN && p.MO == h.MO && strings.HasPrefix(h.Op, "Send") {
			return true
		}
	}
	return false
}
