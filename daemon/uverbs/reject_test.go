package uverbs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// TestSocketConnectRejected: a Connect the peer rejects fails over the
// verbs socket with an *ibv.RejectedError carrying the peer's private
// data, and its message says so once ("connect to A: connection rejected
// by the peer"), as in-process.
func TestSocketConnectRejected(t *testing.T) {
	r := newRig(t)
	e := newEnd(t, r.dial(), 4)
	if err := e.qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	addr := netip.AddrPortFrom(peerAddr.Addr(), peerPort)
	l, err := r.peer.Listen(addr, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if req, err := l.Accept(ctx); err == nil {
			req.Reject([]byte("not now"))
		}
	}()
	err = e.qp.Connect(ctx, addr, verbs.ConnParam{})
	var rej *ibv.RejectedError
	if !errors.As(err, &rej) || string(rej.PrivateData) != "not now" {
		t.Fatalf("Connect = %#v, want a RejectedError with the peer's private data", err)
	}
	if got, want := err.Error(), fmt.Sprintf("connect to %v: connection rejected by the peer", addr); got != want {
		t.Fatalf("error %q, want %q", got, want)
	}
}
