package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// Options say which device to follow and for how long.
type Options struct {
	// Dial connects to the device's daemon (its control socket); Run
	// dials once for the stream, and again to learn QP's addresses.
	Dial func() (*ctl.Client, error)
	// Dev names the device in the line that says the watch started.
	Dev string
	// QP keeps only the connection of this queue pair, with its
	// placements and completions; 0 keeps everything.
	QP int
	// Count stops after this many segments, Duration after this long
	// (0: no limit; the caller's context ends the watch too).
	Count    int
	Duration time.Duration
	// What names the command in the line that says the watch started,
	// which goes to Log (nil: no line).
	What string
	Log  io.Writer
}

// Sink receives the joined blocks.
type Sink interface {
	// Block takes one block; an error ends the watch.
	Block(b *Block) error
	// Finish is called once at the end with the count of events the
	// daemon dropped because the stream fell behind.
	Finish(dropped uint64) error
}

// Run streams the device's events into the sink open returns until the
// count or the duration is reached, the daemon ends the stream, or ctx
// ends. open runs once the stream is up, so nothing is created (a capture
// file) for a device that is not there.
func Run(ctx context.Context, o Options, open func() (Sink, error)) error {
	if o.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Duration)
		defer cancel()
	}
	if o.QP < 0 {
		return fmt.Errorf("--qp %d: queue pair numbers start at 1; 0, the default, is every queue pair", o.QP)
	}
	var filter *qpFilter
	if o.QP > 0 {
		var err error
		if filter, err = newQPFilter(o.Dial, o.QP); err != nil {
			return err
		}
	}
	c, err := o.Dial()
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
	if o.Log != nil {
		fmt.Fprintf(o.Log, "siwtun %s: watching %s%s (%s)\n", o.What, o.Dev, o.filterNote(), o.until())
	}
	r := &run{o: &o, filter: filter, a: inspect.New(), j: &joiner{sink: sink.Block}}
	err = r.loop(ctx, readEvents(stream))
	c.Close()
	if ferr := r.j.flush(true); err == nil {
		err = ferr
	}
	if ferr := sink.Finish(r.dropped); err == nil {
		err = ferr
	}
	return err
}

// filterNote is the start line's note of the queue pair kept, if any.
func (o *Options) filterNote() string {
	if o.QP > 0 {
		return fmt.Sprintf(", queue pair %d", o.QP)
	}
	return ""
}

// until is the start line's note of when the watch ends.
func (o *Options) until() string {
	switch {
	case o.Duration > 0 && o.Count > 0:
		return fmt.Sprintf("for %v or %d segments; Ctrl-C to stop earlier", o.Duration, o.Count)
	case o.Duration > 0:
		return fmt.Sprintf("for %v; Ctrl-C to stop earlier", o.Duration)
	case o.Count > 0:
		return fmt.Sprintf("for %d segments; Ctrl-C to stop earlier", o.Count)
	}
	return "Ctrl-C to stop"
}

// item is one read from the stream: an event or the error that ended it.
type item struct {
	e   ctl.WatchEvent
	err error
}

// readEvents reads the stream on a goroutine of its own until it ends
// (closing the client ends it), so the run loop can flush on a timer.
func readEvents(stream *ctl.WatchStream) <-chan item {
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
	return events
}

// errDone ends the loop without an error: the count was reached.
var errDone = errors.New("watch: done")

// run is one watch's state: the checker, the joiner, the filter and the
// counts.
type run struct {
	o        *Options
	filter   *qpFilter
	a        *inspect.Analyzer
	j        *joiner
	segments int
	dropped  uint64
}

// loop handles events until the stream or ctx ends, an error, or the
// count.
func (r *run) loop(ctx context.Context, events <-chan item) error {
	tick := time.NewTicker(JoinAge / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := r.j.flush(false); err != nil {
				return err
			}
		case it, ok := <-events:
			if !ok || errors.Is(it.err, io.EOF) {
				return nil // the daemon stopped
			}
			if it.err != nil {
				return it.err
			}
			if err := r.event(&it.e); err != nil {
				if err == errDone {
					return nil
				}
				return err
			}
		}
	}
}

// event handles one event of the stream.
func (r *run) event(e *ctl.WatchEvent) error {
	if e.Dropped > r.dropped {
		r.dropped = e.Dropped
	}
	switch {
	case e.Gap != nil:
		return r.gap(e)
	case e.Segment != nil:
		return r.segment(e)
	case e.Place != nil:
		if r.filter == nil || e.Place.QP == r.filter.qp {
			return r.j.place(*e.Place, e.Time)
		}
	case e.WC != nil:
		if r.filter == nil || e.WC.QP == r.filter.qp {
			return r.j.completion(*e.WC, e.Time)
		}
	}
	return nil
}

// gap hands on a window of events the daemon left out, after what came
// before it, and tells the checker which streams it did not see.
func (r *run) gap(e *ctl.WatchEvent) error {
	if err := r.j.flush(true); err != nil {
		return err
	}
	g := e.Gap
	rs := make([]inspect.Unobserved, len(g.Dirs))
	for i, d := range g.Dirs {
		rs[i] = inspect.Unobserved{Src: d.Src, Dst: d.Dst, Seq: d.Seq, End: d.End}
	}
	r.a.NotObserved(rs, g.MoreDirs)
	return r.j.sink(&Block{Gap: g, Time: e.Time})
}

// segment checks a segment and queues it (with the kept first segments
// of its connection, when a queue pair's addresses have just become
// known) for its placements.
func (r *run) segment(e *ctl.WatchEvent) error {
	s := e.Segment
	b := &Block{Seg: s, Time: e.Time, arrived: time.Now()}
	b.Reports = r.a.Add(inspect.Segment{Time: e.Time, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Flags: s.Flags, Payload: s.Payload})
	if s.Dir == "in" {
		b.keys = expectPlacements(b.Reports)
	}
	blocks := []*Block{b}
	if r.filter != nil {
		blocks = r.filter.segments(b)
	}
	for _, b := range blocks {
		if err := r.j.segment(b); err != nil {
			return err
		}
		r.segments++
		if r.o.Count > 0 && r.segments >= r.o.Count {
			return errDone
		}
	}
	return nil
}
