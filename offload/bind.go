package offload

import (
	"net/netip"

	"github.com/siwtun/siwtun/netstack"
)

// Binding is a TCP port of the device held before it listens or connects:
// rdma_bind_addr's, whose port the application learns at the bind (and,
// on a device that shares its host's address, that the host's port space
// reserves from then on). One Listen or QP.ConnectFrom uses it; Close
// gives it back unused.
type Binding struct {
	dev *Device
	nb  *netstack.Bound
}

// Bind holds addr's port (0: a free one) for a later Listen or
// QP.ConnectFrom. A port that is taken fails with an error wrapping
// syscall.EADDRINUSE.
func (d *Device) Bind(addr netip.AddrPort) (*Binding, error) {
	nb, err := d.stack.Bind(addr)
	if err != nil {
		return nil, err // netstack's error names the address
	}
	return &Binding{dev: d, nb: nb}, nil
}

// Addr is the bound address, its port the real one when 0 was asked for.
func (b *Binding) Addr() netip.AddrPort { return b.nb.Addr() }

// Listen starts accepting connections on the bound port, holding up to
// backlog connection requests (0 or less: 16). The binding is used up.
func (b *Binding) Listen(backlog int) (*Listener, error) {
	nl, err := b.nb.Listen()
	if err != nil {
		return nil, err
	}
	return b.dev.serve(nl, backlog)
}

// Close gives the port back if the binding was not used. Idempotent.
func (b *Binding) Close() error { return b.nb.Close() }
