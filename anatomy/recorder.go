package anatomy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Hop is a point on a message's way from one application to the other.
// The hops are numbered in the order a message passes them.
type Hop uint8

// The hops of one direction of a round trip: the sender's application
// and daemon, then the receiver's daemon and application.
const (
	// Post: the application posts the work request (its own stamp).
	Post Hop = iota + 1
	// Pickup: the engine takes the request from the application (the
	// daemon's ring goroutine hands it to the QP: QP.PostSend).
	Pickup
	// TXStart: the QP's TX goroutine takes the request up.
	TXStart
	// Built: its FPDUs are built in TCP's send buffer (the payload copied
	// from registered memory, the CRC computed).
	Built
	// TCPOut: TCP has made the segment and hands it to the link.
	TCPOut
	// TUNWrite: the segment goes into the TUN device (the write system
	// call begins; the kernel routes the packet to the peer's device
	// within it).
	TUNWrite
	// TUNRead: the peer's read from its TUN device returned the segment.
	// (Over netstack's in-memory Pipe, as in-process RNICs run, TUNWrite
	// is the hand-over to the pipe and TUNRead the pipe goroutine's
	// delivery to the peer's stack.)
	TUNRead
	// Queued: the peer's TCP, having run its receive path on the segment
	// (gVisor's processor goroutine), queued the data and woke the reader.
	Queued
	// Handover: the peer's TCP hands the payload to the QP's RX goroutine
	// (the MPA receiver inside the TCP read).
	Handover
	// Placed: the FPDU was parsed, its CRC and header checked, its
	// payload placed.
	Placed
	// Seen: the application saw the data (its own stamp).
	Seen
	numHops
)

var hopNames = [numHops]string{
	Post:     "post",
	Pickup:   "pickup",
	TXStart:  "tx",
	Built:    "built",
	TCPOut:   "tcp-out",
	TUNWrite: "tun-write",
	TUNRead:  "tun-read",
	Queued:   "queued",
	Handover: "handover",
	Placed:   "placed",
	Seen:     "seen",
}

// String returns the hop's short name ("post", "tun-read", ...).
func (h Hop) String() string {
	if h > 0 && h < numHops {
		return hopNames[h]
	}
	return fmt.Sprintf("hop(%d)", uint8(h))
}

// MarshalText names the hop (JSON).
func (h Hop) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// Valid reports whether h is one of the hops.
func (h Hop) Valid() bool { return h > 0 && h < numHops }

// Record is one stamp: a hop of the octets [Seq, Seq+Len) of the TCP
// connection's direction from SrcPort to DstPort (the data's direction,
// seen alike by both daemons), at T (Now). An application's stamps
// (Post, Seen) carry the ports of its connection and no sequence number.
type Record struct {
	Hop              Hop
	SrcPort, DstPort uint16
	Seq, Len         uint32
	T                int64
}

// Ring and limits.
const (
	// RingSize is how many daemon stamps a Recorder keeps (the newest);
	// a 4 B round trip makes 16, so a run of 8,000 round trips fits.
	RingSize = 1 << 17
	// MaxAppRecords bounds the applications' stamps a Recorder keeps.
	MaxAppRecords = 1 << 17
)

// ringEntry is one slot of the ring, written with atomic stores so a
// reader never races a writer (a slot read while it is being rewritten
// is caught by its generation, or is at worst one stale stamp).
type ringEntry struct {
	t   atomic.Int64
	key atomic.Uint64 // SrcPort<<48 | DstPort<<32 | Seq
	aux atomic.Uint64 // generation<<40 | hop<<32 | Len
}

// Recorder keeps one daemon's stamps. The zero value is off and usable.
// Stamp is safe for concurrent use; while the Recorder is off it returns
// at the caller's On check.
type Recorder struct {
	on   atomic.Bool
	gen  atomic.Uint64
	next atomic.Uint64
	ring []ringEntry // allocated by the first Start, then fixed

	mu     sync.Mutex
	app    []Record // guarded by mu
	appCut uint64   // app stamps refused since Start; guarded by mu
}

// NewRecorder returns a Recorder that is off.
func NewRecorder() *Recorder { return &Recorder{} }

// On reports whether stamps are being recorded; a nil Recorder is off.
// Stamp sites call it first: off, it is a load and a predictable branch
// (an atomic load is a plain load on amd64 and arm64).
func (r *Recorder) On() bool { return r != nil && r.on.Load() }

// Stamp records hop h of the octets [seq, seq+n) travelling from port
// sport to port dport, at t. It does not allocate. Call it only when On
// said true (it records nothing before the first Start).
func (r *Recorder) Stamp(h Hop, sport, dport uint16, seq, n uint32, t int64) {
	if r.ring == nil {
		return
	}
	i := r.next.Add(1) - 1
	e := &r.ring[i&(RingSize-1)]
	e.t.Store(t)
	e.key.Store(uint64(sport)<<48 | uint64(dport)<<32 | uint64(seq))
	e.aux.Store(r.gen.Load()<<40 | uint64(h)<<32 | uint64(n))
}

// Start forgets every stamp and starts recording.
func (r *Recorder) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on.Store(false)
	if r.ring == nil {
		r.ring = make([]ringEntry, RingSize)
	}
	r.gen.Add(1)
	r.next.Store(0)
	r.app, r.appCut = r.app[:0], 0
	r.on.Store(true)
}

// Stop stops recording; the stamps stay until the next Start.
func (r *Recorder) Stop() { r.on.Store(false) }

// ErrNotStarted is AddApp's error when the Recorder was never started.
var ErrNotStarted = errors.New("anatomy: recording was not started")

// AddApp adds an application's stamps (Post and Seen only) to those of
// the run; they count whether the Recorder is on or stopped since.
func (r *Recorder) AddApp(recs []Record) error {
	for _, rec := range recs {
		if rec.Hop != Post && rec.Hop != Seen {
			return fmt.Errorf("anatomy: an application stamps %v and %v only, not %v", Post, Seen, rec.Hop)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ring == nil {
		return ErrNotStarted
	}
	room := MaxAppRecords - len(r.app)
	if len(recs) > room {
		r.appCut += uint64(len(recs) - room)
		recs = recs[:room]
	}
	r.app = append(r.app, recs...)
	return nil
}

// Snapshot is what a Recorder holds: its state and its stamps.
type Snapshot struct {
	// On says whether it is recording.
	On bool
	// Records are the daemon's stamps of the run, oldest first, then the
	// applications'.
	Records []Record
	// Lost counts stamps lost: the ring's oldest, overwritten, and
	// applications' stamps beyond MaxAppRecords.
	Lost uint64
}

// Snapshot returns a copy of the stamps of the current (or last) run.
func (r *Recorder) Snapshot() Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Snapshot{On: r.on.Load()}
	if r.ring == nil {
		return s
	}
	n := r.next.Load()
	from := uint64(0)
	if n > RingSize {
		from = n - RingSize
		s.Lost = from
	}
	gen := r.gen.Load() & (1<<24 - 1)
	s.Records = make([]Record, 0, n-from+uint64(len(r.app)))
	for i := from; i < n; i++ {
		e := &r.ring[i&(RingSize-1)]
		aux := e.aux.Load()
		if aux>>40 != gen {
			continue // not written yet in this run, or being rewritten
		}
		key := e.key.Load()
		s.Records = append(s.Records, Record{
			Hop: Hop(aux >> 32 & 0xff), SrcPort: uint16(key >> 48), DstPort: uint16(key >> 32),
			Seq: uint32(key), Len: uint32(aux), T: e.t.Load(),
		})
	}
	s.Records = append(s.Records, r.app...)
	s.Lost += r.appCut
	return s
}
