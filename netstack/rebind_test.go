package netstack

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestListenRebindWhileDraining: a server's port can be listened on again
// right after a run, while the connections it accepted still drain — one
// in TIME_WAIT after the server closed first, one still open — as
// SO_REUSEADDR allows on Linux, so that perf write then perf read on port
// 18515 do not fail for a minute with "address already in use". A second
// listener next to a live one is still refused, and the error names the
// port instead of "invalid AddrPort".
func TestListenRebindWhileDraining(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const port = 18515
	addr := netip.AddrPortFrom(netip.Addr{}, port)
	dial := func(l *Listener) (ca, cb *Conn) {
		t.Helper()
		return dialAccept(ctx, t, a, l, addrB4.Addr())
	}

	l, err := b.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	// The first connection: the server closes first and ends in
	// TIME_WAIT once the client has closed too.
	ca1, cb1 := dial(l)
	cb1.Close()
	if _, err := io.ReadAll(ca1); err != nil {
		t.Fatalf("client read to EOF: %v", err)
	}
	ca1.Close()
	// The second stays open: still established when the port is reused.
	ca2, cb2 := dial(l)
	defer ca2.Close()
	defer cb2.Close()

	_, err = b.Listen(addr)
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("second listener next to a live one: %v, want EADDRINUSE", err)
	}
	if msg := err.Error(); strings.Contains(msg, "invalid") || !strings.Contains(msg, ":18515") {
		t.Errorf("error %q should name :18515", msg)
	}
	l.Close()

	l2, err := b.Listen(addr)
	if err != nil {
		t.Fatalf("listen again while the earlier connections drain: %v", err)
	}
	defer l2.Close()
	ca3, cb3 := dial(l2)
	defer ca3.Close()
	defer cb3.Close()
	if _, err := ca3.Write([]byte("again")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(cb3, buf); err != nil || string(buf) != "again" {
		t.Fatalf("read on the new listener's connection: %q, %v", buf, err)
	}
	// The still-open connection is unharmed.
	if _, err := cb2.Write([]byte("old")); err != nil {
		t.Fatal(err)
	}
	buf = buf[:3]
	if _, err := io.ReadFull(ca2, buf); err != nil || string(buf) != "old" {
		t.Fatalf("read on the old connection: %q, %v", buf, err)
	}
}
