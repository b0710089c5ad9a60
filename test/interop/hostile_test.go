package interop

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// Ports of the hostile scenarios: the rping server (siwtun ping -s -P) and
// the test's own listener whose QPs post no receive.
const (
	hostilePingPort = 7174
	hostileAppPort  = 7200
	hostileReadLen  = 1 << 20
)

// hostileApp is a verbs application on the daemon's socket: it listens on
// hostileAppPort and accepts every request on a QP that posts no receive,
// with IRD 1 / ORD 1, next to a region the peer may read.
type hostileApp struct {
	dev *verbs.Device
	pd  *verbs.PD
	mr  *verbs.MR
	l   *verbs.Listener

	mu  sync.Mutex
	qps []*verbs.QP
	wg  sync.WaitGroup
}

func newHostileApp(t *testing.T, d *daemon) *hostileApp {
	t.Helper()
	dev, err := verbs.DialPath(filepath.Join(d.dir, tunDev+".sock"))
	if err != nil {
		t.Fatal(err)
	}
	a := &hostileApp{dev: dev}
	t.Cleanup(func() { a.close() })
	if a.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	buf, err := dev.AllocBuffer(hostileReadLen)
	if err != nil {
		t.Fatal(err)
	}
	if a.mr, err = a.pd.RegMR(buf[:hostileReadLen], verbs.AccessLocalWrite|verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if a.l, err = dev.Listen(netip.AddrPortFrom(netip.MustParseAddr(rnicIP), hostileAppPort), 4); err != nil {
		t.Fatal(err)
	}
	a.wg.Add(1)
	go a.serve()
	return a
}

func (a *hostileApp) serve() {
	defer a.wg.Done()
	for {
		req, err := a.l.Accept(context.Background())
		if err != nil {
			return
		}
		cq, err := a.dev.CreateCQ(16)
		if err != nil {
			req.Reject(nil)
			continue
		}
		qp, err := a.pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
		if err != nil {
			req.Reject(nil)
			continue
		}
		a.mu.Lock()
		a.qps = append(a.qps, qp)
		a.mu.Unlock()
		req.Accept(qp, verbs.ConnParam{ResponderResources: 1, InitiatorDepth: 1})
	}
}

// lastQPState is the state of the most recently accepted QP.
func (a *hostileApp) lastQPState() (verbs.QPState, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.qps) == 0 {
		return 0, false
	}
	return a.qps[len(a.qps)-1].State(), true
}

// close destroys every QP, the region and the listener, and closes the
// device (idempotent).
func (a *hostileApp) close() {
	if a.dev == nil {
		return
	}
	a.l.Close()
	a.wg.Wait()
	for _, qp := range a.qps {
		qp.Destroy()
	}
	a.mr.Dereg()
	a.dev.Close()
	a.dev = nil
}

// runHostile: misbehaving initiators from the VM (the hostile tool over
// the VM kernel's TCP). siwtun answers as the RFCs say, its listeners keep
// serving (the VM's real rping -c is served after each), and ctl shows
// nothing left behind.
func (e *env) runHostile(t *testing.T) {
	e.vm.setSiw(t, nil)
	d := startDaemon(t, e.netns, e.bin)
	pcap := filepath.Join(e.out, "hostile.pcap")
	c := startCapture(t, e.netns, pcap)
	srv := startProc(t, e.netns, "siwtun ping -s -P", e.bin, "ping", "-s", "-P", "-a", rnicIP, "-p", fmt.Sprint(hostilePingPort),
		"-S", "4096", "-V", "-d", "--dev", tunDev, "--socket-dir", d.dir)
	if err := srv.waitFor("rdma_listen\n", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	app := newHostileApp(t, d)
	hostile := "/mnt/share/hostile"
	served := 0
	stillServes := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, cerr, st := e.vm.client(ctx, fmt.Sprintf("rping -c -a %s -p %d -S 4096 -C 10 -V -v", rnicIP, hostilePingPort))
		if st != 0 || strings.Count(out, "ping data: ") != 10 {
			return fmt.Errorf("the listener no longer serves: rping -c status %d: %s", st, tail(cerr, 3))
		}
		served++
		return nil
	}
	steps := []struct {
		name  string
		args  string
		check func(out string) error
	}{
		{"bare connect+close", fmt.Sprintf("bare %s:%d", rnicIP, hostilePingPort), nil},
		{"truncated MPA Request", fmt.Sprintf("truncated %s:%d", rnicIP, hostilePingPort), nil},
		{"Send without a posted receive", fmt.Sprintf("send-no-recv %s:%d", rnicIP, hostileAppPort), func(string) error {
			return e.appQPInErr(app)
		}},
		{"RDMA Read beyond IRD", fmt.Sprintf("read-beyond-ird %s:%d 0x%x 0x%x %d", rnicIP, hostileAppPort, app.mr.RKey(), app.mr.Addr(), hostileReadLen), func(string) error {
			return e.appQPInErr(app)
		}},
	}
	for _, s := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, st := e.vm.exec(ctx, hostile+" "+s.args)
		cancel()
		var errs []error
		if st != 0 {
			errs = append(errs, fmt.Errorf("hostile %s: status %d: %s", s.args, st, strings.TrimSpace(out)))
		}
		if s.check != nil {
			if err := s.check(out); err != nil {
				errs = append(errs, err)
			}
		}
		if err := stillServes(); err != nil {
			errs = append(errs, err)
		}
		fig := strings.Join(strings.Fields(strings.ReplaceAll(strings.TrimSpace(out), "\n", ";")), " ")
		err := joinErrs(errs)
		if err != nil {
			t.Errorf("%s: %v", s.name, err)
		}
		e.addResult("hostile: "+s.name, "VM tool -> siwtun", "ok", fig+"\nthen rping -c from the VM: 10 pings of 4 KiB verified", err)
	}
	// Nothing left behind: the application's QPs are in ERR until it
	// destroys them; then the daemon holds no QP and no region.
	app.close()
	srv.stop()
	var errs []error
	if err := d.noQPsLeft(); err != nil {
		errs = append(errs, err)
	}
	cnt, err := d.counters()
	if err != nil {
		errs = append(errs, err)
	}
	for name, min := range map[string]uint64{"ddpUntaggedNoBuffer": 1, "rdmapIrdExceeded": 1, "rdmapTerminateTx": 2} {
		if cnt[name] < min {
			errs = append(errs, fmt.Errorf("ctl stats %s = %d, want at least %d", name, cnt[name], min))
		}
	}
	if cnt["qpActive"] != 0 || cnt["mrActive"] != 0 {
		errs = append(errs, fmt.Errorf("ctl stats qpActive %d mrActive %d after every client closed, want 0", cnt["qpActive"], cnt["mrActive"]))
	}
	captured, cerr := c.finish()
	if cerr != nil {
		errs = append(errs, cerr)
	}
	_, figs, terr := e.checkCapture(pcap, true)
	if terr != nil {
		errs = append(errs, terr)
	}
	err = joinErrs(errs)
	if err != nil {
		t.Error(err)
	}
	e.addResult("hostile: afterwards", "ctl", "ok", fmt.Sprintf(
		"ctl qp: no QP; ctl stats: ddpUntaggedNoBuffer %d rdmapIrdExceeded %d rdmapTerminateTx %d qpActive %d mrActive %d; %d rping clients served\n%s (%s)",
		cnt["ddpUntaggedNoBuffer"], cnt["rdmapIrdExceeded"], cnt["rdmapTerminateTx"], cnt["qpActive"], cnt["mrActive"], served, figs, captured), err)
	if err := d.stopDaemon(); err != nil {
		t.Error(err)
	}
}

// appQPInErr waits until the application's last QP is in ERR (the
// daemon ended its connection with a Terminate).
func (e *env) appQPInErr(a *hostileApp) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, ok := a.lastQPState()
		if ok && st == verbs.QPErr {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the application's QP is in %v, want ERR", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
