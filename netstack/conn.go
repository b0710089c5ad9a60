package netstack

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Conn is an established TCP connection.
type Conn struct {
	s      *Stack
	ep     tcpip.Endpoint
	wq     *waiter.Queue
	local  netip.AddrPort
	remote netip.AddrPort
	flow   *flow
	key    flowKey
	// port is the local port reserved in the host's port space (Shared),
	// 0 if none; hold: keep it reserved for a while after the connection
	// (an active one's ephemeral port; see timeWaitHold).
	port uint16
	hold bool

	closed      chan struct{}
	closeOnce   sync.Once // closes closed
	releaseOnce sync.Once // gives ep back (release)

	readMu  sync.Mutex
	rw      readWriter        // guarded by readMu
	rEntry  waiter.Entry      // guarded by readMu; registered only while a read waits
	rNotify chan struct{}     // rEntry's channel
	sw      tcpip.SliceWriter // guarded by readMu; Read's destination
	readN   uint64            // guarded by readMu; bytes read since the handshake

	writeMu sync.Mutex
	written uint64        // guarded by writeMu; bytes queued since the handshake
	pl      payloadReader // guarded by writeMu; the source handed to gVisor
	wEntry  waiter.Entry  // guarded by writeMu; registered only while a write waits
	wNotify chan struct{} // wEntry's channel
	iss     uint32        // guarded by writeMu; our ISS once issOK
	issOK   bool          // guarded by writeMu
	// windowTimer bounds a wait for the peer's window (waitRoomSlow);
	// guarded by writeMu, kept so a wait does not allocate a timer.
	windowTimer *time.Timer
	// partialWrites counts WriteAligned calls that gVisor accepted only in
	// part (the rest was written immediately after).
	partialWrites atomic.Uint64
	// shortRoomRetries counts aligned writes gVisor would have accepted only
	// in part, refused whole and tried again (see writeLocked).
	shortRoomRetries atomic.Uint64
	// retryTimer bounds a wait between such tries; guarded by writeMu.
	retryTimer *time.Timer
	// recentEnds holds the stream offset (c.written) after each of the last
	// coalesceAfter aligned writes, a ring indexed by recentIdx; coalescing
	// says whether Nagle is on. All guarded by writeMu. See coalesce.
	recentEnds [coalesceAfter]uint64
	recentIdx  int
	coalescing bool
	// oneWritePerSegment: see SetOneWritePerSegment; guarded by writeMu.
	oneWritePerSegment bool
	// coalescedWrites counts aligned writes queued while coalescing.
	coalescedWrites atomic.Uint64

	dlMu    sync.Mutex
	dlCh    chan struct{} // guarded by dlMu; closed when the read deadline passes
	dlTimer *time.Timer   // guarded by dlMu
	dlFired bool          // guarded by dlMu

	// hopEntry stays registered for readable events: it stamps TCP's
	// queueing of received data while the stack's recorder is on
	// (hops.go).
	hopEntry waiter.Entry
}

// newConn wraps an established endpoint; port is the local port reserved
// for it in the host's port space (0: none), released with the connection.
func newConn(s *Stack, ep tcpip.Endpoint, wq *waiter.Queue, port uint16) (*Conn, error) {
	// TCP_NODELAY: an FPDU must leave as soon as it is written.
	ep.SocketOptions().SetDelayOption(false)
	if t := s.peerTimeout; t > 0 {
		ut := tcpip.TCPUserTimeoutOption(t)
		idle := tcpip.KeepaliveIdleOption(t)
		intv := tcpip.KeepaliveIntervalOption(t / 3)
		ep.SetSockOpt(&ut)
		ep.SetSockOpt(&idle)
		ep.SetSockOpt(&intv)
		ep.SetSockOptInt(tcpip.KeepaliveCountOption, 3)
		ep.SocketOptions().SetKeepAlive(true)
	}
	la, terr := ep.GetLocalAddress()
	if terr != nil {
		ep.Close()
		s.hostRelease(port, 0)
		return nil, fmt.Errorf("local address: %w", convertError(terr))
	}
	ra, terr := ep.GetRemoteAddress()
	if terr != nil {
		ep.Close()
		s.hostRelease(port, 0)
		return nil, fmt.Errorf("remote address: %w", convertError(terr))
	}
	c := &Conn{
		s:      s,
		ep:     ep,
		wq:     wq,
		port:   port,
		local:  fullToAddrPort(la),
		remote: fullToAddrPort(ra),
		closed: make(chan struct{}),
		dlCh:   make(chan struct{}),
	}
	// The wait entries are made once, so that blocking reads and writes
	// do not allocate.
	c.rEntry, c.rNotify = waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
	c.wEntry, c.wNotify = waiter.NewChannelEntry(waiter.WritableEvents | waiter.EventHUp | waiter.EventErr)
	c.hopEntry = waiter.NewFunctionEntry(waiter.ReadableEvents, c.stampQueued)
	wq.EventRegister(&c.hopEntry)
	c.key = flowKey{local: c.local, remote: c.remote}
	c.flow = s.flows.claim(c.key)
	if !s.addConn(c) {
		ep.Abort()
		ep.Close()
		s.flows.remove(c.key, c.flow)
		s.hostRelease(port, 0)
		return nil, net.ErrClosed
	}
	return c, nil
}

// LocalAddr returns the local address (IPv4 in 4-byte form): the shared
// address on a stack with one (Shared), as the peer sees it.
func (c *Conn) LocalAddr() netip.AddrPort { return c.s.toPublic(c.local) }

// RemoteAddr returns the peer's address (IPv4 in 4-byte form).
func (c *Conn) RemoteAddr() netip.AddrPort { return c.remote }

// MSS returns the largest payload gVisor's sender puts into one segment on
// this connection, i.e. where it splits a larger write: sender.MaxPayloadSize,
// reproduced from the route MTU, the peer's SYN MSS option and the TCP option
// space gVisor reserves (see effectiveMSS). 1420 at MTU 1500 and 8920 at 9000
// (IPv4, gVisor peer). If the handshake was not seen at the link (it always
// is, unless the flow table swept it), a gVisor peer with timestamps and SACK
// is assumed.
func (c *Conn) MSS() int {
	in, out, inOK, outOK := c.flow.synInfo()
	rmtu := networkMTU(c.s.mtu, c.remote.Addr().Is6())
	peer := uint16(max(rmtu-tcpMinimumSize, 0))
	ts, sack := true, true
	if inOK {
		peer = in.mss
		ts, sack = in.ts, in.sack
	}
	if outOK {
		ts, sack = ts && out.ts, sack && out.sack
	}
	return effectiveMSS(rmtu, peer, ts, sack)
}

// SetSegmentHook installs h as this connection's hook: it sees the segments
// of this 4-tuple (in addition to the stack-wide Options.Hook). nil removes
// it. Segments of the handshake have passed before the Conn exists.
func (c *Conn) SetSegmentHook(h SegmentHook) { c.s.flows.setHook(c.flow, h) }

func (c *Conn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// drain empties a notification channel of capacity 1, so that a
// notification left over from an earlier wait does not cause a spurious
// wake-up.
func drain(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// opError converts a gVisor error on c, preferring net.ErrClosed after a
// local Close.
func (c *Conn) opError(op string, terr tcpip.Error) error {
	if c.isClosed() {
		return fmt.Errorf("netstack: %s %v: %w", op, c.remote, net.ErrClosed)
	}
	return fmt.Errorf("netstack: %s %v: %w", op, c.remote, convertError(terr))
}

// CloseWrite sends FIN: the peer reads io.EOF after the data written so far.
// Reading continues to work.
func (c *Conn) CloseWrite() error {
	if c.isClosed() {
		return fmt.Errorf("netstack: close write %v: %w", c.remote, net.ErrClosed)
	}
	if terr := c.ep.Shutdown(tcpip.ShutdownWrite); terr != nil {
		return c.opError("close write", terr)
	}
	return nil
}

// Close closes the connection in order: queued data is sent, then FIN (as
// with close(2), unread received data makes it a reset instead). Blocked
// reads and writes return an error wrapping net.ErrClosed. Idempotent;
// returns nil. After CloseAfter it changes nothing: the FIN keeps its time.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.release(false)
	})
	return nil
}

// CloseAfter closes the connection as Close does, but holds its FIN back
// for d: reads and writes end at once (net.ErrClosed), the connection's
// hook sees no more segments, data already written goes on being sent,
// and the FIN leaves when d has passed (a reset instead if received data
// is left unread then, as with Close), unless Abort or the stack's Close
// resets the connection first. It reports whether it closed the
// connection (false: closed already). The offload engine uses it where a
// peer's transmit path fails a message it has already sent if the FIN
// comes too soon (Linux siw).
func (c *Conn) CloseAfter(d time.Duration) bool {
	closed := false
	c.closeOnce.Do(func() {
		closed = true
		close(c.closed)
		c.SetSegmentHook(nil)
		time.AfterFunc(d, func() { c.release(false) })
	})
	return closed
}

// Abort resets the connection (RST) and discards queued data, also one
// whose FIN CloseAfter holds back. Idempotent; returns nil.
func (c *Conn) Abort() error {
	c.closeOnce.Do(func() { close(c.closed) })
	c.release(true)
	return nil
}

// release hands the endpoint back to gVisor, with a reset if abort, and
// forgets the connection; only its first call counts.
func (c *Conn) release(abort bool) {
	c.releaseOnce.Do(func() {
		if abort {
			c.ep.Abort()
		}
		c.ep.Close()
		c.wq.EventUnregister(&c.hopEntry)
		c.s.flows.remove(c.key, c.flow)
		if a := c.s.ep.acks; a != nil {
			a.forget(c.key)
		}
		c.s.removeConn(c)
		// A reset connection leaves no TIME_WAIT behind; a closed one
		// may.
		hold := time.Duration(0)
		if c.hold && !abort {
			hold = timeWaitHold
		}
		c.s.hostRelease(c.port, hold)
		c.dlMu.Lock()
		if c.dlTimer != nil {
			c.dlTimer.Stop()
		}
		c.dlMu.Unlock()
	})
}
