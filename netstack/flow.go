package netstack

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// flowKey names a connection from this stack's point of view.
type flowKey struct {
	local, remote netip.AddrPort
}

// synInfo is what a SYN (or SYN-ACK) announced, as gVisor parses it
// (header.ParseSynOptions: MSS defaults to 536 when absent).
type synInfo struct {
	mss      uint16
	ts, sack bool
	ws       int    // window scale shift, -1 when absent
	win      uint16 // the SYN's window (never scaled)
}

// flow is the link-level state of one connection.
type flow struct {
	key     flowKey // set at creation
	created time.Time
	claimed atomic.Bool
	removed atomic.Bool // the flow left the table (a new one may take its key)

	mu    sync.Mutex
	in    synInfo // guarded by mu; peer's SYN
	out   synInfo // guarded by mu; our SYN
	inOK  bool    // guarded by mu
	outOK bool    // guarded by mu
	iss   uint32  // guarded by mu; our initial sequence number
	// peerISS is the peer's initial sequence number; guarded by mu, valid
	// with inOK.
	peerISS uint32
	issSet  atomic.Bool

	ack    atomic.Uint64 // 1<<32 | highest cumulative ACK from the peer; 0 = none yet
	edge   atomic.Uint64 // 1<<32 | right edge of the peer's window; 0 = not yet known
	maxWnd atomic.Uint32 // the largest window the peer has offered
	sent   atomic.Uint64 // 1<<32 | highest sequence number sent (segment end); 0 = none yet
	peerWS atomic.Int32  // the peer's window scale in use; -1 until both SYNs were seen
	// rcvAck and rcvEdge are what our own segments told the peer: the
	// highest cumulative ACK and the right edge of our receive window
	// (1<<32|seq; 0 = none yet). ourWS is our window scale in use, -1
	// until both SYNs were seen.
	rcvAck   atomic.Uint64
	rcvEdge  atomic.Uint64
	ourWS    atomic.Int32
	waiting  atomic.Bool
	ackAdvCh chan struct{} // signalled (when waiting) as the ACK advances

	hook atomic.Pointer[hookBox]

	// tail keeps the latest data packets of a Conn's flow until the peer
	// acknowledges them, for the tail rescue (rescue.go).
	tail tailKeeper
	// writeEnds are where the Conn's aligned writes end, for cutting
	// super-segments (gso.go); hold is a tail held back (gsohold.go).
	writeEnds writeEnds
	hold      heldTail
	// kept keeps the new data sent until the peer acknowledges it, for
	// retransmissions on the FPDU grid (resend.go).
	kept sentStore
}

// hookBox lets an interface value live in an atomic.Pointer.
type hookBox struct {
	h       SegmentHook
	payload bool // h reads payloads
}

func (f *flow) setSyn(outbound bool, si synInfo, seq uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if outbound {
		f.out, f.outOK = si, true
		f.iss = seq
		f.issSet.Store(true)
	} else {
		f.in, f.inOK = si, true
		f.peerISS = seq
	}
	if f.inOK && f.outOK {
		// RFC 7323: windows are scaled only when both SYNs carried the
		// option.
		ws := int32(0)
		if f.in.ws >= 0 && f.out.ws >= 0 {
			ws = int32(f.in.ws)
		}
		f.peerWS.Store(ws)
		ws = 0
		if f.in.ws >= 0 && f.out.ws >= 0 {
			ws = int32(f.out.ws)
		}
		f.ourWS.Store(ws)
		// What our SYN offered, until later segments say more (they are
		// seen only while some connection has a hook).
		advanceSeq(&f.rcvAck, f.peerISS+1)
		advanceSeq(&f.rcvEdge, f.peerISS+1+uint32(f.out.win))
	}
}

// advertisedSeen records the ACK and the right edge of the receive window
// that one of our (non-SYN) segments carries, where they move forward.
func (f *flow) advertisedSeen(ack uint32, wnd uint16) {
	ws := f.ourWS.Load()
	if ws < 0 {
		return
	}
	advanceSeq(&f.rcvAck, ack)
	advanceSeq(&f.rcvEdge, ack+uint32(wnd)<<uint(ws))
}

// advertised returns our highest ACK and receive window edge sent, once
// known.
func (f *flow) advertised() (ack, edge uint32, ok bool) {
	a, e := f.rcvAck.Load(), f.rcvEdge.Load()
	return uint32(a), uint32(e), a != 0 && e != 0
}

// windowSeen records the right edge of the peer's receive window (ack plus
// the scaled window) if it moves forward, and wakes a waiting writer.
func (f *flow) windowSeen(ack uint32, wnd uint16) {
	ws := f.peerWS.Load()
	if ws < 0 {
		return
	}
	w := uint32(wnd) << uint(ws)
	for m := f.maxWnd.Load(); w > m && !f.maxWnd.CompareAndSwap(m, w); m = f.maxWnd.Load() {
	}
	edge := ack + w
	if advanceSeq(&f.edge, edge) {
		f.wake()
	}
}

// sentSeen records the end of an outbound segment if it advances the
// highest sequence number sent, and wakes a waiting writer.
func (f *flow) sentSeen(end uint32) {
	if advanceSeq(&f.sent, end) {
		f.wake()
	}
}

// sentEdge returns the highest sequence number sent, once known.
func (f *flow) sentEdge() (uint32, bool) {
	v := f.sent.Load()
	return uint32(v), v != 0
}

// peerEdge returns the right edge of the peer's receive window, once known.
func (f *flow) peerEdge() (uint32, bool) {
	v := f.edge.Load()
	return uint32(v), v != 0
}

// peerInitialSeq returns the peer's initial sequence number, once its SYN
// was seen.
func (f *flow) peerInitialSeq() (uint32, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.peerISS, f.inOK
}

func (f *flow) synInfo() (in, out synInfo, inOK, outOK bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.in, f.out, f.inOK, f.outOK
}

func (f *flow) ourISS() (uint32, bool) {
	if !f.issSet.Load() {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.iss, true
}

// ackSeen records a cumulative ACK number if it advances, and reports
// whether it did.
func (f *flow) ackSeen(a uint32) bool {
	if advanceSeq(&f.ack, a) {
		f.wake()
		return true
	}
	return false
}

// advanceSeq stores v in u (as 1<<32|v; 0 means unset) if u is unset or v is
// beyond it in sequence space, and reports whether it did.
func advanceSeq(u *atomic.Uint64, v uint32) bool {
	for {
		cur := u.Load()
		if cur != 0 && int32(v-uint32(cur)) <= 0 {
			return false
		}
		if u.CompareAndSwap(cur, 1<<32|uint64(v)) {
			return true
		}
	}
}

// wake signals a writer waiting for the peer (ACK, window, or our own
// segments going out).
func (f *flow) wake() {
	if f.waiting.Load() {
		select {
		case f.ackAdvCh <- struct{}{}:
		default:
		}
	}
}

// peerAck returns the highest cumulative ACK seen from the peer.
func (f *flow) peerAck() (uint32, bool) {
	v := f.ack.Load()
	return uint32(v), v != 0
}

func (f *flow) getHook() (SegmentHook, bool) {
	if f == nil {
		return nil, false
	}
	if b := f.hook.Load(); b != nil {
		return b.h, b.payload
	}
	return nil, false
}

// flowTable maps connections to their flow state.
type flowTable struct {
	mu        sync.RWMutex
	m         map[flowKey]*flow // guarded by mu
	lastSweep time.Time         // guarded by mu
	hooks     atomic.Int32      // flows with a per-connection hook
	// last is the flow found last: every packet of a busy connection
	// finds it here, without the lock or the map. A flow marks itself
	// removed before it leaves the map, so a stale last is never used.
	last atomic.Pointer[flow]
}

const (
	// flowSweepSize is the table size above which unclaimed flows (SYNs
	// that never became a Conn: refused, never accepted) are swept.
	flowSweepSize = 256
	// flowOrphanAge is how old an unclaimed flow must be to be swept.
	flowOrphanAge = time.Minute
)

func (t *flowTable) init() { t.m = make(map[flowKey]*flow) }

func (t *flowTable) get(k flowKey) *flow {
	if f := t.last.Load(); f != nil && f.key == k && !f.removed.Load() {
		return f
	}
	t.mu.RLock()
	f := t.m[k]
	t.mu.RUnlock()
	if f != nil {
		t.last.Store(f)
	}
	return f
}

func (t *flowTable) getOrCreate(k flowKey) *flow {
	if f := t.get(k); f != nil {
		return f
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.m[k]; f != nil {
		return f
	}
	now := time.Now()
	if len(t.m) >= flowSweepSize && now.Sub(t.lastSweep) > time.Second {
		t.lastSweep = now
		for k, f := range t.m {
			if !f.claimed.Load() && now.Sub(f.created) > flowOrphanAge {
				f.removed.Store(true)
				delete(t.m, k)
			}
		}
	}
	f := &flow{key: k, created: now, ackAdvCh: make(chan struct{}, 1)}
	f.peerWS.Store(-1)
	f.ourWS.Store(-1)
	t.m[k] = f
	return f
}

// claim returns the flow for k, creating it if the SYNs were never seen,
// and marks it as owned by a Conn.
func (t *flowTable) claim(k flowKey) *flow {
	f := t.getOrCreate(k)
	f.claimed.Store(true)
	return f
}

// remove deletes k if it still maps to f (any flow when f is nil).
func (t *flowTable) remove(k flowKey, f *flow) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.m[k]; ok && (f == nil || cur == f) {
		if cur.hook.Swap(nil) != nil {
			t.hooks.Add(-1)
		}
		cur.removed.Store(true)
		delete(t.m, k)
		cur.tail.release()
		cur.hold.release()
		cur.kept.release()
	}
}

// setHook installs or removes f's per-connection hook.
func (t *flowTable) setHook(f *flow, h SegmentHook) {
	var b *hookBox
	if h != nil {
		b = &hookBox{h: h, payload: wantsPayload(h)}
	}
	old := f.hook.Swap(b)
	switch {
	case old == nil && b != nil:
		t.hooks.Add(1)
	case old != nil && b == nil:
		t.hooks.Add(-1)
	}
}
