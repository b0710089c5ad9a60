package netstack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Reservation holds a TCP port of the stack without listening on it: a
// bound endpoint, as a socket after bind(2) and before listen(2). rdma_cm
// assigns a port at rdma_bind_addr, and programs read it then (to tell a
// peer where to connect) before they listen. Dial never picks a reserved
// port as its ephemeral port; a Listen on the same address and port
// succeeds (both endpoints have SO_REUSEADDR, as a socket's bind and then
// its own listen would), after which the reservation may be closed.
type Reservation struct {
	s    *Stack
	ep   tcpip.Endpoint
	addr netip.AddrPort
	// hostPort is the port held in the host's port space on a stack with
	// a shared address (Shared), 0 if none.
	hostPort uint16
	once     sync.Once
}

// Reserve binds a TCP port on addr: port 0 picks an ephemeral one, an
// unspecified address reserves the port on every address of the stack. A
// port another reservation holds on an overlapping address is refused
// (EADDRINUSE), as a second bind(2) of a port is. On a stack with a shared
// address the port is reserved in the host's port space too (the host
// picks it for port 0), and one a host socket holds is refused.
func (s *Stack) Reserve(addr netip.AddrPort) (*Reservation, error) {
	// gVisor may pick, for port 0, a port another SO_REUSEADDR endpoint
	// holds (a listener's, or another reservation's); pick again then.
	for try := 0; ; try++ {
		r, err := s.reserve(addr)
		if addr.Port() != 0 || try == 16 || !errors.Is(err, syscall.EADDRINUSE) {
			return r, err
		}
	}
}

func (s *Stack) reserve(addr netip.AddrPort) (*Reservation, error) {
	at := AddrPortString(addr)
	if s.isClosed() {
		return nil, fmt.Errorf("netstack: reserve %s: %w", at, net.ErrClosed)
	}
	a := addr.Addr().Unmap()
	v6 := a.Is6() || (!a.IsValid() && s.hasFamily(true))
	proto := ipv4.ProtocolNumber
	if v6 {
		proto = ipv6.ProtocolNumber
	}
	var wq waiter.Queue
	ep, terr := s.s.NewEndpoint(tcp.ProtocolNumber, proto, &wq)
	if terr != nil {
		return nil, fmt.Errorf("netstack: reserve %s: %w", at, convertError(terr))
	}
	if v6 && (!a.IsValid() || a.IsUnspecified()) {
		ep.SocketOptions().SetV6Only(false)
	}
	// As Listen's endpoints, so that the listener this reservation is
	// for can bind the port while the reservation still holds it.
	ep.SocketOptions().SetReuseAddress(true)
	full := tcpip.FullAddress{}
	if pa := s.toPrivate(a); pa.IsValid() && !pa.IsUnspecified() {
		full.Addr = tcpip.AddrFromSlice(pa.AsSlice())
	}
	hostPort, err := s.bindPort(ep, full, addr.Port())
	if err != nil {
		ep.Close()
		return nil, fmt.Errorf("netstack: reserve %s: bind: %w", at, err)
	}
	fail := func(err error) (*Reservation, error) {
		ep.Close()
		s.hostRelease(hostPort, 0)
		return nil, fmt.Errorf("netstack: reserve %s: %w", at, err)
	}
	local, terr := ep.GetLocalAddress()
	if terr != nil {
		return fail(fmt.Errorf("local address: %w", convertError(terr)))
	}
	r := &Reservation{s: s, ep: ep, addr: netip.AddrPortFrom(a, local.Port), hostPort: hostPort}
	s.mu.Lock()
	defer s.mu.Unlock()
	for o := range s.reserved {
		if o.addr.Port() == local.Port && overlap(o.addr.Addr(), a) {
			return fail(fmt.Errorf("port %d is reserved on %s: %w", local.Port, AddrPortString(o.addr), syscall.EADDRINUSE))
		}
	}
	for l := range s.listeners {
		if l.addr.Port() == local.Port && overlap(l.addr.Addr(), a) {
			return fail(fmt.Errorf("%s is listening: %w", AddrPortString(l.addr), syscall.EADDRINUSE))
		}
	}
	if s.closed {
		return fail(net.ErrClosed)
	}
	s.reserved[r] = struct{}{}
	return r, nil
}

// overlap reports whether two bound addresses share a port space: either
// is a wildcard, or they are the same address.
func overlap(a, b netip.Addr) bool {
	return !a.IsValid() || a.IsUnspecified() || !b.IsValid() || b.IsUnspecified() || a == b
}

// Addr is the reserved address and port (the port is the real one when 0
// was asked for).
func (r *Reservation) Addr() netip.AddrPort { return r.addr }

// Close gives the port back. It is idempotent and returns nil.
func (r *Reservation) Close() error {
	r.once.Do(func() {
		r.s.mu.Lock()
		delete(r.s.reserved, r)
		r.s.mu.Unlock()
		r.ep.Close()
		r.s.hostRelease(r.hostPort, 0)
	})
	return nil
}
