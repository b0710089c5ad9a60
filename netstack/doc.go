// Package netstack is siwtun's TCP engine: a gVisor netstack with one NIC,
// wrapped so that no gVisor type escapes.
//
// The exported API speaks net/netip, []byte, io.Writer, context and Go
// errors. gVisor's tcpip.Error values are converted at this boundary into
// errors.Is-compatible values (syscall.ECONNREFUSED, syscall.ECONNRESET,
// net.ErrClosed, io.EOF, os.ErrDeadlineExceeded, ...).
//
// A Stack runs on a Link. Links come from Pipe (two in-memory links joined
// back to back, with seeded impairments, for tests and benchmarks) or from
// NewDeviceLink (any packet device, e.g. a TUN). Every TCP segment passes a
// link-level wrapper that can report it to a SegmentHook and that records
// each connection's SYN options, so Conn.MSS can report the payload size at
// which gVisor's sender actually splits, which is what the iWARP engine needs
// to emit one FPDU per TCP segment (see Conn.WriteAligned).
//
// The receive path is zero-copy: Conn.ReadTo hands the payload views that
// gVisor queued for the connection to an io.Writer, one Write call per view.
//
// # Files
//
// Every non-test file of the package, with what it holds (maps_test.go at
// the root keeps this list and the folder in step):
//
//	doc.go          this overview
//	stack.go        Stack and its Options; Dial and Listen
//	new.go          New: a Stack with one NIC on a Link, TCP options set
//	errors.go       gVisor's errors turned into Go errors at the boundary
//	stats.go        TCPStats: the TCP counters under their TCP-MIB names
//	link.go         Link: the packet link a Stack's NIC runs on
//	pipe.go         Pipe: two links joined back to back in memory
//	impairments.go  Impairments: loss, reordering, delay of a Pipe direction,
//	                and their parser
//	impair.go       Impair: a Link that applies Impairments to another
//	gate.go         Gate: holds back or damages chosen inbound segments, for
//	                tests that need one exact reordering
//	device.go       NewDeviceLink: a Link over a packet device such as a TUN,
//	                with batched writes and whole super-segment reads
//	hook.go         the link-level wrapper every packet passes: SYN options,
//	                ACKs, the SegmentHook calls
//	segment.go      Segment and Direction: one TCP segment as hooks see it
//	run.go          BatchHook and SegmentRun: the wire segments of a
//	                super-segment in one call
//	tap.go          SetTap: a hook that comes and goes while the stack runs
//	flow.go         the link-level state of each connection
//	mss.go          the payload size at which gVisor's sender splits
//	ackhold.go      delayed ACKs at the link, so that a ping-pong's answer
//	                carries the ACK instead of a packet of its own
//	gso.go          segmentation offload on the way out (host GSO), cut on
//	                the FPDU grid
//	gsohold.go      a super-segment's tail held back when TCP cut it inside
//	                an FPDU
//	softgso.go      a GSO packet cut into its wire segments, as a NIC does,
//	                so that an impaired link acts on wire segments
//	resend.go       retransmissions kept on the FPDU grid
//	rescue.go       the tail rescue, for a gVisor sender that stops
//	                retransmitting
//	conn.go         Conn: an established TCP connection
//	read.go         ReadTo and Read: the zero-copy receive path, deadlines
//	write.go        Write, WriteAligned: one FPDU per TCP segment
//	payload.go      the reader gVisor takes a write's bytes from
//	listener.go     Listener: accepting connections
//	bind.go         binding and listening, with the host's port space on a
//	                shared address
//	reserve.go      Reservation: a port held without listening (rdma_bind_addr)
//	shared.go       Shared: the stack on an address the host also has
//	hops.go         the stack's stamps of a round trip's anatomy
package netstack
