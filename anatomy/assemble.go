package anatomy

import (
	"fmt"
	"slices"
	"time"
)

// Flow names one direction of a connection: the data's source and
// destination ports.
type Flow struct {
	Src uint16 `json:"src_port"`
	Dst uint16 `json:"dst_port"`
}

// Reverse is the flow the other way.
func (f Flow) Reverse() Flow { return Flow{Src: f.Dst, Dst: f.Src} }

func (f Flow) has(r *Record) bool { return r.SrcPort == f.Src && r.DstPort == f.Dst }

// Leg is one step of the way: from one hop to the next.
type Leg struct {
	From Hop `json:"from"`
	To   Hop `json:"to"`
}

// Legs are the steps of one direction, in order.
var Legs = []Leg{
	{Post, Pickup}, {Pickup, TXStart}, {TXStart, Built}, {Built, TCPOut}, {TCPOut, TUNWrite},
	{TUNWrite, TUNRead}, {TUNRead, Queued}, {Queued, Handover}, {Handover, Placed}, {Placed, Seen},
}

// legNames say what happens in each leg.
var legNames = map[Leg]string{
	{Post, Pickup}:      "post -> the daemon takes it (ring, doorbell)",
	{Pickup, TXStart}:   "-> the QP's TX goroutine takes it",
	{TXStart, Built}:    "-> FPDU built in TCP's send buffer",
	{Built, TCPOut}:     "-> TCP hands the segment to the link",
	{TCPOut, TUNWrite}:  "-> into the TUN write (system call)",
	{TUNWrite, TUNRead}: "-> the peer's TUN read returned (kernel)",
	{TUNRead, Queued}:   "-> TCP queued it (processor goroutine)",
	{Queued, Handover}:  "-> the RX goroutine takes it",
	{Handover, Placed}:  "-> FPDU parsed, checked, placed",
	{Placed, Seen}:      "-> the application sees it",
	{Post, Seen}:        "one way: post -> seen",
	{Post, Post}:        "round trip: post -> seen the answer",
}

// Name says what happens in the leg.
func (l Leg) Name() string {
	if n := legNames[l]; n != "" {
		return n
	}
	return fmt.Sprintf("%v -> %v", l.From, l.To)
}

// Stat summarises the durations of one leg over the messages that have
// both of its stamps.
type Stat struct {
	Leg    Leg           `json:"leg"`
	N      int           `json:"n"`
	Median time.Duration `json:"median_ns"`
	P99    time.Duration `json:"p99_ns"`
}

// Direction is the anatomy of one direction.
type Direction struct {
	// Flow is the data's direction (ports).
	Flow Flow `json:"flow"`
	// From and To name the sending and receiving side ("client",
	// "server").
	From string `json:"from"`
	To   string `json:"to"`
	// Messages is how many messages the sender's stamps show.
	Messages int `json:"messages"`
	// Legs are the legs of Legs in order, then the whole one-way trip
	// (Post to Seen).
	Legs []Stat `json:"legs"`
}

// Anatomy is a round trip taken apart: both directions, and the round
// trip itself as the first side's application saw it (its Post to its
// Seen of the answer).
type Anatomy struct {
	Dirs      [2]Direction `json:"directions"`
	RoundTrip Stat         `json:"round_trip"`
}

// Side is what one side of a ping-pong contributes: its daemon's records
// (its application's among them) and its name.
type Side struct {
	Name    string
	Records []Record
}

// Assemble takes a ping-pong apart. a is the side whose connection goes
// from port flow.Src to port flow.Dst (its application's data flow), b the
// other side. A message is found by its sender's Built stamp, the write
// of its FPDUs, [Seq, Seq+Len); every later hop is the first stamp of
// that hop after it whose octets include the message's last octet (a
// segment, a received view, an FPDU), so a segment or FPDU holding
// several messages counts for each and a retransmission does not. The applications' stamps
// carry no sequence numbers: a message's Post is the sender application's
// latest before the daemon took it, its Seen the receiver application's
// first after it was placed; in a ping-pong, with one message in flight,
// these are the right ones.
func Assemble(a, b Side, flow Flow) Anatomy {
	var an Anatomy
	an.Dirs[0] = direction(a, b, flow)
	an.Dirs[1] = direction(b, a, flow.Reverse())
	posts := timesOf(a.Records, Post, flow)
	seen := timesOf(a.Records, Seen, flow.Reverse())
	var rtt []time.Duration
	for _, p := range posts {
		if i, ok := firstAfter(seen, p); ok {
			rtt = append(rtt, time.Duration(seen[i]-p))
		}
	}
	an.RoundTrip = summarise(Leg{Post, Post}, rtt)
	return an
}

// direction assembles the messages from snd's application to rcv's.
func direction(snd, rcv Side, flow Flow) Direction {
	d := Direction{Flow: flow, From: snd.Name, To: rcv.Name}
	byHop := func(recs []Record, h Hop) []Record {
		var out []Record
		for i := range recs {
			if r := &recs[i]; r.Hop == h && flow.has(r) {
				out = append(out, *r)
			}
		}
		slices.SortStableFunc(out, func(x, y Record) int { return cmpInt64(x.T, y.T) })
		return out
	}
	built := byHop(snd.Records, Built)
	d.Messages = len(built)
	where := map[Hop][]Record{
		Pickup: byHop(snd.Records, Pickup), TXStart: byHop(snd.Records, TXStart),
		TCPOut: byHop(snd.Records, TCPOut), TUNWrite: byHop(snd.Records, TUNWrite),
		TUNRead: byHop(rcv.Records, TUNRead), Handover: byHop(rcv.Records, Handover),
		Placed: byHop(rcv.Records, Placed),
	}
	queued := timesOf(rcv.Records, Queued, flow)
	posts := timesOf(snd.Records, Post, flow)
	seen := timesOf(rcv.Records, Seen, flow)
	durs := make([][]time.Duration, len(Legs)+1)
	for _, m := range built {
		var at [numHops]int64
		var ok [numHops]bool
		at[Built], ok[Built] = m.T, true
		// Pickup and TXStart are stamped with the write they led to.
		for _, h := range []Hop{Pickup, TXStart} {
			if r, found := sameWrite(where[h], m); found {
				at[h], ok[h] = r.T, true
			}
		}
		last := m.Seq + m.Len - 1
		for _, h := range []Hop{TCPOut, TUNWrite, TUNRead, Handover, Placed} {
			if r, found := covering(where[h], last, m.T); found {
				at[h], ok[h] = r.T, true
			}
		}
		if ok[TUNRead] && ok[Handover] {
			// Queued stamps carry no sequence numbers: the first after
			// the segment came, if the hand-over did not come before.
			if i, found := firstAfter(queued, at[TUNRead]-1); found && queued[i] <= at[Handover] {
				at[Queued], ok[Queued] = queued[i], true
			}
		}
		if ok[Pickup] {
			if i, found := lastBefore(posts, at[Pickup]); found {
				at[Post], ok[Post] = posts[i], true
			}
		}
		if ok[Placed] {
			if i, found := firstAfter(seen, at[Placed]); found {
				at[Seen], ok[Seen] = seen[i], true
			}
		}
		for i, l := range Legs {
			if ok[l.From] && ok[l.To] {
				durs[i] = append(durs[i], time.Duration(at[l.To]-at[l.From]))
			}
		}
		if ok[Post] && ok[Seen] {
			durs[len(Legs)] = append(durs[len(Legs)], time.Duration(at[Seen]-at[Post]))
		}
	}
	for i, l := range Legs {
		d.Legs = append(d.Legs, summarise(l, durs[i]))
	}
	d.Legs = append(d.Legs, summarise(Leg{Post, Seen}, durs[len(Legs)]))
	return d
}

// timesOf returns the times of the stamps of hop h on flow (the
// applications', and TCP's Queued), in time order.
func timesOf(recs []Record, h Hop, flow Flow) []int64 {
	var ts []int64
	for i := range recs {
		if r := &recs[i]; r.Hop == h && flow.has(r) {
			ts = append(ts, r.T)
		}
	}
	slices.Sort(ts)
	return ts
}

// sameWrite finds the stamp made for the write m (same first octet) that
// is the latest at or before it.
func sameWrite(recs []Record, m Record) (Record, bool) {
	var best Record
	found := false
	for _, r := range recs {
		if r.T > m.T {
			break
		}
		if r.Seq == m.Seq {
			best, found = r, true
		}
	}
	return best, found
}

// covering returns the first stamp at or after t whose octets include
// seq (recs in time order).
func covering(recs []Record, seq uint32, t int64) (Record, bool) {
	i, _ := slices.BinarySearchFunc(recs, t, func(r Record, t int64) int { return cmpInt64(r.T, t) })
	for ; i < len(recs); i++ {
		if r := recs[i]; seq-r.Seq < r.Len {
			return r, true
		}
	}
	return Record{}, false
}

// lastBefore returns the index of the latest of ts at or before t.
func lastBefore(ts []int64, t int64) (int, bool) {
	i, _ := slices.BinarySearch(ts, t+1)
	return i - 1, i > 0
}

// firstAfter returns the index of the earliest of ts after t.
func firstAfter(ts []int64, t int64) (int, bool) {
	i, _ := slices.BinarySearch(ts, t+1)
	return i, i < len(ts)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// summarise returns the median and 99th percentile (nearest rank) of ds.
func summarise(l Leg, ds []time.Duration) Stat {
	s := Stat{Leg: l, N: len(ds)}
	if len(ds) == 0 {
		return s
	}
	slices.Sort(ds)
	s.Median = ds[rank(len(ds), 50)]
	s.P99 = ds[rank(len(ds), 99)]
	return s
}

// rank is the 0-based index of the p-th percentile of n sorted values by
// nearest rank.
func rank(n, p int) int {
	r := (n*p + 99) / 100 // ceil(n*p/100)
	return max(r-1, 0)
}
