package netstack

import (
	"errors"
	"fmt"
	"slices"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/qdisc/fifo"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/siwtun/siwtun/anatomy"
)

// New creates a Stack with one NIC on link. The link must not belong to
// another Stack.
//
// TCP is configured explicitly (each choice is commented in
// setTCPOptions): SACK on, Reno congestion control, receive-buffer
// moderation on, buffer ranges from opts, and TCP_NODELAY on every
// endpoint.
func New(link *Link, opts Options) (*Stack, error) {
	mtu, sndBuf, rcvBuf, err := checkOptions(link, opts)
	if err != nil {
		return nil, err
	}
	if !link.inUse.CompareAndSwap(false, true) {
		return nil, ErrLinkInUse
	}
	st := &Stack{
		link:        link,
		mtu:         mtu,
		addrs:       slices.Clone(opts.Addrs),
		hook:        opts.Hook,
		shared:      opts.Shared,
		hookPayload: wantsPayload(opts.Hook),
		peerTimeout: peerTimeout(opts.PeerTimeout),
		conns:       make(map[*Conn]struct{}),
		listeners:   make(map[*Listener]struct{}),
		reserved:    make(map[*Reservation]struct{}),
	}
	st.flows.init()
	if link.hops == nil {
		link.hops = anatomy.NewRecorder()
	}
	st.hops = link.hops
	st.s = stack.New(stack.Options{
		NetworkProtocols: []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		// tcp.NewProtocol is Reno; set again below so the choice is
		// explicit and survives a change of gVisor's default.
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol},
	})
	for _, step := range []func() (string, tcpip.Error){
		func() (string, tcpip.Error) { return st.setTCPOptions(opts, sndBuf, rcvBuf) },
		func() (string, tcpip.Error) { return st.createNIC(opts) },
		st.addAddresses,
	} {
		if what, err := step(); err != nil {
			st.s.Close()
			_ = link.Close()
			st.s.Wait()
			return nil, fmt.Errorf("netstack: %s: %w", what, convertError(err))
		}
	}
	st.rescueDone, st.rescueEnded = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(st.rescueEnded)
		st.rescueLoop(st.rescueDone)
	}()
	return st, nil
}

// checkOptions checks opts for link and resolves the MTU and the buffer
// sizes.
func checkOptions(link *Link, opts Options) (mtu, sndBuf, rcvBuf int, err error) {
	if link == nil {
		return 0, 0, 0, errors.New("netstack: nil link")
	}
	if len(opts.Addrs) == 0 {
		return 0, 0, 0, errors.New("netstack: no addresses")
	}
	mtu = opts.MTU
	if mtu == 0 {
		mtu = link.mtu
	}
	if mtu < 68 || mtu > link.mtu {
		return 0, 0, 0, fmt.Errorf("netstack: MTU %d out of range [68,%d]", mtu, link.mtu)
	}
	sndBuf = opts.SendBufferSize
	if sndBuf == 0 {
		sndBuf = DefaultSendBufferSize
	}
	rcvBuf = opts.ReceiveBufferSize
	if rcvBuf == 0 {
		rcvBuf = DefaultReceiveBufferSize
	}
	if sndBuf < tcp.MinBufferSize || rcvBuf < tcp.MinBufferSize {
		return 0, 0, 0, fmt.Errorf("netstack: buffer sizes must be at least %d bytes", tcp.MinBufferSize)
	}
	for _, p := range opts.Addrs {
		if !p.IsValid() || p.Addr().Is4In6() || p.Addr().IsUnspecified() {
			return 0, 0, 0, fmt.Errorf("netstack: invalid address %v", p)
		}
	}
	if err := checkShared(opts); err != nil {
		return 0, 0, 0, err
	}
	return mtu, sndBuf, rcvBuf, nil
}

// setTCPOptions sets the stack's TCP options; on failure it says which.
func (st *Stack) setTCPOptions(opts Options, sndBuf, rcvBuf int) (string, tcpip.Error) {
	set := func(opt tcpip.SettableTransportProtocolOption) tcpip.Error {
		return st.s.SetTransportProtocolOption(tcp.ProtocolNumber, opt)
	}
	// SACK: gVisor enables it by default today, but tailscale notes it was
	// off by default before; recovery from loss (and the Pipe impairment
	// tests) depends on it, so say it.
	sack := tcpip.TCPSACKEnabled(true)
	if err := set(&sack); err != nil {
		return "enable SACK", err
	}
	if opts.NoRACK {
		// See Options.NoRACK. SACK recovery (RFC 6675) stays.
		rec := tcpip.TCPRecovery(0)
		if err := set(&rec); err != nil {
			return "turn RACK off", err
		}
	}
	// Reno, not CUBIC: "Netstack has an int overflow in sender congestion
	// window arithmetic that is more prone to trigger with cubic"
	// (tailscale wgengine/netstack, google/gvisor#11632).
	cc := tcpip.CongestionControlOption("reno")
	if err := set(&cc); err != nil {
		return "set congestion control", err
	}
	// Receive-buffer moderation lets a connection start at the default
	// receive buffer and grow it with what the application actually
	// consumes per RTT (Conn reads call ModerateRecvBuf).
	mod := tcpip.TCPModerateReceiveBufferOption(true)
	if err := set(&mod); err != nil {
		return "enable receive-buffer moderation", err
	}
	// Buffer ranges: see DefaultSendBufferSize, DefaultReceiveBufferSize
	// and MaxBufferSize for the reasons.
	sndRange := tcpip.TCPSendBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: sndBuf, Max: max(sndBuf, MaxBufferSize)}
	if err := set(&sndRange); err != nil {
		return "set send buffer range", err
	}
	rcvRange := tcpip.TCPReceiveBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: rcvBuf, Max: max(rcvBuf, MaxBufferSize)}
	if err := set(&rcvRange); err != nil {
		return "set receive buffer range", err
	}
	// Nagle off stack-wide as well as per endpoint (TCP_NODELAY): FPDUs
	// must leave as written, not be held for coalescing.
	delay := tcpip.TCPDelayEnabled(false)
	if err := set(&delay); err != nil {
		return "disable Nagle", err
	}
	return "", nil
}

// createNIC creates the stack's NIC on the link's endpoint, wrapped in the
// segment hooks (hookEndpoint), with segmentation offload when the link
// has it and opts allow it.
func (st *Stack) createNIC(opts Options) (string, tcpip.Error) {
	link := st.link
	st.gso = link.gso != nil && link.gso() && !opts.NoGSO
	st.ep = newHookEndpoint(link.ep, st, uint32(st.mtu), st.gso)
	if opts.DelayedACK {
		st.ep.acks = newAckHolder(st.ep)
	}
	var qdisc stack.QueueingDiscipline = &directQDisc{ep: st.ep}
	if link.batch && !st.gso {
		// Queue outbound packets so that a burst reaches the device in one
		// WritePackets call, which coalesces it (gVisor's FIFO discipline:
		// one dispatcher goroutine, batches of up to 47 packets).
		qdisc = fifo.New(st.ep, 1, batchQueueLen)
	}
	if err := st.s.CreateNICWithOptions(nicID, st.ep, stack.NICOptions{QDisc: qdisc}); err != nil {
		return "create NIC", err
	}
	return "", nil
}

// addAddresses gives the NIC the stack's addresses, with a route to each
// one's network and a default route for each family.
func (st *Stack) addAddresses() (string, tcpip.Error) {
	var routes []tcpip.Route
	has4, has6 := false, false
	for _, p := range st.addrs {
		proto := ipv4.ProtocolNumber
		if p.Addr().Is6() {
			proto = ipv6.ProtocolNumber
			has6 = true
		} else {
			has4 = true
		}
		pa := tcpip.ProtocolAddress{
			Protocol: proto,
			AddressWithPrefix: tcpip.AddressWithPrefix{
				Address:   tcpip.AddrFromSlice(p.Addr().AsSlice()),
				PrefixLen: p.Bits(),
			},
		}
		if err := st.s.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return fmt.Sprintf("add address %v", p), err
		}
		routes = append(routes, tcpip.Route{Destination: pa.AddressWithPrefix.Subnet(), NIC: nicID})
	}
	if has4 {
		routes = append(routes, tcpip.Route{Destination: header4Any(), NIC: nicID})
	}
	if has6 {
		routes = append(routes, tcpip.Route{Destination: header6Any(), NIC: nicID})
	}
	st.s.SetRouteTable(routes)
	return "", nil
}
