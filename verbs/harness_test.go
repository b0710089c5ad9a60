package verbs_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/verbs"
)

// testTimeout guards against hangs; it is not a performance bound.
const testTimeout = 60 * time.Second

var (
	cliAddr = netip.MustParsePrefix("198.18.0.1/24")
	srvAddr = netip.MustParsePrefix("198.18.0.2/24")
	srvPort = uint16(7174)
)

// side is one RNIC with one connected QP.
type side struct {
	t      testing.TB
	stack  *netstack.Stack
	eng    *offload.Device
	dev    *verbs.Device
	pd     *verbs.PD
	scq    *verbs.CQ
	rcq    *verbs.CQ
	qp     *verbs.QP
	link   *netstack.Link // the side's end of the in-memory link
	events []verbs.Event
}

type pairOpts struct {
	mtu      int
	imp      netstack.Impairments
	cli, srv func(*offload.Config)
	cliParam verbs.ConnParam
	srvParam verbs.ConnParam
	depth    int
}

func newStack(t testing.TB, link *netstack.Link, addr netip.Prefix, mtu int) *netstack.Stack {
	t.Helper()
	s, err := netstack.New(link, netstack.Options{Addrs: []netip.Prefix{addr}, MTU: mtu})
	if err != nil {
		t.Fatalf("netstack.New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// at is where a side's RNIC sits: its end of the link and its stack's
// options.
type at struct {
	link *netstack.Link
	opts netstack.Options
}

// on places an RNIC on link with address addr and MTU mtu.
func on(link *netstack.Link, addr netip.Prefix, mtu int) at {
	return at{link: link, opts: netstack.Options{Addrs: []netip.Prefix{addr}, MTU: mtu}}
}

// newSide builds an RNIC at where, its engine configured by mod, with one
// QP of depth entries per queue.
func newSide(t testing.TB, where at, name string, mod func(*offload.Config), depth int) *side {
	t.Helper()
	cfg := offload.DefaultConfig(name)
	if mod != nil {
		mod(&cfg)
	}
	r, err := rnic.New(where.link, rnic.Config{Stack: where.opts, Engine: cfg})
	if err != nil {
		t.Fatalf("rnic.New: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	dev := r.Device
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, err := dev.CreateCQ(4 * depth)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := dev.CreateCQ(4 * depth)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, MaxSendWR: depth, MaxRecvWR: depth})
	if err != nil {
		t.Fatal(err)
	}
	return &side{t: t, stack: r.Stack, eng: r.Engine, dev: dev, pd: pd, scq: scq, rcq: rcq, qp: qp, link: where.link}
}

// newPair builds two stacks on an in-memory link and connects a QP on each.
// The server posts prepost receives of recvSize bytes before accepting.
func newPair(t testing.TB, o pairOpts) (cli, srv *side) {
	t.Helper()
	if o.mtu == 0 {
		o.mtu = 1500
	}
	if o.depth == 0 {
		o.depth = 64
	}
	la, lb := netstack.Pipe(o.mtu, o.imp)
	cli = newSide(t, on(la, cliAddr, o.mtu), "siwtun0", o.cli, o.depth)
	srv = newSide(t, on(lb, srvAddr, o.mtu), "siwtun1", o.srv, o.depth)
	connect(t, cli, srv, o.cliParam, o.srvParam)
	return cli, srv
}

// connect connects cli's QP to srv's on the default port.
func connect(t testing.TB, cli, srv *side, cp, sp verbs.ConnParam) {
	t.Helper()
	connectOn(t, cli, srv, srvPort, cp, sp)
}

// waitEvent waits for an event of type want and returns it.
func (s *side) waitEvent(want verbs.EventType) verbs.Event {
	s.t.Helper()
	for _, e := range s.events {
		if e.Type == want {
			return e
		}
	}
	timer := time.NewTimer(testTimeout)
	defer timer.Stop()
	for {
		select {
		case e := <-s.qp.Events():
			s.events = append(s.events, e)
			if e.Type == want {
				return e
			}
		case <-timer.C:
			s.t.Fatalf("%s: no %v event; got %v", s.dev.Name(), want, s.events)
		}
	}
}

// poll collects n completions from cq.
func poll(t testing.TB, cq *verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out := make([]verbs.WorkCompletion, 0, n)
	buf := make([]verbs.WorkCompletion, 16)
	for len(out) < n {
		k, err := cq.Wait(ctx, buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("waiting for %d completions (have %d: %+v): %v", n, len(out), out, err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// noCompletion checks that cq holds nothing.
func noCompletion(t testing.TB, cq *verbs.CQ) {
	t.Helper()
	var wc [1]verbs.WorkCompletion
	if n, _ := cq.Poll(wc[:]); n != 0 {
		t.Fatalf("unexpected completion %+v", wc[0])
	}
}

func wantWC(t testing.TB, got verbs.WorkCompletion, id uint64, op verbs.WCOpcode, st verbs.WCStatus, n uint32) {
	t.Helper()
	if got.ID != id || got.Opcode != op || got.Status != st || (st == verbs.WCSuccess && got.ByteLen != n) {
		t.Fatalf("completion = {id %d %v %v len %d}, want {id %d %v %v len %d}", got.ID, got.Opcode, got.Status, got.ByteLen, id, op, st, n)
	}
}

// guarded is a region with guard bytes on both sides, registered without
// them: nothing the engine does may touch the guards.
type guarded struct {
	mem   []byte
	guard int
	mr    *verbs.MR
}

const guardByte = 0xA5

func (s *side) region(n int, access verbs.Access) *guarded {
	s.t.Helper()
	return s.regionPD(s.pd, n, access)
}

func (s *side) regionPD(pd *verbs.PD, n int, access verbs.Access) *guarded {
	s.t.Helper()
	const guard = 64
	mem := make([]byte, guard+n+guard)
	for i := range mem {
		mem[i] = guardByte
	}
	mr, err := pd.RegMR(mem[guard:guard+n], access)
	if err != nil {
		s.t.Fatalf("RegMR: %v", err)
	}
	return &guarded{mem: mem, guard: guard, mr: mr}
}

func (g *guarded) buf() []byte { return g.mem[g.guard : len(g.mem)-g.guard] }

func (g *guarded) checkGuards(t testing.TB) {
	t.Helper()
	for i := 0; i < g.guard; i++ {
		if g.mem[i] != guardByte || g.mem[len(g.mem)-1-i] != guardByte {
			t.Fatalf("guard bytes around region 0x%08x were written", g.mr.RKey())
		}
	}
}

// fill writes a seeded pattern.
func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x5157))
	for i := 0; i < len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}

func sameBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: %d bytes differ from byte %d on (len got %d want %d)", what, len(want), i, len(got), len(want))
	}
}

func (s *side) post(wrs ...verbs.SendWR) {
	s.t.Helper()
	if n, err := s.qp.PostSend(wrs); err != nil || n != len(wrs) {
		s.t.Fatalf("PostSend: %d of %d: %v", n, len(wrs), err)
	}
}

func (s *side) recv(wrs ...verbs.RecvWR) {
	s.t.Helper()
	if n, err := s.qp.PostRecv(wrs); err != nil || n != len(wrs) {
		s.t.Fatalf("PostRecv: %d of %d: %v", n, len(wrs), err)
	}
}

// terminated checks that the detector sent a Terminate with code and the
// other side received it.
func terminated(t testing.TB, detector, other *side, code rdmap.Code) {
	t.Helper()
	sent := detector.waitEvent(verbs.EventTerminateSent)
	if sent.Code != code {
		t.Fatalf("%s sent Terminate %v, want %v (%v)", detector.dev.Name(), sent.Code, code, sent.Err)
	}
	if other != nil {
		got := other.waitEvent(verbs.EventTerminateReceived)
		if got.Code != code {
			t.Fatalf("%s received Terminate %v, want %v", other.dev.Name(), got.Code, code)
		}
		other.waitEvent(verbs.EventDisconnected)
		if st := other.qp.State(); st != verbs.QPErr {
			t.Fatalf("%s QP state %v after Terminate, want ERR", other.dev.Name(), st)
		}
	}
	detector.waitEvent(verbs.EventDisconnected)
	if st := detector.qp.State(); st != verbs.QPErr {
		t.Fatalf("%s QP state %v after Terminate, want ERR", detector.dev.Name(), st)
	}
}
