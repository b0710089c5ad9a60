package uverbs

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/verbs/internal/uabi"
)

// sPort is a port the client reserved (rdma_bind_addr) and has not
// released: it counts as a listener against the client's limits.
type sPort struct{ r *netstack.Reservation }

// reservePort holds a port of the RNIC for the client: the RNIC's stack
// picks it (port 0) or checks it is free, so the stack stays the one place
// the RNIC's ports come from.
func (ss *session) reservePort(req *uabi.ReservePort) (uabi.Msg, error) {
	cost := usage{listeners: 1}
	if err := ss.charge(cost); err != nil {
		return nil, err
	}
	r, err := ss.srv.eng.Stack().Reserve(req.Addr)
	if err != nil {
		ss.uncharge(cost)
		return nil, err
	}
	h, err := ss.add(&sPort{r: r})
	if err != nil {
		ss.uncharge(cost)
		r.Close()
		return nil, err
	}
	return &uabi.ReservePortReply{Handle: h, Addr: r.Addr()}, nil
}

func (ss *session) releasePort(h uint32) error {
	p, err := take[*sPort](ss, h, "port reservation")
	if err != nil {
		return err
	}
	return p.r.Close()
}

// checkReserved refuses a listener on a port another client reserved; the
// stack lets listeners share a reserved port (the client's own listener
// binds the port its reservation holds).
func (ss *session) checkReserved(addr netip.AddrPort) error {
	if addr.Port() == 0 {
		return nil
	}
	s := ss.srv
	s.mu.Lock()
	others := make([]*session, 0, len(s.sessions))
	for o := range s.sessions {
		if o != ss {
			others = append(others, o)
		}
	}
	s.mu.Unlock()
	for _, o := range others {
		o.mu.Lock()
		var held netip.AddrPort
		for _, obj := range o.objs {
			if p, ok := obj.(*sPort); ok && p.r.Addr().Port() == addr.Port() && overlaps(p.r.Addr().Addr(), addr.Addr()) {
				held = p.r.Addr()
				break
			}
		}
		o.mu.Unlock()
		if held.Port() != 0 {
			return fmt.Errorf("listen on %s: port %d is reserved by another verbs client on %s: %w",
				netstack.AddrPortString(addr), addr.Port(), netstack.AddrPortString(held), syscall.EADDRINUSE)
		}
	}
	return nil
}

// overlaps reports whether two bound addresses share a port space.
func overlaps(a, b netip.Addr) bool {
	return !a.IsValid() || a.IsUnspecified() || !b.IsValid() || b.IsUnspecified() || a.Unmap() == b.Unmap()
}
