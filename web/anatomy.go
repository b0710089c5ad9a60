package web

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/siwtun/siwtun/anatomy"
)

// Anatomy is the page's round-trip anatomy: where the time of the
// messages between the watched devices went, hop by hop (package
// anatomy), for each connection between them that carried messages, as
// `siwtun ctl anatomy show` prints it.
type Anatomy struct {
	// Control says the page can start and stop the daemons' recorders of
	// hop stamps (POST /anatomy): a live view of daemons.
	Control bool `json:"control,omitempty"`
	// Recording says the recorders are on.
	Recording bool `json:"recording,omitempty"`
	// Conns are the connections taken apart, from the stamps the
	// recorders held when they were last read.
	Conns []AnatomyConn `json:"conns,omitempty"`
	// Lost counts stamps the daemons could not keep (their rings' oldest).
	Lost uint64 `json:"lost,omitempty"`
	// Note says what the page should tell besides: why there is nothing
	// to show, or what failed.
	Note string `json:"note,omitempty"`
}

// AnatomyConn is one connection's round trip taken apart.
type AnatomyConn struct {
	// Title names the connection ("siwtun0:40000 <-> siwtun1:18515").
	Title string `json:"title"`
	// Dirs name the two directions' sending and receiving sides
	// ("siwtun0 -> siwtun1").
	Dirs [2]string `json:"dirs"`
	// Legs are the legs of the way in order, then the whole one-way trip
	// (Total).
	Legs []AnatomyLeg `json:"legs"`
	// RoundTrip is the round trip as the first side's application saw it
	// (N 0: the applications handed over no stamps).
	RoundTrip AnatomyStat `json:"rt"`
}

// AnatomyLeg is one row of the table: a leg of the way, or the one-way
// trip, in both directions.
type AnatomyLeg struct {
	// From and To are the hops' short names ("tun-write", "tun-read").
	From string `json:"from"`
	To   string `json:"to"`
	// Name says what happens in the leg, as the CLI's table says it.
	Name string `json:"name"`
	// Total marks the one-way trip (post to seen).
	Total bool `json:"total,omitempty"`
	// Dirs are the leg's figures in each direction of AnatomyConn.Dirs.
	Dirs [2]AnatomyStat `json:"dirs"`
}

// AnatomyStat is a leg's median and 99th percentile in nanoseconds, over
// N messages.
type AnatomyStat struct {
	N      int   `json:"n"`
	Median int64 `json:"med"`
	P99    int64 `json:"p99"`
}

func statOf(s anatomy.Stat) AnatomyStat {
	return AnatomyStat{N: s.N, Median: int64(s.Median), P99: int64(s.P99)}
}

// AnatomyConnOf converts an assembled anatomy for the page. title names
// the connection; name, when not nil, names a leg instead of
// anatomy.Leg.Name (a link other than a TUN device has legs of its own).
func AnatomyConnOf(title string, an anatomy.Anatomy, name func(anatomy.Leg) string) AnatomyConn {
	if name == nil {
		name = anatomy.Leg.Name
	}
	d0, d1 := &an.Dirs[0], &an.Dirs[1]
	c := AnatomyConn{Title: title, Dirs: [2]string{d0.From + " -> " + d0.To, d1.From + " -> " + d1.To}, RoundTrip: statOf(an.RoundTrip)}
	for i := range d0.Legs {
		s0, s1 := d0.Legs[i], d1.Legs[i]
		c.Legs = append(c.Legs, AnatomyLeg{
			From: s0.Leg.From.String(), To: s0.Leg.To.String(), Name: name(s0.Leg),
			Total: i == len(d0.Legs)-1, Dirs: [2]AnatomyStat{statOf(s0), statOf(s1)},
		})
	}
	return c
}

// Actions of POST /anatomy, which the page's buttons send to an
// AnatomyControl.
const (
	// AnatomyStart starts the daemons' recorders (forgetting earlier
	// stamps).
	AnatomyStart = "start"
	// AnatomyStop stops them and shows what they recorded.
	AnatomyStop = "stop"
	// AnatomyShow shows what they have recorded so far, recording on.
	AnatomyShow = "show"
)

// AnatomyControl drives the watched daemons' recorders for the page:
// action is AnatomyStart, AnatomyStop or AnatomyShow. It reports the
// recorders' state and what they hold with Builder.SetAnatomy.
type AnatomyControl func(action string) error

// SetAnatomyControl gives the page buttons that start, stop and read
// the daemons' recorders through c. While no page is open the recorders
// are stopped (Handler).
func (b *Builder) SetAnatomyControl(c AnatomyControl) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.anatomyCtl = c
	a := Anatomy{Control: true}
	if b.v.Anatomy != nil {
		a = *b.v.Anatomy
		a.Control = true
	}
	b.setAnatomy(a)
}

// SetAnatomy replaces the page's anatomy.
func (b *Builder) SetAnatomy(a Anatomy) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a.Control = b.anatomyCtl != nil
	b.setAnatomy(a)
}

func (b *Builder) setAnatomy(a Anatomy) {
	b.v.Anatomy = &a
	c := a
	b.emit(Update{Anatomy: &c})
}

// anatomyControl returns the control and whether the recorders are on.
func (b *Builder) anatomyControl() (AnatomyControl, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.anatomyCtl, b.v.Anatomy != nil && b.v.Anatomy.Recording
}

// anatomyHeader must come with POST /anatomy: a page of another origin
// cannot send it without the server's consent (a CORS preflight, which
// the server does not answer), so only the view's own page drives the
// daemons.
const anatomyHeader = "X-Siwtun-Page"

// serveAnatomy answers POST /anatomy: action=start, stop or show.
func serveAnatomy(b *Builder, open *pages, w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(anatomyHeader) == "" {
		http.Error(w, "anatomy: only the view's page may drive the recorders", http.StatusForbidden)
		return
	}
	ctl, _ := b.anatomyControl()
	if ctl == nil {
		http.Error(w, "anatomy: this view watches no daemons", http.StatusNotFound)
		return
	}
	action := r.URL.Query().Get("action")
	switch action {
	case AnatomyStart, AnatomyStop, AnatomyShow:
	default:
		http.Error(w, fmt.Sprintf("anatomy: unknown action %q (want start, stop or show)", action), http.StatusBadRequest)
		return
	}
	if err := ctl(action); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if action == AnatomyStart {
		open.started()
	}
	w.WriteHeader(http.StatusNoContent)
}

// pageGrace is how long the recorders stay on after the last page
// closed its event stream: a page that reloads comes back within it.
const pageGrace = 5 * time.Second

// pages counts the open event streams. When the last one has been
// closed for pageGrace, it stops the daemons' recorders: they record
// only while someone looks.
type pages struct {
	b     *Builder
	grace time.Duration
	mu    sync.Mutex
	n     int
	timer *time.Timer
	gen   uint64 // counts the timers armed
}

func (p *pages) open() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
		p.gen++ // a timer that fired already finds itself stale
	}
}

func (p *pages) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n--
	p.arm()
}

// started is called when the recorders were started: with no page open
// (a request of its own), the grace period starts at once.
func (p *pages) started() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.arm()
}

// arm starts the grace period if no page is open and none runs; p.mu is
// held.
func (p *pages) arm() {
	if p.n > 0 || p.timer != nil {
		return
	}
	p.gen++
	gen := p.gen
	p.timer = time.AfterFunc(p.grace, func() {
		p.mu.Lock()
		idle := p.gen == gen && p.n == 0 // not stopped, nor a later one's
		if p.gen == gen {
			p.timer = nil
		}
		p.mu.Unlock()
		if ctl, on := p.b.anatomyControl(); idle && on {
			if err := ctl(AnatomyStop); err != nil {
				p.b.SetAnatomy(Anatomy{Recording: true, Note: "no page is open, and stopping the recorders failed: " + err.Error()})
			}
		}
	})
}
