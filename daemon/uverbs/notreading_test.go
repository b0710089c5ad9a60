package uverbs

import (
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/internal/uabi"
)

// TestClientNotReading: a client floods requests and never reads the
// replies. Its socket fills; the session's handlers then waited for ever
// in their replies, holding the session's writer, and Server.Close (the
// daemon's shutdown) waited with them. Now the session is cut off after
// the send timeout, its objects freed, and other clients are served
// throughout.
func TestClientNotReading(t *testing.T) {
	r := newRig(t)
	r.srv.sendTimeout.Store(int64(300 * time.Millisecond))
	rc := r.raw(t)
	if st, msg, _ := rc.req(uabi.OpAllocPD, nil); st != uabi.StOK {
		t.Fatalf("AllocPD: %d %s", st, msg)
	}
	flooded := make(chan int, 1)
	go func() {
		var e uabi.Enc
		rc.c.C.SetWriteDeadline(time.Now().Add(testTimeout))
		n := 0
		for ; ; n++ {
			if err := rc.c.Send(e.Message(uabi.OpQueryQP, uint32(n+100), &uabi.Ref{Handle: 1 << 30}, 0)); err != nil {
				break
			}
		}
		flooded <- n
	}()
	good := r.dial()
	testkit.Eventually(t, 10*time.Second, "the client that does not read cut off", func() bool {
		pd, err := good.AllocPD()
		if err != nil {
			t.Fatalf("another client: %v", err)
		}
		pd.Dealloc()
		return r.srv.Sessions() == 1
	})
	t.Logf("requests sent before the daemon closed the session: %d", <-flooded)
	closed := make(chan struct{})
	go func() {
		r.srv.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Server.Close hangs")
	}
}
