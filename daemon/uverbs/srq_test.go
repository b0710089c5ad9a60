package uverbs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// srqRig is a receiver with one SRQ that n QPs share, each connected to a
// QP of the sender.
type srqRig struct {
	recv, send *side // recv.qp and send.qp are unused
	srq        *verbs.SRQ
	rqps, sqps []*verbs.QP
	buf        *verbs.MR // the receiver's slots
	sbuf       *verbs.MR // the sender's messages
}

// srqSlot is the size of a receive; the receiver's region has srqSlots.
const srqSlot, srqSlots = 4096, 100

// newSRQRig connects n QPs of send to n QPs of recv on one SRQ of depth,
// the receiver's QPs listening at addr (an address of recv's RNIC).
func newSRQRig(t *testing.T, recvDev, sendDev *verbs.Device, addr netip.Addr, n, depth int) *srqRig {
	t.Helper()
	g := &srqRig{recv: newEnd(t, recvDev, 4), send: newEnd(t, sendDev, 4)}
	var err error
	if g.srq, err = g.recv.pd.CreateSRQ(verbs.SRQAttr{MaxWR: depth}); err != nil {
		t.Fatal(err)
	}
	// One CQ each side for every QP's completions.
	rcq, err := recvDev.CreateCQ(4 * depth)
	if err != nil {
		t.Fatal(err)
	}
	scq, err := sendDev.CreateCQ(4 * n * 4)
	if err != nil {
		t.Fatal(err)
	}
	g.recv.rcq, g.send.scq = rcq, scq
	g.buf = g.recv.region(t, srqSlots*srqSlot, verbs.AccessLocalWrite)
	g.sbuf = g.send.region(t, n*srqSlot*4, verbs.AccessLocalWrite)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	l, err := recvDev.Listen(netip.AddrPortFrom(addr, 0), n)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for range n {
		rq, err := g.recv.pd.CreateQP(verbs.QPInitAttr{SendCQ: rcq, RecvCQ: rcq, MaxSendWR: 4, SRQ: g.srq})
		if err != nil {
			t.Fatal(err)
		}
		sq, err := g.send.pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: scq, MaxSendWR: 4, MaxRecvWR: 1})
		if err != nil {
			t.Fatal(err)
		}
		acc := make(chan error, 1)
		go func() {
			req, err := l.Accept(ctx)
			if err == nil {
				err = req.Accept(rq, verbs.ConnParam{})
			}
			acc <- err
		}()
		if err := sq.Connect(ctx, l.Addr(), verbs.ConnParam{}); err != nil {
			t.Fatal(err)
		}
		if err := <-acc; err != nil {
			t.Fatal(err)
		}
		waitEvent(t, rq, verbs.EventEstablished)
		g.rqps, g.sqps = append(g.rqps, rq), append(g.sqps, sq)
	}
	return g
}

// post posts the receive of slot i.
func (g *srqRig) post(t *testing.T, i int) {
	t.Helper()
	if _, err := g.srq.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{g.buf.SGE(i*srqSlot, srqSlot)}}}); err != nil {
		t.Fatal(err)
	}
}

// message is the content of message seq of sender QP q: its length
// varies, its first 8 bytes name it.
func message(q, seq int) []byte {
	b := make([]byte, 64+(q*131+seq*17)%(srqSlot-64))
	binary.BigEndian.PutUint32(b, uint32(q))
	binary.BigEndian.PutUint32(b[4:], uint32(seq))
	for i := 8; i < len(b); i++ {
		b[i] = byte(q*7 + seq*13 + i)
	}
	return b
}

// rounds has every sender QP send per messages each round, the receiver
// checking each message in the slot its completion names and posting the
// slot again; a QP's messages must arrive in order. The SRQ holds
// n*per receives, so none is ever missing.
func (g *srqRig) rounds(t *testing.T, rounds, per int) {
	t.Helper()
	n := len(g.sqps)
	byNum := map[uint32]int{}
	for i, q := range g.rqps {
		byNum[q.Num()] = i
	}
	next := make([]int, n) // the next seq each receiver QP expects
	seq := 0
	for r := range rounds {
		for q, sq := range g.sqps {
			var wrs []verbs.SendWR
			for k := range per {
				m := message(q, seq+k)
				off := (q*4 + k) * srqSlot
				copy(g.sbuf.Bytes()[off:], m)
				wrs = append(wrs, verbs.SendWR{ID: uint64(seq + k), Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{g.sbuf.SGE(off, len(m))}})
			}
			if _, err := sq.PostSend(wrs); err != nil {
				t.Fatal(err)
			}
		}
		for _, wc := range poll(t, g.send.scq, n*per) {
			if wc.Status != verbs.WCSuccess {
				t.Fatalf("round %d: send %+v", r, wc)
			}
		}
		for _, wc := range poll(t, g.recv.rcq, n*per) {
			q, ok := byNum[wc.QPNum]
			if wc.Status != verbs.WCSuccess || !ok || wc.Opcode != verbs.WCRecv {
				t.Fatalf("round %d: receive %+v", r, wc)
			}
			want := message(q, next[q])
			got := g.buf.Bytes()[int(wc.ID)*srqSlot:][:wc.ByteLen]
			if !bytes.Equal(got, want) {
				t.Fatalf("round %d: QP %d's message %d in slot %d: %d bytes %x..., want %d bytes %x...", r, wc.QPNum, next[q], wc.ID, len(got), got[:8], len(want), want[:8])
			}
			next[q]++
			g.post(t, int(wc.ID))
		}
		seq += per
	}
	for q := range next {
		if next[q] != seq {
			t.Fatalf("QP index %d received %d messages, want %d", q, next[q], seq)
		}
	}
}

// TestSRQ: eight QPs on one SRQ, in-process and over the verbs socket
// (each way between a daemon's client and an in-process RNIC): every
// message lands in the slot its completion names, in order per QP, with
// the QP's number; QP.PostRecv on a QP with an SRQ fails; posting past the
// depth fails with ErrQueueFull; the limit event fires once, below the
// armed limit, and Query shows it disarmed; destroying the SRQ while QPs
// use it fails with ErrBusy; growing the SRQ (a new ring over the socket)
// keeps the receives it held; after the QPs, the SRQ and its PD go.
func TestSRQ(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remote bool // the receiver is the daemon's client
	}{{"socket receiver", true}, {"in-process receiver", false}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			client := r.dial()
			recv, send, addr := r.peer, client, peerAddr.Addr()
			if tc.remote {
				recv, send, addr = client, r.peer, daemonAddr.Addr()
			}
			const n, per, depth = 8, 2, 16
			g := newSRQRig(t, recv, send, addr, n, depth)
			if a := recv.Query(); a.MaxSRQ <= 0 || a.MaxSRQWR != verbs.MaxQPWR || a.MaxSRQSGE != verbs.MaxSGE {
				t.Fatalf("device SRQ limits %d/%d/%d", a.MaxSRQ, a.MaxSRQWR, a.MaxSRQSGE)
			}
			if _, err := g.rqps[0].PostRecv([]verbs.RecvWR{{ID: 1}}); !errors.Is(err, verbs.ErrInvalidWR) {
				t.Fatalf("PostRecv on a QP with an SRQ: %v", err)
			}
			for i := range depth {
				g.post(t, i)
			}
			if _, err := g.srq.PostRecv([]verbs.RecvWR{{ID: 99}}); !errors.Is(err, verbs.ErrQueueFull) {
				t.Fatalf("posting past the depth: %v", err)
			}
			g.rounds(t, 20, per)

			// The limit: armed at 10 with 16 posted; one round takes 16
			// and the test posts each back after it completes.
			if err := g.srq.Modify(verbs.SRQAttr{Limit: 10}, verbs.SRQLimit); err != nil {
				t.Fatal(err)
			}
			if a, err := g.srq.Query(); err != nil || a.Limit != 10 || a.MaxWR != depth || a.MaxSGE != verbs.MaxSGE {
				t.Fatalf("Query: %+v, %v", a, err)
			}
			g.rounds(t, 1, per)
			select {
			case e := <-g.srq.Events():
				if e.Type != verbs.EventSRQLimitReached {
					t.Fatalf("event %v", e)
				}
			case <-time.After(testTimeout):
				t.Fatal("no limit event")
			}
			if a, _ := g.srq.Query(); a.Limit != 0 {
				t.Fatalf("limit %d after the event, want 0 (disarmed)", a.Limit)
			}
			g.rounds(t, 2, per)
			select {
			case e := <-g.srq.Events():
				t.Fatalf("a second event without re-arming: %v", e)
			default:
			}

			if err := g.srq.Destroy(); !errors.Is(err, verbs.ErrBusy) {
				t.Fatalf("destroy in use: %v", err)
			}
			// Grow the SRQ to 100 (a new ring over the socket): the 16
			// posted stay, 84 more fit, a round of 4 per QP then runs.
			if err := g.srq.Modify(verbs.SRQAttr{MaxWR: 100}, verbs.SRQMaxWR); err != nil {
				t.Fatal(err)
			}
			for i := depth; i < 100; i++ {
				g.post(t, i)
			}
			if _, err := g.srq.PostRecv([]verbs.RecvWR{{ID: 99}}); !errors.Is(err, verbs.ErrQueueFull) {
				t.Fatalf("posting past the new depth: %v", err)
			}
			if err := g.srq.Modify(verbs.SRQAttr{MaxWR: 50}, verbs.SRQMaxWR); err == nil {
				t.Fatal("shrinking below the 100 posted receives succeeded")
			}
			g.rounds(t, 3, 4)
			for _, q := range g.rqps {
				if err := q.Destroy(); err != nil {
					t.Fatal(err)
				}
			}
			if err := g.srq.Destroy(); err != nil {
				t.Fatalf("destroy unused: %v", err)
			}
			if err := g.srq.Destroy(); !errors.Is(err, verbs.ErrDestroyed) {
				t.Fatalf("second destroy: %v", err)
			}
		})
	}
}

// TestSRQLimits: the per-client limit of SRQs (--max-client-srqs), shown
// as max_srq, and SRQ depths counting in --max-client-wrs; destroying an
// SRQ makes room again.
func TestSRQLimits(t *testing.T) {
	r := newRig(t)
	r.srv.SetLimits(Limits{SRQs: 2, WRs: 64})
	d := r.dial()
	if a := d.Query(); a.MaxSRQ != 2 {
		t.Fatalf("max SRQs %d, want 2 (the client's limit)", a.MaxSRQ)
	}
	pd := must[*verbs.PD](t)(d.AllocPD())
	s1 := must[*verbs.SRQ](t)(pd.CreateSRQ(verbs.SRQAttr{MaxWR: 8}))
	must[*verbs.SRQ](t)(pd.CreateSRQ(verbs.SRQAttr{MaxWR: 8}))
	_, err := pd.CreateSRQ(verbs.SRQAttr{MaxWR: 8})
	wantLimit(t, err, "srqs")
	if err := s1.Destroy(); err != nil {
		t.Fatal(err)
	}
	_, err = pd.CreateSRQ(verbs.SRQAttr{MaxWR: 100}) // 128 ring entries, 8 in use
	wantLimit(t, err, "wrs")
	s3 := must[*verbs.SRQ](t)(pd.CreateSRQ(verbs.SRQAttr{MaxWR: 8}))
	// Growing past the WR limit fails and leaves the SRQ as it was.
	err = s3.Modify(verbs.SRQAttr{MaxWR: 60}, verbs.SRQMaxWR)
	wantLimit(t, err, "wrs")
	if a, err := s3.Query(); err != nil || a.MaxWR != 8 {
		t.Fatalf("after a refused resize: %+v, %v", a, err)
	}
	if err := s3.Modify(verbs.SRQAttr{MaxWR: 32}, verbs.SRQMaxWR); err != nil {
		t.Fatal(err)
	}
}

// daemonPD is the daemon's object for a client's PD.
func daemonPD(t *testing.T, r *rig, pd *verbs.PD) *sPD {
	t.Helper()
	h := findHandle(t, r, pd)
	r.srv.mu.Lock()
	defer r.srv.mu.Unlock()
	for ss := range r.srv.sessions {
		ss.mu.Lock()
		o, ok := ss.objs[h].(*sPD)
		ss.mu.Unlock()
		if ok {
			return o
		}
	}
	t.Fatalf("no daemon PD %d", h)
	return nil
}

// TestSRQOtherPD: QPs of one PD on an SRQ of another take receives whose
// regions are the SRQ's PD's. Such a region deregistered while a QP of the
// other PD is attached may still be copied into by that QP: the daemon
// keeps its mapping until the QP is gone (the SRQ's PD counts the QP).
func TestSRQOtherPD(t *testing.T) {
	r := newRig(t)
	client := r.dial()
	recv, send := newEnd(t, client, 4), newEnd(t, r.peer, 4)
	spd, err := client.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	srq, err := spd.CreateSRQ(verbs.SRQAttr{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := client.AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := spd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := recv.pd.CreateQP(verbs.QPInitAttr{SendCQ: recv.scq, RecvCQ: recv.rcq, MaxSendWR: 4, SRQ: srq})
	if err != nil {
		t.Fatal(err)
	}
	recv.qp = qp
	if _, err := srq.PostRecv([]verbs.RecvWR{{ID: 5, SGL: []verbs.SGE{mr.SGE(0, 4096)}}}); err != nil {
		t.Fatal(err)
	}
	connectAt(t, send, recv, netip.AddrPortFrom(daemonAddr.Addr(), 7310), verbs.ConnParam{})
	waitEvent(t, qp, verbs.EventEstablished)
	if _, err := send.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("other PD")}}); err != nil {
		t.Fatal(err)
	}
	if wc := poll(t, recv.rcq, 1)[0]; wc.Status != verbs.WCSuccess || wc.ID != 5 || string(buf[:8]) != "other PD" {
		t.Fatalf("receive into the SRQ's PD's region: %+v %q", wc, buf[:8])
	}
	dpd := daemonPD(t, r, spd)
	if err := mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	dpd.mu.Lock()
	kept, qps := len(dpd.zombies), dpd.qps
	dpd.mu.Unlock()
	if kept != 1 || qps != 1 {
		t.Fatalf("the SRQ's PD after dereg: %d mappings kept, %d QPs; want 1, 1 (the QP of the other PD)", kept, qps)
	}
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	dpd.mu.Lock()
	kept, qps = len(dpd.zombies), dpd.qps
	dpd.mu.Unlock()
	if kept != 0 || qps != 0 {
		t.Fatalf("after the QP went: %d mappings kept, %d QPs; want 0, 0", kept, qps)
	}
}
