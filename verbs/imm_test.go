package verbs_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// immSize is the size of the i-th message of exerciseImm: from 0 up to
// max, never twice the same in a row.
func immSize(i, max int) int {
	switch i % 5 {
	case 0:
		return 0
	case 1:
		return 1 + i%7
	}
	return (i*7919)%max + 1
}

// exerciseImm sends n messages with immediate data from cli to srv, RDMA
// Writes with Immediate Data (every fourth a Send with Immediate Data,
// every third solicited, some inline), each into its own slot of up to max
// bytes, and checks at the responder that each completes in order with its
// immediate value, its opcode, flags and length, and that every byte of
// its data was placed by the time its completion came.
func exerciseImm(t *testing.T, cli, srv *side, n, max int, seed uint64) {
	t.Helper()
	if p := cli.qp.Info().Params; p.Ext&mpa.ExtImmediate == 0 {
		t.Fatalf("connection negotiated extensions %v, want imm", p.Ext)
	}
	src := cli.region(n*max, verbs.AccessLocalWrite)
	fill(src.buf(), seed)
	dst := srv.region(n*max, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	rbuf := srv.region(n*max, verbs.AccessLocalWrite)
	const window = 16 // requests in flight: below the queues' depth
	posted, done := 0, 0
	var sent []verbs.WorkCompletion
	buf := make([]verbs.WorkCompletion, 16)
	reap := func() { // the sender's completions, before its CQ fills
		for {
			k, err := cli.scq.Poll(buf)
			if err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				return
			}
			sent = append(sent, buf[:k]...)
		}
	}
	post := func() {
		i := posted
		size := immSize(i, max)
		off := i * max
		imm := uint32(seed)<<24 ^ uint32(i)*0x9e3779b1
		srv.recv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{rbuf.mr.SGE(off, max)}})
		wr := verbs.SendWR{ID: uint64(i), Opcode: verbs.WRWriteWithImm, Flags: verbs.FlagSignaled, ImmData: imm,
			SGL: []verbs.SGE{src.mr.SGE(off, size)}, RemoteAddr: dst.mr.Addr() + uint64(off), RKey: dst.mr.RKey()}
		if i%4 == 3 {
			wr.Opcode = verbs.WRSendWithImm
		}
		if i%3 == 2 {
			wr.Flags |= verbs.FlagSolicited
		}
		if i%10 == 6 && size <= verbs.MaxInline {
			wr.Flags |= verbs.FlagInline
			wr.SGL, wr.Inline = nil, src.buf()[off:off+size]
		}
		cli.post(wr)
		posted++
	}
	for posted < n || done < n {
		for posted < n && posted-done < window {
			post()
		}
		reap()
		wc := poll(t, srv.rcq, 1)[0]
		i := done
		size, off := immSize(i, max), i*max
		imm := uint32(seed)<<24 ^ uint32(i)*0x9e3779b1
		want := verbs.WorkCompletion{ID: uint64(i), Opcode: verbs.WCRecvRDMAWithImm, ByteLen: uint32(size),
			QPNum: srv.qp.Num(), Flags: verbs.WCWithImm, ImmData: imm}
		if i%4 == 3 {
			want.Opcode = verbs.WCRecv
		}
		if wc != want {
			t.Fatalf("message %d: completion %+v, want %+v", i, wc, want)
		}
		if want.Opcode == verbs.WCRecv {
			sameBytes(t, fmt.Sprintf("Send with Immediate Data %d", i), rbuf.buf()[off:off+size], src.buf()[off:off+size])
		} else {
			sameBytes(t, fmt.Sprintf("RDMA Write with Immediate Data %d", i), dst.buf()[off:off+size], src.buf()[off:off+size])
		}
		done++
	}
	reap()
	sent = append(sent, poll(t, cli.scq, n-len(sent))...)
	for i, wc := range sent {
		op := verbs.WCWrite
		if i%4 == 3 {
			op = verbs.WCSend
		}
		wantWC(t, wc, uint64(i), op, verbs.WCSuccess, uint32(immSize(i, max)))
	}
	noCompletion(t, srv.rcq)
	for _, g := range []*guarded{src, dst, rbuf} {
		g.checkGuards(t)
	}
	if got := srv.eng.Stats().ImmediatesRx.Load(); got < uint64(n) {
		t.Fatalf("InRdmaImmediates %d, want at least %d", got, n)
	}
}

// TestImmediateMatrix: RDMA Write and Send with Immediate Data between two
// in-process RNICs in every MPA mode: revisions 1 and 2, CRC on and off,
// markers in either direction, and each peer-to-peer RTR.
func TestImmediateMatrix(t *testing.T) {
	type mode struct {
		name       string
		rev        uint8
		crc        bool
		cliMarkers bool
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
	for i, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{
				cli: func(c *offload.Config) { c.MPARev, c.CRC, c.Markers, c.P2P = m.rev, m.crc, m.cliMarkers, m.p2p },
				srv: func(c *offload.Config) { c.MPARev, c.CRC, c.Markers = m.rev, false, m.srvMarkers },
			})
			p := cli.qp.Info().Params
			if p.CRC != m.crc || p.MarkersRx != m.cliMarkers || p.MarkersTx != m.srvMarkers || p.Rev != m.rev || p.Ext != mpa.ExtAll {
				t.Fatalf("negotiated %+v, want rev %d crc %v markers rx %v tx %v ext imm|atomic", p, m.rev, m.crc, m.cliMarkers, m.srvMarkers)
			}
			exerciseImm(t, cli, srv, 120, 9000, uint64(i+1))
			st := srv.eng.Stats()
			if st.CRCErrors.Load() != 0 || st.TerminatesTx.Load() != 0 {
				t.Fatalf("errors on a clean run: crc %d terminates %d", st.CRCErrors.Load(), st.TerminatesTx.Load())
			}
		})
	}
}

// TestImmediateLarge: a thousand Writes with Immediate Data of up to 64 KiB
// at MTU 9000, every byte checked, on an impaired link too.
func TestImmediateLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	cli, srv := newPair(t, pairOpts{mtu: 9000, depth: 64})
	exerciseImm(t, cli, srv, 1000, 64<<10, 9)
}

// TestImmediateSolicited: Immediate Data with SE wakes a CQ armed for
// solicited completions only; one without SE does not.
func TestImmediateSolicited(t *testing.T) {
	cli, srv := newPair(t, pairOpts{})
	dst := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	srv.recv(verbs.RecvWR{ID: 1}, verbs.RecvWR{ID: 2})
	if err := srv.rcq.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	w := verbs.SendWR{ID: 1, Opcode: verbs.WRWriteWithImm, Flags: verbs.FlagInline, Inline: []byte("x"), ImmData: 5,
		RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}
	cli.post(w)
	testkit.Eventually(t, testTimeout, "the first Immediate Data", func() bool { return srv.eng.Stats().ImmediatesRx.Load() == 1 })
	select {
	case <-srv.rcq.Notify():
		t.Fatal("notified for a completion without a solicited event")
	case <-time.After(50 * time.Millisecond):
	}
	wantWC(t, poll(t, srv.rcq, 1)[0], 1, verbs.WCRecvRDMAWithImm, verbs.WCSuccess, 1)
	select { // poll's own wait may have armed and fired the CQ
	case <-srv.rcq.Notify():
	default:
	}
	if err := srv.rcq.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	w.ID, w.Flags = 2, w.Flags|verbs.FlagSolicited
	cli.post(w)
	select {
	case <-srv.rcq.Notify():
	case <-time.After(testTimeout):
		t.Fatal("no notification for Immediate Data with SE")
	}
	wantWC(t, poll(t, srv.rcq, 1)[0], 2, verbs.WCRecvRDMAWithImm, verbs.WCSuccess, 1)
}

// TestImmediateNoReceive: Immediate Data that finds no receive posted ends
// the stream with DDP's "no buffer" Terminate, as a Send does.
func TestImmediateNoReceive(t *testing.T) {
	for _, op := range []verbs.WROpcode{verbs.WRWriteWithImm, verbs.WRSendWithImm} {
		t.Run(op.String(), func(t *testing.T) {
			cli, srv := newPair(t, pairOpts{})
			dst := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			cli.post(verbs.SendWR{ID: 1, Opcode: op, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("no receive"),
				ImmData: 1, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
			terminated(t, srv, cli, rdmap.TermDDPNoBuffer)
			if n := srv.eng.Stats().RecvNoBuffer.Load(); n != 1 {
				t.Fatalf("ddpUntaggedNoBuffer %d, want 1", n)
			}
		})
	}
}

// TestImmediatePeerWithoutSupport: toward a peer that did not negotiate
// RFC 7306 (a siwtun with extensions off, standing in for Linux siw) a
// request with immediate data fails at post time with
// ErrNotSupportedByPeer, nothing reaches the wire, and the QP goes on.
func TestImmediatePeerWithoutSupport(t *testing.T) {
	off := func(c *offload.Config) { c.RDMAPExt = false }
	for _, tc := range []struct {
		name     string
		cli, srv func(*offload.Config)
	}{{"responder-without", nil, off}, {"initiator-without", off, nil}} {
		t.Run(tc.name, func(t *testing.T) {
			cli, srv := newPair(t, pairOpts{cli: tc.cli, srv: tc.srv})
			for _, s := range []*side{cli, srv} {
				if ext := s.qp.Info().Params.Ext; ext != 0 {
					t.Fatalf("%s: extensions %v negotiated", s.dev.Name(), ext)
				}
			}
			dst := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			rbuf := srv.region(64, verbs.AccessLocalWrite)
			srv.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{rbuf.mr.SGE(0, 64)}})
			fpdus := cli.eng.Stats().FPDUsTx.Load()
			for _, s := range []*side{cli, srv} {
				for _, op := range []verbs.WROpcode{verbs.WRWriteWithImm, verbs.WRSendWithImm} {
					n, err := s.qp.PostSend([]verbs.SendWR{{ID: 9, Opcode: op, Flags: verbs.FlagSignaled | verbs.FlagInline,
						Inline: []byte("x"), ImmData: 1, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}})
					if n != 0 || !errors.Is(err, verbs.ErrNotSupportedByPeer) {
						t.Fatalf("%s: PostSend(%v) = %d, %v; want 0, ErrNotSupportedByPeer", s.dev.Name(), op, n, err)
					}
					t.Logf("%s: %v", s.dev.Name(), err)
				}
			}
			time.Sleep(20 * time.Millisecond)
			if got := cli.eng.Stats().FPDUsTx.Load(); got != fpdus {
				t.Fatalf("%d FPDUs sent after refused posts", got-fpdus)
			}
			noCompletion(t, cli.scq)
			// The QP goes on: a plain Write and a Send.
			cli.post(verbs.SendWR{ID: 3, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("ok"), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()},
				verbs.SendWR{ID: 4, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("ok")})
			wantWC(t, poll(t, srv.rcq, 1)[0], 1, verbs.WCRecv, verbs.WCSuccess, 2)
			if n := srv.eng.Stats().ImmediatesRx.Load() + cli.eng.Stats().ImmediatesTx.Load(); n != 0 {
				t.Fatalf("%d Immediate Data messages on the wire", n)
			}
			if st := cli.qp.State(); st != verbs.QPRTS {
				t.Fatalf("state %v, want RTS", st)
			}
		})
	}
}

// TestImmediateOOO: the Write of a Write with Immediate Data is placed out
// of order behind a held segment, as any Write; its Immediate Data waits
// in stream order, so the receive completes only once the held segment
// came and every byte is in place.
func TestImmediateOOO(t *testing.T) {
	for _, m := range oooModes {
		t.Run(m.name, func(t *testing.T) {
			cli, srv, gate := newGatedPair(t, m)
			const size = 8 << 10
			src := cli.region(size, verbs.AccessLocalWrite)
			fill(src.buf(), 3)
			dst := srv.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			srv.recv(verbs.RecvWR{ID: 1})
			hf := &holdFirst{}
			gate.SetRule(hf.rule)
			hf.arm(0)
			cli.post(verbs.SendWR{ID: 10, Opcode: verbs.WRWriteWithImm, Flags: verbs.FlagSignaled, ImmData: 0xabcdef,
				SGL: []verbs.SGE{src.mr.SGE(0, size)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
			poll(t, cli.scq, 1)
			testkit.Eventually(t, testTimeout, "out-of-order placement", func() bool { return srv.eng.Stats().PlacedOOOFPDUs.Load() > 0 })
			noCompletion(t, srv.rcq)
			if n := srv.eng.Stats().ImmediatesRx.Load(); n != 0 {
				t.Fatalf("Immediate Data delivered before the gap was filled")
			}
			gate.SetRule(nil)
			if gate.Release() == 0 {
				t.Fatal("nothing was held")
			}
			wc := poll(t, srv.rcq, 1)[0]
			if wc.Opcode != verbs.WCRecvRDMAWithImm || wc.ImmData != 0xabcdef || wc.ByteLen != size || wc.Flags != verbs.WCWithImm {
				t.Fatalf("completion %+v", wc)
			}
			sameBytes(t, "region", dst.buf(), src.buf())
			dst.checkGuards(t)
			t.Logf("placed out of order: %d FPDUs, %d octets", srv.eng.Stats().PlacedOOOFPDUs.Load(), srv.eng.Stats().PlacedOOOBytes.Load())
		})
	}
}
