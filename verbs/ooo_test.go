package verbs_test

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/verbs"

	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
)

// oooMode is one framing of the client→server direction.
type oooMode struct {
	name    string
	crc     bool // MPA CRC (both sides)
	markers bool // the server asks for Markers
}

// oooModes: CRC finds FPDUs by alignment, Markers without CRC by FPDUPTR.
var oooModes = []oooMode{
	{name: "crc", crc: true},
	{name: "markers-nocrc", markers: true},
}

// newGatedPair connects a client and a server whose inbound link runs
// through a Gate.
func newGatedPair(t *testing.T, m oooMode) (cli, srv *side, gate *netstack.Gate) {
	t.Helper()
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	lb, gate = netstack.NewGate(lb)
	cli = newSide(t, on(la, cliAddr, 1500), "siwtun0", func(c *offload.Config) { c.CRC = m.crc }, 64)
	srv = newSide(t, on(lb, srvAddr, 1500), "siwtun1", func(c *offload.Config) {
		c.CRC = m.crc
		c.Markers = m.markers
	}, 64)
	connect(t, cli, srv, verbs.ConnParam{}, verbs.ConnParam{})
	return cli, srv, gate
}

// holdFirst is a Gate rule: once armed, it holds the first data segment
// and every segment that sends already-sent octets again (retransmissions,
// so nothing fills the gap by itself), passes the others, and may corrupt
// the n-th segment it passes.
type holdFirst struct {
	mu          sync.Mutex
	armed       bool
	held        bool
	high        uint32 // end of the highest data passed or held
	passed      int
	corruptNth  int
	corruptedTO uint64 // the corrupted segment's first FPDU (markers off): TO
	corruptedN  int    // and payload length
}

func (h *holdFirst) arm(corruptNth int) {
	h.mu.Lock()
	h.armed, h.corruptNth = true, corruptNth
	h.mu.Unlock()
}

func (h *holdFirst) rule(s *netstack.Segment) netstack.GateVerdict {
	if s.Len == 0 {
		return netstack.GatePass
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.armed {
		return netstack.GatePass
	}
	end := s.Seq + uint32(s.Len)
	if !h.held {
		h.held, h.high = true, end
		return netstack.GateHold
	}
	if int32(s.Seq-h.high) < 0 {
		return netstack.GateHold // sends octets again
	}
	h.high = end
	h.passed++
	if h.passed == h.corruptNth && len(s.Payload) >= 16 {
		// A tagged FPDU, markers off: ULPDU_Length, then the DDP
		// header (control, reserved, STag, TO).
		h.corruptedTO = binary.BigEndian.Uint64(s.Payload[8:16])
		h.corruptedN = int(binary.BigEndian.Uint16(s.Payload[:2])) - 14
		return netstack.GateCorrupt
	}
	return netstack.GatePass
}

// TestOOOPlacementHeldSegment holds back the first segment of an 8 KiB RDMA
// Write (it and the Send after it fit in TCP's initial window) and lets the rest through: the later FPDUs are placed out of order
// (counters, tap events with OutOfOrder), the held part of the region is
// untouched and the Send posted after the Write has not completed; once
// the segment is released every byte and the completion order are exact.
func TestOOOPlacementHeldSegment(t *testing.T) {
	for _, m := range oooModes {
		t.Run(m.name, func(t *testing.T) {
			cli, srv, gate := newGatedPair(t, m)
			w := srv.eng.Watch(1 << 16)
			defer w.Close()
			const size = 8 << 10
			src := cli.region(size, verbs.AccessLocalWrite)
			fill(src.buf(), 7)
			dst := srv.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			rbuf := srv.region(64, verbs.AccessLocalWrite)
			srv.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{rbuf.mr.SGE(0, 64)}})
			hf := &holdFirst{}
			gate.SetRule(hf.rule)
			hf.arm(0)
			fpdusBefore := cli.eng.Stats().FPDUsTx.Load()
			cli.post(
				verbs.SendWR{ID: 10, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, size)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()},
				verbs.SendWR{ID: 11, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("after the write")},
			)
			// The client completes both once TCP took the data.
			poll(t, cli.scq, 2)
			// One FPDU per segment at MTU 1500: every Write FPDU but the
			// held first one is placed out of order.
			writeFPDUs := cli.eng.Stats().FPDUsTx.Load() - fpdusBefore - 1
			st := srv.eng.Stats()
			testkit.Eventually(t, testTimeout, "out-of-order placement", func() bool { return srv.eng.Stats().PlacedOOOFPDUs.Load() >= writeFPDUs-1 })
			st = srv.eng.Stats()
			fpdus, octets := st.PlacedOOOFPDUs.Load(), st.PlacedOOOBytes.Load()
			t.Logf("%d Write FPDUs; placed out of order: %d FPDUs, %d octets", writeFPDUs, fpdus, octets)
			if fpdus != writeFPDUs-1 {
				t.Fatalf("%d FPDUs placed out of order, want %d", fpdus, writeFPDUs-1)
			}
			// The region: a prefix (the held FPDU's payload) untouched,
			// the rest already the source's bytes.
			got, want := dst.buf(), src.buf()
			x := size
			for x > 0 && got[x-1] == want[x-1] {
				x--
			}
			for i := range x {
				if got[i] != guardByte {
					t.Fatalf("octet %d of the held part was written (%d octets not yet placed)", i, x)
				}
			}
			if x == 0 || x > 1500 || octets != uint64(size-x) {
				t.Fatalf("%d octets untouched, %d placed out of order, want the first FPDU's payload (0 < n ≤ 1500) and the rest", x, octets)
			}
			dst.checkGuards(t)
			noCompletion(t, srv.rcq)
			if n := srv.eng.Stats().WritesRx.Load(); n != 0 {
				t.Fatalf("InRdmaWrites %d before the gap was filled", n)
			}
			gate.SetRule(nil)
			if gate.Release() == 0 {
				t.Fatal("nothing was held")
			}
			wc := poll(t, srv.rcq, 1)
			wantWC(t, wc[0], 1, verbs.WCRecv, verbs.WCSuccess, uint32(len("after the write")))
			sameBytes(t, "region", dst.buf(), src.buf())
			sameBytes(t, "receive", rbuf.buf()[:15], []byte("after the write"))
			dst.checkGuards(t)
			rbuf.checkGuards(t)
			if n := srv.eng.Stats().WritesRx.Load(); n != 1 {
				t.Fatalf("InRdmaWrites %d, want 1", n)
			}
			// The trace shows the out-of-order placements.
			var ooo, inOrder int
			for done := false; !done; {
				select {
				case e := <-w.Events():
					if p := e.Place; p != nil && p.Op == rdmap.OpWrite {
						if p.OutOfOrder {
							ooo++
						} else {
							inOrder++
						}
					}
				default:
					done = true
				}
			}
			t.Logf("tap: %d Write placements out of order, %d in order", ooo, inOrder)
			if uint64(ooo) != fpdus || uint64(inOrder) != writeFPDUs {
				t.Fatalf("tap: %d out-of-order and %d in-order Write placements, want %d and %d", ooo, inOrder, fpdus, writeFPDUs)
			}
		})
	}
}

// TestOOOPlacementRejected: FPDUs that arrive out of order but fail a
// check — an invalid STag, a TO outside the region, a bad CRC — are not
// placed (the region and its guards keep their bytes), and once the gap is
// filled the in-order path Terminates as it always did.
func TestOOOPlacementRejected(t *testing.T) {
	cases := []struct {
		name    string
		mode    oooMode
		badKey  bool
		badTO   bool
		corrupt int // corrupt the n-th segment passed
		code    rdmap.Code
	}{
		{name: "invalid stag", mode: oooModes[0], badKey: true, code: rdmap.TermDDPTaggedInvalidSTag},
		{name: "invalid stag markers", mode: oooModes[1], badKey: true, code: rdmap.TermDDPTaggedInvalidSTag},
		{name: "outside the region", mode: oooModes[0], badTO: true, code: rdmap.TermDDPTaggedBaseBounds},
		{name: "bad crc", mode: oooModes[0], corrupt: 3, code: rdmap.TermLLPCRC},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cli, srv, gate := newGatedPair(t, c.mode)
			const size = 16 << 10
			src := cli.region(size, verbs.AccessLocalWrite)
			fill(src.buf(), 3)
			dst := srv.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			raddr, rkey := dst.mr.Addr(), dst.mr.RKey()
			if c.badKey {
				rkey += 1 << 8 // another slot: no region
			}
			if c.badTO {
				raddr += size // every FPDU beyond the region's end
			}
			hf := &holdFirst{}
			gate.SetRule(hf.rule)
			hf.arm(c.corrupt)
			fpdusBefore := cli.eng.Stats().FPDUsTx.Load()
			dataBefore := srv.eng.Stats().DataSegmentsRx.Load()
			cli.post(verbs.SendWR{ID: 10, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, size)}, RemoteAddr: raddr, RKey: rkey})
			poll(t, cli.scq, 1)
			writeFPDUs := cli.eng.Stats().FPDUsTx.Load() - fpdusBefore
			hf.mu.Lock()
			passed := hf.passed
			hf.mu.Unlock()
			wantOOO := uint64(0)
			if c.corrupt > 0 {
				wantOOO = writeFPDUs - 2 // all but the held and the corrupted one
				testkit.Eventually(t, testTimeout, "out-of-order placement", func() bool { return srv.eng.Stats().PlacedOOOFPDUs.Load() >= wantOOO })
			} else {
				// The server's hook counts each segment before it looks
				// at it for placement.
				testkit.Eventually(t, testTimeout, "the later segments", func() bool {
					return srv.eng.Stats().DataSegmentsRx.Load()-dataBefore >= uint64(passed)
				})
				time.Sleep(50 * time.Millisecond) // the last one was looked at
			}
			if got := srv.eng.Stats().PlacedOOOFPDUs.Load(); got != wantOOO {
				t.Fatalf("%d FPDUs placed out of order, want %d", got, wantOOO)
			}
			got := dst.buf()
			if c.corrupt > 0 {
				off := int(hf.corruptedTO - dst.mr.Addr())
				for i := off; i < off+hf.corruptedN; i++ {
					if got[i] != guardByte {
						t.Fatalf("octet %d of the corrupted FPDU [%d, +%d) was placed", i, off, hf.corruptedN)
					}
				}
			} else {
				for i, b := range got {
					if b != guardByte {
						t.Fatalf("octet %d of the region was written", i)
					}
				}
			}
			dst.checkGuards(t)
			gate.SetRule(nil)
			gate.Release()
			terminated(t, srv, cli, c.code)
			dst.checkGuards(t)
			if c.corrupt == 0 {
				for i, b := range dst.buf() {
					if b != guardByte {
						t.Fatalf("octet %d of the region was written", i)
					}
				}
			}
		})
	}
}

// TestOOOPlacementReorder runs many RDMA Writes, each followed by a Send,
// over a link that reorders 5 % of the packets (seeded): FPDUs are placed
// out of order, and every byte, the guards and the completion order are
// exact.
func TestOOOPlacementReorder(t *testing.T) {
	for _, m := range oooModes {
		t.Run(m.name, func(t *testing.T) {
			la, lb := netstack.Pipe(1500, netstack.Impairments{Seed: 5, Reorder: 0.05})
			cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", func(c *offload.Config) { c.CRC = m.crc }, 64)
			srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", func(c *offload.Config) {
				c.CRC = m.crc
				c.Markers = m.markers
			}, 64)
			connect(t, cli, srv, verbs.ConnParam{}, verbs.ConnParam{})
			const (
				rounds = 48
				size   = 24 << 10
			)
			src := cli.region(rounds*size, verbs.AccessLocalWrite)
			fill(src.buf(), 11)
			dst := srv.region(rounds*size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			rbuf := srv.region(rounds*8, verbs.AccessLocalWrite)
			for i := range rounds {
				srv.recv(verbs.RecvWR{ID: uint64(1000 + i), SGL: []verbs.SGE{rbuf.mr.SGE(8*i, 8)}})
			}
			for i := range rounds {
				msg := fmt.Appendf(nil, "done%04d", i)
				cli.post(
					verbs.SendWR{ID: uint64(2 * i), Opcode: verbs.WRWrite, SGL: []verbs.SGE{src.mr.SGE(i*size, size)}, RemoteAddr: dst.mr.Addr() + uint64(i*size), RKey: dst.mr.RKey()},
					verbs.SendWR{ID: uint64(2*i + 1), Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: msg},
				)
				if i%8 == 7 {
					// Keep the SQ from filling.
					for _, wc := range poll(t, cli.scq, 8) {
						if wc.Status != verbs.WCSuccess {
							t.Fatalf("send completion %+v", wc)
						}
					}
				}
			}
			wcs := poll(t, srv.rcq, rounds)
			for i, wc := range wcs {
				wantWC(t, wc, uint64(1000+i), verbs.WCRecv, verbs.WCSuccess, 8)
				sameBytes(t, fmt.Sprintf("receive %d", i), rbuf.buf()[8*i:8*i+8], fmt.Appendf(nil, "done%04d", i))
			}
			sameBytes(t, "region", dst.buf(), src.buf())
			dst.checkGuards(t)
			rbuf.checkGuards(t)
			st := srv.eng.Stats()
			ls := lb.Stats()
			t.Logf("link: %d packets reordered towards the server; placed out of order: %d FPDUs, %d octets; in order %d octets",
				ls.Rx.Reordered, st.PlacedOOOFPDUs.Load(), st.PlacedOOOBytes.Load(), st.PlacedBytes.Load())
			if st.PlacedOOOFPDUs.Load() == 0 || st.PlacedOOOBytes.Load() == 0 {
				t.Fatal("nothing was placed out of order")
			}
			if st.PlacedBytes.Load() < rounds*size {
				t.Fatalf("in order placed %d octets, want at least %d", st.PlacedBytes.Load(), rounds*size)
			}
		})
	}
}
