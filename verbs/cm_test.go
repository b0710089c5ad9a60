package verbs_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// TestConnectBadReply answers our MPA Request with unacceptable Replies
// from a raw responder: Connect fails with the MPA error, and where the
// Reply was well formed the initiator sends the LLP Terminate before closing.
func TestConnectBadReply(t *testing.T) {
	tests := []struct {
		name  string
		reply func(req mpa.Frame) []byte
		code  uint8 // MPA error code; 0: no Terminate expected (bad frame)
	}{
		{"rtr-not-offered", func(req mpa.Frame) []byte {
			rep := mpa.Frame{Reply: true, Rev: 2, Enhanced: true, IRD: 4, ORD: 4, P2P: true, RTR: mpa.RTRSend, CRC: req.CRC}
			b, _ := rep.Append(nil)
			return b
		}, mpa.CodeNoMatchingRTR},
		{"bad-key", func(req mpa.Frame) []byte {
			b := []byte("MPA ID Rxx Frame\x40\x02\x00\x00")
			return b
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			la, lb := netstack.Pipe(1500, netstack.Impairments{})
			cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", func(c *offload.Config) { c.P2P = mpa.RTRWrite }, 8)
			ss := newStack(t, lb, srvAddr, 1500)
			l, err := ss.Listen(netipPort(srvPort))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			got := make(chan []byte, 1)
			go func() {
				c, err := l.Accept(ctx)
				if err != nil {
					got <- nil
					return
				}
				defer c.Close()
				hdr := make([]byte, mpa.FrameHeaderLen)
				io.ReadFull(c, hdr)
				rest := make([]byte, binary.BigEndian.Uint16(hdr[18:]))
				io.ReadFull(c, rest)
				req, _ := mpa.ParseFrame(append(hdr, rest...))
				c.Write(tt.reply(req))
				after, _ := io.ReadAll(c)
				got <- after
			}()
			err = cli.qp.Connect(ctx, netipPort(srvPort), verbs.ConnParam{})
			var me *mpa.Error
			if !errors.As(err, &me) {
				t.Fatalf("Connect = %v, want an *mpa.Error", err)
			}
			if tt.code != 0 && me.Code != tt.code {
				t.Fatalf("Connect error code 0x%02x, want 0x%02x (%v)", me.Code, tt.code, err)
			}
			after := <-got
			if tt.code == 0 {
				if len(after) != 0 {
					t.Fatalf("initiator sent %d bytes after a malformed Reply", len(after))
				}
				return
			}
			// One FPDU: length, untagged Terminate header, Terminate body.
			if len(after) < 2+ddp.UntaggedHeaderLen+rdmap.TerminateHeaderLen {
				t.Fatalf("after the Reply the initiator sent %x, want a Terminate", after)
			}
			var h ddp.Header
			h.Unmarshal(after[2:])
			var term rdmap.Terminate
			if err := term.Unmarshal(after[2+ddp.UntaggedHeaderLen : 2+int(binary.BigEndian.Uint16(after))]); err != nil {
				t.Fatal(err)
			}
			if _, op := rdmap.ParseCtrl(h.ULPCtrl); op != rdmap.OpTerminate || h.QN != 2 || term.Code != rdmap.MakeCode(rdmap.LayerLLP, 0, tt.code) {
				t.Fatalf("sent %v %v, want Terminate LLP 0x%02x", h, term.Code, tt.code)
			}
			if st := cli.qp.State(); st != verbs.QPInit {
				t.Fatalf("QP state %v after a failed connect, want INIT", st)
			}
		})
	}
}

// TestListenerSurvivesHostilePeers: bare connect+close, a truncated
// Request, garbage, and silence (AcceptTimeout) cost nothing but their own
// connection; the listener then accepts a real QP.
func TestListenerSurvivesHostilePeers(t *testing.T) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", nil, 8)
	srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", func(c *offload.Config) { c.AcceptTimeout = 200 * time.Millisecond }, 8)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	l, err := srv.dev.Listen(netipPort(srvPort), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, send := range [][]byte{nil, []byte("MPA ID Req Fr"), []byte("GET / HTTP/1.0\r\n\r\n"), {}} {
		c, err := cli.stack.Dial(ctx, netip.Addr{}, netipPort(srvPort))
		if err != nil {
			t.Fatal(err)
		}
		if len(send) > 0 {
			c.Write(send)
		}
		if send != nil && len(send) == 0 {
			// Silence: the responder gives up after AcceptTimeout.
			if _, err := io.ReadAll(c); err != nil && !errors.Is(err, io.EOF) {
				t.Logf("silent peer: %v", err)
			}
		}
		c.Close()
	}
	// The silent one was reaped by the MPA accept timeout; the other three
	// ended (closed, cut off, garbage) before their Request was whole.
	deadline := time.Now().Add(testTimeout)
	for srv.eng.Stats().BadRequests.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if to, bad := srv.eng.Stats().AcceptTimeouts.Load(), srv.eng.Stats().BadRequests.Load(); to != 1 || bad != 3 {
		t.Errorf("mpaAcceptTimeouts %d, mpaBadRequests %d; want 1 and 3", to, bad)
	}
	go func() {
		if req, err := l.Accept(ctx); err == nil {
			req.Accept(srv.qp, verbs.ConnParam{})
		}
	}()
	if err := cli.qp.Connect(ctx, netipPort(srvPort), verbs.ConnParam{}); err != nil {
		t.Fatalf("Connect after hostile peers: %v", err)
	}
	srv.waitEvent(verbs.EventEstablished)
}

// TestNoGoroutineLeak: a connected pair, traffic, then everything closed
// leaves no goroutine behind.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		tb := &cleanupTB{TB: t}
		defer tb.run()
		cli, srv := newPair(tb, pairOpts{})
		exerciseSmall(t, cli, srv)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before, %d after close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

func exerciseSmall(t *testing.T, cli, srv *side) {
	dst := srv.region(1000, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	src := cli.region(1000, verbs.AccessLocalWrite)
	cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, 1000)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
	cli.post(verbs.SendWR{ID: 2, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, 1000)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
	poll(t, cli.scq, 2)
}

// cleanupTB runs Cleanup functions when run is called, so a test can
// check what remains after them.
type cleanupTB struct {
	testing.TB
	fns []func()
}

func (c *cleanupTB) Cleanup(f func()) { c.fns = append(c.fns, f) }
func (c *cleanupTB) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
}
