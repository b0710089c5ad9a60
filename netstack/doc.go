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
package netstack
