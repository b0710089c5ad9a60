package netstack

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// TestReserve: a reserved port is not listening (a dial to it is refused),
// its own Listen binds it while the reservation holds it, and it serves
// once listening; a second reservation of the port is refused.
func TestReserve(t *testing.T) {
	a, b := newPair(t, pairOpts{mtu: 1500})
	for _, at := range []netip.Addr{addrB4.Addr(), {}} {
		r, err := b.Reserve(netip.AddrPortFrom(at, 0))
		if err != nil {
			t.Fatalf("Reserve(%v): %v", at, err)
		}
		port := r.Addr().Port()
		if port == 0 || r.Addr().Addr() != at {
			t.Fatalf("Reserve(%v) = %v, want %v with a port", at, r.Addr(), at)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := a.Dial(ctx, netip.Addr{}, netip.AddrPortFrom(addrB4.Addr(), port)); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial to a reserved port: %v, want ECONNREFUSED", err)
		}
		if _, err := b.Reserve(netip.AddrPortFrom(at, port)); err == nil {
			t.Errorf("a second reservation of %v succeeded", r.Addr())
		}
		l, err := b.Listen(netip.AddrPortFrom(at, port))
		if err != nil {
			t.Fatalf("Listen on the reserved %v: %v", r.Addr(), err)
		}
		r.Close()
		r.Close()
		ca, cb := dialAccept(ctx, t, a, l, addrB4.Addr())
		ca.Close()
		cb.Close()
		l.Close()
		cancel()
	}
}

// TestReservedPortNotEphemeral: no dial takes a reserved port as its own.
func TestReservedPortNotEphemeral(t *testing.T) {
	a, b := newPair(t, pairOpts{mtu: 1500})
	l, err := b.Listen(netip.AddrPortFrom(netip.Addr{}, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reserved := map[uint16]bool{}
	for i := 0; i < 200; i++ {
		r, err := a.Reserve(netip.AddrPortFrom(addrA4.Addr(), 0))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		reserved[r.Addr().Port()] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; i < 50; i++ {
		ca, cb := dialAccept(ctx, t, a, l, addrB4.Addr())
		if p := ca.LocalAddr().Port(); reserved[p] {
			t.Fatalf("dial %d took reserved port %d", i, p)
		}
		ca.Close()
		cb.Close()
	}
}

// TestReserveListening: a port a listener holds cannot be reserved.
func TestReserveListening(t *testing.T) {
	_, b := newPair(t, pairOpts{mtu: 1500})
	l, err := b.Listen(netip.AddrPortFrom(netip.Addr{}, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := b.Reserve(netip.AddrPortFrom(addrB4.Addr(), l.Addr().Port())); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("reserving a listening port: %v, want EADDRINUSE", err)
	}
}
