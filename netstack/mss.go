package netstack

// This file reproduces, without touching gVisor internals, the payload size
// at which gVisor's TCP sender splits data (sender.MaxPayloadSize in
// pkg/tcpip/transport/tcp/snd.go). gVisor's own MaxSegOption returns 536 on a
// connected endpoint, so it cannot be asked.

const (
	tcpMinimumSize   = 20 // header.TCPMinimumSize
	tcpOptionsMax    = 40 // maxOptionSize in connect.go: the option buffer size
	tcpMaxSACKBlocks = 4  // header.TCPMaxSACKBlocks
	ipv4MinimumSize  = 20 // header.IPv4MinimumSize
	ipv6MinimumSize  = 40 // header.IPv6MinimumSize
	ipv4MinimumMTU   = 68 // header.IPv4MinimumMTU
	ipv6MinimumMTU   = 1280
	ipMaxTotalSize   = 0xffff
)

// MaxHeaderLen is the most a TCP segment's headers take out of the link
// MTU: the IP header (20 octets for IPv4, 40 for IPv6), the TCP header (20)
// and the largest TCP option space gVisor reserves (40: timestamps and
// SACK blocks), so a link MTU m gives an effective MSS of at least
// m - MaxHeaderLen(v6) (more when the peer negotiated fewer options).
func MaxHeaderLen(v6 bool) int {
	if v6 {
		return ipv6MinimumSize + tcpMinimumSize + tcpOptionsMax
	}
	return ipv4MinimumSize + tcpMinimumSize + tcpOptionsMax
}

// MinLinkMTU is the smallest link MTU the IP layer takes: 68 for IPv4,
// 1280 for IPv6.
func MinLinkMTU(v6 bool) int {
	if v6 {
		return ipv6MinimumMTU
	}
	return ipv4MinimumMTU
}

// networkMTU mirrors the network endpoints' MTU(), which is what
// stack.Route.MTU() returns for a route without its own MTU:
// ipv4.calculateNetworkMTU (min(linkMTU, 65535) - 20) and
// ipv6.calculateNetworkMTU (min(linkMTU - 40, 65535)). It is 0 when the link
// MTU is too small for the family.
func networkMTU(linkMTU int, v6 bool) int {
	if v6 {
		if linkMTU < ipv6MinimumMTU {
			return 0
		}
		return min(linkMTU-ipv6MinimumSize, ipMaxTotalSize)
	}
	if linkMTU < ipv4MinimumMTU {
		return 0
	}
	return min(linkMTU, ipMaxTotalSize) - ipv4MinimumSize
}

// maxOptionSize mirrors tcp.Endpoint.maxOptionSize (endpoint.go), which is
// len(makeOptions(<TCPMaxSACKBlocks blocks>)) (connect.go): with timestamps
// negotiated (SendTSOk), NOP NOP + 10-byte TS option = 12 bytes; with SACK
// permitted, NOP NOP and then as many 8-byte SACK blocks as
// header.EncodeSACKBlocks fits into the rest of the 40-byte option buffer
// (2-byte kind/length plus up to 4 blocks). Results: TS+SACK 40, SACK only
// 36, TS only 12, neither 0.
func maxOptionSize(ts, sack bool) int {
	off := 0
	if ts {
		off += 2 + 10
	}
	if sack {
		off += 2
		if blocks := min(tcpMaxSACKBlocks, (tcpOptionsMax-off-2)/8); blocks > 0 {
			off += 2 + 8*blocks
		}
	}
	return off
}

// effectiveMSS mirrors how gVisor sets sender.MaxPayloadSize:
//
//	initSender (snd.go):           MaxPayloadSize = int(mss) - ep.maxOptionSize()
//	then updateMaxPayloadSize(route.MTU(), 0):
//	                               m := mtu - header.TCPMinimumSize - ep.maxOptionSize()
//	                               if m < MaxPayloadSize { MaxPayloadSize = max(m, 1) }
//
// where mss is the MSS option of the peer's SYN (or SYN-ACK) as parsed by
// header.ParseSynOptions (536 when absent, raised to 48 when smaller).
func effectiveMSS(routeMTU int, peerMSS uint16, ts, sack bool) int {
	opt := maxOptionSize(ts, sack)
	p := int(peerMSS) - opt
	if m := routeMTU - tcpMinimumSize - opt; m < p {
		p = max(m, 1)
	}
	return p
}
