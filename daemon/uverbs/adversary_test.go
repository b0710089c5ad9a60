package uverbs

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// reqFDs is req keeping the reply's descriptors.
func (rc *rawClient) reqFDs(op uint16, m uabi.Msg, fds ...int) (uint32, string, []byte, []int) {
	rc.t.Helper()
	seq := rc.post(op, m, fds...)
	rep := rc.collect(1)[seq]
	return rep.st, rep.msg, rep.body, rep.fds
}

// post sends request m of op without waiting for its reply.
func (rc *rawClient) post(op uint16, m uabi.Msg, fds ...int) uint32 {
	rc.t.Helper()
	rc.seq++
	var e uabi.Enc
	if err := rc.c.Send(e.Message(op, rc.seq, m, len(fds)), fds...); err != nil {
		rc.t.Fatal(err)
	}
	return rc.seq
}

type rawReply struct {
	st   uint32
	msg  string
	body []byte
	fds  []int
}

// collect reads n replies (skipping events), by sequence number.
func (rc *rawClient) collect(n int) map[uint32]rawReply {
	rc.t.Helper()
	out := make(map[uint32]rawReply, n)
	rc.c.C.SetReadDeadline(time.Now().Add(testTimeout))
	for len(out) < n {
		h, body, fds, err := rc.c.Recv()
		if err != nil {
			rc.t.Fatalf("reading replies: %v", err)
		}
		if h.Op == uabi.OpEvent {
			uabi.CloseFDs(fds)
			continue
		}
		var st uabi.Status
		d := &uabi.Dec{B: body}
		if err := st.Decode(d); err != nil {
			rc.t.Fatalf("the reply's status: %v", err)
		}
		out[h.Seq] = rawReply{st: st.Code, msg: st.Msg, body: append([]byte(nil), d.B...), fds: fds}
	}
	return out
}

// must sends a request that has to succeed and decodes its reply.
func (rc *rawClient) must(op uint16, m uabi.Msg, rep uabi.Msg, fds ...int) []int {
	rc.t.Helper()
	st, msg, body, rfds := rc.reqFDs(op, m, fds...)
	if st != uabi.StOK {
		rc.t.Fatalf("%s: status %d: %s", uabi.OpName(op), st, msg)
	}
	if rep != nil {
		if err := uabi.Decode(body, rep); err != nil {
			rc.t.Fatalf("%s reply: %v", uabi.OpName(op), err)
		}
	}
	return rfds
}

// refuse sends a request that has to fail; it returns the status.
func (rc *rawClient) refuse(what string, op uint16, m uabi.Msg, fds ...int) uint32 {
	rc.t.Helper()
	st, msg, _, rfds := rc.reqFDs(op, m, fds...)
	uabi.CloseFDs(rfds)
	if st == uabi.StOK {
		rc.t.Fatalf("%s: accepted", what)
	}
	rc.t.Logf("%s: status %d: %s", what, st, msg)
	return st
}

// badQP is a hostile client's QP: its rings, mapped as the client maps
// them, and the peer's QP it is connected to (if it is).
type badQP struct {
	h, num   uint32
	mem      []byte
	sq, rq   *uabi.Ring
	doorbell int
	peer     *side
}

func (rc *rawClient) createQP(pd, cq uint32, depth uint32) *badQP {
	rc.t.Helper()
	var rep uabi.CreateQPReply
	fds := rc.must(uabi.OpCreateQP, &uabi.CreateQP{PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: depth, MaxRecvWR: depth}, &rep)
	mapping, mem, err := uabi.MapShared(fds[0], 0, uint64(rep.Total))
	uabi.Close(fds[0])
	if err != nil {
		rc.t.Fatal(err)
	}
	q := &badQP{h: rep.Handle, num: rep.Num, mem: mapping, doorbell: fds[1]}
	if q.sq, err = uabi.OpenRing(mem[:rep.SQBytes], rep.SQCount, uabi.SQESize); err != nil {
		rc.t.Fatal(err)
	}
	if q.rq, err = uabi.OpenRing(mem[rep.SQBytes:], rep.RQCount, uabi.RQESize); err != nil {
		rc.t.Fatal(err)
	}
	return q
}

func (q *badQP) close() {
	uabi.Unmap(q.mem)
	uabi.Close(q.doorbell)
}

// badCQ is a hostile client's CQ ring.
type badCQ struct {
	h    uint32
	mem  []byte
	ring *uabi.Ring
	nfd  int
	cons uint32
}

func (rc *rawClient) createCQ(depth uint32) *badCQ {
	rc.t.Helper()
	var rep uabi.CreateCQReply
	fds := rc.must(uabi.OpCreateCQ, &uabi.CreateCQ{Depth: depth}, &rep)
	mapping, mem, err := uabi.MapShared(fds[0], 0, uint64(rep.Size))
	uabi.Close(fds[0])
	if err != nil {
		rc.t.Fatal(err)
	}
	ring, err := uabi.OpenRing(mem, rep.Count, uabi.CQESize)
	if err != nil {
		rc.t.Fatal(err)
	}
	return &badCQ{h: rep.Handle, mem: mapping, ring: ring, nfd: fds[1]}
}

func (c *badCQ) close() {
	uabi.Unmap(c.mem)
	uabi.Close(c.nfd)
}

// poll waits for a completion of the CQ ring.
func (c *badCQ) poll(t *testing.T) ibv.WorkCompletion {
	t.Helper()
	var wc ibv.WorkCompletion
	testkit.Eventually(t, testTimeout, "a completion", func() bool {
		if _, ok := c.ring.Ready(c.cons); !ok {
			return false
		}
		uabi.DecodeCQE(c.ring.Entry(c.cons), &wc)
		c.ring.Release(c.cons)
		c.cons++
		return true
	})
	return wc
}

// connectTo connects q to a fresh QP of the peer, through a listener at
// port.
func (rc *rawClient) connectTo(r *rig, q *badQP, port uint16) {
	rc.t.Helper()
	q.peer = newEnd(rc.t, r.peer, 16)
	addr := netip.AddrPortFrom(peerAddr.Addr(), port)
	l, err := r.peer.Listen(addr, 4)
	if err != nil {
		rc.t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		req, err := l.Accept(ctx)
		if err == nil {
			err = req.Accept(q.peer.qp, verbs.ConnParam{})
		}
		acc <- err
	}()
	rc.must(uabi.OpConnect, &uabi.Connect{Handle: q.h, Remote: addr}, nil)
	if err := <-acc; err != nil {
		rc.t.Fatal(err)
	}
	waitEvent(rc.t, q.peer.qp, verbs.EventEstablished)
}

// postSend publishes wr in q's SQ at pos, changed by mutate (if not nil),
// and rings the doorbell.
func (q *badQP) postSend(pos uint32, wr ibv.SendWR, mutate func(e []byte)) {
	uabi.EncodeSQE(q.sq.Entry(pos), &wr)
	if mutate != nil {
		mutate(q.sq.Entry(pos))
	}
	q.sq.Publish(pos, 0)
	uabi.Signal(q.doorbell)
}

// guarded is memory with guard bytes on both sides of a region.
type guarded struct {
	buf  []byte // guard page, region, guard page
	mr   *verbs.MR
	size int
}

const guardByte = 0xA5

func newGuarded(t *testing.T, e *side, size int, access verbs.Access) *guarded {
	t.Helper()
	page := os.Getpagesize()
	buf, err := e.dev.AllocBuffer(2*page + size)
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = guardByte
	}
	mr, err := e.pd.RegMR(buf[page:page+size], access)
	if err != nil {
		t.Fatal(err)
	}
	return &guarded{buf: buf, mr: mr, size: size}
}

// intact checks the guard bytes.
func (g *guarded) intact(t *testing.T, what string) {
	t.Helper()
	page := os.Getpagesize()
	for _, part := range [][]byte{g.buf[:page], g.buf[page+g.size:]} {
		for _, b := range part {
			if b != guardByte {
				t.Errorf("%s: guard byte changed", what)
				return
			}
		}
	}
}

// goodTraffic is a well-behaved client's traffic: it writes a fresh
// pattern into the peer's region, reads it back into its own, and checks
// every byte, until stop or max rounds (0: no maximum); it returns the
// rounds done.
func goodTraffic(t *testing.T, cli *side, src, sink, remote *guarded, stop <-chan struct{}, max int) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*testTimeout)
	defer cancel()
	wcs := make([]verbs.WorkCompletion, 2)
	n := src.size
	for round := 1; ; round++ {
		select {
		case <-stop:
			return round - 1, nil
		default:
		}
		if max > 0 && round > max {
			return max, nil
		}
		s := src.mr.Bytes()
		for i := range s {
			s[i] = byte(round*7 + i)
		}
		clear(sink.mr.Bytes())
		if _, err := cli.qp.PostSend([]verbs.SendWR{
			{ID: 1, Opcode: verbs.WRWrite, SGL: []verbs.SGE{src.mr.SGE(0, n)}, RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()},
			{ID: 2, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(0, n)}, RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()},
		}); err != nil {
			return round, err
		}
		if _, err := cli.scq.Wait(ctx, wcs[:1]); err != nil {
			return round, err
		}
		if wcs[0].Status != verbs.WCSuccess {
			t.Errorf("good client, round %d: %v", round, wcs[0].Status)
			return round, nil
		}
		if !bytes.Equal(sink.mr.Bytes(), s) {
			t.Errorf("good client, round %d: the data read back differs", round)
			return round, nil
		}
	}
}

// resources counts what the process holds that a session's objects use:
// memfd and eventfd descriptors, and mappings of the verbs memfds.
func resources(t *testing.T) (fds, maps int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && (strings.HasPrefix(l, "/memfd:") || strings.Contains(l, "eventfd")) {
			fds++
		}
	}
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "/memfd:") {
			maps++
		}
	}
	return fds, maps
}

// TestHostileClient: a client speaks the protocol by hand and does what a
// hostile program would: regions beyond or around its memfd, SGEs with
// another client's lkey and with lengths that wrap, wild indexes, owner
// words and lengths written into its rings while the daemon reads them,
// objects destroyed twice and in the wrong order, and floods past its
// limits. Meanwhile a well-behaved client writes to and reads from the
// peer, checking every byte, with guard bytes around every region. The
// daemon must refuse each bad request, serve the good client unharmed,
// write nothing outside the regions, and free everything the bad client
// held when it goes.
func TestHostileClient(t *testing.T) {
	r := newRig(t)
	lim := Limits{QPs: 8, CQs: 16, MRs: 32, PDs: 8, Listeners: 4, MRBytes: 8 << 20, WRs: 1024, CQEs: 4096}
	r.srv.SetLimits(lim)

	// The good client, and the peer's side of its connection.
	good := newEnd(t, r.dial(), 16)
	goodPeer := newEnd(t, r.peer, 16)
	connect(t, good, goodPeer)
	const size = 8192
	src := newGuarded(t, good, size, verbs.AccessLocalWrite)
	sink := newGuarded(t, good, size, verbs.AccessLocalWrite)
	remote := newGuarded(t, goodPeer, size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	var rounds int
	var trafficErr error
	go func() {
		defer wg.Done()
		rounds, trafficErr = goodTraffic(t, good, src, sink, remote, stop, 0)
	}()

	baseQPs, baseMRs := len(r.daemon.QPs()), r.daemon.Regions().Len()
	baseFDs, baseMaps := resources(t)

	bad := r.raw(t)
	bad.must(uabi.OpHello, &uabi.Hello{Version: uabi.Version}, nil)
	var pdRep uabi.AllocPDReply
	bad.must(uabi.OpAllocPD, nil, &pdRep)
	pd := pdRep.Handle

	// Its memory: three pages; the region is the middle one.
	page := uint64(os.Getpagesize())
	memfd, mem, err := uabi.NewShared("hostile", int(3*page), false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range mem {
		mem[i] = guardByte
	}
	access := uint32(ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead)

	t.Run("regions", func(t *testing.T) {
		bad.t = t
		bad.refuse("beyond the memfd", uabi.OpRegMR, &uabi.RegMR{PD: pd, Offset: 2 * page, Length: 2 * page, Access: access}, memfd)
		bad.refuse("offset past the end", uabi.OpRegMR, &uabi.RegMR{PD: pd, Offset: 1 << 40, Length: 1, Access: access}, memfd)
		bad.refuse("offset+length wraps", uabi.OpRegMR, &uabi.RegMR{PD: pd, Offset: ^uint64(0) - 100, Length: 2 * page, Access: access}, memfd)
		bad.refuse("empty", uabi.OpRegMR, &uabi.RegMR{PD: pd, Offset: 0, Length: 0, Access: access}, memfd)
		bad.refuse("huge", uabi.OpRegMR, &uabi.RegMR{PD: pd, Offset: 0, Length: 1 << 50, Access: access}, memfd)
		bad.refuse("IOVA+length wraps", uabi.OpRegMR, &uabi.RegMR{PD: pd, Length: page, IOVA: ^uint64(0) - 10, Access: access}, memfd)
		bad.refuse("unknown access bits", uabi.OpRegMR, &uabi.RegMR{PD: pd, Length: page, Access: 0xffff}, memfd)
		bad.refuse("another client's PD", uabi.OpRegMR, &uabi.RegMR{PD: findHandle(t, r, good.pd), Length: page, Access: access}, memfd)
		unsealed, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		defer uabi.Close(unsealed)
		unix.Ftruncate(unsealed, int64(page))
		bad.refuse("memfd that can shrink", uabi.OpRegMR, &uabi.RegMR{PD: pd, Length: page, Access: access}, unsealed)
		// Overlapping regions are allowed, as in libibverbs.
		var a, b uabi.RegMRReply
		bad.must(uabi.OpRegMR, &uabi.RegMR{PD: pd, Offset: page, Length: page, IOVA: 0x10000, Access: access}, &a, memfd)
		bad.must(uabi.OpRegMR, &uabi.RegMR{PD: pd, Offset: page, Length: page / 2, IOVA: 0x10000, Access: access}, &b, memfd)
		bad.must(uabi.OpDeregMR, &uabi.Ref{Handle: b.Handle}, nil)
		bad.must(uabi.OpDeregMR, &uabi.Ref{Handle: a.Handle}, nil)
	})

	// The bad client's region for the transfers below: the middle page.
	var mr uabi.RegMRReply
	bad.t = t
	bad.must(uabi.OpRegMR, &uabi.RegMR{PD: pd, Offset: page, Length: page, IOVA: 0x10000, Access: access}, &mr, memfd)
	cq := bad.createCQ(256)

	t.Run("bad SGEs", func(t *testing.T) {
		bad.t = t
		cases := []struct {
			name   string
			wr     ibv.SendWR
			mutate func(e []byte)
		}{
			{"another client's lkey", ibv.SendWR{Opcode: ibv.WRSend, SGL: []ibv.SGE{{Addr: src.mr.Addr(), Length: 64, LKey: src.mr.LKey()}}}, nil},
			{"another client's lkey as a Read's sink", ibv.SendWR{Opcode: ibv.WRRead, SGL: []ibv.SGE{{Addr: sink.mr.Addr(), Length: 64, LKey: sink.mr.LKey()}},
				RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()}, nil},
			{"length past the region", ibv.SendWR{Opcode: ibv.WRSend, SGL: []ibv.SGE{{Addr: 0x10000 + 100, Length: 0xffffffff, LKey: mr.STag}}}, nil},
			{"address+length wraps", ibv.SendWR{Opcode: ibv.WRSend, SGL: []ibv.SGE{{Addr: ^uint64(0) - 10, Length: 100, LKey: mr.STag}}}, nil},
			{"below the region", ibv.SendWR{Opcode: ibv.WRSend, SGL: []ibv.SGE{{Addr: 0x10000 - 1, Length: 2, LKey: mr.STag}}}, nil},
			{"Read sink overflowing", ibv.SendWR{Opcode: ibv.WRRead, SGL: []ibv.SGE{{Addr: 0x10000 + page - 8, Length: 64, LKey: mr.STag}},
				RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()}, nil},
			{"too many SGEs", ibv.SendWR{Opcode: ibv.WRSend}, func(e []byte) { e[5] = 200 }},
			{"inline longer than the entry", ibv.SendWR{Opcode: ibv.WRSend, Flags: ibv.FlagInline, Inline: []byte("x")},
				func(e []byte) { binary.LittleEndian.PutUint16(e[6:], 60000) }},
			{"unknown flags", ibv.SendWR{Opcode: ibv.WRSend}, func(e []byte) { binary.LittleEndian.PutUint32(e[8:], 0xfff0) }},
			{"unknown opcode", ibv.SendWR{Opcode: 77, SGL: []ibv.SGE{{Addr: 0x10000, Length: 8, LKey: mr.STag}}}, nil},
		}
		for i, c := range cases {
			q := bad.createQP(pd, cq.h, 16)
			bad.connectTo(r, q, 7300+uint16(i))
			c.wr.ID = uint64(1000 + i)
			c.wr.Flags |= ibv.FlagSignaled
			q.postSend(0, c.wr, c.mutate)
			wc := cq.poll(t)
			if wc.Status == ibv.WCSuccess {
				t.Errorf("%s: completed successfully", c.name)
			}
			t.Logf("%s: %v", c.name, wc.Status)
			bad.must(uabi.OpDestroyQP, &uabi.Ref{Handle: q.h}, nil)
			q.close()
			for { // the flushed rest, if any
				if _, ok := cq.ring.Ready(cq.cons); !ok {
					break
				}
				cq.ring.Release(cq.cons)
				cq.cons++
			}
		}
	})

	t.Run("the good client's rkey", func(t *testing.T) {
		// A Write completes when handed to TCP; the peer refuses it (the
		// region is in another PD) with a Terminate.
		bad.t = t
		q := bad.createQP(pd, cq.h, 16)
		defer q.close()
		bad.connectTo(r, q, 7350)
		q.postSend(0, ibv.SendWR{ID: 1, Opcode: ibv.WRWrite, Flags: ibv.FlagSignaled, SGL: []ibv.SGE{{Addr: 0x10000, Length: 64, LKey: mr.STag}},
			RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()}, nil)
		ev := waitEvent(t, q.peer.qp, verbs.EventTerminateSent)
		t.Logf("peer: %v %v", ev.Type, ev.Err)
		for range 2 { // the Write's completion, then flushes, if any
			cq.poll(t)
			if _, ok := cq.ring.Ready(cq.cons); !ok {
				break
			}
		}
		bad.must(uabi.OpDestroyQP, &uabi.Ref{Handle: q.h}, nil)
	})

	t.Run("peer beyond the region", func(t *testing.T) {
		bad.t = t
		q := bad.createQP(pd, cq.h, 16)
		defer q.close()
		bad.connectTo(r, q, 7400)
		// The peer writes across the end of the bad client's region.
		from := newGuarded(t, q.peer, 4096, verbs.AccessLocalWrite)
		q.peer.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{from.mr.SGE(0, 200)}, RemoteAddr: 0x10000 + page - 100, RKey: mr.STag}})
		waitEvent(t, q.peer.qp, verbs.EventDisconnected)
		bad.must(uabi.OpDestroyQP, &uabi.Ref{Handle: q.h}, nil)
	})

	t.Run("wild rings", func(t *testing.T) {
		bad.t = t
		q := bad.createQP(pd, cq.h, 64)
		defer q.close()
		bad.connectTo(r, q, 7500)
		// The peer sends to the bad QP all along (the daemon then looks
		// for receives in its ring) while the client scribbles.
		from := newGuarded(t, q.peer, 4096, verbs.AccessLocalWrite)
		done := make(chan struct{})
		var sw sync.WaitGroup
		sw.Add(2)
		go func() {
			defer sw.Done()
			for i := uint64(0); ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if _, err := q.peer.qp.PostSend([]verbs.SendWR{{ID: i, Opcode: verbs.WRSend, SGL: []verbs.SGE{from.mr.SGE(0, 64)}}}); err != nil {
					time.Sleep(time.Millisecond)
				}
			}
		}()
		go func() {
			defer sw.Done()
			rng := rand.New(rand.NewPCG(1, 2))
			le := binary.LittleEndian
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				switch i % 4 {
				case 0: // random bytes anywhere, headers included
					for range 64 {
						q.mem[rng.IntN(len(q.mem))] = byte(rng.Uint32())
						cq.mem[rng.IntN(len(cq.mem))] = byte(rng.Uint32())
					}
				case 1: // valid owner words over garbage entries
					for range 8 {
						e := q.sq.Entry(rng.Uint32())
						for j := 4; j < len(e); j++ {
							e[j] = byte(rng.Uint32())
						}
						le.PutUint32(e, uabi.Valid)
						e = q.rq.Entry(rng.Uint32())
						for j := 4; j < len(e); j++ {
							e[j] = byte(rng.Uint32())
						}
						le.PutUint32(e, uabi.Valid)
					}
				case 2: // plausible entries with wild lengths and keys
					wr := ibv.SendWR{ID: rng.Uint64(), Opcode: ibv.WROpcode(rng.IntN(4)), SGL: []ibv.SGE{
						{Addr: 0x10000 + rng.Uint64N(2*page), Length: rng.Uint32(), LKey: mr.STag},
						{Addr: rng.Uint64(), Length: rng.Uint32(), LKey: []uint32{mr.STag, src.mr.LKey(), rng.Uint32()}[rng.IntN(3)]},
					}, RemoteAddr: rng.Uint64(), RKey: rng.Uint32()}
					q.postSend(rng.Uint32(), wr, nil)
					rwr := ibv.RecvWR{ID: rng.Uint64(), SGL: []ibv.SGE{{Addr: 0x10000 + rng.Uint64N(2*page), Length: rng.Uint32(), LKey: mr.STag}}}
					pos := rng.Uint32()
					uabi.EncodeRQE(q.rq.Entry(pos), &rwr)
					q.rq.Publish(pos, 0)
				case 3: // notify words, counts and the CQ's owner words
					le.PutUint32(q.mem[rng.IntN(4)*4:], rng.Uint32())
					le.PutUint32(cq.mem[rng.IntN(5)*4:], rng.Uint32())
					le.PutUint32(cq.ring.Entry(rng.Uint32()), rng.Uint32())
				}
				uabi.Signal(q.doorbell)
				if i%64 == 0 {
					time.Sleep(100 * time.Microsecond)
				}
			}
		}()
		time.Sleep(time.Second)
		close(done)
		sw.Wait()
		bad.must(uabi.OpDestroyQP, &uabi.Ref{Handle: q.h}, nil)
	})

	t.Run("destroy twice and out of order", func(t *testing.T) {
		bad.t = t
		q := bad.createQP(pd, cq.h, 16)
		defer q.close()
		if st := bad.refuse("CQ of a live QP", uabi.OpDestroyCQ, &uabi.Ref{Handle: cq.h}); st != uabi.StBusy {
			t.Errorf("status %d, want StBusy", st)
		}
		if st := bad.refuse("PD with a region and a QP", uabi.OpDeallocPD, &uabi.Ref{Handle: pd}); st != uabi.StBusy {
			t.Errorf("status %d, want StBusy", st)
		}
		bad.refuse("a QP as a CQ", uabi.OpDestroyCQ, &uabi.Ref{Handle: q.h})
		bad.refuse("a region as a PD", uabi.OpDeallocPD, &uabi.Ref{Handle: mr.Handle})
		if st := bad.refuse("the good client's QP", uabi.OpDestroyQP, &uabi.Ref{Handle: findHandle(t, r, good.qp)}); st != uabi.StForeign {
			t.Errorf("status %d, want StForeign", st)
		}
		bad.must(uabi.OpDestroyQP, &uabi.Ref{Handle: q.h}, nil)
		if st := bad.refuse("the QP again", uabi.OpDestroyQP, &uabi.Ref{Handle: q.h}); st != uabi.StBadHandle {
			t.Errorf("status %d, want StBadHandle", st)
		}
		bad.refuse("modify a destroyed QP", uabi.OpModifyQP, &uabi.ModifyQP{Handle: q.h, State: uint32(ibv.QPInit)})
		bad.refuse("connect a destroyed QP", uabi.OpConnect, &uabi.Connect{Handle: q.h, Remote: netip.AddrPortFrom(peerAddr.Addr(), 1)})

		// The same object destroyed by two requests at once: one wins.
		for range 20 {
			var a uabi.RegMRReply
			bad.must(uabi.OpRegMR, &uabi.RegMR{PD: pd, Offset: page, Length: page, Access: access}, &a, memfd)
			s1 := bad.post(uabi.OpDeregMR, &uabi.Ref{Handle: a.Handle})
			s2 := bad.post(uabi.OpDeregMR, &uabi.Ref{Handle: a.Handle})
			reps := bad.collect(2)
			if (reps[s1].st == uabi.StOK) == (reps[s2].st == uabi.StOK) {
				t.Fatalf("two DeregMR of one region: statuses %d (%s) and %d (%s), want one success",
					reps[s1].st, reps[s1].msg, reps[s2].st, reps[s2].msg)
			}
		}
		// A QP created on a CQ that another request destroys meanwhile:
		// the CQ goes and the QP fails, or the QP is made and the CQ
		// stays; never both.
		outcome := map[[2]uint32]int{}
		defer func() { t.Logf("CreateQP and DestroyCQ at once: statuses %v", outcome) }()
		// The second request follows the first after a growing delay,
		// so that it comes in every phase of the first.
		for i := range 60 {
			c := bad.createCQ(4)
			s1 := bad.post(uabi.OpCreateQP, &uabi.CreateQP{PD: pd, SendCQ: c.h, RecvCQ: c.h, MaxSendWR: 4, MaxRecvWR: 4})
			spin(time.Duration(2*i) * time.Microsecond)
			s2 := bad.post(uabi.OpDestroyCQ, &uabi.Ref{Handle: c.h})
			reps := bad.collect(2)
			uabi.CloseFDs(reps[s1].fds)
			if reps[s1].st == uabi.StOK && reps[s2].st == uabi.StOK {
				t.Fatalf("a QP was created on a CQ destroyed meanwhile")
			}
			outcome[[2]uint32{reps[s1].st, reps[s2].st}]++
			if reps[s1].st == uabi.StOK {
				var qr uabi.CreateQPReply
				uabi.Decode(reps[s1].body, &qr)
				bad.must(uabi.OpDestroyQP, &uabi.Ref{Handle: qr.Handle}, nil)
				bad.must(uabi.OpDestroyCQ, &uabi.Ref{Handle: c.h}, nil)
			}
			c.close()
		}
		// A PD deallocated while a region is registered in it.
		for i := range 40 {
			var p uabi.AllocPDReply
			bad.must(uabi.OpAllocPD, nil, &p)
			s1 := bad.post(uabi.OpRegMR, &uabi.RegMR{PD: p.Handle, Offset: page, Length: page, Access: access}, memfd)
			spin(time.Duration(i%40) * time.Microsecond)
			s2 := bad.post(uabi.OpDeallocPD, &uabi.Ref{Handle: p.Handle})
			reps := bad.collect(2)
			if reps[s1].st == uabi.StOK && reps[s2].st == uabi.StOK {
				t.Fatalf("a region was registered in a PD deallocated meanwhile")
			}
			if reps[s1].st == uabi.StOK {
				var a uabi.RegMRReply
				uabi.Decode(reps[s1].body, &a)
				bad.must(uabi.OpDeregMR, &uabi.Ref{Handle: a.Handle}, nil)
				bad.must(uabi.OpDeallocPD, &uabi.Ref{Handle: p.Handle}, nil)
			}
		}
	})

	t.Run("flood", func(t *testing.T) {
		bad.t = t
		// Up to and past each limit; what it holds stays for the
		// disconnect below to free.
		flood := func(what string, max int, op uint16, m func() uabi.Msg, fds ...int) {
			n := 0
			for ; n <= max+1; n++ {
				st, msg, _, rfds := bad.reqFDs(op, m(), fds...)
				uabi.CloseFDs(rfds)
				if st == uabi.StLimit {
					t.Logf("%s: %d, then %s", what, n, msg)
					return
				}
				if st != uabi.StOK {
					t.Fatalf("%s %d: status %d: %s", what, n, st, msg)
				}
			}
			t.Fatalf("%s: no limit after %d", what, n)
		}
		flood("PDs", lim.PDs, uabi.OpAllocPD, func() uabi.Msg { return nil })
		flood("CQs", lim.CQs, uabi.OpCreateCQ, func() uabi.Msg { return &uabi.CreateCQ{Depth: 16} })
		flood("regions", lim.MRs, uabi.OpRegMR, func() uabi.Msg {
			return &uabi.RegMR{PD: pd, Offset: page, Length: page, Access: access}
		}, memfd)
		port := uint16(7600)
		flood("listeners", lim.Listeners, uabi.OpListen, func() uabi.Msg {
			port++
			return &uabi.Listen{Addr: netip.AddrPortFrom(daemonAddr.Addr(), port), Backlog: 4}
		})
		var c uabi.CreateCQReply
		bad.must(uabi.OpDestroyCQ, &uabi.Ref{Handle: cq.h}, nil) // room for one more CQ below
		fds := bad.must(uabi.OpCreateCQ, &uabi.CreateCQ{Depth: 16}, &c)
		uabi.CloseFDs(fds)
		flood("QPs", lim.QPs, uabi.OpCreateQP, func() uabi.Msg {
			return &uabi.CreateQP{PD: pd, SendCQ: c.Handle, RecvCQ: c.Handle, MaxSendWR: 8, MaxRecvWR: 8}
		})
	})

	// The daemon served the good client all along and wrote nothing
	// outside the regions.
	close(stop)
	wg.Wait()
	if trafficErr != nil {
		t.Fatalf("good client: %v", trafficErr)
	}
	t.Logf("good client: %d rounds of %d bytes written and read back during the attack", rounds, size)
	if rounds == 0 {
		t.Error("the good client did no round")
	}
	for _, g := range []struct {
		name string
		g    *guarded
	}{{"good client's source", src}, {"good client's sink", sink}, {"peer's region", remote}} {
		g.g.intact(t, g.name)
	}
	for i, b := range mem {
		if uint64(i) >= page && uint64(i) < 2*page {
			continue
		}
		if b != guardByte {
			t.Fatalf("the bad client's memory changed at %d, outside its region", i)
		}
	}

	// It goes: everything it held is freed.
	cq.close()
	uabi.Unmap(mem)
	uabi.Close(memfd)
	bad.c.C.Close()
	freed := func() bool {
		fds, maps := resources(t)
		return r.srv.Sessions() == 1 && len(r.daemon.QPs()) == baseQPs && r.daemon.Regions().Len() == baseMRs &&
			fds == baseFDs && maps == baseMaps
	}
	deadline := time.Now().Add(testTimeout)
	for !freed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	fds, maps := resources(t)
	if !freed() {
		t.Errorf("the bad client's objects not freed")
	}
	t.Logf("after the bad client: %d sessions, %d daemon QPs, %d regions, %d memfd/eventfd descriptors, %d memfd mappings (baseline %d, %d, %d, %d)",
		r.srv.Sessions(), len(r.daemon.QPs()), r.daemon.Regions().Len(), fds, maps, baseQPs, baseMRs, baseFDs, baseMaps)
	// The good client still works.
	if _, err := goodTraffic(t, good, src, sink, remote, nil, 3); err != nil {
		t.Fatal(err)
	}
}

// findHandle returns the daemon's handle of a remote client's object (a
// *verbs.PD or *verbs.QP), looking it up by its number.
func findHandle(t *testing.T, r *rig, obj any) uint32 {
	t.Helper()
	r.srv.mu.Lock()
	sessions := make([]*session, 0, len(r.srv.sessions))
	for ss := range r.srv.sessions {
		sessions = append(sessions, ss)
	}
	r.srv.mu.Unlock()
	for _, ss := range sessions {
		ss.mu.Lock()
		for h, o := range ss.objs {
			switch o := o.(type) {
			case *sPD:
				if p, ok := obj.(*verbs.PD); ok && o.pd.Handle() == p.Handle() {
					ss.mu.Unlock()
					return h
				}
			case *sQP:
				if q, ok := obj.(*verbs.QP); ok && o.qp.Num() == q.Num() {
					ss.mu.Unlock()
					return h
				}
			}
		}
		ss.mu.Unlock()
	}
	t.Fatalf("no daemon object for %T", obj)
	return 0
}

// spin waits d without sleeping (sleeps are too coarse to place a request
// inside another's handling).
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}
