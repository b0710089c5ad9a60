package verbs_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// zeroed returns g with its region's bytes cleared (region fills them
// with the guard byte).
func zeroed(g *guarded) *guarded {
	clear(g.buf())
	return g
}

// word reads the 8-byte word at off of a region as the application's
// memory holds it (host byte order).
func word(g *guarded, off int) uint64 { return binary.NativeEndian.Uint64(g.buf()[off:]) }

// atomicWR is an atomic work request with its 8-byte result at off of res.
func atomicWR(id uint64, op verbs.WROpcode, res *guarded, off int, dst *guarded, doff int, cmpAdd, swap uint64) verbs.SendWR {
	return verbs.SendWR{ID: id, Opcode: op, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{res.mr.SGE(off, 8)},
		RemoteAddr: dst.mr.Addr() + uint64(doff), RKey: dst.mr.RKey(), CompareAdd: cmpAdd, Swap: swap}
}

// TestAtomicMatrix: Fetch-and-Add and Compare-and-Swap between two
// in-process RNICs in every MPA mode: each returns the word's original
// value into its 8-byte result buffer and completes as FETCH_ADD or
// COMP_SWAP with byte_len 8; Compare-and-Swap stores only when the word
// equals CompareAdd; more atomics than ORD are in flight at once.
func TestAtomicMatrix(t *testing.T) {
	type mode struct {
		name       string
		rev        uint8
		crc        bool
		cliMarkers bool
		srvMarkers bool
	}
	var modes []mode
	for _, rev := range []uint8{1, 2} {
		for _, crc := range []bool{false, true} {
			for _, m := range []struct {
				name string
				c, s bool
			}{{"none", false, false}, {"to-cli", true, false}, {"to-srv", false, true}, {"both", true, true}} {
				modes = append(modes, mode{fmt.Sprintf("rev%d/crc=%v/markers=%s", rev, crc, m.name), rev, crc, m.c, m.s})
			}
		}
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{
				cli: func(c *offload.Config) { c.MPARev, c.CRC, c.Markers = m.rev, m.crc, m.cliMarkers },
				srv: func(c *offload.Config) { c.MPARev, c.CRC, c.Markers = m.rev, false, m.srvMarkers },
			})
			if p := cli.qp.Info().Params; p.Ext&mpa.ExtAtomic == 0 {
				t.Fatalf("negotiated %v, want atomics", p.Ext)
			}
			exerciseAtomics(t, cli, srv)
		})
	}
}

// exerciseAtomics runs Fetch-and-Adds and Compare-and-Swaps from cli on a
// word of srv and checks every result and the word.
func exerciseAtomics(t *testing.T, cli, srv *side) {
	t.Helper()
	const n = 40 // more than the default ORD (16): the sender waits for responses
	res := cli.region(8*n, verbs.AccessLocalWrite)
	dst := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	zeroed(dst)
	binary.NativeEndian.PutUint64(dst.buf()[16:], 1000)
	var wrs []verbs.SendWR
	for i := range n {
		wrs = append(wrs, atomicWR(uint64(i), verbs.WRAtomicFetchAdd, res, 8*i, dst, 16, uint64(i), 0))
	}
	cli.post(wrs[:n/2]...)
	cli.post(wrs[n/2:]...)
	wcs := poll(t, cli.scq, n)
	sum := uint64(1000)
	for i, wc := range wcs {
		wantWC(t, wc, uint64(i), verbs.WCFetchAdd, verbs.WCSuccess, 8)
		if got := word(res, 8*i); got != sum {
			t.Fatalf("Fetch-and-Add %d returned %d, want %d", i, got, sum)
		}
		sum += uint64(i)
	}
	if got := word(dst, 16); got != sum {
		t.Fatalf("word %d after the adds, want %d", got, sum)
	}
	// Compare-and-Swap: equal stores, different does not; both return
	// the original value.
	cli.post(atomicWR(100, verbs.WRAtomicCmpSwap, res, 0, dst, 16, sum, 0xfeedface00000001),
		atomicWR(101, verbs.WRAtomicCmpSwap, res, 8, dst, 16, sum, 7),
		atomicWR(102, verbs.WRAtomicFetchAdd, res, 16, dst, 16, ^uint64(0), 0)) // adds -1: wraps
	wcs = poll(t, cli.scq, 3)
	wantWC(t, wcs[0], 100, verbs.WCCompSwap, verbs.WCSuccess, 8)
	wantWC(t, wcs[1], 101, verbs.WCCompSwap, verbs.WCSuccess, 8)
	wantWC(t, wcs[2], 102, verbs.WCFetchAdd, verbs.WCSuccess, 8)
	if a, b, c := word(res, 0), word(res, 8), word(res, 16); a != sum || b != 0xfeedface00000001 || c != 0xfeedface00000001 {
		t.Fatalf("results %#x %#x %#x, want %#x, 0xfeedface00000001 twice", a, b, c, sum)
	}
	if got := word(dst, 16); got != 0xfeedface00000000 {
		t.Fatalf("word %#x, want 0xfeedface00000000", got)
	}
	for i, v := range dst.buf() {
		if (i < 16 || i >= 24) && v != 0 {
			t.Fatalf("byte %d of the target region written", i)
		}
	}
	dst.checkGuards(t)
	res.checkGuards(t)
	if st := srv.eng.Stats(); st.AtomicsRx.Load() != n+3 || st.AtomicResponsesTx.Load() != n+3 || st.TerminatesTx.Load() != 0 {
		t.Fatalf("responder: %d atomics, %d responses, %d Terminates", st.AtomicsRx.Load(), st.AtomicResponsesTx.Load(), st.TerminatesTx.Load())
	}
	if st := cli.eng.Stats(); st.AtomicsTx.Load() != n+3 || st.AtomicsCompleted.Load() != n+3 {
		t.Fatalf("requester: %d atomics sent, %d completed", st.AtomicsTx.Load(), st.AtomicsCompleted.Load())
	}
}

// TestAtomicOrderWithReads: atomics and RDMA Reads interleaved share the
// ORD and the responder's IRD and complete in order, each with its own
// result. The responder performs an atomic in stream order as it arrives
// (as Sends and Writes are placed) and reads a Read's data when it answers
// it, so a Read sees every atomic before it, and a later one only when that
// one was not fenced: the atomic after each Read is fenced here, so each
// Read sees exactly the adds before it.
func TestAtomicOrderWithReads(t *testing.T) {
	cli, srv := newPair(t, pairOpts{
		cli: func(c *offload.Config) { c.ORD, c.IRD = 2, 2 },
		srv: func(c *offload.Config) { c.ORD, c.IRD = 2, 2 },
	})
	res := cli.region(8*64+64*64, verbs.AccessLocalWrite)
	dst := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic|verbs.AccessRemoteRead)
	zeroed(dst)
	var wrs []verbs.SendWR
	for i := range 64 {
		if i%3 == 2 {
			wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: verbs.WRRead, Flags: verbs.FlagSignaled,
				SGL: []verbs.SGE{res.mr.SGE(8*64+64*i, 8)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
			continue
		}
		wr := atomicWR(uint64(i), verbs.WRAtomicFetchAdd, res, 8*i, dst, 0, 1, 0)
		if i%3 == 0 && i > 0 {
			wr.Flags |= verbs.FlagFence
		}
		wrs = append(wrs, wr)
	}
	cli.post(wrs...)
	wcs := poll(t, cli.scq, len(wrs))
	count := uint64(0)
	for i, wc := range wcs {
		if i%3 == 2 {
			wantWC(t, wc, uint64(i), verbs.WCRead, verbs.WCSuccess, 8)
			if got := binary.NativeEndian.Uint64(res.buf()[8*64+64*i:]); got != count {
				t.Fatalf("Read %d saw %d, want %d (the adds before it)", i, got, count)
			}
			continue
		}
		wantWC(t, wc, uint64(i), verbs.WCFetchAdd, verbs.WCSuccess, 8)
		if got := word(res, 8*i); got != count {
			t.Fatalf("add %d returned %d, want %d", i, got, count)
		}
		count++
	}
}

// TestAtomicManyQPs: Fetch-and-Adds from several queue pairs on one word
// are atomic with respect to each other: the word ends at the total.
func TestAtomicManyQPs(t *testing.T) {
	const qps, per = 4, 500
	la, lb := newLinkPair(1500)
	cliAt, srvAt := on(la, cliAddr, 1500), on(lb, srvAddr, 1500)
	srv := newSide(t, srvAt, "siwtun1", nil, 64)
	dst := srv.region(8, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	zeroed(dst)
	var clis []*side
	cli := newSide(t, cliAt, "siwtun0", nil, 64)
	clis = append(clis, cli)
	connectOn(t, cli, srv, srvPort, verbs.ConnParam{}, verbs.ConnParam{})
	for i := 1; i < qps; i++ {
		c := cli.extraQP(t)
		s := srv.extraQP(t)
		connectOn(t, c, s, srvPort+uint16(i), verbs.ConnParam{}, verbs.ConnParam{})
		clis = append(clis, c)
	}
	var wg sync.WaitGroup
	errs := make(chan error, qps)
	for _, c := range clis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- addMany(c, dst, per)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := word(dst, 0); got != qps*per {
		t.Fatalf("counter %d, want %d", got, qps*per)
	}
}

// addMany adds 1 to the word of dst n times from c, 8 in flight.
func addMany(c *side, dst *guarded, n int) error {
	res := c.region(8*8, verbs.AccessLocalWrite)
	buf := make([]verbs.WorkCompletion, 8)
	posted, done := 0, 0
	deadline := time.Now().Add(testTimeout)
	for done < n {
		for posted < n && posted-done < 8 {
			wr := atomicWR(uint64(posted), verbs.WRAtomicFetchAdd, res, 8*(posted%8), dst, 0, 1, 0)
			if _, err := c.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				return err
			}
			posted++
		}
		k, err := c.scq.Poll(buf)
		if err != nil {
			return err
		}
		for _, wc := range buf[:k] {
			if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCFetchAdd {
				return fmt.Errorf("completion %+v", wc)
			}
		}
		done += k
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d adds done", done, n)
		}
		if k == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	return nil
}

// TestAtomicErrors: an atomic the responder cannot perform ends the stream
// with RDMAP's Terminate, and the request completes with the error; a
// request malformed locally is refused at post time.
func TestAtomicErrors(t *testing.T) {
	tests := []struct {
		name   string
		access verbs.Access
		off    int
		rkey   func(*guarded) uint32
		code   rdmap.Code
		status verbs.WCStatus
	}{
		// RFC 7306 §8.2: Remote Operation Error / Catastrophic error,
		// localized to RDMAP Stream; a remote operation error completes
		// the request with IBV_WC_REM_OP_ERR.
		{name: "misaligned", access: verbs.AccessLocalWrite | verbs.AccessRemoteAtomic, off: 4, code: rdmap.TermRDMAPCatastrophicStream, status: verbs.WCRemOpErr},
		{name: "no REMOTE_ATOMIC", access: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead, code: rdmap.TermRDMAPAccess, status: verbs.WCRemAccessErr},
		{name: "outside the region", access: verbs.AccessLocalWrite | verbs.AccessRemoteAtomic, off: 64, code: rdmap.TermRDMAPBaseBounds, status: verbs.WCRemAccessErr},
		{name: "invalid STag", access: verbs.AccessLocalWrite | verbs.AccessRemoteAtomic, rkey: func(g *guarded) uint32 { return g.mr.RKey() ^ 0x100 },
			code: rdmap.TermRDMAPInvalidSTag, status: verbs.WCRemAccessErr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cli, srv := newPair(t, pairOpts{})
			res := cli.region(8, verbs.AccessLocalWrite)
			dst := srv.region(64, tc.access)
			zeroed(dst)
			wr := atomicWR(1, verbs.WRAtomicCmpSwap, res, 0, dst, tc.off, 0, 5)
			if tc.rkey != nil {
				wr.RKey = tc.rkey(dst)
			}
			cli.post(wr)
			terminated(t, srv, cli, tc.code)
			wc := poll(t, cli.scq, 1)[0]
			wantWC(t, wc, 1, verbs.WCCompSwap, tc.status, 0)
			for i, v := range dst.buf() {
				if v != 0 {
					t.Fatalf("byte %d of the target written", i)
				}
			}
		})
	}
	t.Run("malformed", func(t *testing.T) {
		cli, srv := newPair(t, pairOpts{})
		res := cli.region(16, verbs.AccessLocalWrite)
		dst := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
		zeroed(dst)
		for _, wr := range []verbs.SendWR{
			{Opcode: verbs.WRAtomicFetchAdd, SGL: []verbs.SGE{res.mr.SGE(0, 4)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()},
			{Opcode: verbs.WRAtomicFetchAdd, SGL: []verbs.SGE{res.mr.SGE(0, 8), res.mr.SGE(8, 8)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()},
			{Opcode: verbs.WRAtomicCmpSwap, Flags: verbs.FlagInline, Inline: make([]byte, 8), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()},
		} {
			if n, err := cli.qp.PostSend([]verbs.SendWR{wr}); n != 0 || !errors.Is(err, verbs.ErrInvalidWR) {
				t.Fatalf("PostSend(%+v) = %d, %v; want ErrInvalidWR", wr, n, err)
			}
		}
		if n := cli.eng.Stats().AtomicsTx.Load(); n != 0 {
			t.Fatalf("%d Atomic Requests sent", n)
		}
	})
	t.Run("region without LOCAL_WRITE", func(t *testing.T) {
		cli, _ := newPair(t, pairOpts{})
		if _, err := cli.pd.RegMR(make([]byte, 8), verbs.AccessRemoteAtomic); err == nil {
			t.Fatal("REMOTE_ATOMIC without LOCAL_WRITE registered")
		}
	})
}

// TestAtomicPeerWithoutSupport: toward a peer that did not negotiate
// atomics (a siwtun with extensions off, standing in for Linux siw) an
// atomic fails at post time with ErrNotSupportedByPeer, no Atomic Request
// reaches the wire, and the QP goes on.
func TestAtomicPeerWithoutSupport(t *testing.T) {
	off := func(c *offload.Config) { c.RDMAPExt = false }
	for _, tc := range []struct {
		name     string
		cli, srv func(*offload.Config)
	}{{"responder-without", nil, off}, {"initiator-without", off, nil}} {
		t.Run(tc.name, func(t *testing.T) {
			cli, srv := newPair(t, pairOpts{cli: tc.cli, srv: tc.srv})
			res := cli.region(8, verbs.AccessLocalWrite)
			dst := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic|verbs.AccessRemoteWrite)
			zeroed(dst)
			fpdus := cli.eng.Stats().FPDUsTx.Load()
			for _, op := range []verbs.WROpcode{verbs.WRAtomicFetchAdd, verbs.WRAtomicCmpSwap} {
				n, err := cli.qp.PostSend([]verbs.SendWR{atomicWR(9, op, res, 0, dst, 0, 1, 2)})
				if n != 0 || !errors.Is(err, verbs.ErrNotSupportedByPeer) {
					t.Fatalf("PostSend(%v) = %d, %v; want 0, ErrNotSupportedByPeer", op, n, err)
				}
				t.Log(err)
			}
			time.Sleep(20 * time.Millisecond)
			if got := cli.eng.Stats().FPDUsTx.Load(); got != fpdus {
				t.Fatalf("%d FPDUs sent after refused posts", got-fpdus)
			}
			noCompletion(t, cli.scq)
			cli.post(verbs.SendWR{ID: 3, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("ok"), RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
			wantWC(t, poll(t, cli.scq, 1)[0], 3, verbs.WCWrite, verbs.WCSuccess, 2)
			if n := cli.eng.Stats().AtomicsTx.Load() + srv.eng.Stats().AtomicsRx.Load(); n != 0 {
				t.Fatalf("%d Atomic Requests on the wire", n)
			}
		})
	}
}

// newLinkPair is an unimpaired in-memory link of MTU mtu.
func newLinkPair(mtu int) (*netstack.Link, *netstack.Link) {
	return netstack.Pipe(mtu, netstack.Impairments{})
}

// extraQP is another queue pair (with its own CQs) on s's device and
// protection domain, as a side of its own.
func (s *side) extraQP(t testing.TB) *side {
	t.Helper()
	scq, err := s.dev.CreateCQ(256)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := s.dev.CreateCQ(256)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := s.pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, MaxSendWR: 64, MaxRecvWR: 64})
	if err != nil {
		t.Fatal(err)
	}
	n := *s
	n.t, n.scq, n.rcq, n.qp, n.events = t, scq, rcq, qp, nil
	return &n
}
