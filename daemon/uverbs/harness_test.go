package uverbs

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic/rnictest"
	"github.com/siwtun/siwtun/verbs"
)

const testTimeout = 30 * time.Second

var (
	daemonAddr = netip.MustParsePrefix("198.18.0.1/24")
	peerAddr   = netip.MustParsePrefix("198.18.0.2/24")
	peerPort   = uint16(7174)
)

// rig is a daemon serving siwtun0 on a verbs socket in a temp dir, and an
// in-process peer RNIC siwtun1 on the same in-memory link.
type rig struct {
	t       testing.TB
	daemon  *offload.Device
	local   *verbs.Device // siwtun0 in-process (what the server serves)
	srv     *Server
	path    string
	peerEng *offload.Device
	peer    *verbs.Device
	serveCh chan error
}

func newRig(t testing.TB) *rig { return newRigWith(t, nil) }

// newRigWith is newRig with the peer RNIC's engine configured by peerMod.
func newRigWith(t testing.TB, peerMod func(*offload.Config)) *rig {
	return newRigMods(t, nil, peerMod)
}

// newRigMods is newRig with the daemon's engine configured by daemonMod
// and the peer's by peerMod.
func newRigMods(t testing.TB, daemonMod, peerMod func(*offload.Config)) *rig {
	t.Helper()
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	r := &rig{t: t, serveCh: make(chan error, 1)}
	daemon, peer := rnictest.New(t, la, daemonAddr, 1500, "siwtun0", daemonMod), rnictest.New(t, lb, peerAddr, 1500, "siwtun1", peerMod)
	r.daemon, r.local = daemon.Engine, daemon.Device
	r.peerEng, r.peer = peer.Engine, peer.Device
	var log *slog.Logger
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv, err := NewServer(r.local, log)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = srv
	r.path = filepath.Join(t.TempDir(), "siwtun0.sock")
	l, err := Listen(r.path, -1)
	if err != nil {
		t.Fatal(err)
	}
	go func() { r.serveCh <- srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return r
}

func (r *rig) dial() *verbs.Device {
	r.t.Helper()
	d, err := verbs.DialPath(r.path)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { d.Close() })
	return d
}

// end is one side's objects.
type side struct {
	dev      *verbs.Device
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	qp       *verbs.QP
}

func newEnd(t testing.TB, dev *verbs.Device, depth int) *side {
	t.Helper()
	e := &side{dev: dev}
	var err error
	if e.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.scq, err = dev.CreateCQ(4 * depth); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = dev.CreateCQ(4 * depth); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq, MaxSendWR: depth, MaxRecvWR: depth}); err != nil {
		t.Fatal(err)
	}
	return e
}

// region registers n bytes: from AllocBuffer (the way that works on both
// kinds of device).
func (e *side) region(t testing.TB, n int, access verbs.Access) *verbs.MR {
	t.Helper()
	buf, err := e.dev.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := e.pd.RegMR(buf, access)
	if err != nil {
		t.Fatal(err)
	}
	return mr
}

// connect connects cli to a QP of srv accepted on a fresh listener and
// waits for both to be established.
func connect(t testing.TB, cli, srv *side) {
	t.Helper()
	connectAt(t, cli, srv, netip.AddrPortFrom(peerAddr.Addr(), peerPort), verbs.ConnParam{})
	waitEvent(t, cli.qp, verbs.EventEstablished)
	waitEvent(t, srv.qp, verbs.EventEstablished)
}

// connectAt connects cli to addr, where srv listens, and accepts the
// request there into srv's QP with accept; it returns when both calls
// have, leaving their events to the caller.
func connectAt(t testing.TB, cli, srv *side, addr netip.AddrPort, accept verbs.ConnParam) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	l, err := srv.dev.Listen(addr, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			acc <- err
			return
		}
		acc <- req.Accept(srv.qp, accept)
	}()
	if err := cli.qp.Connect(ctx, addr, verbs.ConnParam{}); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	if err := <-acc; err != nil {
		t.Fatalf("Accept: %v", err)
	}
}

func waitEvent(t testing.TB, qp *verbs.QP, want verbs.EventType) verbs.Event {
	t.Helper()
	timer := time.NewTimer(testTimeout)
	defer timer.Stop()
	for {
		select {
		case e := <-qp.Events():
			if e.Type == want {
				return e
			}
		case <-timer.C:
			t.Fatalf("no %v event", want)
		}
	}
}

func poll(t testing.TB, cq *verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out := make([]verbs.WorkCompletion, 0, n)
	buf := make([]verbs.WorkCompletion, 16)
	for len(out) < n {
		k, err := cq.Wait(ctx, buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("waiting for %d completions (have %+v): %v", n, out, err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}
