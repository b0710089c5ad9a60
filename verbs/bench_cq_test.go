package verbs_test

import (
	"context"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// BenchmarkCQPushPoll is the CQ alone: the engine's Push of one completion
// and the application's Poll of it.
func BenchmarkCQPushPoll(b *testing.B) {
	cq := newCQ(b, 256)
	wc := verbs.WorkCompletion{ID: 1, Opcode: verbs.WCRecv, ByteLen: 64, QPNum: 1}
	var out [1]verbs.WorkCompletion
	b.ReportAllocs()
	for b.Loop() {
		cq.Push(&wc, false)
		if n, err := cq.Poll(out[:]); n != 1 || err != nil {
			b.Fatalf("Poll = %d, %v", n, err)
		}
	}
}

// BenchmarkPostRecv is the cost of ibv_post_recv alone: one receive with
// one SGE into a QP in INIT (no network); every depth posts the queue is
// emptied with INIT→RESET→INIT, which completes nothing.
func BenchmarkPostRecv(b *testing.B) {
	const depth = 1024
	s := loneSide(b, depth)
	buf := s.region(4096, verbs.AccessLocalWrite)
	if err := s.qp.Modify(verbs.QPInit); err != nil {
		b.Fatal(err)
	}
	wr := [1]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{buf.mr.SGE(0, 4096)}}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == depth {
			if err := s.qp.Modify(verbs.QPReset); err != nil {
				b.Fatal(err)
			}
			if err := s.qp.Modify(verbs.QPInit); err != nil {
				b.Fatal(err)
			}
			i = 0
		}
		if n, err := s.qp.PostRecv(wr[:]); n != 1 || err != nil {
			b.Fatalf("PostRecv = %d, %v", n, err)
		}
		i++
	}
}

// BenchmarkPostRecvFlushPoll is a whole receive cycle without a network:
// post a receive on a QP in ERR, where it is flushed at once, and poll its
// completion. It measures the engine's completion path (receive queue →
// CQ); see the report for its allocation.
func BenchmarkPostRecvFlushPoll(b *testing.B) {
	s := loneSide(b, 16)
	buf := s.region(4096, verbs.AccessLocalWrite)
	if err := s.qp.Modify(verbs.QPErr); err != nil {
		b.Fatal(err)
	}
	wr := [1]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{buf.mr.SGE(0, 4096)}}}
	var out [1]verbs.WorkCompletion
	b.ReportAllocs()
	for b.Loop() {
		if n, err := s.qp.PostRecv(wr[:]); n != 1 || err != nil {
			b.Fatalf("PostRecv = %d, %v", n, err)
		}
		if n, err := s.rcq.Poll(out[:]); n != 1 || err != nil || out[0].Status != verbs.WCFlushErr {
			b.Fatalf("Poll = %d, %v, %+v", n, err, out[0])
		}
	}
}

// BenchmarkPostSendFlushPoll is a whole send cycle without a network: an
// unsignaled inline Send posted on a QP in ERR is flushed at once (errors
// always complete) and polled. It measures PostSend's validation and copy
// and the engine's send completion path; see the report for its allocation.
func BenchmarkPostSendFlushPoll(b *testing.B) {
	s := loneSide(b, 16)
	if err := s.qp.Modify(verbs.QPErr); err != nil {
		b.Fatal(err)
	}
	wr := [1]verbs.SendWR{{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: make([]byte, 64)}}
	var out [1]verbs.WorkCompletion
	b.ReportAllocs()
	for b.Loop() {
		if n, err := s.qp.PostSend(wr[:]); n != 1 || err != nil {
			b.Fatalf("PostSend = %d, %v", n, err)
		}
		if n, err := s.scq.Poll(out[:]); n != 1 || err != nil || out[0].Status != verbs.WCFlushErr {
			b.Fatalf("Poll = %d, %v, %+v", n, err, out[0])
		}
	}
}

// BenchmarkPostSendInlineWritePoll posts 64-byte inline RDMA Writes over a
// connected in-process pair, every 16th signaled, and waits for that
// completion: post + transmit + completion per WR.
func BenchmarkPostSendInlineWritePoll(b *testing.B) {
	const every = 16
	cli, srv := newPair(b, pairOpts{depth: 64})
	dst := srv.region(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	payload := make([]byte, 64)
	fill(payload, 1)
	wr := [1]verbs.SendWR{{Opcode: verbs.WRWrite, Flags: verbs.FlagInline, Inline: payload, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}}
	var out [4]verbs.WorkCompletion
	ctx := context.Background()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	i := uint64(0)
	for b.Loop() {
		i++
		wr[0].ID = i
		wr[0].Flags = verbs.FlagInline
		if i%every == 0 {
			wr[0].Flags |= verbs.FlagSignaled
		}
		if n, err := cli.qp.PostSend(wr[:]); n != 1 || err != nil {
			b.Fatalf("PostSend = %d, %v", n, err)
		}
		if i%every == 0 {
			n, err := cli.scq.Wait(ctx, out[:])
			if n != 1 || err != nil || out[0].ID != i || out[0].Status != verbs.WCSuccess {
				b.Fatalf("Wait = %d, %v, %+v", n, err, out[0])
			}
		}
	}
	// Drain: the last signaled request retires every earlier one.
	wr[0].ID, wr[0].Flags = 0, verbs.FlagInline|verbs.FlagSignaled
	if n, err := cli.qp.PostSend(wr[:]); n != 1 || err != nil {
		b.Fatalf("PostSend = %d, %v", n, err)
	}
	if n, err := cli.scq.Wait(ctx, out[:]); n != 1 || err != nil {
		b.Fatalf("Wait = %d, %v", n, err)
	}
}
