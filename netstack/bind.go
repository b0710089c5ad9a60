package netstack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Bound is a TCP endpoint bound to a local address and port, neither
// listening nor connected yet: what rdma_bind_addr holds, a port that is
// the caller's from the bind on (in the host's port space too, on a stack
// with a shared address), and that one Listen or Dial then uses. Close
// gives it back unused.
type Bound struct {
	s    *Stack
	ep   tcpip.Endpoint
	wq   *waiter.Queue
	addr netip.AddrPort // as Addr reports it
	v6   bool           // an IPv6 (maybe dual-stack) endpoint
	port uint16         // reserved in the host's port space, 0 if none

	mu   sync.Mutex
	used bool // guarded by mu: listening, connected or closed
}

// Bind binds a TCP endpoint to addr. Port 0 picks a free port (on a stack
// with a shared address, the host picks it from its ephemeral range); an
// unspecified address binds every address of the stack, as Listen's. A
// port that is taken fails with an error wrapping syscall.EADDRINUSE.
// The endpoint has SO_REUSEADDR, as Listen's and Linux siw's sockets
// have it.
func (s *Stack) Bind(addr netip.AddrPort) (*Bound, error) {
	b, err := s.bind(addr)
	if err != nil {
		return nil, fmt.Errorf("netstack: bind %s: %w", AddrPortString(addr), err)
	}
	return b, nil
}

func (s *Stack) bind(addr netip.AddrPort) (*Bound, error) {
	if s.isClosed() {
		return nil, net.ErrClosed
	}
	a := s.toPrivate(addr.Addr().Unmap())
	v6 := a.Is6() || (!a.IsValid() && s.hasFamily(true))
	proto := ipv4.ProtocolNumber
	if v6 {
		proto = ipv6.ProtocolNumber
	}
	wq := &waiter.Queue{}
	ep, terr := s.s.NewEndpoint(tcp.ProtocolNumber, proto, wq)
	if terr != nil {
		return nil, convertError(terr)
	}
	if v6 && (!a.IsValid() || a.IsUnspecified()) {
		ep.SocketOptions().SetV6Only(false)
	}
	ep.SocketOptions().SetDelayOption(false)
	// SO_REUSEADDR, as Linux servers and siw's listening socket (siw_cm.c)
	// set it: the port can be bound again while connections accepted on it
	// earlier still drain (FIN_WAIT, TIME_WAIT for a minute), and perftest
	// -R listens twice on its port, the second time with its control
	// connection up. Two listeners on one port are still refused (the
	// demuxer keeps one listening endpoint per address). Accepted
	// connections inherit the flag, which is what lets a later listener
	// share the port with them.
	ep.SocketOptions().SetReuseAddress(true)
	full := tcpip.FullAddress{}
	if a.IsValid() && !a.IsUnspecified() {
		full.Addr = tcpip.AddrFromSlice(a.AsSlice())
	}
	port, err := s.bindPort(ep, full, addr.Port())
	if err != nil {
		ep.Close()
		return nil, err
	}
	local, terr := ep.GetLocalAddress()
	if terr != nil {
		ep.Close()
		s.release(port, 0)
		return nil, fmt.Errorf("local address: %w", convertError(terr))
	}
	b := &Bound{s: s, ep: ep, wq: wq, v6: v6, port: port, addr: s.toPublic(fullToAddrPort(local))}
	if !a.IsValid() || a.IsUnspecified() {
		b.addr = netip.AddrPortFrom(addr.Addr().Unmap(), b.addr.Port())
	}
	return b, nil
}

// Addr returns the bound address: the port is the real one when 0 was
// asked for; the address stays unspecified for a wildcard bind.
func (b *Bound) Addr() netip.AddrPort { return b.addr }

// use marks b used; it reports false if it was already.
func (b *Bound) use() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used {
		return false
	}
	b.used = true
	return true
}

// Close gives the port back if b was neither listened on nor connected.
// It is idempotent and returns nil.
func (b *Bound) Close() error {
	if b.use() {
		b.ep.Close()
		b.s.release(b.port, 0)
	}
	return nil
}

// Listen starts listening on the bound port; on a stack with a shared
// address new connections to it then reach the stack. b is used up,
// whether Listen succeeds or not.
func (b *Bound) Listen() (*Listener, error) {
	at := AddrPortString(b.addr)
	if !b.use() {
		return nil, fmt.Errorf("netstack: listen on %s: %w", at, net.ErrClosed)
	}
	s := b.s
	fail := func(err error) (*Listener, error) {
		b.ep.Close()
		s.release(b.port, 0)
		return nil, fmt.Errorf("netstack: listen on %s: %w", at, err)
	}
	if terr := b.ep.Listen(listenBacklog); terr != nil {
		return fail(convertError(terr))
	}
	l := &Listener{s: s, ep: b.ep, wq: b.wq, addr: b.addr, closed: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fail(net.ErrClosed)
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	if err := s.publish(b.port); err != nil {
		s.removeListener(l)
		return fail(err)
	}
	l.port = b.port
	return l, nil
}

// Dial connects from the bound address and port to remote; ctx bounds
// the handshake only. b is used up, whether Dial succeeds or not.
func (b *Bound) Dial(ctx context.Context, remote netip.AddrPort) (*Conn, error) {
	if !b.use() {
		return nil, fmt.Errorf("netstack: dial %v from %s: %w", remote, AddrPortString(b.addr), net.ErrClosed)
	}
	ra := remote.Addr().Unmap()
	bad := !ra.IsValid() || ra.IsUnspecified() || remote.Port() == 0
	if !bad && ra.Is4() && b.v6 {
		if b.addr.Addr().IsValid() && !b.addr.Addr().IsUnspecified() {
			bad = true // an IPv6 address cannot reach an IPv4 one
		} else {
			ra = netip.AddrFrom16(ra.As16()) // a dual-stack endpoint: v4-mapped
		}
	}
	if bad || (ra.Is6() && !b.v6) {
		b.ep.Close()
		b.s.release(b.port, 0)
		return nil, fmt.Errorf("netstack: dial %v from %s: invalid remote address", remote, AddrPortString(b.addr))
	}
	return b.s.connect(ctx, b.ep, b.wq, ra, remote.Port(), b.port)
}
