package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/web"
)

// demoView feeds the watch streams of the in-process demo's two engines
// into a web.Builder: siwtun0 is the ladder's left side, siwtun1 its
// right; the demo's numbered lines become the view's steps. A lesson in
// parts runs each part on engines of its own: the view watches one pair
// after the other (attach, detach).
type demoView struct {
	b        *web.Builder
	names    [2]string
	mu       sync.Mutex
	engs     [2]*offload.Device // the engines watched now (for the regions' lookup)
	provs    [2]ctl.Provider
	watches  [2]*offload.Watch
	merger   *web.Merger   // the two engines' events in time order
	beat     chan struct{} // closed to stop the heartbeats
	wg       sync.WaitGroup
	srv      *web.Server
	attached bool // watching engs
	parts    int  // pairs of engines attached so far
	stopped  bool
	notes    map[string]string // a lesson's notes per step
}

// startDemoView starts watching both engines. With serve set it also
// serves the view live there.
func startDemoView(title string, names [2]string, engs [2]*offload.Device, serve string) (*demoView, error) {
	v := &demoView{names: names}
	lookup := func(dev string, stag uint32) (web.Region, bool) {
		v.mu.Lock()
		engs := v.engs
		v.mu.Unlock()
		for i, n := range names {
			if n != dev {
				continue
			}
			r, ok := engs[i].Regions().Lookup(stag)
			if !ok {
				return web.Region{}, false
			}
			return web.Region{Addr: r.Addr(), Len: r.Len(), Access: r.Access().String(), PD: r.PD()}, true
		}
		return web.Region{}, false
	}
	v.b = web.NewBuilder(title, names[0], names[1], lookup)
	if serve != "" {
		v.b.SetLive()
		srv, err := web.Serve(serve, v.b)
		if err != nil {
			return nil, err
		}
		v.srv = srv
	}
	v.attach(engs)
	return v, nil
}

// attach starts watching engs: the first pair of engines, or the next
// part's, whose queue pairs and regions the view keeps apart from the
// earlier ones' (the numbers start again). Nothing for a nil view.
func (v *demoView) attach(engs [2]*offload.Device) {
	if v == nil {
		return
	}
	if v.parts > 0 {
		v.b.NewDevices()
	}
	v.parts++
	v.attached = true
	v.mu.Lock()
	v.engs = engs
	v.mu.Unlock()
	v.merger = web.NewMerger(v.b, 2, stallAge)
	for i, e := range engs {
		v.provs[i] = ctl.NewProvider(v.names[i], e, nil)
		v.watches[i] = e.Watch(1 << 16)
		v.wg.Add(1)
		go func(i int, w *offload.Watch) {
			defer v.wg.Done()
			for ev := range w.Events() {
				v.merger.Add(i, ctl.NewWatchEvent(ev))
			}
			v.merger.End(i)
		}(i, v.watches[i])
	}
	// Heartbeats tell the merger an idle engine has nothing older to say.
	v.beat = make(chan struct{})
	v.wg.Add(1)
	go func(ws [2]*offload.Watch, stop chan struct{}) {
		defer v.wg.Done()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				ws[0].Idle()
				ws[1].Idle()
			}
		}
	}(v.watches, v.beat)
	v.snapshot()
}

// snapshot records both devices' queue pairs and counters.
func (v *demoView) snapshot() {
	now := time.Now()
	for i, p := range v.provs {
		st := p.Stats()
		v.b.SetState(now, v.names[i], p.QPs(), &st)
	}
}

// step begins a step of the view titled title with text (a lesson's
// part), with a snapshot of the queue pairs. Nothing for a nil view.
func (v *demoView) step(title, text string) {
	if v == nil {
		return
	}
	v.snapshot()
	v.flush()
	v.b.Step(time.Now(), title, text)
}

// flush passes on the events the merger holds, before a step begins: the
// demo's text comes after what it describes.
func (v *demoView) flush() {
	if v.attached {
		time.Sleep(15 * time.Millisecond) // a heartbeat from each engine
		v.merger.Flush()
	}
}

// detach ends the watches of the engines (before they close). Nothing
// for a nil view or one not watching.
func (v *demoView) detach() {
	if v == nil || !v.attached {
		return
	}
	v.attached = false
	v.snapshot()
	// Let the last events reach the watch queues before closing them.
	time.Sleep(20 * time.Millisecond)
	close(v.beat)
	for _, w := range v.watches {
		w.Close()
	}
	v.wg.Wait()
	v.merger.Flush()
}

// stop ends the watches (before the engines close) and completes the view.
func (v *demoView) stop() {
	if v == nil || v.stopped {
		return
	}
	v.stopped = true
	v.detach()
	v.b.Finish()
}

// writeHTML writes the view to path and says so on w.
func (v *demoView) writeHTML(w io.Writer, path string) error {
	if err := createFile(path, v.b.WriteHTML); err != nil {
		return err
	}
	fmt.Fprintf(w, "view written to %s (open it in a browser; it needs no network)\n", path)
	return nil
}

// stepRE matches the demo's numbered step lines ("3. RDMA Write ...").
var stepRE = regexp.MustCompile(`^\d+\. `)

// stepWriter passes the demo's text on to w and turns its numbered lines
// into steps of the view (with a snapshot of the queue pairs), and the
// indented lines after them into the steps' text.
type stepWriter struct {
	w    io.Writer
	v    *demoView
	pace time.Duration
	line bytes.Buffer
}

func (s *stepWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.line.Write(p[:n])
	for {
		b := s.line.Bytes()
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		l := string(b[:i])
		s.line.Next(i + 1)
		switch {
		case stepRE.MatchString(l):
			time.Sleep(s.pace)
			s.v.snapshot()
			s.v.flush()
			s.v.b.Step(time.Now(), l, "")
			for prefix, note := range s.v.notes {
				if strings.HasPrefix(l, prefix) {
					s.v.b.StepText(note)
				}
			}
		case strings.HasPrefix(l, " ") && strings.TrimSpace(l) != "":
			s.v.b.StepText(strings.TrimSpace(l))
		}
	}
	return n, err
}

// addDemoViewFlags adds the demo's view flags.
func addDemoViewFlags(cmd interface{ Flags() *pflag.FlagSet }, o *demoOptions) {
	f := cmd.Flags()
	f.StringVar(&o.html, "html", "", "write the view of the in-process demo (ladder, byte maps, memory, queue pairs) to this self-contained HTML file (implies --in-process)")
	f.StringVar(&o.serve, "serve", "", "serve the view of the in-process demo live at this address, e.g. 127.0.0.1:7180, until interrupted (implies --in-process)")
	f.DurationVar(&o.pace, "pace", 0, "pause this long before each step (to watch the live view)")
}

// startDemoViewFor starts the view when --html or --serve asks for it and
// returns the writer the demo application prints its steps to. The view
// is nil otherwise.
func startDemoViewFor(w io.Writer, o demoOptions, engs [2]*offload.Device) (io.Writer, *demoView, error) {
	if o.html == "" && o.serve == "" {
		return w, nil, nil
	}
	title := "siwtun demo"
	if o.lesson != nil {
		title = "siwtun lesson: " + o.lesson.summary
	}
	v, err := startDemoView(title, [2]string{"siwtun0", "siwtun1"}, engs, o.serve)
	if err != nil {
		return nil, nil, err
	}
	if l := o.lesson; l != nil {
		v.b.Step(time.Now(), "Lesson: "+l.name, l.intro)
		v.notes = l.notes
	}
	if v.srv != nil {
		fmt.Fprintf(w, "live view at %s\n\n", v.srv.URL())
	}
	return &stepWriter{w: w, v: v, pace: o.pace}, v, nil
}

// close completes the view: writes the file, and with --serve keeps
// serving until interrupted. Nothing for a nil view.
func (v *demoView) close(w io.Writer, o demoOptions) error {
	if v == nil {
		return nil
	}
	v.stop()
	if o.html != "" {
		if err := v.writeHTML(w, o.html); err != nil {
			return err
		}
	}
	if v.srv != nil {
		fmt.Fprintf(w, "serving the view at %s until interrupted (Ctrl-C)\n", v.srv.URL())
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
		return v.srv.Close()
	}
	return nil
}
