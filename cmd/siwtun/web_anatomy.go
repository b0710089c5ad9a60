package main

import (
	"fmt"
	"sync"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/web"
)

// webAnatomy drives the recorders of hop stamps of the daemons `siwtun
// web` watches for the page (web.AnatomyControl): Record starts them, Stop
// stops them and takes every connection between the watched devices
// apart, as `siwtun ctl anatomy show` does, and Show takes apart what they
// hold so far. The recorders are on only between a page's Record and its
// Stop (or the last page's leaving, or the end of siwtun web): otherwise
// a daemon's stamp sites cost a load and a branch.
type webAnatomy struct {
	b       *web.Builder
	sockets []string
	mu      sync.Mutex // one action at a time
	on      bool       // this view started the recorders
}

func newWebAnatomy(b *web.Builder, opts []ctlOptions) *webAnatomy {
	a := &webAnatomy{b: b}
	for _, o := range opts {
		a.sockets = append(a.sockets, ctl.SocketPath(o.dir, o.dev))
	}
	return a
}

// control is the page's web.AnatomyControl.
func (a *webAnatomy) control(action string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch action {
	case web.AnatomyStart:
		if err := anatomyAction(a.sockets, ctl.AnatomyStart); err != nil {
			// One may have started: stop whatever did.
			anatomyAction(a.sockets, ctl.AnatomyStop)
			return err
		}
		a.on = true
		a.b.SetAnatomy(web.Anatomy{Recording: true})
		return nil
	case web.AnatomyStop:
		if err := anatomyAction(a.sockets, ctl.AnatomyStop); err != nil {
			return err
		}
		a.on = false
	case web.AnatomyShow:
	default:
		return fmt.Errorf("anatomy: unknown action %q", action)
	}
	return a.show()
}

// show takes apart what the recorders hold and puts it on the page.
func (a *webAnatomy) show() error {
	run, err := collectAnatomy(a.sockets)
	if err != nil {
		return err
	}
	out := web.Anatomy{Recording: run.on, Lost: run.lost}
	for i, an := range run.all {
		out.Conns = append(out.Conns, web.AnatomyConnOf(run.title(i), an, nil))
	}
	if len(run.flows) == 0 {
		out.Note = run.none() + ": press Record, run a ping-pong between the watched devices (siwtun perf write --lat), then Stop and show"
		if len(a.sockets) == 1 {
			out.Note += "; watch both ends' devices (--dev twice) to take apart the messages between two daemons"
		}
	}
	a.b.SetAnatomy(out)
	return nil
}

// stop stops the recorders if this view started them and they were not
// stopped since: siwtun web leaves none on behind it.
func (a *webAnatomy) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.on {
		anatomyAction(a.sockets, ctl.AnatomyStop)
		a.on = false
	}
}
