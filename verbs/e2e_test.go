package verbs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// exercise runs Write, Read and the four Send kinds between cli and srv
// with size-byte messages and verifies every byte.
func exercise(t *testing.T, cli, srv *side, size int, seed uint64) {
	t.Helper()
	// RDMA Write cli -> srv.
	src := cli.region(size, verbs.AccessLocalWrite)
	dst := srv.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	fill(src.buf(), seed)
	cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, size)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
	wantWC(t, poll(t, cli.scq, 1)[0], 1, verbs.WCWrite, verbs.WCSuccess, uint32(size))

	// A Send after the Write tells srv the Write has been placed (RDMAP
	// delivers in order).
	msg := srv.region(64, verbs.AccessLocalWrite)
	srv.recv(verbs.RecvWR{ID: 10, SGL: []verbs.SGE{msg.mr.SGE(0, 64)}})
	cli.post(verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("write done")})
	wantWC(t, poll(t, cli.scq, 1)[0], 2, verbs.WCSend, verbs.WCSuccess, 10)
	wantWC(t, poll(t, srv.rcq, 1)[0], 10, verbs.WCRecv, verbs.WCSuccess, 10)
	sameBytes(t, "inline send", msg.buf()[:10], []byte("write done"))
	sameBytes(t, "RDMA Write", dst.buf(), src.buf())

	// RDMA Read cli <- srv (into a fresh sink).
	fill(dst.buf(), seed+1)
	sink := cli.region(size, verbs.AccessLocalWrite)
	cli.post(verbs.SendWR{ID: 3, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(0, size)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
	wantWC(t, poll(t, cli.scq, 1)[0], 3, verbs.WCRead, verbs.WCSuccess, uint32(size))
	sameBytes(t, "RDMA Read", sink.buf(), dst.buf())

	// Sends: plain, solicited, with invalidate, solicited with invalidate,
	// each scattered over three SGEs on the receiver and gathered from two.
	inv1 := srv.region(16, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	inv2 := srv.region(16, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	kinds := []struct {
		op    verbs.WROpcode
		flags verbs.SendFlags
		inv   uint32
	}{
		{verbs.WRSend, 0, 0},
		{verbs.WRSend, verbs.FlagSolicited, 0},
		{verbs.WRSendWithInv, 0, inv1.mr.RKey()},
		{verbs.WRSendWithInv, verbs.FlagSolicited, inv2.mr.RKey()},
	}
	for i, k := range kinds {
		sbuf := cli.region(size, verbs.AccessLocalWrite)
		fill(sbuf.buf(), seed+uint64(10+i))
		rbuf := srv.region(size+100, verbs.AccessLocalWrite)
		a, b := size/3, 2*size/3
		srv.recv(verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{rbuf.mr.SGE(0, a), rbuf.mr.SGE(a, b-a), rbuf.mr.SGE(b, size+100-b)}})
		if k.flags&verbs.FlagSolicited != 0 {
			if err := srv.rcq.ReqNotify(true); err != nil {
				t.Fatal(err)
			}
		}
		h := size / 2
		cli.post(verbs.SendWR{ID: uint64(20 + i), Opcode: k.op, Flags: verbs.FlagSignaled | k.flags, InvalidateRKey: k.inv,
			SGL: []verbs.SGE{sbuf.mr.SGE(0, h), sbuf.mr.SGE(h, size-h)}})
		wantWC(t, poll(t, cli.scq, 1)[0], uint64(20+i), verbs.WCSend, verbs.WCSuccess, uint32(size))
		if k.flags&verbs.FlagSolicited != 0 {
			select {
			case <-srv.rcq.Notify():
			case <-time.After(testTimeout):
				t.Fatalf("no solicited-event notification for %v", k.op)
			}
		}
		wc := poll(t, srv.rcq, 1)[0]
		wantWC(t, wc, uint64(100+i), verbs.WCRecv, verbs.WCSuccess, uint32(size))
		if k.inv != 0 {
			if wc.Flags&verbs.WCWithInv == 0 || wc.InvalidatedRKey != k.inv {
				t.Fatalf("Send with Invalidate: flags %v rkey 0x%x, want WITH_INV 0x%x", wc.Flags, wc.InvalidatedRKey, k.inv)
			}
			if _, ok := srv.eng.Regions().Lookup(k.inv); ok {
				t.Fatalf("STag 0x%x still valid after Send with Invalidate", k.inv)
			}
		}
		sameBytes(t, fmt.Sprintf("send %d", i), rbuf.buf()[:size], sbuf.buf())
		rbuf.checkGuards(t)
	}
	for _, g := range []*guarded{src, dst, sink, msg} {
		g.checkGuards(t)
	}
}

func TestOperationsMatrix(t *testing.T) {
	type mode struct {
		name       string
		rev        uint8
		crc        bool
		cliMarkers bool // cli asks srv to send markers
		srvMarkers bool
		p2p        mpa.RTR
	}
	var modes []mode
	for _, rev := range []uint8{1, 2} {
		for _, crc := range []bool{false, true} {
			for _, m := range []struct {
				name string
				c, s bool
			}{{"none", false, false}, {"to-cli", true, false}, {"to-srv", false, true}, {"both", true, true}} {
				modes = append(modes, mode{fmt.Sprintf("rev%d/crc=%v/markers=%s", rev, crc, m.name), rev, crc, m.c, m.s, 0})
			}
		}
	}
	for _, rtr := range []mpa.RTR{mpa.RTRWrite, mpa.RTRRead, mpa.RTRSend} {
		modes = append(modes, mode{fmt.Sprintf("rev2/p2p=%v", rtr), 2, true, false, false, rtr})
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{
				cli: func(c *offload.Config) { c.MPARev, c.CRC, c.Markers, c.P2P = m.rev, m.crc, m.cliMarkers, m.p2p },
				srv: func(c *offload.Config) { c.MPARev, c.CRC, c.Markers = m.rev, false, m.srvMarkers },
			})
			p := cli.qp.Info().Params
			if p.CRC != m.crc || p.MarkersRx != m.cliMarkers || p.MarkersTx != m.srvMarkers || p.Rev != m.rev {
				t.Fatalf("negotiated %+v, want rev %d crc %v markers rx %v tx %v", p, m.rev, m.crc, m.cliMarkers, m.srvMarkers)
			}
			if m.p2p != 0 && (!p.P2P || p.RTR != m.p2p) {
				t.Fatalf("negotiated P2P %v RTR %v, want %v", p.P2P, p.RTR, m.p2p)
			}
			exercise(t, cli, srv, 70000, 1)
			st := srv.eng.Stats()
			if st.CRCErrors.Load() != 0 || st.TerminatesTx.Load() != 0 {
				t.Fatalf("errors on a clean run: crc %d terminates %d", st.CRCErrors.Load(), st.TerminatesTx.Load())
			}
		})
	}
}

func TestLargeMessages(t *testing.T) {
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprintf("mtu%d", mtu), func(t *testing.T) {
			cli, srv := newPair(t, pairOpts{mtu: mtu,
				cli: func(c *offload.Config) { c.Markers = true },
				srv: func(c *offload.Config) { c.Markers = true }})
			exercise(t, cli, srv, 16<<20, 7)
			// srv: the Write and four Sends; cli: the Read.
			if got := srv.eng.Stats().PlacedBytes.Load(); got < 5*16<<20 {
				t.Fatalf("server placed %d bytes, want at least %d", got, 5*16<<20)
			}
			if got := cli.eng.Stats().PlacedBytes.Load(); got < 16<<20 {
				t.Fatalf("client placed %d bytes, want at least %d", got, 16<<20)
			}
		})
	}
}

func TestImpairedLink(t *testing.T) {
	for _, seed := range []int64{1, 7} {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			imp := netstack.Impairments{Seed: seed, Loss: 0.01, Reorder: 0.02, Duplicate: 0.01, Delay: 100 * time.Microsecond}
			t.Logf("impairments %v", imp)
			cli, srv := newPair(t, pairOpts{imp: imp,
				cli: func(c *offload.Config) { c.Markers = true }})
			exercise(t, cli, srv, 1<<20, uint64(seed))
		})
	}
}

func TestPrivateDataAndReject(t *testing.T) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", nil, 8)
	srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", nil, 8)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	l, err := srv.dev.Listen(netipPort(srvPort), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pd := make([]byte, 252)
	fill(pd, 3)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			return
		}
		if string(req.PrivateData) != string(pd) || req.IRD != 3 || req.ORD != 5 {
			req.Reject([]byte("bad request"))
			return
		}
		req.Reject([]byte("go away"))
	}()
	err = cli.qp.Connect(ctx, netipPort(srvPort), verbs.ConnParam{PrivateData: pd, ResponderResources: 3, InitiatorDepth: 5})
	rej, ok := err.(interface{ Unwrap() error })
	_ = rej
	var re *verbs.RejectedError
	if !asErr(err, &re) || string(re.PrivateData) != "go away" {
		t.Fatalf("Connect = %v (%v), want a reject with private data \"go away\"", err, ok)
	}
	if st := cli.qp.State(); st != verbs.QPInit {
		t.Fatalf("QP state after reject = %v, want INIT", st)
	}
	// Too much private data is refused before anything is sent.
	if err := cli.qp.Connect(ctx, netipPort(srvPort), verbs.ConnParam{PrivateData: make([]byte, 300)}); err == nil {
		t.Fatal("Connect with 300 bytes of private data succeeded")
	}
}
