package uverbs

import (
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/internal/uabi"
)

// TestWaitingRequestsThenGone: a client fills its session with requests
// that wait (GetRequest on a listener nobody connects to), more than the
// session handles at once, and closes its socket. The session's reader
// waited for a free slot instead of reading, so it never saw the close:
// the session and its objects stayed until the daemon exited. Now it
// reads on, cancels the waiting requests when the client goes and frees
// everything; before that, a Cancel still reaches a request that waits,
// and requests past a bound are refused.
func TestWaitingRequestsThenGone(t *testing.T) {
	r := newRig(t)
	rc := r.raw(t)
	var l uabi.ListenReply
	rc.must(uabi.OpListen, &uabi.Listen{Addr: netip.AddrPortFrom(daemonAddr.Addr(), 7900), Backlog: 4}, &l)
	var seqs []uint32
	for range maxQueued {
		seqs = append(seqs, rc.post(uabi.OpGetRequest, &uabi.Ref{Handle: l.Handle}))
	}
	// Past maxQueued a request is refused at once.
	over := rc.post(uabi.OpGetRequest, &uabi.Ref{Handle: l.Handle})
	if rep := rc.collect(1)[over]; rep.st != uabi.StBusy {
		t.Fatalf("request %d past the queue: status %d (%s), want StBusy", maxQueued+1, rep.st, rep.msg)
	}
	// The reader reads on: a Cancel reaches a request in a slot and one
	// waiting for a slot.
	for _, seq := range []uint32{seqs[0], seqs[len(seqs)-1]} {
		rc.post(uabi.OpCancel, &uabi.Cancel{Seq: seq})
		if rep, ok := rc.collect(1)[seq]; !ok || rep.st != uabi.StCanceled {
			t.Fatalf("the canceled GetRequest %d: %+v", seq, rep)
		}
	}
	rc.c.C.Close()
	testkit.Eventually(t, 10*time.Second, "the session gone", func() bool { return r.srv.Sessions() == 0 })
	// Its listener went with it: another client gets the port.
	rc2 := r.raw(t)
	rc2.must(uabi.OpListen, &uabi.Listen{Addr: netip.AddrPortFrom(daemonAddr.Addr(), 7900), Backlog: 4}, &l)
}
