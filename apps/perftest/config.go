package perftest

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// Verb is the operation a test measures.
type Verb int

// The verbs, with perftest's names.
const (
	Send Verb = iota
	Write
	Read
	// Atomic is ib_atomic_bw: RFC 7306 Fetch-and-Add or Compare-and-Swap
	// (Config.AtomicType) of 8 bytes, siwtun peers only.
	Atomic
)

// AtomicType is the operation of an Atomic test (perftest's -A).
type AtomicType int

// The atomic operations, with perftest's names.
const (
	FetchAndAdd AtomicType = iota
	CmpAndSwap
)

// String is perftest's name of the operation.
func (a AtomicType) String() string {
	if a == CmpAndSwap {
		return "CMP_AND_SWAP"
	}
	return "FETCH_AND_ADD"
}

// ParseAtomicType parses "FETCH_AND_ADD" or "CMP_AND_SWAP".
func ParseAtomicType(s string) (AtomicType, error) {
	switch s {
	case "FETCH_AND_ADD":
		return FetchAndAdd, nil
	case "CMP_AND_SWAP":
		return CmpAndSwap, nil
	}
	return 0, fmt.Errorf("%w: atomic type %q: want FETCH_AND_ADD or CMP_AND_SWAP", ErrConfig, s)
}

// perftest's atomic operands (ATOMIC_ADD_VALUE, ATOMIC_SWAP_VALUE).
const (
	atomicAddValue  = 1
	atomicSwapValue = 0
)

// String is perftest's name of the verb (testsStr).
func (v Verb) String() string {
	switch v {
	case Send:
		return "Send"
	case Write:
		return "RDMA_Write"
	case Read:
		return "RDMA_Read"
	case Atomic:
		return "Atomic"
	}
	return fmt.Sprintf("Verb(%d)", int(v))
}

// ParseVerb parses "write", "read", "send" or "atomic".
func ParseVerb(s string) (Verb, error) {
	switch s {
	case "atomic":
		return Atomic, nil
	case "send":
		return Send, nil
	case "write":
		return Write, nil
	case "read":
		return Read, nil
	}
	return 0, fmt.Errorf("unknown test %q: want write, read, send or atomic", s)
}

// perftest's defaults and limits (perftest_parameters.h).
const (
	DefaultPort   = 18515
	defSizeBW     = 65536
	defSizeLat    = 2
	defItersWrite = 5000 // write bandwidth
	defIters      = 1000
	defTxBW       = 128
	defTxLat      = 1
	defRxSend     = 512
	defRxRDMA     = 1
	defCQMod      = 100
	// cqModLimit: above this message size perftest signals every request
	// (a batched completion would hide the last message's time).
	cqModLimit   = 8192
	defInlineWr  = 220 // latency tests
	defInlineSnd = 236
	minIters     = 5
	maxIters     = 100000000
	maxTx        = 15000
	maxRx        = 16384
	maxQPs       = 16384
	maxSizeAll   = 1 << 23 // -a runs 2 .. 2^23
	maxSize      = 1 << 30
	cacheLine    = 64
)

// Config is a test's parameters, named as perftest's flags. Zero values take
// perftest's defaults (except Inline, where a negative value does);
// Normalize applies them and checks the rest.
type Config struct {
	Verb Verb
	// Latency runs the latency test (ib_*_lat) instead of bandwidth.
	Latency bool
	// Imm makes a Write test use RDMA Write with Immediate Data (--imm,
	// perftest's --write_with_imm; RFC 7306, siwtun peers only): each
	// message also consumes a receive at the peer, which the receiver
	// posts and polls as in a Send test (receive credits included).
	Imm bool
	// Spin makes a Write latency test wait for the peer's Write as
	// perftest's run_iter_lat_write does: a pure busy loop on the buffer's
	// last byte that never gives up the processor (--spin). By default the
	// wait yields the processor after a short spin, which on a machine with
	// fewer cores than busy processes leaves the RNIC daemons the processor
	// they need. Waits for completions are the same either way.
	Spin bool
	// AtomicType is an Atomic test's operation (-A).
	AtomicType AtomicType
	// Size is the message size (-s); an Atomic test's is 8.
	Size int
	// All runs every size from 2 to 2^23 (-a).
	All bool
	// Iters is the number of messages per size (-n).
	Iters int
	// Duration runs for this long instead of Iters (-D, whole seconds).
	Duration time.Duration
	// QPs is the number of test queue pairs (-q, bandwidth tests).
	QPs int
	// TxDepth is the send queue depth (-t).
	TxDepth int
	// RxDepth is the receive queue depth of send tests (-r).
	RxDepth int
	// Inline is the largest message sent inline (-I); negative: perftest's
	// default (none in bandwidth tests, 220 bytes for Write and 236 for
	// Send latency, at most the device's limit).
	Inline int
	// OutReads is the number of outstanding RDMA Reads (-o); 0: the
	// device maximum.
	OutReads int
	// Bidirectional measures both directions at once (-b).
	Bidirectional bool
	// Gbits reports Gb/s instead of MiB/s (--report_gbits).
	Gbits bool
	// LegacyUnits prints perftest 4.5's "MB/sec" column names (the same
	// MiB-based figures) for parsers that expect them.
	LegacyUnits bool
	// JSON prints one JSON document at the end instead of the text.
	JSON bool
	// SettleDelay is how long a client waits after the control
	// connection before its first message (ib_write_bw sleeps 1 s there;
	// Linux siw can leave an FPDU unread that arrives right after its MPA
	// Reply).
	SettleDelay time.Duration
	// ConnectRetries and ConnectRetryDelay bound the client's attempts to
	// connect the test queue pairs while the server starts listening for
	// them (perftest: 10 tries, 100 ms apart).
	ConnectRetries    int
	ConnectRetryDelay time.Duration
	// Stamps, when set, makes a Write latency test (not Imm, one size)
	// record the application's stamps of the round trip's anatomy
	// (siwtun perf --anatomy).
	Stamps *Stamps

	// trace, when set (by tests), sees every control message: its
	// direction and length.
	trace func(sent bool, n int)
	// allUpTo, when set (by tests), ends -a's sizes there instead of 2^23.
	allUpTo int
}

// Stamps are a Write latency test's application stamps: the time of each
// post and of each sight of the peer's Write, read from Clock (the clock
// the daemons stamp their hops with).
type Stamps struct {
	// Clock reads the clock (CLOCK_MONOTONIC nanoseconds).
	Clock func() int64
	// Start, if set, is called once before the run's first message, with
	// the test connection's endpoints (to start the daemons' recording).
	Start func(local, remote netip.AddrPort) error
	// Local and Remote are the test connection's endpoints; Posts and
	// Seen the stamps, in order. The run fills them.
	Local, Remote netip.AddrPort
	Posts, Seen   []int64
}

// begin readies st for a run of about n messages on qp and calls Start.
func (st *Stamps) begin(qp *verbs.QP, n int) error {
	info := qp.Info()
	st.Local, st.Remote = info.Local, info.Remote
	st.Posts, st.Seen = make([]int64, 0, n+1), make([]int64, 0, n+1)
	if st.Start != nil {
		return st.Start(st.Local, st.Remote)
	}
	return nil
}

// NominalDeviceAttr has the limits every siwtun device has (verbs'
// constants), for checking a Config before a device is open.
func NominalDeviceAttr() verbs.DeviceAttr {
	return verbs.DeviceAttr{MaxInline: verbs.MaxInline, MaxQPRdAtom: verbs.MaxIRDORD, MaxQPInitRdAtom: verbs.MaxIRDORD}
}

// ErrConfig marks an invalid parameter.
var ErrConfig = errors.New("invalid parameter")

func badf(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
}

// Normalize returns c with perftest's defaults and dependencies applied
// (perftest_parameters.c: init_perftest_params, force_dependecies), or an
// error naming the bad parameter. dev gives the device limits.
func (c Config) Normalize(dev verbs.DeviceAttr) (Config, error) {
	if c.Verb != Send && c.Verb != Write && c.Verb != Read && c.Verb != Atomic {
		return c, badf("verb %d", int(c.Verb))
	}
	if c.Stamps != nil && (c.Verb != Write || !c.Latency || c.Imm || c.All) {
		return c, badf("the anatomy is taken of the RDMA Write latency test of one size (write --lat, no --imm, no --all)")
	}
	if c.Verb == Atomic {
		if c.Latency {
			return c, badf("atomic tests measure bandwidth only (ib_atomic_bw)")
		}
		if c.All || c.Size != 0 && c.Size != 8 {
			return c, badf("atomic tests move 8 bytes (no --size, no --all)")
		}
		c.Size = 8
	} else if c.AtomicType != FetchAndAdd {
		return c, badf("--atomic_type applies to atomic tests only")
	}
	if c.Imm && c.Verb != Write {
		return c, badf("--imm applies to RDMA Write tests only")
	}
	if c.Spin && (c.Verb != Write || c.Imm || !c.Latency) {
		return c, badf("--spin applies to RDMA Write latency tests only (without --imm)")
	}
	if c.Size < 0 {
		return c, badf("size %d: must be positive", c.Size)
	}
	if c.Size > 0 && c.All {
		return c, badf("--size and --all exclude each other")
	}
	if c.Size == 0 {
		c.Size = defSizeBW
		if c.Latency {
			c.Size = defSizeLat
		}
	}
	if c.Size > maxSize {
		return c, badf("size %d: at most %d", c.Size, maxSize)
	}
	if c.All {
		c.Size = maxSizeAll
		if c.allUpTo > 0 {
			c.Size = c.allUpTo
		}
	}
	if c.Duration < 0 {
		return c, badf("duration %v: must be positive", c.Duration)
	}
	if c.Duration > 0 {
		if c.Duration%time.Second != 0 {
			return c, badf("duration %v: whole seconds", c.Duration)
		}
		if c.All {
			return c, badf("--duration does not run on all sizes (--all)")
		}
		if c.Iters != 0 {
			return c, badf("--iters and --duration exclude each other")
		}
	}
	if c.Iters == 0 && c.Duration == 0 {
		c.Iters = defIters
		if c.Verb == Write && !c.Latency {
			c.Iters = defItersWrite
		}
	}
	if c.Duration == 0 && (c.Iters < minIters || c.Iters > maxIters) {
		return c, badf("iterations %d: want %d..%d", c.Iters, minIters, maxIters)
	}
	if c.QPs == 0 {
		c.QPs = 1
	}
	if c.QPs < 1 || c.QPs > maxQPs {
		return c, badf("queue pairs %d: want 1..%d", c.QPs, maxQPs)
	}
	if c.Latency && c.QPs != 1 {
		return c, badf("latency tests run on one queue pair (--qp %d)", c.QPs)
	}
	if c.Latency && c.Bidirectional {
		return c, badf("--bidirectional is only available in bandwidth tests")
	}
	if c.TxDepth == 0 {
		c.TxDepth = defTxBW
		if c.Latency {
			c.TxDepth = defTxLat
		}
	}
	if c.TxDepth < 1 || c.TxDepth > maxTx {
		return c, badf("tx depth %d: want 1..%d", c.TxDepth, maxTx)
	}
	if c.RxDepth != 0 && !c.recvs() {
		return c, badf("--rx-depth applies to send and write --imm tests only")
	}
	if c.RxDepth == 0 {
		c.RxDepth = defRxRDMA
		if c.recvs() {
			c.RxDepth = defRxSend
		}
	}
	if c.RxDepth < 1 || c.RxDepth > maxRx {
		return c, badf("rx depth %d: want 1..%d", c.RxDepth, maxRx)
	}
	if c.Duration == 0 {
		c.TxDepth = min(c.TxDepth, c.Iters)
		if c.recvs() {
			c.RxDepth = min(c.RxDepth, c.Iters)
		}
	}
	if c.recvs() && !c.Latency && c.RxDepth < 3 {
		return c, badf("rx depth %d: send and write --imm bandwidth tests need at least 3 (credits every third)", c.RxDepth)
	}
	switch {
	case c.Verb == Read || c.Verb == Atomic:
		if c.Inline > 0 {
			what := "RDMA Read"
			if c.Verb == Atomic {
				what = "atomic tests"
			}
			return c, badf("--inline_size does not apply to %s", what)
		}
		c.Inline = 0
	case c.Inline < 0:
		c.Inline = 0
		if c.Latency {
			c.Inline = defInlineSnd
			if c.Verb == Write {
				c.Inline = defInlineWr
			}
			c.Inline = min(c.Inline, dev.MaxInline)
		}
	case c.Inline > dev.MaxInline:
		return c, badf("inline size %d: the device allows %d", c.Inline, dev.MaxInline)
	}
	if c.readsOut() {
		max := dev.MaxQPRdAtom
		if c.OutReads == 0 {
			c.OutReads = max
		}
		if c.OutReads < 1 || c.OutReads > max {
			return c, badf("outstanding reads %d: want 1..%d", c.OutReads, max)
		}
	} else {
		if c.OutReads != 0 {
			return c, badf("--outs applies to RDMA Read and atomic tests only")
		}
		c.OutReads = 1
	}
	if c.SettleDelay < 0 || c.ConnectRetries < 0 || c.ConnectRetryDelay < 0 {
		return c, badf("negative settle delay or connect retries")
	}
	if c.ConnectRetries == 0 {
		c.ConnectRetries = 10
	}
	if c.ConnectRetryDelay == 0 {
		c.ConnectRetryDelay = 100 * time.Millisecond
	}
	return c, nil
}

// readsOut reports whether the test's requests are answered by the peer
// and so bounded by the outstanding reads (ORD): RDMA Read and atomics.
func (c *Config) readsOut() bool { return c.Verb == Read || c.Verb == Atomic }

// recvs reports whether the receiver of the test's messages consumes
// receives: Send tests and Write tests with immediate data.
func (c *Config) recvs() bool { return c.Verb == Send || c.Imm }

// cqMod is the completion moderation: one signaled request in cqMod.
func (c *Config) cqMod() int {
	m := defCQMod
	if c.Size > cqModLimit && !c.All {
		m = 1
	}
	return min(m, c.TxDepth)
}

// sizes lists the message sizes of the run.
func (c *Config) sizes() []int {
	if !c.All {
		return []int{c.Size}
	}
	var s []int
	for i := 1; 1<<i <= c.Size; i++ {
		s = append(s, 1<<i)
	}
	return s
}

// margin is the part of each end of a timed run left out of the
// measurement: a quarter of the duration, in whole seconds, as perftest.
func (c *Config) margin() time.Duration {
	return (c.Duration / 4).Truncate(time.Second)
}

// noPeak reports whether the peak bandwidth is not measured.
func (c *Config) noPeak(server bool) bool {
	return c.Duration > 0 || (c.recvs() && server && !c.Bidirectional)
}
