package netstack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/siwtun/siwtun/anatomy"
)

const (
	// nicID is the ID of the stack's only NIC.
	nicID tcpip.NICID = 1
	// DefaultMTU is the link MTU used when neither Options.MTU nor the
	// link says otherwise.
	DefaultMTU = 1500
	// DefaultSendBufferSize is the default per-endpoint send buffer: 1 MiB,
	// gVisor's own default. It holds ~740 MSS-sized FPDUs at MTU 1500, far
	// more than the send window of an in-host path, and gVisor's send-buffer
	// auto-tuning grows it up to MaxBufferSize when the congestion window
	// needs more.
	DefaultSendBufferSize = 1 << 20
	// DefaultReceiveBufferSize is the default per-endpoint receive buffer
	// (1 MiB). With receive-buffer moderation on, gVisor grows it towards
	// MaxBufferSize as the application keeps up, so a connection starts
	// small and only long-fat ones pay for 4 MiB.
	DefaultReceiveBufferSize = 1 << 20
	// MaxBufferSize caps both buffers (4 MiB, gVisor's default maximum):
	// enough for ~1 GB/s at 4 ms RTT, which is well above what one gVisor
	// connection moves on this class of machine (see the netstack probe),
	// while bounding memory per QP.
	MaxBufferSize = 4 << 20
	// listenBacklog matches Linux's default somaxconn, as gonet does.
	listenBacklog = 4096
)

// Options configure a Stack.
type Options struct {
	// Addrs are the stack's own addresses (IPv4 and/or IPv6). Each prefix
	// gets an on-link route, and a default route per address family points
	// out of the NIC. At least one is required.
	Addrs []netip.Prefix
	// MTU is the link MTU. 0 means the Link's MTU (1500 for a Pipe created
	// with 0). It must not exceed the Link's MTU.
	MTU int
	// SendBufferSize and ReceiveBufferSize are the per-endpoint default
	// buffer sizes; 0 means DefaultSendBufferSize and
	// DefaultReceiveBufferSize. Both may grow to MaxBufferSize (or to the
	// default, when that is larger) through gVisor's auto-tuning.
	SendBufferSize, ReceiveBufferSize int
	// Hook, if non-nil, sees every TCP segment in both directions.
	Hook SegmentHook
	// PeerTimeout bounds how long a connection lives with a silent peer:
	// data unacknowledged for that long ends it (TCP_USER_TIMEOUT), and an
	// idle connection sends keepalives from then on and ends after 3
	// unanswered ones a third of it apart. An RNIC must see a crashed peer
	// within a minute, not after TCP's default retransmission limit (many
	// minutes); too short a value ends healthy connections whose
	// retransmissions back off on a starved machine. 0 means
	// DefaultPeerTimeout; negative disables both.
	PeerTimeout time.Duration
	// NoRACK turns off RACK loss detection and its tail loss probes (RFC
	// 8985); loss is then found by SACK and duplicate ACKs (RFC 6675) and
	// the retransmission timer. gVisor's probe timeout is twice the
	// smoothed round trip with no floor (Linux adds at least 2 ms): on a
	// busy host, where the ACKs of a 100 µs path lag by more, probes fire
	// for segments that were not lost, and each counts as a loss and
	// halves the window. Many connections on few cores then share far less
	// than one (doc/performance.md: many queue pairs).
	NoRACK bool
	// NoGSO turns segmentation offload off on a link that has it (a
	// device link whose device takes offloaded frames): gVisor then builds
	// every segment itself, as on any other link.
	NoGSO bool
	// DelayedACK holds pure ACKs at the link for an answer to carry them
	// (ackhold.go).
	DelayedACK bool
	// Shared, if set, puts the stack on an address the host shares with
	// it (see Shared); nil: the stack's addresses are its own.
	Shared *Shared
}

// DefaultPeerTimeout is the default Options.PeerTimeout.
// (Chelsio's iw_cxgb4 uses the same 60 s for its endpoint timeout).
const DefaultPeerTimeout = 60 * time.Second

// Stack is a gVisor network stack with one NIC on one Link.
type Stack struct {
	s     *stack.Stack
	link  *Link
	ep    *hookEndpoint
	mtu   int
	addrs []netip.Prefix
	hook  SegmentHook
	// shared is Options.Shared (nil: no shared address).
	shared *Shared
	// gso: gVisor builds super-segments that the link's device cuts
	// (gso.go); tailsHeld and tailsAlone count the tails held back
	// (gsohold.go) and those that left without their rest.
	gso                   bool
	tailsHeld, tailsAlone atomic.Uint64
	// resent counts retransmissions sent again on the FPDU grid
	// (resend.go), holdProbes the window probes sent for held tails
	// (gsohold.go).
	resent, holdProbes atomic.Uint64
	// resendAsIs counts, for tests, the retransmissions resend left as
	// TCP cut them: the grid not known, the FPDU not sent whole, the
	// octets not kept.
	resendAsIs [3]atomic.Uint64
	// peerTimeout is Options.PeerTimeout resolved.
	peerTimeout time.Duration
	// hookPayload: the stack-wide hook reads payloads.
	hookPayload bool
	flows       flowTable
	// segPool recycles the Segment values handed to hooks.
	segPool sync.Pool
	// runPool recycles the SegmentRun values handed to BatchHooks.
	runPool sync.Pool
	// tap is the hook SetTap installed, or nil.
	tap atomic.Pointer[hookBox]
	// hops records the hop stamps of round trips (hops.go): the link's.
	hops *anatomy.Recorder

	mu        sync.Mutex
	closed    bool                      // guarded by mu
	conns     map[*Conn]struct{}        // guarded by mu
	listeners map[*Listener]struct{}    // guarded by mu
	reserved  map[*Reservation]struct{} // guarded by mu (reserve.go)
	closeOnce sync.Once

	// rescueDone stops rescueLoop; tailRescues counts the packets it
	// wrote again (rescue.go).
	rescueDone  chan struct{}
	rescueEnded chan struct{}
	tailRescues atomic.Uint64
}

// batchQueueLen is the outbound queue of a batching link's NIC, in packets.
const batchQueueLen = 4096

// MTU returns the link MTU the stack uses.
func (s *Stack) MTU() int { return s.mtu }

// Addrs returns a copy of the stack's addresses; with a shared address,
// the shared one stands in place of the private one.
func (s *Stack) Addrs() []netip.Prefix {
	out := slices.Clone(s.addrs)
	for i, p := range out {
		if s.shared != nil && p.Addr() == s.shared.Private {
			out[i] = s.shared.Public
		}
	}
	return out
}

// Close aborts every connection (RST) and listener of the stack, closes the
// NIC and its Link and waits for all goroutines of the stack and the link.
// It is idempotent and returns nil.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		conns := make([]*Conn, 0, len(s.conns))
		for c := range s.conns {
			conns = append(conns, c)
		}
		ls := make([]*Listener, 0, len(s.listeners))
		for l := range s.listeners {
			ls = append(ls, l)
		}
		s.mu.Unlock()
		for _, c := range conns {
			_ = c.Abort()
		}
		for _, l := range ls {
			_ = l.Close()
		}
		// Stop the link before gVisor removes the NIC: RemoveNIC runs
		// under the stack lock, and the link's goroutines must not be
		// delivering into a stack that is being torn down.
		close(s.rescueDone)
		<-s.rescueEnded
		_ = s.link.Close()
		s.s.Close()
		s.s.Wait()
		s.flows.releaseAll()
	})
	return nil
}

func (s *Stack) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Stack) addConn(c *Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Stack) removeConn(c *Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *Stack) removeListener(l *Listener) {
	s.mu.Lock()
	delete(s.listeners, l)
	s.mu.Unlock()
}

// hasFamily reports whether the stack has an address of a's family.
func (s *Stack) hasFamily(v6 bool) bool {
	for _, p := range s.addrs {
		if p.Addr().Is6() == v6 {
			return true
		}
	}
	return false
}

// Listen listens for TCP connections on addr. Port 0 picks an ephemeral
// port; an unspecified address (the zero netip.Addr, 0.0.0.0 or ::) listens
// on every address of the stack (the zero Addr and :: are dual-stack when
// the stack has IPv6 addresses). On a stack with a shared address (Shared)
// the port is reserved in the host's port space first: a port a host
// socket holds fails with an error wrapping syscall.EADDRINUSE.
func (s *Stack) Listen(addr netip.AddrPort) (*Listener, error) {
	l, err := s.listen(addr)
	if err != nil {
		return nil, fmt.Errorf("netstack: listen on %s: %w", AddrPortString(addr), err)
	}
	return l, nil
}

// Dial opens a TCP connection to remote. local may be the zero Addr (the
// stack picks the source address by route). ctx bounds the handshake only.
// On a stack with a shared address (Shared) the local port is one the
// host's port space reserves for the connection.
func (s *Stack) Dial(ctx context.Context, local netip.Addr, remote netip.AddrPort) (*Conn, error) {
	if s.isClosed() {
		return nil, fmt.Errorf("netstack: dial %v: %w", remote, net.ErrClosed)
	}
	ra := remote.Addr().Unmap()
	if !ra.IsValid() || ra.IsUnspecified() || remote.Port() == 0 {
		return nil, fmt.Errorf("netstack: dial %v: invalid remote address", remote)
	}
	proto := ipv4.ProtocolNumber
	if ra.Is6() {
		proto = ipv6.ProtocolNumber
	}
	var wq waiter.Queue
	ep, terr := s.s.NewEndpoint(tcp.ProtocolNumber, proto, &wq)
	if terr != nil {
		return nil, fmt.Errorf("netstack: dial %v: %w", remote, convertError(terr))
	}
	ep.SocketOptions().SetDelayOption(false)
	la := s.toPrivate(local.Unmap())
	if la.IsValid() && la.Is6() != ra.Is6() {
		ep.Close()
		return nil, fmt.Errorf("netstack: dial %v from %v: address family mismatch", remote, local)
	}
	full := tcpip.FullAddress{}
	if la.IsValid() {
		full.Addr = tcpip.AddrFromSlice(la.AsSlice())
	}
	var port uint16
	var err error
	if la.IsValid() || s.shared != nil {
		if port, err = s.bindPort(ep, full, 0); err != nil {
			ep.Close()
			return nil, fmt.Errorf("netstack: dial %v: bind %v: %w", remote, local, err)
		}
	}
	return s.connect(ctx, ep, &wq, ra, remote.Port(), port)
}

// connect connects ep (bound already, or not: then the stack picks its
// local address and port) to ra:rport and wraps the connection; port is
// the local port reserved in the host's port space (0: none), given back
// if the connection fails.
func (s *Stack) connect(ctx context.Context, ep tcpip.Endpoint, wq *waiter.Queue, ra netip.Addr, rport, port uint16) (*Conn, error) {
	remote := netip.AddrPortFrom(ra.Unmap(), rport)
	entry, notify := waiter.NewChannelEntry(waiter.WritableEvents | waiter.EventHUp | waiter.EventErr)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)
	fail := func(err error) (*Conn, error) {
		s.forgetFlow(ep)
		ep.Close()
		s.hostRelease(port, 0)
		return nil, fmt.Errorf("netstack: dial %v: %w", remote, err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	terr := ep.Connect(tcpip.FullAddress{Addr: tcpip.AddrFromSlice(ra.AsSlice()), Port: rport})
	if _, ok := terr.(*tcpip.ErrConnectStarted); ok {
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-notify:
		}
		terr = ep.LastError()
	}
	if terr != nil {
		return fail(convertError(terr))
	}
	c, err := newConn(s, ep, wq, port)
	if err != nil {
		return nil, fmt.Errorf("netstack: dial %v: %w", remote, err)
	}
	c.hold = true
	return c, nil
}

// forgetFlow drops the flow state a failed endpoint left behind.
func (s *Stack) forgetFlow(ep tcpip.Endpoint) {
	local, err1 := ep.GetLocalAddress()
	remote, err2 := ep.GetRemoteAddress()
	if err1 != nil || err2 != nil {
		return
	}
	s.flows.remove(flowKey{local: fullToAddrPort(local), remote: fullToAddrPort(remote)}, nil)
}

// fullToAddrPort converts a gVisor address; IPv4 comes out in 4-byte form.
// AddrPortString formats a listening or connecting address for messages:
// like netip.AddrPort.String, but a wildcard address with no IP (the zero
// netip.Addr, which the Listen methods accept for "every address") prints
// as ":port", as package net does, instead of "invalid AddrPort".
func AddrPortString(ap netip.AddrPort) string {
	if !ap.Addr().IsValid() {
		return fmt.Sprintf(":%d", ap.Port())
	}
	return ap.String()
}

func fullToAddrPort(f tcpip.FullAddress) netip.AddrPort {
	a, _ := netip.AddrFromSlice(f.Addr.AsSlice())
	return netip.AddrPortFrom(a.Unmap(), f.Port)
}

func header4Any() tcpip.Subnet {
	sn, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{}), tcpip.MaskFromBytes(make([]byte, 4)))
	return sn
}

func header6Any() tcpip.Subnet {
	sn, _ := tcpip.NewSubnet(tcpip.AddrFrom16([16]byte{}), tcpip.MaskFromBytes(make([]byte, 16)))
	return sn
}

// peerTimeout resolves Options.PeerTimeout.
func peerTimeout(t time.Duration) time.Duration {
	switch {
	case t == 0:
		return DefaultPeerTimeout
	case t < 0:
		return 0
	}
	return t
}
