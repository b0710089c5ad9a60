package uverbs

import (
	"fmt"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"

	"github.com/siwtun/siwtun/verbs"
)

// pingPong has the in-process peer (srv) send rounds pings to the client
// on the verbs socket (cli), each answered at once, and checks every
// message. pause before each ping lets the client's ring goroutine go to
// sleep. Each end has rounds receives posted into bufs of 16*rounds bytes.
func pingPong(t *testing.T, cli, srv *side, cbuf, sbuf *verbs.MR, rounds int, pause time.Duration) {
	t.Helper()
	for i := range rounds {
		if _, err := cli.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{cbuf.SGE(16*i, 16)}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{sbuf.SGE(16*i, 16)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range rounds {
		time.Sleep(pause)
		ping := fmt.Sprintf("ping %d", i)
		post(t, srv.qp, verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte(ping)})
		wc := poll(t, cli.rcq, 1)[0]
		if got := string(cbuf.Bytes()[16*i : 16*i+int(wc.ByteLen)]); wc.ID != uint64(i) || got != ping {
			t.Fatalf("round %d: client received %q (%+v)", i, got, wc)
		}
		pong := fmt.Sprintf("pong %d", i)
		post(t, cli.qp, verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte(pong)})
		wc = poll(t, srv.rcq, 1)[0]
		if got := string(sbuf.Bytes()[16*i : 16*i+int(wc.ByteLen)]); wc.ID != uint64(i) || got != pong {
			t.Fatalf("round %d: peer received %q (%+v)", i, got, wc)
		}
	}
}

// TestRxIdleTakesAnswers: each ping reaches the client's QP while its
// ring goroutine sleeps, so the engine's receive goroutine watches the
// rings (lengthened here, so the client is never too slow). The answers
// must all arrive, in order, and the watches must have taken them without
// the doorbell.
func TestRxIdleTakesAnswers(t *testing.T) {
	r := newRig(t)
	r.srv.rxSpin.Store(int64(2 * time.Second))
	const rounds = 20
	cli := newEnd(t, r.dial(), rounds)
	srv := newEnd(t, r.peer, rounds)
	connect(t, cli, srv)
	cbuf := cli.region(t, 16*rounds, verbs.AccessLocalWrite)
	sbuf := srv.region(t, 16*rounds, verbs.AccessLocalWrite)
	before := r.srv.Stats()
	pingPong(t, cli, srv, cbuf, sbuf, rounds, 5*time.Millisecond)
	st := r.srv.Stats()
	watches, taken := st.RxWatches-before.RxWatches, st.RxTaken-before.RxTaken
	t.Logf("%d rounds: %d watches, %d answers taken by them", rounds, watches, taken)
	// The client may post before the watch begins (then its doorbell
	// wakes the ring goroutine), but not every time.
	if taken == 0 || taken > watches || watches > rounds {
		t.Fatalf("%d watches took %d answers in %d rounds", watches, taken, rounds)
	}
}

// TestRxIdleBacksOffAndRearms: a QP that only receives (an RDMA WRITE
// sink) is watched a few times and then almost never; once its client
// answers what arrives, the watches resume.
func TestRxIdleBacksOffAndRearms(t *testing.T) {
	r := newRig(t)
	r.srv.rxSpin.Store(int64(time.Millisecond))
	const rounds = 20
	cli := newEnd(t, r.dial(), rounds)
	srv := newEnd(t, r.peer, rounds)
	connect(t, cli, srv)
	dst := cli.region(t, 64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	src := srv.region(t, 64, verbs.AccessLocalWrite)
	before := r.srv.Stats()
	const writes = 300
	for i := range writes {
		src.Bytes()[0] = byte(i)
		post(t, srv.qp, verbs.SendWR{ID: uint64(i), Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{src.SGE(0, 64)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
		poll(t, srv.scq, 1)
		// One Write per arrival: wait until it is placed.
		testkit.Eventually(t, testTimeout, "the write placed", func() bool { return dst.Bytes()[0] == byte(i) })
	}
	st := r.srv.Stats()
	watches, taken := st.RxWatches-before.RxWatches, st.RxTaken-before.RxTaken
	t.Logf("%d Writes received: %d watches", writes, watches)
	// Misses 1..k skip 2^n-1 arrivals each: 8 watches cover 510.
	if taken != 0 || watches == 0 || watches > 8 {
		t.Fatalf("%d Writes received: %d watches, %d taken", writes, watches, taken)
	}

	// Now the client answers; the first answers ring the doorbell soon
	// after their ping (well within twice the watch), which rearms.
	r.srv.rxSpin.Store(int64(2 * time.Second))
	before = r.srv.Stats()
	cbuf := cli.region(t, 16*rounds, verbs.AccessLocalWrite)
	sbuf := srv.region(t, 16*rounds, verbs.AccessLocalWrite)
	pingPong(t, cli, srv, cbuf, sbuf, rounds, 5*time.Millisecond)
	st = r.srv.Stats()
	watches, taken = st.RxWatches-before.RxWatches, st.RxTaken-before.RxTaken
	t.Logf("then %d rounds: %d watches, %d answers taken by them", rounds, watches, taken)
	if taken < rounds/2 {
		t.Fatalf("after the client began answering: %d watches took %d answers in %d rounds", watches, taken, rounds)
	}
}

// TestRingDepthOne: with queues one request deep (perftest's latency
// tests ask for that), each request is a lap of the ring. The drain must
// take it alone: reading on past it would find it again, and the engine,
// already holding it, would refuse the copy as a full queue, sending the
// ring goroutine into its pause with the doorbell off.
func TestRingDepthOne(t *testing.T) {
	r := newRig(t)
	cli := newEnd(t, r.dial(), 1)
	srv := newEnd(t, r.peer, 1)
	connect(t, cli, srv)
	src := cli.region(t, 64, verbs.AccessLocalWrite)
	dst := srv.region(t, 64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	rbuf := cli.region(t, 64, verbs.AccessLocalWrite)
	before := r.srv.Stats()
	const n = 200
	for i := range n {
		src.Bytes()[0] = byte(i)
		post(t, cli.qp, verbs.SendWR{ID: uint64(i), Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{src.SGE(0, 8)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
		if wc := poll(t, cli.scq, 1)[0]; wc.ID != uint64(i) || wc.Status != verbs.WCSuccess {
			t.Fatalf("Write %d: %+v", i, wc)
		}
		if i%10 == 0 { // the receive ring, one deep too
			if _, err := cli.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{rbuf.SGE(0, 64)}}}); err != nil {
				t.Fatal(err)
			}
			post(t, srv.qp, verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSignaled, Inline: []byte{byte(i)}})
			if wc := poll(t, cli.rcq, 1)[0]; wc.ID != uint64(i) || rbuf.Bytes()[0] != byte(i) {
				t.Fatalf("receive %d: %+v", i, wc)
			}
			poll(t, srv.scq, 1)
		}
	}
	// The last Write landed: read it back (the peer's memory is this
	// process's, written by its engine; reading it here would race).
	post(t, cli.qp, verbs.SendWR{ID: n, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{rbuf.SGE(8, 8)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	if wc := poll(t, cli.scq, 1)[0]; wc.Status != verbs.WCSuccess || rbuf.Bytes()[8] != byte(n-1) {
		t.Fatalf("read back %d, want %d (%+v)", rbuf.Bytes()[8], byte(n-1), wc)
	}
	if full := r.srv.Stats().RingFull - before.RingFull; full != 0 {
		t.Fatalf("%d requests one at a time: the ring goroutine found the engine full %d times", n, full)
	}
}
