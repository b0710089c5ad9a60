package netstack

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeMapper is a host port space: ports the host holds, ports reserved
// for the stack (counted) and ports published to it.
type fakeMapper struct {
	mu        sync.Mutex
	host      map[uint16]bool
	held      map[uint16]int
	published map[uint16]bool
	next      uint16
}

func newFakeMapper(hostPorts ...uint16) *fakeMapper {
	m := &fakeMapper{host: map[uint16]bool{}, held: map[uint16]int{}, published: map[uint16]bool{}, next: 40000}
	for _, p := range hostPorts {
		m.host[p] = true
	}
	return m
}

func (m *fakeMapper) Reserve(port uint16) (uint16, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if port == 0 {
		for m.host[m.next] || m.held[m.next] > 0 {
			m.next++
		}
		port = m.next
	}
	if m.host[port] {
		return 0, syscall.EADDRINUSE
	}
	m.held[port]++
	return port, nil
}

func (m *fakeMapper) Release(port uint16) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held[port] == 0 {
		panic("release of a port not reserved")
	}
	m.held[port]--
}

func (m *fakeMapper) Publish(port uint16) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.published[port] = true
	return nil
}

func (m *fakeMapper) Unpublish(port uint16) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.published, port)
}

func (m *fakeMapper) state(port uint16) (held int, published bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held[port], m.published[port]
}

// TestSharedAddress runs a stack that shares the address 10.9.9.1 with its
// host (private 10.9.0.1) against a plain one: it reports the shared
// address, reserves and publishes its listener's port, reserves its
// connections' ports, refuses a port the host holds, and gives every port
// back.
func TestSharedAddress(t *testing.T) {
	public := netip.MustParsePrefix("10.9.9.1/24")
	m := newFakeMapper(7000)
	la, lb := Pipe(1500, Impairments{})
	a, err := New(la, Options{Addrs: []netip.Prefix{addrA4}, Shared: &Shared{Public: public, Private: addrA4.Addr(), Ports: m}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(lb, Options{Addrs: []netip.Prefix{addrB4}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	if got := a.Addrs(); len(got) != 1 || got[0] != public {
		t.Errorf("Addrs = %v, want [%v]", got, public)
	}
	_, err = a.Listen(netip.AddrPortFrom(public.Addr(), 7000))
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("Listen on a port the host holds: %v, want EADDRINUSE", err)
	}
	if held, _ := m.state(7000); held != 0 {
		t.Errorf("port 7000 reserved %d times after the failed listen", held)
	}

	l, err := a.Listen(netip.AddrPortFrom(public.Addr(), 7001))
	if err != nil {
		t.Fatal(err)
	}
	if l.Addr() != netip.MustParseAddrPort("10.9.9.1:7001") {
		t.Errorf("listener Addr = %v, want 10.9.9.1:7001", l.Addr())
	}
	if held, pub := m.state(7001); held != 1 || !pub {
		t.Errorf("listener's port: reserved %d, published %v; want 1, true", held, pub)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// b connects to a's private address: the pipe has no NAT.
	cb, ca := dialAccept(ctx, t, b, l, addrA4.Addr())
	if ca.LocalAddr() != netip.MustParseAddrPort("10.9.9.1:7001") {
		t.Errorf("accepted LocalAddr = %v, want 10.9.9.1:7001", ca.LocalAddr())
	}
	if held, _ := m.state(7001); held != 2 {
		t.Errorf("listener's port reserved %d times with one accepted connection, want 2", held)
	}
	l.Close()
	if held, pub := m.state(7001); held != 1 || pub {
		t.Errorf("after the listener closed: reserved %d, published %v; want 1 (the connection's), false", held, pub)
	}
	ca.Abort()
	cb.Close()
	if held, _ := m.state(7001); held != 0 {
		t.Errorf("after the reset: port 7001 reserved %d times, want 0", held)
	}

	lb2, err := b.Listen(netip.AddrPortFrom(netip.Addr{}, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer lb2.Close()
	for _, local := range []netip.Addr{{}, public.Addr()} {
		c, err := a.Dial(ctx, local, netip.AddrPortFrom(addrB4.Addr(), lb2.Addr().Port()))
		if err != nil {
			t.Fatalf("Dial from %v: %v", local, err)
		}
		peer, err := lb2.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lp := c.LocalAddr()
		if lp.Addr() != public.Addr() {
			t.Errorf("Dial from %v: LocalAddr = %v, want the shared address", local, lp)
		}
		if peer.RemoteAddr().Port() != lp.Port() {
			t.Errorf("peer sees port %d, LocalAddr says %d", peer.RemoteAddr().Port(), lp.Port())
		}
		if held, _ := m.state(lp.Port()); held != 1 {
			t.Errorf("connection's port %d reserved %d times, want 1", lp.Port(), held)
		}
		c.Abort()
		peer.Close()
		if held, _ := m.state(lp.Port()); held != 0 {
			t.Errorf("after the reset: port %d reserved %d times, want 0", lp.Port(), held)
		}
	}
}

// TestSharedChecks refuses a shared address without a mapper or whose
// private address is not the stack's.
func TestSharedChecks(t *testing.T) {
	public := netip.MustParsePrefix("10.9.9.1/24")
	for _, sh := range []*Shared{
		{Public: public, Private: addrA4.Addr()},
		{Public: public, Private: addrB4.Addr(), Ports: newFakeMapper()},
		{Public: netip.MustParsePrefix("fd00::1/64"), Private: addrA4.Addr(), Ports: newFakeMapper()},
	} {
		la, _ := Pipe(1500, Impairments{})
		if s, err := New(la, Options{Addrs: []netip.Prefix{addrA4}, Shared: sh}); err == nil {
			s.Close()
			t.Errorf("New with %+v: no error", sh)
		}
	}
}

// TestReserveShared: rdma_bind_addr's reservation on a stack with a
// shared address holds the port in the host's port space too and reports
// the shared address; the listener that follows takes the port, and the
// port goes back when both are closed. A port a host socket holds cannot
// be reserved.
func TestReserveShared(t *testing.T) {
	public := netip.MustParsePrefix("10.9.9.1/24")
	m := newFakeMapper(7000)
	la, _ := Pipe(1500, Impairments{})
	a, err := New(la, Options{Addrs: []netip.Prefix{addrA4}, Shared: &Shared{Public: public, Private: addrA4.Addr(), Ports: m}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	if _, err := a.Reserve(netip.AddrPortFrom(public.Addr(), 7000)); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("Reserve of a port a host socket holds: %v, want EADDRINUSE", err)
	}
	r, err := a.Reserve(netip.AddrPortFrom(public.Addr(), 0))
	if err != nil {
		t.Fatal(err)
	}
	p := r.Addr().Port()
	if r.Addr().Addr() != public.Addr() || p == 0 {
		t.Errorf("Reserve(shared:0).Addr() = %v, want the shared address and a port", r.Addr())
	}
	if held, pub := m.state(p); held != 1 || pub {
		t.Errorf("reserved port %d: held %d, published %v; want 1, false", p, held, pub)
	}
	l, err := a.Listen(r.Addr())
	if err != nil {
		t.Fatalf("Listen on the reserved port: %v", err)
	}
	if held, pub := m.state(p); held != 2 || !pub {
		t.Errorf("reserved port %d with its listener: held %d, published %v; want 2, true", p, held, pub)
	}
	r.Close()
	r.Close()
	l.Close()
	if held, pub := m.state(p); held != 0 || pub {
		t.Errorf("port %d after both closed: held %d, published %v; want 0, false", p, held, pub)
	}
}
