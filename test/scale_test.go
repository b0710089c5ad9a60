package test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// TestHundredQPs: one application holds 100 connections at once between
// the two daemons (one listener on siwtun1, 100 concurrent Connects from
// siwtun0, each request matched to its server QP by its private data). On
// every connection an RDMA Write of 64 KiB and a Send of 1 KiB behind it,
// every byte verified; then every connection is disconnected and both
// daemons' `siwtun ctl qp -j` show no QP left in RTS; once the QPs are
// destroyed they show none at all and qpActive is 0.
func TestHundredQPs(t *testing.T) {
	const (
		nQP   = 100
		wsize = 64 << 10
		ssize = 1 << 10
		port  = 7300
	)
	r := newTwoRNICs(t, 1500)

	type side struct {
		pd  *verbs.PD
		cq  *verbs.CQ // send and receive completions of every QP
		qps []*verbs.QP
	}
	mkSide := func(dev *verbs.Device) *side {
		pd, err := dev.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := dev.CreateCQ(4 * nQP)
		if err != nil {
			t.Fatal(err)
		}
		s := &side{pd: pd, cq: cq}
		for range nQP {
			qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
			if err != nil {
				t.Fatalf("create QP %d: %v", len(s.qps), err)
			}
			if err := qp.Modify(verbs.QPInit); err != nil {
				t.Fatal(err)
			}
			s.qps = append(s.qps, qp)
		}
		return s
	}
	cli, srv := mkSide(r.dev0), mkSide(r.dev1)
	regMR := func(s *side, dev *verbs.Device, n int, access verbs.Access) (*verbs.MR, []byte) {
		buf, err := dev.AllocBuffer(n)
		if err != nil {
			t.Fatal(err)
		}
		mr, err := s.pd.RegMR(buf[:n], access)
		if err != nil {
			t.Fatal(err)
		}
		return mr, buf[:n]
	}
	// Client: QP i writes from src[i*wsize:] and sends from msg[i*ssize:].
	srcMR, src := regMR(cli, r.dev0, nQP*wsize, verbs.AccessLocalWrite)
	msgMR, msg := regMR(cli, r.dev0, nQP*ssize, verbs.AccessLocalWrite)
	// Server: QP i is written at dst[i*wsize:] and receives into rcv[i*ssize:].
	dstMR, dst := regMR(srv, r.dev1, nQP*wsize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	rcvMR, rcv := regMR(srv, r.dev1, nQP*ssize, verbs.AccessLocalWrite)
	for i := range nQP {
		copy(src[i*wsize:], pattern(wsize, byte(i)))
		copy(msg[i*ssize:], pattern(ssize, byte(i+128)))
		if _, err := srv.qps[i].PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{rcvMR.SGE(i*ssize, ssize)}}}); err != nil {
			t.Fatal(err)
		}
	}

	// Connect all 100 at once.
	l, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, port), nQP)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accErr := make(chan error, 1)
	go func() {
		taken := make([]bool, nQP)
		for range nQP {
			req, err := l.Accept(ctx(t))
			if err != nil {
				accErr <- fmt.Errorf("accept: %w", err)
				return
			}
			if len(req.PrivateData) != 4 {
				accErr <- fmt.Errorf("request from %v with private data %x", req.Remote, req.PrivateData)
				return
			}
			i := binary.BigEndian.Uint32(req.PrivateData)
			if i >= nQP || taken[i] {
				accErr <- fmt.Errorf("request from %v for QP index %d (taken %v)", req.Remote, i, i < nQP && taken[i])
				return
			}
			taken[i] = true
			if err := req.Accept(srv.qps[i], verbs.ConnParam{}); err != nil {
				accErr <- fmt.Errorf("accept QP index %d: %w", i, err)
				return
			}
		}
		accErr <- nil
	}()
	start := time.Now()
	var wg sync.WaitGroup
	connErr := make([]error, nQP)
	for i := range nQP {
		wg.Go(func() {
			pd := binary.BigEndian.AppendUint32(nil, uint32(i))
			connErr[i] = cli.qps[i].Connect(ctx(t), netip.AddrPortFrom(r.a1, port), verbs.ConnParam{PrivateData: pd})
		})
	}
	wg.Wait()
	for i, err := range connErr {
		if err != nil {
			t.Fatalf("Connect %d: %v", i, err)
		}
	}
	if err := <-accErr; err != nil {
		t.Fatal(err)
	}
	for _, qp := range srv.qps {
		waitState(t, qp, verbs.QPRTS)
	}
	t.Logf("%d connections established in %v", nQP, time.Since(start))
	for _, d := range []*daemon{r.d0, r.d1} {
		if st := statesOf(ctlQPsCLI(t, r.bin, d)); st["RTS"] != nQP {
			t.Fatalf("%s: QP states %v, want %d in RTS", d.dev, st, nQP)
		}
	}

	// A Write and a Send on every connection.
	for i, qp := range cli.qps {
		if _, err := qp.PostSend([]verbs.SendWR{
			{ID: uint64(2 * i), Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{srcMR.SGE(i*wsize, wsize)},
				RemoteAddr: dstMR.Addr() + uint64(i*wsize), RKey: dstMR.RKey()},
			{ID: uint64(2*i + 1), Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{msgMR.SGE(i*ssize, ssize)}},
		}); err != nil {
			t.Fatalf("post on QP %d: %v", i, err)
		}
	}
	sent := collect(t, cli.cq, 2*nQP)
	for id := range 2 * nQP {
		wc, ok := sent[uint64(id)]
		want := verbs.WCWrite
		if id%2 == 1 {
			want = verbs.WCSend
		}
		if !ok || wc.Status != verbs.WCSuccess || wc.Opcode != want || wc.QPNum != cli.qps[id/2].Num() {
			t.Fatalf("client completion %d: %+v (present %v), want %v on QP %d", id, wc, ok, want, cli.qps[id/2].Num())
		}
	}
	got := collect(t, srv.cq, nQP)
	for i := range nQP {
		wc, ok := got[uint64(i)]
		if !ok || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.ByteLen != ssize || wc.QPNum != srv.qps[i].Num() {
			t.Fatalf("server receive %d: %+v (present %v)", i, wc, ok)
		}
		// The Send follows the Write on the stream: the Write is placed.
		if !bytes.Equal(dst[i*wsize:(i+1)*wsize], src[i*wsize:(i+1)*wsize]) {
			t.Fatalf("connection %d: RDMA Write target differs", i)
		}
		if !bytes.Equal(rcv[i*ssize:(i+1)*ssize], msg[i*ssize:(i+1)*ssize]) {
			t.Fatalf("connection %d: received Send differs", i)
		}
	}

	// Disconnect every connection: nothing stays in RTS on either daemon.
	for _, qp := range cli.qps {
		qp.Disconnect()
	}
	for _, d := range []*daemon{r.d0, r.d1} {
		eventually(t, 30*time.Second, d.dev+": no QP in RTS after Disconnect", func() (bool, string) {
			qps := ctlQPsCLI(t, r.bin, d)
			st := statesOf(qps)
			return len(qps) == nQP && st["RTS"] == 0, describe(st)
		})
	}
	for _, s := range []*side{cli, srv} {
		for _, qp := range s.qps {
			if st := qp.State(); st != verbs.QPErr {
				t.Errorf("QP %d after Disconnect: %v, want ERR", qp.Num(), st)
			}
			if err := qp.Destroy(); err != nil {
				t.Fatalf("destroy QP %d: %v", qp.Num(), err)
			}
		}
	}
	for _, d := range []*daemon{r.d0, r.d1} {
		eventually(t, 10*time.Second, d.dev+": no QP after Destroy", func() (bool, string) {
			qps, active := ctlQPs(t, d), ctlVerbsCounters(t, d)["qpActive"]
			return len(qps) == 0 && active == 0, fmt.Sprintf("%d QPs listed, qpActive %d", len(qps), active)
		})
	}
	// Closing the devices releases the memory regions too.
	r.dev0.Close()
	r.dev1.Close()
	for _, d := range []*daemon{r.d0, r.d1} {
		eventually(t, 10*time.Second, d.dev+": nothing left after Close", func() (bool, string) {
			c := ctlVerbsCounters(t, d)
			return c["qpActive"] == 0 && c["mrActive"] == 0, describe(c)
		})
	}
}

// collect polls n completions from cq (bounded by the test's context) and
// returns them by work request ID; a repeated ID fails the test.
func collect(t testing.TB, cq *verbs.CQ, n int) map[uint64]verbs.WorkCompletion {
	t.Helper()
	out := make(map[uint64]verbs.WorkCompletion, n)
	wcs := make([]verbs.WorkCompletion, 64)
	c := timeoutCtx(t, time.Minute)
	for len(out) < n {
		k, err := cq.Wait(c, wcs)
		if err != nil {
			t.Fatalf("after %d of %d completions: %v", len(out), n, err)
		}
		for _, wc := range wcs[:k] {
			if prev, dup := out[wc.ID]; dup {
				t.Fatalf("completion ID %d twice: %+v and %+v", wc.ID, prev, wc)
			}
			out[wc.ID] = wc
		}
	}
	return out
}
