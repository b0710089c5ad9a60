package test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/verbs"
)

// ctlProc is the daemon process's footprint (siwtun ctl proc); with gc,
// after the daemon collected its garbage and returned the freed memory to
// the system.
func ctlProc(t testing.TB, d *daemon, gc bool) ctl.Proc {
	t.Helper()
	c, err := ctl.Dial(ctl.SocketPath(d.socketDir, d.dev))
	if err != nil {
		t.Fatalf("ctl %s: %v", d.dev, err)
	}
	defer c.Close()
	p, err := c.Proc(gc)
	if err != nil {
		t.Fatalf("ctl proc %s: %v", d.dev, err)
	}
	return p
}

// procString is a footprint for a log line.
func procString(p ctl.Proc) string {
	return fmt.Sprintf("RSS %d KiB (peak %d), heap %d KiB, %d goroutines, %d threads, %d fds, %d mappings",
		p.RSSKiB, p.HWMKiB, p.HeapBytes>>10, p.Goroutines, p.Threads, p.FDs, p.Mappings)
}

// procBack reports whether now is back at the baseline base (taken with
// the same load already run once, so that the Go runtime's own pools are
// at their working size), within what a Go process's footprint moves by
// on its own: 2 goroutines, 16 mappings (the Go heap's own), a quarter of
// the resident set plus 8 MiB, an eighth of the heap plus 2 MiB.
// Descriptors must be back exactly.
func procBack(base, now ctl.Proc) (bool, string) {
	ok := now.Goroutines <= base.Goroutines+2 && now.FDs <= base.FDs && now.Mappings <= base.Mappings+16 &&
		now.RSSKiB <= base.RSSKiB+base.RSSKiB/4+8<<10
	ok = ok && now.HeapBytes <= base.HeapBytes+base.HeapBytes/8+2<<20
	return ok, fmt.Sprintf("now %s; baseline %s", procString(now), procString(base))
}

// buildHostile builds test/interop/hostile, the misbehaving initiator.
func buildHostile(t testing.TB) string {
	t.Helper()
	hostile := filepath.Join(t.TempDir(), "hostile")
	if out, err := exec.Command("go", "build", "-o", hostile, "./interop/hostile").CombinedOutput(); err != nil {
		t.Fatalf("go build hostile: %v\n%s", err, out)
	}
	return hostile
}

// goodClients are well-formed clients of a listener l on dev1 from dev0:
// one PD and region each side for the test, a fresh CQ and QP per round.
type goodClients struct {
	r          *twoRNICs
	l          *verbs.Listener
	cpd, spd   *verbs.PD
	smr, rmr   *verbs.MR
	sbuf, rbuf []byte
	// diag, if set, adds to a failed Connect's report.
	diag func() string
}

func newGoodClients(t testing.TB, r *twoRNICs, l *verbs.Listener) *goodClients {
	t.Helper()
	g := &goodClients{r: r, l: l}
	var err error
	if g.cpd, err = r.dev0.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if g.spd, err = r.dev1.AllocPD(); err != nil {
		t.Fatal(err)
	}
	reg := func(dev *verbs.Device, pd *verbs.PD) (*verbs.MR, []byte) {
		buf, err := dev.AllocBuffer(1024)
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(buf[:1024], verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		return mr, buf[:1024]
	}
	g.smr, g.sbuf = reg(r.dev0, g.cpd)
	g.rmr, g.rbuf = reg(r.dev1, g.spd)
	return g
}

// round connects a fresh QP of dev0 to the listener (the server side
// accepts with a fresh QP), sends 1 KiB and checks it arrived, then
// destroys both QPs and their CQs. It returns how long Connect took.
func (g *goodClients) round(t testing.TB, round int) time.Duration {
	t.Helper()
	mk := func(dev *verbs.Device, pd *verbs.PD) (*verbs.CQ, *verbs.QP) {
		cq, err := dev.CreateCQ(8)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 2, MaxRecvWR: 2})
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.Modify(verbs.QPInit); err != nil {
			t.Fatal(err)
		}
		return cq, qp
	}
	ccq, cqp := mk(g.r.dev0, g.cpd)
	scq, sqp := mk(g.r.dev1, g.spd)
	defer func() {
		for _, qp := range []*verbs.QP{cqp, sqp} {
			if err := qp.Destroy(); err != nil {
				t.Errorf("destroy QP: %v", err)
			}
		}
		for _, cq := range []*verbs.CQ{ccq, scq} {
			if err := cq.Destroy(); err != nil {
				t.Errorf("destroy CQ: %v", err)
			}
		}
	}()
	copy(g.sbuf, pattern(1024, byte(round)))
	clear(g.rbuf)
	if _, err := sqp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{g.rmr.SGE(0, 1024)}}}); err != nil {
		t.Fatal(err)
	}
	acc := make(chan error, 1)
	go func() {
		req, err := g.l.Accept(ctx(t))
		if err == nil {
			err = req.Accept(sqp, verbs.ConnParam{})
		}
		acc <- err
	}()
	start := time.Now()
	if err := cqp.Connect(ctx(t), g.l.Addr(), verbs.ConnParam{}); err != nil {
		if g.diag != nil {
			t.Logf("diagnostics:\n%s", g.diag())
		}
		t.Fatalf("good client %d: Connect: %v", round, err)
	}
	took := time.Since(start)
	if err := <-acc; err != nil {
		t.Fatalf("good client %d: Accept: %v", round, err)
	}
	if _, err := cqp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{g.smr.SGE(0, 1024)}}}); err != nil {
		t.Fatal(err)
	}
	wcs := make([]verbs.WorkCompletion, 1)
	for _, cq := range []*verbs.CQ{ccq, scq} {
		if _, err := cq.Wait(ctx(t), wcs); err != nil {
			t.Fatalf("good client %d: %v", round, err)
		}
		if wcs[0].Status != verbs.WCSuccess {
			t.Fatalf("good client %d: %+v", round, wcs[0])
		}
	}
	if wcs[0].ByteLen != 1024 || !bytes.Equal(g.rbuf, g.sbuf) {
		t.Fatalf("good client %d: received %+v, bytes equal %v", round, wcs[0], bytes.Equal(g.rbuf, g.sbuf))
	}
	return took
}

// TestConnectionFlood: thousands of connection attempts from
// the namespace kernel's TCP (test/interop/hostile flood) against a verbs
// listener on siwtun1's daemon: connects closed or reset at once, and
// half-open handshakes — connections that never send an MPA Request, and
// Requests cut off in their key or their private data — held open. While
// it runs and after, well-formed clients through the daemons connect and
// Send, each checked; every half-open attempt is reset unanswered by the
// MPA accept timeout (--mpa-accept-timeout 2s here), counted in
// mpaAcceptTimeouts. The flood runs twice: the first brings the daemon's
// Go runtime to its working size (heap arenas, stack and goroutine pools,
// which a Go process keeps), and after the second its goroutines,
// descriptors, mappings and resident set (siwtun ctl proc --gc) must be
// back where they were between the two: a flood leaves nothing behind.
//
// Before the fix a "connect, reset" dying in the accept queue stopped the
// listener's accept loop for good: every later connection got its TCP
// handshake but never an MPA Reply.
func TestConnectionFlood(t *testing.T) {
	attempts, conc := "5000", "1000"
	if testing.Short() {
		attempts, conc = "500", "100"
	}
	const port = 7600
	r := newTwoRNICs(t, 1500, "--mpa-accept-timeout", "2s")
	hostile := buildHostile(t)
	l, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, port), 64)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	good := newGoodClients(t, r, l)
	good.diag = func() string {
		c0, c1 := ctlCounters(t, r.d0), ctlCounters(t, r.d1)
		out, _ := r.ns.command("sh", "-c", "ip -s link; nstat -az | grep -i -E 'drop|overflow|retrans|listen'").CombinedOutput()
		return fmt.Sprintf("siwtun0 %v\nsiwtun1 %v\n%s", c0, c1, out)
	}
	for i := range 3 { // whatever starts lazily is in the baseline
		good.round(t, i)
	}
	fresh := ctlProc(t, r.d1, true)
	t.Logf("siwtun1 before any flood: %s", procString(fresh))
	rounds := 3
	flood := func(name string) {
		c0 := ctlCounters(t, r.d1)
		out := &syncbuf.Buffer{}
		fl := r.ns.command(hostile, "flood", attempts, conc, "60s", netip.AddrPortFrom(r.a1, port).String())
		fl.Stdout, fl.Stderr = out, out
		if err := fl.Start(); err != nil {
			t.Fatal(err)
		}
		floodDone := make(chan error, 1)
		go func() { floodDone <- fl.Wait() }()
		defer fl.Process.Kill() // by its PID; no-op once reaped

		// While it runs: good clients, one after the other, and the
		// daemon's peak footprint.
		var peak ctl.Proc
		var mu sync.Mutex
		stopSampling := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stopSampling:
					return
				case <-time.After(200 * time.Millisecond):
				}
				c, err := ctl.Dial(ctl.SocketPath(r.d1.socketDir, r.d1.dev))
				if err != nil {
					continue
				}
				p, err := c.Proc(false)
				c.Close()
				if err == nil {
					mu.Lock()
					peak.Goroutines = max(peak.Goroutines, p.Goroutines)
					peak.RSSKiB = max(peak.RSSKiB, p.RSSKiB)
					peak.FDs = max(peak.FDs, p.FDs)
					mu.Unlock()
				}
			}
		}()
		var during []time.Duration
		var floodErr error
	loop:
		for {
			during = append(during, good.round(t, rounds))
			rounds++
			select {
			case floodErr = <-floodDone:
				break loop
			case <-time.After(10 * time.Millisecond):
			}
		}
		close(stopSampling)
		<-sampled
		t.Logf("%s: hostile flood %s %s 60s:\n%s", name, attempts, conc, out)
		if floodErr != nil {
			t.Fatalf("%s: hostile flood: %v", name, floodErr)
		}
		slices.Sort(during)
		t.Logf("%s: %d good clients connected and checked during it (Connect median %v, slowest %v); siwtun1's peak: %d goroutines, RSS %d KiB, %d fds",
			name, len(during), during[len(during)/2].Round(time.Microsecond), during[len(during)-1].Round(time.Millisecond), peak.Goroutines, peak.RSSKiB, peak.FDs)
		if len(during) < 2 {
			t.Errorf("%s: only %d good clients during the flood", name, len(during))
		}

		// The flood's own account: connects that worked, and of the
		// half-open ones, how many the responder ended (unanswered:
		// hostile fails otherwise).
		var held, quick int
		for _, line := range strings.Split(out.String(), "\n") {
			var kind string
			var att, fail, ans, closed, open, other int
			if n, _ := fmt.Sscanf(line, "%s attempts %d connect_failed %d answered %d closed_by_responder %d still_open %d other_errors %d",
				&kind, &att, &fail, &ans, &closed, &open, &other); n != 7 {
				continue
			}
			kind = strings.TrimSuffix(kind, ":")
			if fail > 0 || other > 0 {
				t.Errorf("%s: %s: %d connects failed, %d other errors", name, kind, fail, other)
			}
			switch kind {
			case "close", "reset":
				quick += att - fail
			default:
				held += closed
			}
		}
		if held+quick == 0 {
			t.Fatalf("%s: no flood figures in the hostile output", name)
		}
		c1 := ctlCounters(t, r.d1)
		timeouts, badReq := c1["mpaAcceptTimeouts"]-c0["mpaAcceptTimeouts"], c1["mpaBadRequests"]-c0["mpaBadRequests"]
		t.Logf("%s: siwtun1: mpaAcceptTimeouts +%d (half-open held: %d), mpaBadRequests +%d (closed or reset at once: %d; the rest died in the accept queue)",
			name, timeouts, held, badReq, quick)
		if timeouts != uint64(held) {
			t.Errorf("%s: mpaAcceptTimeouts +%d, want one per half-open connection (%d)", name, timeouts, held)
		}
		if badReq > uint64(quick) {
			t.Errorf("%s: mpaBadRequests +%d, more than the connections closed or reset at once (%d)", name, badReq, quick)
		}
		// After: the listener still serves.
		for range 3 {
			good.round(t, rounds)
			rounds++
		}
	}
	flood("first flood")
	var base ctl.Proc
	eventually(t, 30*time.Second, "siwtun1's goroutines back after the first flood", func() (bool, string) {
		base = ctlProc(t, r.d1, true)
		return base.Goroutines <= fresh.Goroutines+2 && base.FDs <= fresh.FDs, procString(base)
	})
	t.Logf("siwtun1 after the first flood: %s", procString(base))
	flood("second flood")
	var now ctl.Proc
	// Connections the daemon closed first (the good clients') stay in
	// TIME_WAIT for a minute: both floods' have gone after 60 s.
	eventually(t, 100*time.Second, "siwtun1 back at its baseline after the second flood", func() (bool, string) {
		now = ctlProc(t, r.d1, true)
		return procBack(base, now)
	})
	t.Logf("siwtun1 after the second flood: %s", procString(now))
	if qps := ctlQPs(t, r.d1); len(qps) != 0 {
		t.Errorf("siwtun1 lists QPs after the floods: %+v", qps)
	}
}
