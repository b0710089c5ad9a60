// Package rping speaks the protocol of rdma-core's rping
// (librdmacm/examples/rping.c) on siwtun's verbs, so that siwtun can ping,
// and be pinged by, the real rping on another RNIC.
//
// Per ping, the client Sends a 16-byte advert of its source buffer; the
// server RDMA READs the ping data from it and Sends a 16-byte "go ahead";
// the client Sends the advert of its sink buffer; the server RDMA WRITEs
// the data back into it and Sends another "go ahead". Each side keeps one
// receive posted and posts the next as each arrives. The client may verify
// every byte that came back (Options.Validate).
//
// Output lines and exit statuses are rping's: "ping data: ..." and
// "server ping data: ..." on standard output, "server DISCONNECT EVENT...",
// "wait for RDMA_READ_ADV state 10", "data mismatch!" and the like on
// standard error, 0 when the run ends normally (also when the peer
// disconnects, as rping does), 255 on failure, 22 for invalid options.
// Where rping would leave the cause unsaid, a line starting "siwtun ping: "
// follows with it.
package rping

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
)

// rping's defaults and limits.
const (
	// DefaultPort is rping's port.
	DefaultPort = 7174
	// DefaultSize is rping's ping size in bytes.
	DefaultSize = 64
	// MinSize is rping's RPING_MIN_BUFSIZE: room for "rdma-ping-<INT_MAX>: "
	// (sizeof(stringify(INT_MAX)) + sizeof(RPING_MSG_FMT) = 11 + 15).
	MinSize = 26
	// MaxSize is the largest size rping accepts (RPING_BUFSIZE - 1).
	MaxSize = 64*1024 - 1

	sqDepth = 16          // RPING_SQ_DEPTH
	rqDepth = 2           // max_recv_wr; one receive is posted at a time
	cqDepth = 2 * sqDepth // the CQ both queues share
)

// Exit statuses, as rping's main returns them.
const (
	// StatusFailed is rping's -1 (connection or protocol failure).
	StatusFailed = 255
	// StatusInvalid is EINVAL: an invalid option.
	StatusInvalid = 22
)

// Options are rping's flags.
type Options struct {
	// Size is the ping size in bytes (-S), MinSize..MaxSize; 0 means
	// DefaultSize. The server's buffer must be at least the client's.
	Size int
	// Count is the number of pings (-C); 0 pings until the peer goes. The
	// server ignores it, as rping's does.
	Count int
	// Verbose prints each ping's data (-v).
	Verbose bool
	// Validate compares every byte that came back with what was sent
	// (-V). On the server it checks that the data read is rping's pattern
	// (rping's server ignores -V).
	Validate bool
	// Debug prints what happens step by step (-d).
	Debug bool
	// Persistent keeps the server serving one client after another, each
	// on its own, at the same time if they come together (-P).
	Persistent bool
	// Stdout and Stderr receive rping's output; nil discards it.
	Stdout, Stderr io.Writer
}

// Check fills in the defaults and rejects what rping rejects, printing
// rping's line to Stderr ("Invalid size 8 (valid range is 26 to 65535)";
// rping says 65536 there although it refuses 65536). The error is an
// *ExitError with StatusInvalid. Listen and Ping check their options too.
func (o *Options) Check() error { return o.check(newOutput(o)) }

func (o *Options) check(out *output) error {
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if o.Size < MinSize || o.Size > MaxSize {
		out.errf("Invalid size %d (valid range is %d to %d)\n", o.Size, MinSize, MaxSize)
		return &ExitError{Status: StatusInvalid, Err: fmt.Errorf("invalid size %d", o.Size)}
	}
	if o.Count < 0 {
		out.errf("Invalid count %d\n", o.Count)
		return &ExitError{Status: StatusInvalid, Err: fmt.Errorf("invalid count %d", o.Count)}
	}
	return nil
}

// ExitError is a failed run: Status is the exit status rping has for it.
// The run has already printed rping's lines about it.
type ExitError struct {
	Status int
	Err    error
}

func (e *ExitError) Error() string { return fmt.Sprintf("rping: %v (exit status %d)", e.Err, e.Status) }

// Unwrap returns the cause.
func (e *ExitError) Unwrap() error { return e.Err }

// ExitStatus is the process exit status for the failure.
func (e *ExitError) ExitStatus() int { return e.Status }

func failed(err error) error { return &ExitError{Status: StatusFailed, Err: err} }

// output serializes the lines of every connection of a run (a persistent
// server's connections print at the same time).
type output struct {
	mu     sync.Mutex
	stdout io.Writer
	stderr io.Writer
	debug  bool
}

func newOutput(o *Options) *output {
	out := &output{stdout: o.Stdout, stderr: o.Stderr, debug: o.Debug}
	if out.stdout == nil {
		out.stdout = io.Discard
	}
	if out.stderr == nil {
		out.stderr = io.Discard
	}
	return out
}

// outf prints to standard output (rping's printf).
func (o *output) outf(format string, args ...any) {
	o.mu.Lock()
	fmt.Fprintf(o.stdout, format, args...)
	o.mu.Unlock()
}

// errf prints to standard error (rping's fprintf(stderr) and perror).
func (o *output) errf(format string, args ...any) {
	o.mu.Lock()
	fmt.Fprintf(o.stderr, format, args...)
	o.mu.Unlock()
}

// debugf prints with -d, to standard output like rping's DEBUG_LOG.
func (o *output) debugf(format string, args ...any) {
	if o.debug {
		o.outf(format, args...)
	}
}

// cause prints the line that says what rping's own lines leave unsaid.
func (o *output) cause(err error) {
	o.errf("siwtun ping: %v\n", err)
}

// errnoOf is the errno behind err, or 0.
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return 0
}

// strerror spells an errno as the C library does ("Connection refused").
func strerror(errno syscall.Errno) string {
	s := errno.Error()
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// state is rping's test_state, numbered as rping numbers it: its error
// lines print the number ("wait for RDMA_READ_ADV state 10").
type state int

const (
	stateIdle state = iota + 1
	stateConnectRequest
	stateAddrResolved
	stateRouteResolved
	stateConnected
	stateReadAdv
	stateReadComplete
	stateWriteAdv
	stateWriteComplete
	stateDisconnected
	stateError
)
