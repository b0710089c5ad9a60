package verbs_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/mpa/inspect"
	"github.com/siwtun/siwtun/verbs"
)

// TestStartupOrder: the order on the wire of a connection whose server
// speaks first, seen at the responder's link (a Watch) and written out by
// the capture checker, against golden files (go test -update rewrites
// them). The server posts its Send the moment Accept returns, before it
// has seen the client's first FPDU (in peer-to-peer mode even before its
// ESTABLISHED); RFC 5044 §7.1.2 has it send nothing after its Reply until
// that FPDU (the RTR, in RFC 6581's peer-to-peer mode) has arrived, and
// the Send wait for it rather than fail. In every MPA mode: revision 1
// and 2, CRC on and off, Markers.
//
// Without peer-to-peer mode the client's first FPDU is its application's:
// "strict" cases hold for ever (StartupHold negative), the client sees
// nothing for quiet, then sends first; the "bounded" case ends the hold
// StartupHold after the Reply was acknowledged, the client never sending
// (mpaStartupHoldsBounded counts it). Between two siwtuns with the
// defaults (peer-to-peer mode offered) no timer is involved: no first
// FPDU delay, no bounded hold.
func TestStartupOrder(t *testing.T) {
	const quiet = 100 * time.Millisecond
	const bound = 40 * time.Millisecond
	noP2P := func(c *offload.Config) { c.P2P = 0 }
	strict := func(c *offload.Config) { c.StartupHold = -1 }
	both := func(fs ...func(*offload.Config)) func(*offload.Config) {
		return func(c *offload.Config) {
			for _, f := range fs {
				f(c)
			}
		}
	}
	rev1 := func(c *offload.Config) { c.MPARev = 1 }
	markers := func(c *offload.Config) { c.Markers = true }
	noCRC := func(c *offload.Config) { c.CRC = false }
	readRTR := func(c *offload.Config) { c.P2P = mpa.RTRRead }
	for _, tc := range []struct {
		name          string
		cli, srv      func(*offload.Config)
		clientFirst   bool   // the client sends a Send after quiet
		bounded       uint64 // mpaStartupHoldsBounded at the server
		bound         bool   // the server's Send comes at least bound after the Reply
		noTimerAtBoth bool   // no first-FPDU delay, no bounded hold
	}{
		{name: "p2p-write-rtr", noTimerAtBoth: true},
		{name: "p2p-read-rtr", cli: readRTR, noTimerAtBoth: true},
		{name: "p2p-markers-nocrc", cli: both(markers, noCRC), srv: both(markers, noCRC), noTimerAtBoth: true},
		{name: "strict-rev2", cli: noP2P, srv: strict, clientFirst: true},
		{name: "strict-rev2-nocrc", cli: both(noP2P, noCRC), srv: both(strict, noCRC), clientFirst: true},
		{name: "strict-rev1", cli: rev1, srv: both(rev1, strict), clientFirst: true},
		{name: "strict-markers", cli: both(noP2P, markers), srv: both(strict, markers), clientFirst: true},
		{name: "bounded-rev2", cli: noP2P, srv: func(c *offload.Config) { c.StartupHold = bound }, bounded: 1, bound: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			la, lb := netstack.Pipe(1500, netstack.Impairments{})
			cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", tc.cli, 8)
			srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", tc.srv, 8)
			w := srv.eng.Watch(1 << 12)
			defer w.Close()
			cbuf := cli.region(64, verbs.AccessLocalWrite)
			sbuf := srv.region(64, verbs.AccessLocalWrite)
			for _, s := range []*side{cli, srv} {
				if err := s.qp.Modify(verbs.QPInit); err != nil {
					t.Fatal(err)
				}
			}
			cli.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{cbuf.mr.SGE(0, 64)}})
			srv.recv(verbs.RecvWR{ID: 2, SGL: []verbs.SGE{sbuf.mr.SGE(0, 64)}})

			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			l, err := srv.dev.Listen(netipPort(srvPort), 1)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			accepted := make(chan error, 1)
			go func() {
				req, err := l.Accept(ctx)
				if err == nil {
					err = req.Accept(srv.qp, verbs.ConnParam{})
				}
				if err == nil {
					// The server speaks first, at once.
					_, err = srv.qp.PostSend([]verbs.SendWR{{ID: 3, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSignaled, Inline: []byte("server first")}})
				}
				accepted <- err
			}()
			if err := cli.qp.Connect(ctx, netipPort(srvPort), verbs.ConnParam{}); err != nil {
				t.Fatalf("Connect: %v", err)
			}
			connected := time.Now()
			if err := <-accepted; err != nil {
				t.Fatalf("Accept and post: %v", err)
			}
			if tc.clientFirst {
				time.Sleep(quiet)
				noCompletion(t, cli.rcq)
				cli.post(verbs.SendWR{ID: 4, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSignaled, Inline: []byte("client")})
				wantWC(t, poll(t, srv.rcq, 1)[0], 2, verbs.WCRecv, verbs.WCSuccess, 6)
			}
			wantWC(t, poll(t, cli.rcq, 1)[0], 1, verbs.WCRecv, verbs.WCSuccess, 12)
			took := time.Since(connected)
			sameBytes(t, "the server's Send", cbuf.buf()[:12], []byte("server first"))
			wantWC(t, poll(t, srv.scq, 1)[0], 3, verbs.WCSend, verbs.WCSuccess, 12)
			srv.waitEvent(verbs.EventEstablished)
			if tc.bound && took < bound {
				t.Errorf("the server's Send arrived %v after Connect returned, want at least the bound %v", took, bound)
			}
			if n := srv.eng.Stats().StartupHoldsBounded.Load(); n != tc.bounded {
				t.Errorf("mpaStartupHoldsBounded = %d, want %d", n, tc.bounded)
			}
			if n := cli.eng.Stats().FirstFPDUDelays.Load(); tc.noTimerAtBoth && n != 0 {
				t.Errorf("mpaFirstFpduDelays = %d at the client, want 0 (the server said it reads at once)", n)
			}
			time.Sleep(20 * time.Millisecond) // the last ACKs
			w.Close()
			if w.Dropped() != 0 {
				t.Fatalf("the watch dropped %d events", w.Dropped())
			}
			testkit.Golden(t, filepath.Join("testdata", "startup", tc.name+".golden"), []byte(wireOrder(t, w)))
		})
	}
}

// wireOrder renders what a Watch saw of one connection as the capture
// checker reads it: one line per MPA frame and per FPDU, in the order the
// segments carrying them crossed the link, with who sent it. Segments
// without payload and retransmissions are left out, and so are sequence
// numbers and ports, which change from run to run.
func wireOrder(t *testing.T, w *offload.Watch) string {
	t.Helper()
	a := inspect.New()
	base := time.Unix(0, 0)
	var reports []inspect.Report
	i := 0
	for e := range w.Events() {
		s := e.Segment
		if s == nil {
			continue
		}
		i++
		// The Watch's order is the link's; the Analyzer may hand a
		// segment back later (held for the peer's MPA frame), so each
		// gets its place in time.
		at := base.Add(time.Duration(i) * time.Microsecond)
		reports = append(reports, a.Add(inspect.Segment{Time: at, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Flags: s.Flags, Payload: s.Payload})...)
	}
	sort.SliceStable(reports, func(i, j int) bool { return reports[i].Time.Before(reports[j].Time) })
	var sb strings.Builder
	for _, r := range reports {
		arrow := r.Role + " ->"
		switch r.Kind {
		case inspect.KindRequest, inspect.KindReply:
			fmt.Fprintf(&sb, "%s %s: %s\n", arrow, r.Kind, r.Frame)
		case inspect.KindFPDU:
		default:
			continue
		}
		if r.Note != "" {
			t.Errorf("the checker's note on a segment: %s", r.Note)
		}
		if r.Aligned != nil && !*r.Aligned {
			t.Errorf("a segment not FPDU-aligned: %+v", r)
		}
		for _, f := range r.FPDUs {
			fmt.Fprintf(&sb, "%s %s\n", arrow, f.String())
		}
		for _, m := range r.Markers {
			fmt.Fprintf(&sb, "%s   %s\n", arrow, m.String())
		}
	}
	return sb.String()
}

// BenchmarkConnect sets up one connection per iteration between two RNICs
// on an in-memory link and tears it down: Connect and Accept, both
// ESTABLISHED, the server's first Send at the client (posted at Accept),
// then both QPs destroyed. With peer-to-peer mode (the default) the
// server's ESTABLISHED and its Send wait for the client's RTR; without it
// and with the strict rule they would wait for the client's first
// message, which this client never sends: "no-p2p" is the bounded hold
// set to 0, the Reply's acknowledgement alone. Compare the two side by
// side, in one run (go test -run '^$' -bench Connect ./verbs/).
func BenchmarkConnect(b *testing.B) {
	for _, bc := range []struct {
		name string
		cli  func(*offload.Config)
		srv  func(*offload.Config)
	}{
		{"p2p", nil, nil},
		{"no-p2p", func(c *offload.Config) { c.P2P = 0 }, func(c *offload.Config) { c.StartupHold = 0 }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			la, lb := netstack.Pipe(1500, netstack.Impairments{})
			cli := newSide(b, on(la, cliAddr, 1500), "siwtun0", bc.cli, 8)
			srv := newSide(b, on(lb, srvAddr, 1500), "siwtun1", bc.srv, 8)
			cbuf := cli.region(64, verbs.AccessLocalWrite)
			ctx := context.Background()
			l, err := srv.dev.Listen(netipPort(srvPort), 4)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.ResetTimer()
			for range b.N {
				cq := cli.newQP(verbs.QPInitAttr{MaxSendWR: 4, MaxRecvWR: 4})
				sq := srv.newQP(verbs.QPInitAttr{MaxSendWR: 4, MaxRecvWR: 4})
				if err := cq.Modify(verbs.QPInit); err != nil {
					b.Fatal(err)
				}
				cli.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{cbuf.mr.SGE(0, 64)}})
				accepted := make(chan error, 1)
				go func() {
					req, err := l.Accept(ctx)
					if err == nil {
						err = req.Accept(sq, verbs.ConnParam{})
					}
					if err == nil {
						_, err = sq.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("hello")}})
					}
					accepted <- err
				}()
				if err := cq.Connect(ctx, netipPort(srvPort), verbs.ConnParam{}); err != nil {
					b.Fatal(err)
				}
				if err := <-accepted; err != nil {
					b.Fatal(err)
				}
				cli.waitEvent(verbs.EventEstablished)
				srv.waitEvent(verbs.EventEstablished)
				poll(b, cli.rcq, 1)
				cq.Destroy()
				sq.Destroy()
			}
		})
	}
}

// TestStartupHoldDisconnect: a server that posts a Send and disconnects
// before the client's first FPDU has arrived (no peer-to-peer mode, the
// rule kept strictly) puts nothing on the wire after its Reply: the Send
// completes flushed, and the client, which receives no data, sees the
// connection end.
func TestStartupHoldDisconnect(t *testing.T) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", func(c *offload.Config) { c.P2P = 0 }, 8)
	srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", func(c *offload.Config) { c.StartupHold = -1 }, 8)
	cbuf := cli.region(64, verbs.AccessLocalWrite)
	if err := cli.qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	cli.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{cbuf.mr.SGE(0, 64)}})
	connect(t, cli, srv, verbs.ConnParam{}, verbs.ConnParam{})
	srv.post(verbs.SendWR{ID: 3, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSignaled, Inline: []byte("never sent")})
	time.Sleep(50 * time.Millisecond)
	noCompletion(t, srv.scq)
	srv.qp.Disconnect()
	wantWC(t, poll(t, srv.scq, 1)[0], 3, verbs.WCSend, verbs.WCFlushErr, 0)
	cli.waitEvent(verbs.EventDisconnected)
	wantWC(t, poll(t, cli.rcq, 1)[0], 1, verbs.WCRecv, verbs.WCFlushErr, 0)
	if n := srv.eng.Stats().FPDUsTx.Load(); n != 0 {
		t.Errorf("the server sent %d FPDUs, want none", n)
	}
}
