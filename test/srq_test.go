package test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// srqMessage is message seq of sender QP q: 8 to 4096 bytes, its first 8
// naming it.
func srqMessage(q, seq int) []byte {
	b := make([]byte, 8+(q*389+seq*1021)%4089)
	binary.BigEndian.PutUint32(b, uint32(q))
	binary.BigEndian.PutUint32(b[4:], uint32(seq))
	for i := 8; i < len(b); i++ {
		b[i] = byte(q*7 + seq*13 + i*3)
	}
	return b
}

// TestSRQSixtyFourQPs: between two daemons, 64 QPs of siwtun1 share one
// SRQ of 256 receives, and 64 QPs of siwtun0 send to them at once, each
// from its own goroutine, 150 messages each of 8 to 4096 bytes (9,600
// messages). Senders hold credits, one per receive, which the receiver
// hands back after checking a message and posting its receive again, so
// the SRQ is never empty however the load falls; the receiver checks
// every message byte for byte in the receive its completion names, that
// the completion carries the number of the QP the sender's peer is, and
// that each QP's messages arrive in order. Then the SRQ is armed at 64
// and 200 receives are taken with none posted back: the limit event
// comes, once.
func TestSRQSixtyFourQPs(t *testing.T) {
	const (
		nQP   = 64
		depth = 256
		per   = 150
		slot  = 4096
		port  = 7400
	)
	r := newTwoRNICs(t, 1500)
	rpd, err := r.dev1.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	srq, err := rpd.CreateSRQ(verbs.SRQAttr{MaxWR: depth})
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := r.dev1.CreateCQ(4 * depth)
	if err != nil {
		t.Fatal(err)
	}
	rbuf, err := r.dev1.AllocBuffer(depth * slot)
	if err != nil {
		t.Fatal(err)
	}
	rmr, err := rpd.RegMR(rbuf[:depth*slot], verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	post := func(i int) {
		t.Helper()
		if _, err := srq.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{rmr.SGE(i*slot, slot)}}}); err != nil {
			t.Fatalf("post SRQ receive %d: %v", i, err)
		}
	}
	for i := range depth {
		post(i)
	}

	spd, err := r.dev0.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	sbuf, err := r.dev0.AllocBuffer(nQP * 4 * slot)
	if err != nil {
		t.Fatal(err)
	}
	smr, err := spd.RegMR(sbuf[:nQP*4*slot], verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	l, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, port), nQP)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rqps := make([]*verbs.QP, nQP)
	sqps := make([]*verbs.QP, nQP)
	scqs := make([]*verbs.CQ, nQP)
	byNum := map[uint32]int{}
	for i := range nQP {
		if rqps[i], err = rpd.CreateQP(verbs.QPInitAttr{SendCQ: rcq, RecvCQ: rcq, MaxSendWR: 1, SRQ: srq}); err != nil {
			t.Fatalf("receiver QP %d: %v", i, err)
		}
		byNum[rqps[i].Num()] = i
		if scqs[i], err = r.dev0.CreateCQ(8); err != nil {
			t.Fatal(err)
		}
		if sqps[i], err = spd.CreateQP(verbs.QPInitAttr{SendCQ: scqs[i], RecvCQ: scqs[i], MaxSendWR: 4, MaxRecvWR: 1}); err != nil {
			t.Fatalf("sender QP %d: %v", i, err)
		}
		acc := make(chan error, 1)
		go func() {
			req, err := l.Accept(ctx(t))
			if err == nil {
				err = req.Accept(rqps[i], verbs.ConnParam{})
			}
			acc <- err
		}()
		if err := sqps[i].Connect(ctx(t), netip.AddrPortFrom(r.a1, port), verbs.ConnParam{}); err != nil {
			t.Fatalf("connect %d: %v", i, err)
		}
		if err := <-acc; err != nil {
			t.Fatalf("accept %d: %v", i, err)
		}
	}
	for _, q := range rqps {
		waitState(t, q, verbs.QPRTS)
	}

	// The load: a goroutine per sender QP, a credit per receive.
	credits := make(chan struct{}, depth)
	for range depth {
		credits <- struct{}{}
	}
	c := ctx(t)
	var wg sync.WaitGroup
	sendErr := make(chan error, nQP)
	for q := range nQP {
		wg.Go(func() {
			wc := make([]verbs.WorkCompletion, 4)
			outstanding := 0
			for seq := range per {
				if outstanding == 4 { // the send queue and the 4 slots are full
					n, err := scqs[q].Wait(c, wc[:1])
					if err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
						sendErr <- fmt.Errorf("QP %d send: %v %+v", q, err, wc[0])
						return
					}
					outstanding--
				}
				select {
				case <-credits:
				case <-c.Done():
					sendErr <- fmt.Errorf("QP %d: no credit for message %d: %w", q, seq, c.Err())
					return
				}
				m := srqMessage(q, seq)
				off := (q*4 + seq%4) * slot
				copy(sbuf[off:], m)
				if _, err := sqps[q].PostSend([]verbs.SendWR{{ID: uint64(seq), Opcode: verbs.WRSend, Flags: verbs.FlagSignaled,
					SGL: []verbs.SGE{smr.SGE(off, len(m))}}}); err != nil {
					sendErr <- fmt.Errorf("QP %d post %d: %w", q, seq, err)
					return
				}
				outstanding++
			}
			for ; outstanding > 0; outstanding-- {
				n, err := scqs[q].Wait(c, wc[:1])
				if err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
					sendErr <- fmt.Errorf("QP %d send: %v %+v", q, err, wc[0])
					return
				}
			}
		})
	}

	next := make([]int, nQP)
	wcs := make([]verbs.WorkCompletion, 64)
	for got := 0; got < nQP*per; {
		n, err := rcq.Wait(c, wcs)
		if err != nil {
			t.Fatalf("after %d messages: %v", got, err)
		}
		for _, wc := range wcs[:n] {
			q, ok := byNum[wc.QPNum]
			if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || !ok {
				t.Fatalf("after %d messages: %+v (QP known: %v)", got, wc, ok)
			}
			want := srqMessage(q, next[q])
			b := rbuf[int(wc.ID)*slot:][:wc.ByteLen]
			if !bytes.Equal(b, want) {
				t.Fatalf("QP %d (index %d) message %d in receive %d: %d bytes, header %x; want %d bytes, header %x",
					wc.QPNum, q, next[q], wc.ID, len(b), b[:min(8, len(b))], len(want), want[:8])
			}
			next[q]++
			got++
			post(int(wc.ID))
			credits <- struct{}{}
		}
	}
	wg.Wait()
	close(sendErr)
	for err := range sendErr {
		t.Fatal(err)
	}
	for q, n := range next {
		if n != per {
			t.Fatalf("QP index %d: %d messages, want %d", q, n, per)
		}
	}

	// The limit event: armed at 64 with 256 posted; 200 messages, their
	// receives not posted back, leave 56.
	if err := srq.Modify(verbs.SRQAttr{Limit: 64}, verbs.SRQLimit); err != nil {
		t.Fatal(err)
	}
	for q := range 200 {
		m := srqMessage(q%nQP, per+q/nQP)
		copy(sbuf[(q%nQP)*4*slot:], m)
		if _, err := sqps[q%nQP].PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{smr.SGE((q%nQP)*4*slot, len(m))}}}); err != nil {
			t.Fatal(err)
		}
		if n, err := scqs[q%nQP].Wait(c, wcs[:1]); err != nil || n != 1 || wcs[0].Status != verbs.WCSuccess {
			t.Fatalf("send %d: %v %+v", q, err, wcs[0])
		}
	}
	for got := 0; got < 200; {
		n, err := rcq.Wait(c, wcs)
		if err != nil {
			t.Fatal(err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.WCSuccess {
				t.Fatalf("receive %+v", wc)
			}
		}
		got += n
	}
	select {
	case e := <-srq.Events():
		if e.Type != verbs.EventSRQLimitReached {
			t.Fatalf("SRQ event %v", e)
		}
	case <-c.Done():
		t.Fatal("no SRQ limit event")
	}
	if a, err := srq.Query(); err != nil || a.Limit != 0 || a.MaxWR != depth {
		t.Fatalf("SRQ after the event: %+v, %v", a, err)
	}
	select {
	case e := <-srq.Events():
		t.Fatalf("a second event: %v", e)
	default:
	}
	for _, q := range rqps {
		if err := q.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	if err := srq.Destroy(); err != nil {
		t.Fatal(err)
	}
}
