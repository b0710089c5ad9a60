package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/ctl/watch"
	"github.com/siwtun/siwtun/web"
)

// defaultWebListen is where `siwtun web` serves by default: loopback only.
const defaultWebListen = "127.0.0.1:7180"

// webStatePeriod is how often `siwtun web` asks the daemons for their queue
// pairs and counters, and dropAge how long a segment one end sent may go
// unseen at the other before it counts as dropped.
const (
	webStatePeriod = time.Second
	dropAge        = 2 * time.Second
	// stallAge is how long a device's stream may stay silent (its
	// daemon sends a heartbeat every 50 ms) before the other device's
	// events stop waiting for it.
	stallAge = 2 * time.Second
)

// samplingPolicy says, on the page, how the daemons sample what the view
// cannot take (offload.Watch, ctl's watch stream).
const samplingPolicy = "whole windows: when the view falls behind, a daemon leaves out every event until the view has caught up, and the ladder marks each window it left out"

func newWebCmd() *cobra.Command {
	var (
		listen  string
		devs    []string
		dir     string
		maxSegs int
	)
	cmd := &cobra.Command{
		Use:   "web [--listen 127.0.0.1:7180] [--dev siwtun0 [--dev siwtun1]]",
		Short: "Serve a live web view of what the RNIC does (ladder, byte maps, memory, queue pairs)",
		Long: `web serves, at --listen (loopback by default), a page that shows live what
the daemons of the given devices do, from their ctl watch streams (the same
records siwtun trace prints, run through the same checker as siwtun check):
a ladder diagram with one arrow per TCP segment, the byte map of a chosen
segment (Markers with their FPDUPTR, MPA, DDP and RDMAP fields, payload, pad,
CRC), a memory strip per region that fills as payload is placed, the queue
pairs' states, the MPA negotiation and the counters, each linked to the RFC
section that defines it.

The first --dev is the ladder's left side. A second --dev (the peer of the
connections) adds when each segment reached the other end, and marks the
segments one end sent and the other never received (dropped). The rows are
in time order across both devices (CLOCK_MONOTONIC, which the daemons of
one host share). Start it before connecting: FPDUs are decoded for
connections whose MPA Request and Reply it saw.

When the view cannot keep up (a bulk transfer), a daemon leaves out whole
windows of events rather than single ones, and reports each: the ladder
shows the window as a row of its own ("not observed"), and the checker
skips the octets in it and picks the FPDU stream up again at the next FPDU
it can verify; no segment is flagged out of order because of them.
--max-segments bounds the view's memory. See doc/live-view.md.

The page's round trip anatomy section has buttons that start and stop
both daemons' recorders of hop stamps (as siwtun ctl anatomy start and
show do) and show, for each connection between the watched devices, every
hop's median and 99th percentile in each direction (doc/latency-anatomy.md).
The recorders are on only between Record and Stop; they stop when no page
has been open for 5 seconds, and when siwtun web ends.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runWeb(ctx, cmd.OutOrStdout(), listen, dir, devs, maxSegs)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", defaultWebListen, "address to serve the page at (keep it on loopback: the page shows memory contents' placement and addresses)")
	f.StringArrayVar(&devs, "dev", []string{defaultDev}, "device to watch (at most two: the first is the ladder's left side)")
	socketDirFlag(f, &dir, "control sockets")
	f.IntVar(&maxSegs, "max-segments", defaultWebMaxSegments, "the most segments the view holds (its memory grows with them, about 3 KiB each); later traffic is left out, and the page says so; 0: no limit")
	return cmd
}

// defaultWebMaxSegments bounds the view of `siwtun web`: some minutes of
// sampled bulk traffic, a few hundred MB.
const defaultWebMaxSegments = 100000

// runWeb serves the live view of devs until ctx ends or a watch fails.
func runWeb(ctx context.Context, w io.Writer, listen, dir string, devs []string, maxSegs int) error {
	if maxSegs < 0 {
		return fmt.Errorf("web: --max-segments %d: want a number of segments, or 0 for no limit", maxSegs)
	}
	if len(devs) == 0 || len(devs) > 2 {
		return fmt.Errorf("web: give one or two devices (--dev), not %d", len(devs))
	}
	if host, _, err := net.SplitHostPort(listen); err == nil {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			fmt.Fprintf(w, "siwtun web: warning: %s is not a loopback address; anyone who can reach it sees the trace\n", listen)
		}
	}
	peer := ""
	if len(devs) == 2 {
		peer = devs[1]
	}
	opts := make([]ctlOptions, len(devs))
	for i, d := range devs {
		opts[i] = ctlOptions{dev: d, dir: dir}
	}
	b := web.NewBuilder("siwtun web "+devs[0], devs[0], peer, regionLookup(opts))
	b.SetLive()
	b.SetSampling(samplingPolicy)
	b.SetMaxSegments(maxSegs)
	anat := newWebAnatomy(b, opts)
	b.SetAnatomyControl(anat.control)
	defer anat.stop()
	streams, closeAll, err := openWebStreams(opts)
	if err != nil {
		return err
	}
	defer closeAll()
	srv, err := web.Serve(listen, b)
	if err != nil {
		return err
	}
	defer srv.Close()
	fmt.Fprintf(w, "siwtun web: watching %v; open %s (Ctrl-C to stop)\n", devs, srv.URL())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The two daemons' events, put in one order by their common clock.
	m := web.NewMerger(b, len(devs), stallAge)
	defer m.Flush()
	errc := mergeWebStreams(m, streams, devs)
	tick := time.NewTicker(webStatePeriod)
	defer tick.Stop()
	for {
		m.Tick()
		pollState(b, opts)
		if peer != "" {
			b.Sweep(time.Now(), dropAge)
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-tick.C:
		}
	}
}

// openWebStreams opens the watch streams of the devices' daemons; closeAll
// closes their clients.
func openWebStreams(opts []ctlOptions) (streams []*ctl.WatchStream, closeAll func(), err error) {
	var clients []*ctl.Client
	closeAll = func() {
		for _, c := range clients {
			c.Close()
		}
	}
	for i := range opts {
		c, err := opts[i].dial()
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		clients = append(clients, c)
		// The peer's segments are only matched with the local device's:
		// their payloads stay in its daemon.
		watch := c.Watch
		if i > 0 {
			watch = c.WatchHeaders
		}
		s, err := watch()
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		streams = append(streams, s)
	}
	return streams, closeAll, nil
}

// mergeWebStreams reads each stream on a goroutine of its own into m, and
// reports on the channel returned why a stream ended.
func mergeWebStreams(m *web.Merger, streams []*ctl.WatchStream, devs []string) <-chan error {
	errc := make(chan error, len(streams))
	for i, s := range streams {
		go func(i int, s *ctl.WatchStream) {
			for {
				e, err := s.Next()
				if err != nil {
					m.End(i)
					if !errors.Is(err, io.EOF) {
						errc <- err
					} else {
						errc <- fmt.Errorf("web: the daemon of %s ended the watch stream", devs[i])
					}
					return
				}
				m.Add(i, e)
			}
		}(i, s)
	}
	return errc
}

// regionLookup describes the devices' regions as their daemons list them
// (the ctl mr op), asking again when a region is not known yet.
func regionLookup(opts []ctlOptions) web.RegionLookup {
	var mu sync.Mutex
	known := make(map[string]map[uint32]web.Region)
	return func(dev string, stag uint32) (web.Region, bool) {
		mu.Lock()
		defer mu.Unlock()
		if r, ok := known[dev][stag]; ok {
			return r, true
		}
		for i := range opts {
			if opts[i].dev != dev {
				continue
			}
			c, err := opts[i].dial()
			if err != nil {
				return web.Region{}, false
			}
			mrs, err := c.MRs()
			c.Close()
			if err != nil {
				return web.Region{}, false
			}
			m := make(map[uint32]web.Region, len(mrs))
			for _, r := range mrs {
				m[r.STag] = web.Region{STag: r.STag, Addr: r.Addr, Len: r.Len, Access: r.Access, PD: r.PDN}
			}
			known[dev] = m
		}
		r, ok := known[dev][stag]
		return r, ok
	}
}

// pollState records every device's queue pairs and counters.
func pollState(b *web.Builder, opts []ctlOptions) {
	for i := range opts {
		c, err := opts[i].dial()
		if err != nil {
			continue
		}
		qps, err1 := c.QPs(0)
		st, err2 := c.Stats()
		c.Close()
		if err1 == nil && err2 == nil {
			b.SetState(time.Now(), opts[i].dev, qps, &st)
		}
	}
}

// htmlSink writes `siwtun trace --html`: the blocks of the watch, fed to
// a web.Builder as the events they came from, and the page at the end.
type htmlSink struct {
	b    *web.Builder
	o    *watchOptions
	path string
	w    io.Writer
	segs int
}

func newHTMLSink(o *watchOptions, path string, w io.Writer) *htmlSink {
	lookup := regionLookup([]ctlOptions{o.ctl})
	return &htmlSink{b: web.NewBuilder("siwtun trace "+o.ctl.dev, o.ctl.dev, "", lookup), o: o, path: path, w: w}
}

func (s *htmlSink) Block(bl *watch.Block) error {
	if bl.Gap != nil {
		// The blocks' times are wall clock times: the gap's too.
		g := *bl.Gap
		g.FromMono, g.ToMono = 0, 0
		s.b.Event(true, ctl.WatchEvent{Time: bl.Time, Gap: &g})
		return nil
	}
	if bl.Seg != nil {
		s.b.Event(true, ctl.WatchEvent{Time: bl.Time, Segment: bl.Seg})
		s.segs++
	}
	for i := range bl.Places {
		s.b.Event(true, ctl.WatchEvent{Time: bl.Time, Place: &bl.Places[i]})
	}
	for i := range bl.WCs {
		s.b.Event(true, ctl.WatchEvent{Time: bl.Time, WC: &bl.WCs[i]})
	}
	return nil
}

func (s *htmlSink) Finish(dropped uint64) error {
	if dropped > 0 {
		s.b.Event(true, ctl.WatchEvent{Time: time.Now(), Dropped: dropped})
	}
	pollState(s.b, []ctlOptions{s.o.ctl})
	s.b.Finish()
	if err := createFile(s.path, s.b.WriteHTML); err != nil {
		return err
	}
	fmt.Fprintf(s.w, "%d segments written to %s (open it in a browser; it needs no network)\n", s.segs, s.path)
	return nil
}
