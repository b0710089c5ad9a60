package uverbs

import (
	"context"
	"net/netip"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// TestSocketAcceptPrivateData: over the verbs socket too, the connecting
// side's EventEstablished carries the listener's accept private data (the
// event now carries it to the client), and a listener reached over the
// socket sends it.
func TestSocketAcceptPrivateData(t *testing.T) {
	r := newRig(t)
	dev := r.dial()
	for _, tc := range []struct {
		name     string
		cli, srv *side
	}{
		{"connect-over-socket", newEnd(t, dev, 8), newEnd(t, r.peer, 8)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			pd := []byte{0, 0, 0x7f, 1, 2, 3, 4, 5, 0x11, 0x22, 0x33, 0x44}
			l, err := tc.srv.dev.Listen(netip.AddrPortFrom(peerAddr.Addr(), peerPort), 4)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			acc := make(chan error, 1)
			go func() {
				req, err := l.Accept(ctx)
				if err != nil {
					acc <- err
					return
				}
				acc <- req.Accept(tc.srv.qp, verbs.ConnParam{PrivateData: pd})
			}()
			if err := tc.cli.qp.Connect(ctx, netip.AddrPortFrom(peerAddr.Addr(), peerPort), verbs.ConnParam{}); err != nil {
				t.Fatal(err)
			}
			if err := <-acc; err != nil {
				t.Fatal(err)
			}
			if got := waitEvent(t, tc.cli.qp, verbs.EventEstablished).PrivateData; string(got) != string(pd) {
				t.Errorf("EventEstablished private data %x, want %x", got, pd)
			}
		})
	}
	// And the other way: the listener on the socket, the initiator in-process.
	cli, srv := newEnd(t, r.peer, 8), newEnd(t, dev, 8)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	l, err := srv.dev.Listen(netip.AddrPortFrom(daemonAddr.Addr(), 7300), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			acc <- err
			return
		}
		acc <- req.Accept(srv.qp, verbs.ConnParam{PrivateData: []byte("from the socket")})
	}()
	if err := cli.qp.Connect(ctx, netip.AddrPortFrom(daemonAddr.Addr(), 7300), verbs.ConnParam{}); err != nil {
		t.Fatal(err)
	}
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
	if got := waitEvent(t, cli.qp, verbs.EventEstablished).PrivateData; string(got) != "from the socket" {
		t.Errorf("EventEstablished private data %q", got)
	}
}
