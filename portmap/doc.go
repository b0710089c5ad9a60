// Package portmap lets an RNIC answer on an address that the host already
// has, as the iWARP port mapper (rdma-core's iwpmd with the kernel's iwpm)
// does for a hardware iWARP RNIC, which runs a TCP stack of its own yet
// shares its host's IP address.
//
// The RNIC's stack keeps a private address on its TUN device. The host's
// kernel would deliver every packet to the shared address itself (the
// local routing table comes before any policy rule), so the kernel's own
// NAT carries the RNIC's ports across, in an nftables table of siwtun's
// own, named for the device ("siwtun-<dev>", family ip):
//
//   - prerouting and output: new TCP connections to a published port of
//     the shared address (set "ports", the RNIC's listeners) are sent to
//     the private address, port unchanged (DNAT);
//   - postrouting and input: the RNIC's own connections leave from the
//     shared address, port unchanged (SNAT), to other hosts and to this
//     host's own sockets alike;
//   - prerouting ("invalid"): a segment to the shared address that
//     conntrack finds out of its connection's window escapes NAT; unless
//     a socket of the host's own is its, it is dropped, so that the host
//     does not answer a segment of the RNIC's with a reset;
//   - forward: on an interface whose IPv4 forwarding was off until the
//     RNIC needed it (set "fwdoff"), only NATed traffic is forwarded, so
//     the host forwards nothing else it did not before.
//
// conntrack translates each connection's later packets both ways. iWARP
// carries no IP address inside its frames (MPA, DDP and RDMAP speak of
// the TCP stream only; RFC 5044, RFC 6581), so the translation is
// invisible to the peer.
//
// Every port the RNIC uses, a listener's or an active connection's local
// port, is reserved in the host's port space by a kernel TCP socket bound
// to the shared address and that port (Mapper.Reserve, called by the
// RNIC's stack before it binds): a port a host socket holds cannot be
// reserved (EADDRINUSE), and no host socket can take a reserved one; the
// kernel's ephemeral ports skip it. The sockets close with the process,
// so a daemon killed with SIGKILL holds no port; the table it leaves
// behind is removed by the next Setup of its device.
package portmap
