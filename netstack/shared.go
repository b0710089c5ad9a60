package netstack

import (
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// Shared puts a stack on an address that the host also has, the way a
// hardware iWARP RNIC shares its host's address: the stack keeps a private
// address on its link (Options.Addrs), the host translates between it and
// Public (NAT), and the stack's TCP ports are held in the host's port space
// of Public for as long as the stack uses them, so that neither takes the
// other's ports. The stack then speaks of Public wherever it reports an
// address: Addrs, Listener.Addr, Conn.LocalAddr.
type Shared struct {
	// Public is the shared address and the prefix length it has on the
	// host's interface.
	Public netip.Prefix
	// Private is the stack's own address, one of Options.Addrs.
	Private netip.Addr
	// Ports holds the stack's ports in the host's port space.
	Ports PortMapper
}

// PortMapper holds a stack's TCP ports in the port space of the host whose
// address it shares (Shared), as the iWARP port mapper (iwpm) does for a
// hardware RNIC. Every port the stack binds, a listener's or an active
// connection's local port, goes through Reserve first and Release after.
type PortMapper interface {
	// Reserve holds port of the shared address for the stack and returns
	// it; port 0 asks for any free port, which the host picks from its
	// ephemeral range. Reserves of one port are counted: the port stays
	// held until each has been released. An error wrapping
	// syscall.EADDRINUSE means a host socket holds the port.
	Reserve(port uint16) (uint16, error)
	// Release ends one Reserve of port. It is harmless after the mapper
	// has been closed.
	Release(port uint16)
	// Publish sends new connections to port of the shared address to the
	// stack (a listener); the host keeps every port not published.
	Publish(port uint16) error
	// Unpublish ends Publish of port.
	Unpublish(port uint16)
}

// timeWaitHold is how long the local port of an active connection stays
// reserved after the connection: the stack lingers in TIME_WAIT on it for
// gVisor's timeout (60 s), and the host's conntrack keeps the
// connection's entry, which maps the port, for its TIME_WAIT timeout
// (net.netfilter.nf_conntrack_tcp_timeout_time_wait, 120 s by default):
// a host connection from the same port to the same peer meanwhile clashes
// with that entry and its SYNs are dropped (seen: the connect timed out).
// A listener's port needs no hold: its connections share it, and a new
// listener may take it at once (SO_REUSEADDR).
const timeWaitHold = 2 * tcp.DefaultTCPTimeWaitTimeout

// checkShared validates opts.Shared against opts.Addrs.
func checkShared(opts Options) error {
	sh := opts.Shared
	if sh == nil {
		return nil
	}
	if sh.Ports == nil {
		return fmt.Errorf("netstack: shared address %v: no port mapper", sh.Public)
	}
	if !sh.Public.IsValid() || !sh.Private.IsValid() || sh.Public.Addr().Is6() != sh.Private.Is6() {
		return fmt.Errorf("netstack: shared address %v: private address %v: want two addresses of one family", sh.Public, sh.Private)
	}
	for _, p := range opts.Addrs {
		if p.Addr() == sh.Private {
			return nil
		}
	}
	return fmt.Errorf("netstack: shared address %v: private address %v is not one of the stack's addresses", sh.Public, sh.Private)
}

// toPrivate maps the shared address to the stack's own; any other address
// is returned as it is.
func (s *Stack) toPrivate(a netip.Addr) netip.Addr {
	if s.shared != nil && a == s.shared.Public.Addr() {
		return s.shared.Private
	}
	return a
}

// toPublic maps an address of the stack's to the shared address.
func (s *Stack) toPublic(ap netip.AddrPort) netip.AddrPort {
	if s.shared != nil && ap.Addr() == s.shared.Private {
		return netip.AddrPortFrom(s.shared.Public.Addr(), ap.Port())
	}
	return ap
}

// hostReserve holds port for the stack in the host's port space (a no-op
// returning port on a stack that shares no address).
func (s *Stack) hostReserve(port uint16) (uint16, error) {
	if s.shared == nil {
		return port, nil
	}
	// The mapper's errors name the port and the shared address.
	return s.shared.Ports.Reserve(port)
}

// hostRelease ends a hostReserve of port, after a delay for a closed connection.
func (s *Stack) hostRelease(port uint16, after time.Duration) {
	if s.shared == nil || port == 0 {
		return
	}
	if after <= 0 {
		s.shared.Ports.Release(port)
		return
	}
	time.AfterFunc(after, func() { s.shared.Ports.Release(port) })
}

// publish and unpublish send new connections to a listener's port to the
// stack, or no longer.
func (s *Stack) publish(port uint16) error {
	if s.shared == nil {
		return nil
	}
	if err := s.shared.Ports.Publish(port); err != nil {
		return fmt.Errorf("publish port %d of the shared address %v: %w", port, s.shared.Public.Addr(), err)
	}
	return nil
}

func (s *Stack) unpublish(port uint16) {
	if s.shared != nil {
		s.shared.Ports.Unpublish(port)
	}
}

// maxBindTries bounds how often Dial asks the host for another port when
// the one it reserved is still bound in the stack (a connection of the
// stack's lingering past the hold).
const maxBindTries = 8

// errPortsExhausted says that Dial found no port both spaces had free.
var errPortsExhausted = fmt.Errorf("no local port free in both the host's and the stack's port space: %w", syscall.EADDRINUSE)

// bindPort binds ep to full's address and port (0: any free one). On a
// stack with a shared address the port is first reserved in the host's
// port space and returned (0: none reserved); the host picks a free one
// for port 0. It is the one place where the stack binds a local port.
func (s *Stack) bindPort(ep tcpip.Endpoint, full tcpip.FullAddress, port uint16) (uint16, error) {
	if s.shared == nil {
		full.Port = port
		return 0, convertError(ep.Bind(full))
	}
	if port != 0 {
		p, err := s.hostReserve(port)
		if err != nil {
			return 0, err
		}
		full.Port = p
		if terr := ep.Bind(full); terr != nil {
			s.hostRelease(p, 0)
			return 0, convertError(terr)
		}
		return p, nil
	}
	// The host picks a port free in its space; the stack may still hold
	// it (a connection of its own past the reservation's hold): ask again,
	// keeping the refused ones reserved until a port fits so the host does
	// not hand the same one back.
	var refused []uint16
	defer func() {
		for _, p := range refused {
			s.hostRelease(p, 0)
		}
	}()
	for range maxBindTries {
		p, err := s.hostReserve(0)
		if err != nil {
			return 0, err
		}
		full.Port = p
		terr := ep.Bind(full)
		if terr == nil {
			return p, nil
		}
		if _, inUse := terr.(*tcpip.ErrPortInUse); !inUse {
			s.hostRelease(p, 0)
			return 0, convertError(terr)
		}
		refused = append(refused, p)
	}
	return 0, errPortsExhausted
}
