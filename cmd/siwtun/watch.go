package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/offload/mpa/inspect"
)

// watchOptions are the flags of `siwtun capture` and `siwtun trace`.
type watchOptions struct {
	ctl      ctlOptions
	qp       int
	count    int
	duration time.Duration
	// what names the command in the line that says the watch started;
	// log receives that line (standard error).
	what string
	log  io.Writer
}

func addWatchFlags(cmd *cobra.Command, o *watchOptions) {
	f := cmd.Flags()
	f.StringVar(&o.ctl.dev, "dev", defaultDev, "device to watch")
	socketDirFlag(f, &o.ctl.dir, "control sockets")
	f.IntVar(&o.qp, "qp", 0, "only the connection of this queue pair (and its placements and completions); 0: all, as in ctl qp --qp")
	f.IntVarP(&o.count, "count", "c", 0, "stop after this many segments (0: until interrupted)")
	f.DurationVar(&o.duration, "duration", 0, "stop after this long (0: until interrupted)")
}

// segBlock is one segment with what the checker found in it and the
// placements and completions that followed it. A block without a segment
// carries only completions (or placements) that had no segment to join.
type segBlock struct {
	gap     *ctl.WatchGap // a window of events the daemon left out (alone)
	seg     *ctl.WatchSegment
	time    time.Time
	reports []inspect.Report
	places  []ctl.WatchPlace
	wcs     []ctl.WatchWC
	keys    []placeKey // placements still expected
	arrived time.Time
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

// joinAge is how long a segment waits for the placements of its FPDUs.
const joinAge = 200 * time.Millisecond

// joiner attaches placements and completions to the segments they follow
// and hands the blocks on in arrival order.
type joiner struct {
	q    []*segBlock
	sink func(*segBlock) error
	// early holds out-of-order placements: the engine places them from
	// the segment hook, so they are reported just before their segment.
	early []earlyPlace
}

// earlyPlace is an out-of-order placement waiting for its segment.
type earlyPlace struct {
	p ctl.WatchPlace
	t time.Time
}

func (j *joiner) segment(b *segBlock) error {
	for i := 0; i < len(j.early); {
		if b.expects(&j.early[i].p) {
			// The FPDU stays expected: it is placed again in order.
			b.places = append(b.places, j.early[i].p)
			j.early = append(j.early[:i], j.early[i+1:]...)
			continue
		}
		i++
	}
	j.q = append(j.q, b)
	return j.flush(false)
}

// expects reports whether p places one of the FPDUs b still expects.
func (b *segBlock) expects(p *ctl.WatchPlace) bool {
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
				b.places = append(b.places, p)
				return j.flush(false)
			}
		}
	}
	if len(j.q) > 0 {
		last := j.q[len(j.q)-1]
		last.places = append(last.places, p)
		return nil
	}
	return j.sink(&segBlock{time: t, places: []ctl.WatchPlace{p}})
}

func (j *joiner) completion(wc ctl.WatchWC, t time.Time) error {
	if len(j.q) > 0 {
		last := j.q[len(j.q)-1]
		last.wcs = append(last.wcs, wc)
		return nil
	}
	return j.sink(&segBlock{time: t, wcs: []ctl.WatchWC{wc}})
}

// flush hands on the blocks at the head of the queue that expect no more
// placements or have waited joinAge (all of them when all is set).
func (j *joiner) flush(all bool) error {
	now := time.Now()
	for len(j.early) > 0 && (all || now.Sub(j.early[0].t) >= joinAge) {
		e := j.early[0]
		j.early = j.early[1:]
		if err := j.sink(&segBlock{time: e.t, places: []ctl.WatchPlace{e.p}}); err != nil {
			return err
		}
	}
	for len(j.q) > 0 {
		b := j.q[0]
		if !all && len(b.keys) > 0 && now.Sub(b.arrived) < joinAge {
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
	o       *ctlOptions
	known   bool
	a, b    netip.AddrPort
	lastTry time.Time
	early   map[[2]netip.AddrPort][]*segBlock
}

// maxEarly bounds the segments kept per connection before the queue
// pair's addresses are known.
const maxEarly = 16

func newQPFilter(o *ctlOptions, qp int) (*qpFilter, error) {
	f := &qpFilter{qp: uint32(qp), o: o, early: make(map[[2]netip.AddrPort][]*segBlock)}
	if err := f.resolve(); err != nil {
		return nil, err
	}
	return f, nil
}

// resolve asks the daemon for the queue pair's addresses.
func (f *qpFilter) resolve() error {
	f.lastTry = time.Now()
	c, err := f.o.dial()
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
func (f *qpFilter) segments(b *segBlock) []*segBlock {
	s := b.seg
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

// watchSink receives the joined blocks.
type watchSink interface {
	block(b *segBlock) error
	finish(dropped uint64) error
}

// runWatch streams the device's events into the sink open returns until
// the count or the duration is reached, the daemon ends the stream, or
// SIGINT/SIGTERM. open runs once the stream is up, so nothing is created
// (a capture file) for a device that is not there.
func runWatch(o *watchOptions, open func() (watchSink, error)) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	if o.qp < 0 {
		return fmt.Errorf("--qp %d: queue pair numbers start at 1; 0, the default, is every queue pair", o.qp)
	}
	var filter *qpFilter
	if o.qp > 0 {
		var err error
		if filter, err = newQPFilter(&o.ctl, o.qp); err != nil {
			return err
		}
	}
	c, err := o.ctl.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	stream, err := c.Watch()
	if err != nil {
		return err
	}
	sink, err := open()
	if err != nil {
		return err
	}
	if o.log != nil {
		filter := ""
		if o.qp > 0 {
			filter = fmt.Sprintf(", queue pair %d", o.qp)
		}
		until := "Ctrl-C to stop"
		switch {
		case o.duration > 0 && o.count > 0:
			until = fmt.Sprintf("for %v or %d segments; Ctrl-C to stop earlier", o.duration, o.count)
		case o.duration > 0:
			until = fmt.Sprintf("for %v; Ctrl-C to stop earlier", o.duration)
		case o.count > 0:
			until = fmt.Sprintf("for %d segments; Ctrl-C to stop earlier", o.count)
		}
		fmt.Fprintf(o.log, "siwtun %s: watching %s%s (%s)\n", o.what, o.ctl.dev, filter, until)
	}
	type item struct {
		e   ctl.WatchEvent
		err error
	}
	events := make(chan item, 256)
	go func() {
		defer close(events)
		for {
			e, err := stream.Next()
			events <- item{e, err}
			if err != nil {
				return
			}
		}
	}()
	a := inspect.New()
	segments := 0
	var dropped uint64
	j := &joiner{sink: sink.block}
	tick := time.NewTicker(joinAge / 2)
	defer tick.Stop()
	finish := func(err error) error {
		c.Close()
		if ferr := j.flush(true); err == nil {
			err = ferr
		}
		if ferr := sink.finish(dropped); err == nil {
			err = ferr
		}
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return finish(nil)
		case <-tick.C:
			if err := j.flush(false); err != nil {
				return finish(err)
			}
		case it, ok := <-events:
			if !ok {
				return finish(nil)
			}
			if it.err != nil {
				if errors.Is(it.err, io.EOF) {
					return finish(nil) // the daemon stopped
				}
				return finish(it.err)
			}
			e := it.e
			if e.Dropped > dropped {
				dropped = e.Dropped
			}
			switch {
			case e.Gap != nil:
				// What came before the gap goes out first.
				if err := j.flush(true); err != nil {
					return finish(err)
				}
				g := e.Gap
				rs := make([]inspect.Unobserved, len(g.Dirs))
				for i, d := range g.Dirs {
					rs[i] = inspect.Unobserved{Src: d.Src, Dst: d.Dst, Seq: d.Seq, End: d.End}
				}
				a.NotObserved(rs, g.MoreDirs)
				if err := sink.block(&segBlock{gap: g, time: e.Time}); err != nil {
					return finish(err)
				}
			case e.Segment != nil:
				s := e.Segment
				b := &segBlock{seg: s, time: e.Time, arrived: time.Now()}
				b.reports = a.Add(inspect.Segment{Time: e.Time, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Flags: s.Flags, Payload: s.Payload})
				if s.Dir == "in" {
					b.keys = expectPlacements(b.reports)
				}
				blocks := []*segBlock{b}
				if filter != nil {
					blocks = filter.segments(b)
				}
				for _, b := range blocks {
					if err := j.segment(b); err != nil {
						return finish(err)
					}
					segments++
					if o.count > 0 && segments >= o.count {
						return finish(nil)
					}
				}
			case e.Place != nil:
				if filter == nil || e.Place.QP == filter.qp {
					if err := j.place(*e.Place, e.Time); err != nil {
						return finish(err)
					}
				}
			case e.WC != nil:
				if filter == nil || e.WC.QP == filter.qp {
					if err := j.completion(*e.WC, e.Time); err != nil {
						return finish(err)
					}
				}
			}
		}
	}
}

// placeString renders a placement, for example
// "placed: QP 1 RDMA Write stag 0x200 to 0x1000 (region offset 0x0), 1380 octets".
func placeString(p *ctl.WatchPlace) string {
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

// wcString renders a completion, for example
// "completion: QP 1 RDMA_WRITE wr 1 success, 4096 bytes".
func wcString(wc *ctl.WatchWC) string {
	return fmt.Sprintf("completion: QP %d %s wr %d %s, %d bytes", wc.QP, wc.Opcode, wc.ID, wc.Status, wc.ByteLen)
}
