package netstack

import (
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// listen is Listen: it binds an endpoint to addr (through bindPort, which
// reserves the port in the host's port space on a stack with a shared
// address), listens, and publishes the port to the host's NAT.
func (s *Stack) listen(addr netip.AddrPort) (*Listener, error) {
	if s.isClosed() {
		return nil, net.ErrClosed
	}
	ep, wq, port, err := s.bindTCP(addr)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Listener, error) {
		ep.Close()
		s.hostRelease(port, 0)
		return nil, err
	}
	if terr := ep.Listen(listenBacklog); terr != nil {
		return fail(convertError(terr))
	}
	local, terr := ep.GetLocalAddress()
	if terr != nil {
		return fail(convertError(terr))
	}
	l := &Listener{s: s, ep: ep, wq: wq, addr: s.toPublic(fullToAddrPort(local)), closed: make(chan struct{})}
	if a := addr.Addr().Unmap(); !a.IsValid() || a.IsUnspecified() {
		l.addr = netip.AddrPortFrom(a, l.addr.Port())
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fail(net.ErrClosed)
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	if err := s.publish(port); err != nil {
		s.removeListener(l)
		return fail(err)
	}
	l.port = port
	return l, nil
}

// bindTCP makes a TCP endpoint bound to addr (the shared address taken
// for the stack's own), with SO_REUSEADDR, as Linux servers and siw's
// listening socket (siw_cm.c) set it: the port can be bound again while
// connections accepted on it earlier still drain (FIN_WAIT, TIME_WAIT for
// a minute), and perftest -R listens twice on its port, the second time
// with its control connection up. Two listeners on one port are still
// refused (the demuxer keeps one listening endpoint per address).
// Accepted connections inherit the flag, which is what lets a later
// listener share the port with them. port is the port reserved in the
// host's port space (0: none).
func (s *Stack) bindTCP(addr netip.AddrPort) (ep tcpip.Endpoint, wq *waiter.Queue, port uint16, err error) {
	a := s.toPrivate(addr.Addr().Unmap())
	v6 := a.Is6() || (!a.IsValid() && s.hasFamily(true))
	proto := ipv4.ProtocolNumber
	if v6 {
		proto = ipv6.ProtocolNumber
	}
	wq = &waiter.Queue{}
	ep, terr := s.s.NewEndpoint(tcp.ProtocolNumber, proto, wq)
	if terr != nil {
		return nil, nil, 0, convertError(terr)
	}
	if v6 && (!a.IsValid() || a.IsUnspecified()) {
		ep.SocketOptions().SetV6Only(false)
	}
	ep.SocketOptions().SetDelayOption(false)
	ep.SocketOptions().SetReuseAddress(true)
	full := tcpip.FullAddress{}
	if a.IsValid() && !a.IsUnspecified() {
		full.Addr = tcpip.AddrFromSlice(a.AsSlice())
	}
	if port, err = s.bindPort(ep, full, addr.Port()); err != nil {
		ep.Close()
		return nil, nil, 0, err
	}
	return ep, wq, port, nil
}
