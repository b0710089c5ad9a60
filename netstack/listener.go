package netstack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Listener accepts TCP connections.
type Listener struct {
	s    *Stack
	ep   tcpip.Endpoint
	wq   *waiter.Queue
	addr netip.AddrPort
	// port is the port reserved in the host's port space (Shared), 0 if
	// none.
	port   uint16
	closed chan struct{}
	once   sync.Once
}

// Addr returns the address the listener is bound to (the port is the real
// one when 0 was asked for; the address stays unspecified for a wildcard
// listener).
func (l *Listener) Addr() netip.AddrPort { return l.addr }

// Accept waits for the next connection. It returns an error wrapping
// net.ErrClosed once the listener (or its stack) is closed, and ctx.Err() if
// ctx ends first.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	entry, notify := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
	l.wq.EventRegister(&entry)
	defer l.wq.EventUnregister(&entry)
	for {
		select {
		case <-l.closed:
			return nil, fmt.Errorf("netstack: accept on %s: %w", AddrPortString(l.addr), net.ErrClosed)
		default:
		}
		ep, wq, terr := l.ep.Accept(nil)
		if terr == nil {
			// The connection holds the listener's port too: it keeps
			// using it after the listener closes.
			port := l.port
			if port != 0 {
				if _, err := l.s.hostReserve(port); err != nil {
					port = 0 // the mapper has closed with the stack
				}
			}
			c, err := newConn(l.s, ep, wq, port)
			if err != nil {
				// The connection died in the accept queue (its peer
				// reset it right after the handshake: it has no remote
				// address any more). That is the connection's failure,
				// not the listener's: newConn closed it; take the next.
				continue
			}
			return c, nil
		}
		if _, ok := terr.(*tcpip.ErrWouldBlock); !ok {
			select {
			case <-l.closed:
				return nil, fmt.Errorf("netstack: accept on %s: %w", AddrPortString(l.addr), net.ErrClosed)
			default:
			}
			return nil, fmt.Errorf("netstack: accept on %s: %w", AddrPortString(l.addr), convertError(terr))
		}
		select {
		case <-notify:
		case <-l.closed:
		case <-ctx.Done():
			return nil, fmt.Errorf("netstack: accept on %s: %w", AddrPortString(l.addr), ctx.Err())
		}
	}
}

// Close stops listening; pending and future Accept calls return an error
// wrapping net.ErrClosed. Connections not yet accepted are reset. It is
// idempotent and returns nil.
func (l *Listener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.s.unpublish(l.port)
		l.ep.Close()
		l.s.removeListener(l)
		l.s.hostRelease(l.port, 0)
	})
	return nil
}
