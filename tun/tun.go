// Package tun is siwtun's TUN device: the kernel side of the RNIC's private
// TCP/IP stack.
//
// Device is wireguard-go's tun.Device contract (batched Read and Write with
// headroom at a caller-chosen offset, BatchSize fixed for the device's
// life, an Events channel). Create opens a Linux TUN through
// github.com/songgao/water with IFF_TUN|IFF_NO_PI, one packet per read and
// write (BatchSize 1): the path the netstack probe measured fastest for
// gVisor's per-packet receive. Configure, Delete and Exists manage the link
// with netlink (never by running ip). NewPacketDevice adapts any Device to
// the one-packet-at-a-time interface of netstack.NewDeviceLink, and
// tun/tuntest provides an in-memory Device so nothing above this package
// needs root to test.
//
// Namespaces: Create, Configure, Delete and Exists act in the network
// namespace of the calling OS thread. A Device stays bound to the namespace
// it was created in: its Read, Write, MTU and Events work from any goroutine
// afterwards.
package tun

import (
	"os"
	"strconv"
)

// SuperReader is a Device that can hand over, whole, the TCP
// super-segments the kernel did not cut (a TUN device with segmentation
// offload), where Read splits them into wire segments.
type SuperReader interface {
	// ReadSuper reads one frame into p and returns its length: an IP
	// packet (gso 0), or a TCP super-segment made of wire segments of gso
	// octets of payload each (the last may be shorter), one IP and TCP
	// header for all. Its checksums need no checking by the caller: they
	// were verified, vouched for by the kernel, or are still partial
	// because the kernel built the packet (as a NIC with receive checksum
	// offload hands packets up). p should hold 65535 octets.
	ReadSuper(p []byte) (n, gso int, err error)
}

// FrameWriter is a Device that takes frames whose segmentation and
// checksum the kernel (or a NIC downstream) completes: a TCP super-segment
// for the kernel to cut, or a packet whose TCP checksum is only partial (a
// stack with segmentation offload builds both).
type FrameWriter interface {
	// WriteFrame writes one IP packet made of pieces (the IP and TCP
	// headers, hdrLen octets, come first and may span pieces). With gso >
	// 0 it is a TCP super-segment that the kernel cuts into segments of gso
	// octets of payload (the last may be shorter), its IP length fields
	// set to the whole packet. With csumOffset > 0 the checksum at
	// csumStart+csumOffset holds only the pseudo-header sum, and the
	// kernel completes it over the octets from csumStart on.
	WriteFrame(pieces [][]byte, gso, hdrLen, csumStart, csumOffset int) error
}

// Device is a TUN device: a source and sink of raw IP packets (no link
// header). It is wireguard-go's tun.Device contract.
type Device interface {
	// File returns the file descriptor of the device, or nil for a device
	// without one (such as tuntest.ChannelTUN).
	File() *os.File

	// Read reads one or more packets from the device (without any added
	// header). Packet i is placed at bufs[i][offset:] and its length stored
	// in sizes[i]; it returns the number of packets read. len(sizes) must
	// be >= len(bufs), and at most BatchSize packets are read per call. A
	// nonzero offset leaves headroom at the front of each buffer. Once the
	// device is closed (or its link removed) Read returns an error that
	// satisfies errors.Is(err, os.ErrClosed).
	Read(bufs [][]byte, sizes []int, offset int) (n int, err error)

	// Write writes one or more packets to the device (without any added
	// header); packet i is bufs[i][offset:]. It returns the number of
	// packets written. A failure of one packet does not stop the others:
	// the errors are joined. bufs is only used during the call.
	Write(bufs [][]byte, offset int) (int, error)

	// MTU returns the MTU of the device as the kernel has it now.
	MTU() (int, error)

	// Name returns the interface name of the device.
	Name() (string, error)

	// Events returns a channel of link state changes (EventUp, EventDown,
	// EventMTUUpdate). It is closed when the device is closed.
	Events() <-chan Event

	// Close stops the device, unblocks Read and closes the Events channel.
	// It is safe to call more than once.
	Close() error

	// BatchSize returns the preferred and maximum number of packets per
	// Read or Write. It does not change over the lifetime of a Device.
	BatchSize() int
}

// Event is a change of a Device's link state, as in wireguard-go.
type Event int

// The events a Device reports on its Events channel; their values are
// wireguard-go's.
const (
	// EventUp: the link became operational (IFF_RUNNING set).
	EventUp Event = 1 << iota
	// EventDown: the link stopped being operational (IFF_RUNNING cleared,
	// or the link was deleted).
	EventDown
	// EventMTUUpdate: the link's MTU changed; MTU returns the new value.
	EventMTUUpdate
)

// String returns the event's name.
func (e Event) String() string {
	switch e {
	case EventUp:
		return "up"
	case EventDown:
		return "down"
	case EventMTUUpdate:
		return "mtu-update"
	}
	return "Event(" + strconv.Itoa(int(e)) + ")"
}

// Bounds on the MTU that Create and Configure accept.
const (
	// MinMTU is the smallest MTU IPv4 allows (RFC 791).
	MinMTU = 68
	// MinMTUIPv6 is the smallest MTU that keeps IPv6 on a link (RFC 8200);
	// Configure refuses IPv6 addresses below it.
	MinMTUIPv6 = 1280
	// MaxMTU is the largest MTU the Linux TUN driver accepts.
	MaxMTU = 65535
)

// HostQueueLen is the length Configure gives the link's transmit queue:
// the packets the host has routed to the RNIC and the RNIC has not read
// yet. The kernel's default for TUN devices, 500, overflowed when an RNIC
// read bursts of RDMA Read Responses (two queue pairs with 128 Reads of
// 64 KiB outstanding); the drops then met gVisor's slow recovery, which
// stalled the connection for up to minutes (`perf read -n 200 -s 65536`,
// 1 run in 10 to 60 with 500; none in 150 runs with 4096).
const HostQueueLen = 4096

// maxPacketSize is the largest IP packet a Device can carry (the IPv4
// total-length limit; also the TUN driver's MTU limit).
const maxPacketSize = 65535
