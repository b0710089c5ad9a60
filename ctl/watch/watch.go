// Package watch follows a device's traffic through its daemon's control
// socket, for siwtun trace, capture and trace --html: each TCP segment
// checked by the MPA inspector as it comes, and the placements and
// completions the engine reports joined to the segment whose FPDUs they
// belong to, handed to a Sink one Block at a time in arrival order.
package watch

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// Block is one segment with what the checker found in it and the
// placements and completions that followed it. A block without a segment
// carries only completions (or placements) that had no segment to join.
type Block struct {
	Gap     *ctl.WatchGap // a window of events the daemon left out (alone)
	Seg     *ctl.WatchSegment
	Time    time.Time        // when the daemon saw it
	Reports []inspect.Report // the checker's findings in Seg
	Places  []ctl.WatchPlace
	WCs     []ctl.WatchWC

	keys    []placeKey // placements still expected
	arrived time.Time  // when it arrived here
}

// placeKey names an FPDU whose payload the engine will place.
type placeKey struct {
	tagged  bool
	stag    uint32
	to      uint64
	msn, mo uint32
}

func (k placeKey) match(p *ctl.WatchPlace) bool {
	if k.tagged {
		return p.STag == k.stag && p.TO == k.to && p.MSN == 0
	}
	return p.STag == 0 && p.MSN == k.msn && p.MO == k.mo
}

// expectPlacements lists the FPDUs of an inbound segment whose payload is
// placed when they end.
func expectPlacements(rs []inspect.Report) []placeKey {
	var keys []placeKey
	for _, r := range rs {
		for _, f := range r.FPDUs {
			h := f.Header
			if !f.Ends || h == nil || h.Payload == 0 || f.CRC == "bad" {
				continue
			}
			switch {
			case h.Tagged:
				keys = append(keys, placeKey{tagged: true, stag: h.STag, to: h.TO})
			case strings.HasPrefix(h.Op, "Send"):
				keys = append(keys, placeKey{msn: h.MSN, mo: h.MO})
			}
		}
	}
	return keys
}

// JoinAge is how long a segment waits for the placements of its FPDUs.
const JoinAge = 200 * time.Millisecond

// joiner attaches placements and completions to the segments they follow
// and hands the blocks on in arrival order.
type joiner struct {
	q    []*Block
	sink func(*Block) error
	// early holds out-of-order placements: the engine places them from
	// the segment hook, so they are reported just before their segment.
	early []earlyPlace
}

// earlyPlace is an out-of-order placement waiting for its segment.
type earlyPlace struct {
	p ctl.WatchPlace
	t time.Time
}

func (j *joiner) segment(b *Block) error {
	for i := 0; i < len(j.early); {
		if b.expects(&j.early[i].p) {
			// The FPDU stays expected: it is placed again in order.
			b.Places = append(b.Places, j.early[i].p)
			j.early = append(j.early[:i], j.early[i+1:]...)
			continue
		}
		i++
	}
	j.q = append(j.q, b)
	return j.flush(false)
}

// expects reports whether p places one of the FPDUs b still expects.
func (b *Block) expects(p *ctl.WatchPlace) bool {
	for _, k := range b.keys {
		if k.match(p) {
			return true
		}
	}
	return false
}

func (j *joiner) place(p ctl.WatchPlace, t time.Time) error {
	if p.OutOfOrder {
		j.early = append(j.early, earlyPlace{p: p, t: t})
		return j.flush(false)
	}
	for _, b := range j.q {
		for i, k := range b.keys {
			if k.match(&p) {
				b.keys = append(b.keys[:i], b.keys[i+1:]...)
				b.Places = append(b.Places, p)
				return j.flush(false)
			}
		}
	}
	if len(j.q) > 0 {
		last := j.q[len(j.q)-1]
		last.Places = append(last.Places, p)
		return nil
	}
	return j.sink(&Block{Time: t, Places: []ctl.WatchPlace{p}})
}

func (j *joiner) completion(wc ctl.WatchWC, t time.Time) error {
	if len(j.q) > 0 {
		last := j.q[len(j.q)-1]
		last.WCs = append(last.WCs, wc)
		return nil
	}
	return j.sink(&Block{Time: t, WCs: []ctl.WatchWC{wc}})
}

// flush hands on the blocks at the head of the queue that expect no more
// placements or have waited JoinAge (all of them when all is set).
func (j *joiner) flush(all bool) error {
	now := time.Now()
	for len(j.early) > 0 && (all || now.Sub(j.early[0].t) >= JoinAge) {
		e := j.early[0]
		j.early = j.early[1:]
		if err := j.sink(&Block{Time: e.t, Places: []ctl.WatchPlace{e.p}}); err != nil {
			return err
		}
	}
	for len(j.q) > 0 {
		b := j.q[0]
		if !all && len(b.keys) > 0 && now.Sub(b.arrived) < JoinAge {
			return nil
		}
		j.q = j.q[1:]
		if err := j.sink(b); err != nil {
			return err
		}
	}
	return nil
}

// qpFilter keeps the segments of one queue pair's connection. Until the
// daemon reports the connection's addresses (after the MPA exchange), the
// first segments of every connection are kept, so the handshake of the
// queue pair's connection is not lost.
type qpFilter struct {
	qp      uint32
	dial    func() (*ctl.Client, error)
	known   bool
	a, b    netip.AddrPort
	lastTry time.Time
	early   map[[2]netip.AddrPort][]*Block
}

// maxEarly bounds the segments kept per connection before the queue
// pair's addresses are known.
const maxEarly = 16

func newQPFilter(dial func() (*ctl.Client, error), qp int) (*qpFilter, error) {
	f := &qpFilter{qp: uint32(qp), dial: dial, early: make(map[[2]netip.AddrPort][]*Block)}
	if err := f.resolve(); err != nil {
		return nil, err
	}
	return f, nil
}

// resolve asks the daemon for the queue pair's addresses.
func (f *qpFilter) resolve() error {
	f.lastTry = time.Now()
	c, err := f.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	qps, err := c.QPs(int(f.qp))
	if err != nil {
		return err
	}
	if len(qps) == 1 && qps[0].Src != "" && qps[0].Dst != "" {
		a, err1 := netip.ParseAddrPort(qps[0].Src)
		b, err2 := netip.ParseAddrPort(qps[0].Dst)
		if err1 == nil && err2 == nil {
			f.a, f.b, f.known = a, b, true
		}
	}
	return nil
}

func connOf(s *ctl.WatchSegment) [2]netip.AddrPort {
	if s.Src.Compare(s.Dst) < 0 {
		return [2]netip.AddrPort{s.Src, s.Dst}
	}
	return [2]netip.AddrPort{s.Dst, s.Src}
}

// segments returns the blocks to pass on for b: none, b, or b after the
// kept first segments of its connection.
func (f *qpFilter) segments(b *Block) []*Block {
	s := b.Seg
	if !f.known && time.Since(f.lastTry) > 100*time.Millisecond {
		if f.resolve() != nil {
			f.lastTry = time.Now()
		}
	}
	k := connOf(s)
	if !f.known {
		if e := f.early[k]; len(e) < maxEarly && len(f.early) < 1024 {
			f.early[k] = append(e, b)
		}
		return nil
	}
	if k != connOf(&ctl.WatchSegment{Src: f.a, Dst: f.b}) {
		return nil
	}
	out := append(f.early[k], b)
	delete(f.early, k)
	return out
}

// PlaceString renders a placement, for example
// "placed: QP 1 RDMA Write stag 0x200 to 0x1000 (region offset 0x0), 1380 octets".
func PlaceString(p *ctl.WatchPlace) string {
	var where string
	if p.STag != 0 || p.TO != 0 {
		where = fmt.Sprintf("stag 0x%x to 0x%x (region offset 0x%x)", p.STag, p.TO, p.Offset)
	} else {
		where = fmt.Sprintf("msn %d mo %d into receive wr %d at offset %d", p.MSN, p.MO, p.RecvWR, p.Offset)
	}
	s := fmt.Sprintf("placed: QP %d %s %s, %d octets", p.QP, p.Op, where, p.Len)
	if p.OutOfOrder {
		s += ", out of order"
	}
	return s
}

// WCString renders a completion, for example
// "completion: QP 1 RDMA_WRITE wr 1 success, 4096 bytes".
func WCString(wc *ctl.WatchWC) string {
	return fmt.Sprintf("completion: QP %d %s wr %d %s, %d bytes", wc.QP, wc.Opcode, wc.ID, wc.Status, wc.ByteLen)
}
