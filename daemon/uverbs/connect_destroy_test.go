package uverbs

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/verbs"
)

// TestDestroyQPWhileConnecting: a client destroys its QP while the QP's
// Connect waits for the peer's MPA Reply; the peer then accepts and sends.
// The daemon had freed the QP's rings, and the engine started the
// connection anyway: its receive path read the unmapped rings (the daemon
// died of SIGSEGV). Now the Connect fails, the peer sees the connection
// close, and the daemon serves on.
func TestDestroyQPWhileConnecting(t *testing.T) {
	r := newRig(t)
	dev := r.dial()
	cli := newEnd(t, dev, 8)
	srv := newEnd(t, r.peer, 8)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	addr := netip.AddrPortFrom(peerAddr.Addr(), peerPort)
	l, err := r.peer.Listen(addr, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	connErr := make(chan error, 1)
	go func() { connErr <- cli.qp.Connect(ctx, addr, verbs.ConnParam{}) }()
	req, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The daemon's QP waits for the MPA Reply now.
	if err := cli.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, testTimeout, "the daemon's QP gone", func() bool { return len(r.daemon.QPs()) == 0 })
	if err := req.Accept(srv.qp, verbs.ConnParam{}); err != nil {
		t.Logf("accept: %v", err)
	}
	// Data towards the destroyed QP: a Send (the daemon would look for a
	// receive in the client's ring) and a Write.
	src := srv.region(t, 4096, verbs.AccessLocalWrite)
	srv.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRSend, SGL: []verbs.SGE{src.SGE(0, 64)}, Flags: verbs.FlagSignaled}})
	select {
	case err := <-connErr:
		if err == nil {
			t.Fatal("Connect of a destroyed QP succeeded")
		}
		t.Logf("Connect: %v", err)
	case <-time.After(testTimeout):
		t.Fatal("Connect did not return")
	}
	waitEvent(t, srv.qp, verbs.EventDisconnected)
	l.Close()
	// The daemon serves on.
	again := newEnd(t, r.dial(), 8)
	srv2 := newEnd(t, r.peer, 8)
	connect(t, again, srv2)
}
