// Package tcpperf is the TCP workload of `siwtun bench`: a bulk transfer
// and a request/response ping-pong over any TCP connection, so that the
// kernel's TCP (net.TCPConn) and the RNIC's own gVisor TCP (netstack.Conn)
// are measured by the same code.
//
// The client opens the connection and sends a 12-byte header: the magic
// "STPF", the mode (1 bulk, 2 request/response), three zero bytes and the
// message size (4 bytes, big-endian). Then:
//
//   - bulk: the client writes messages of the size until its duration has
//     passed, then sends FIN; the server reads (copying into a buffer of the
//     size) until EOF and answers with a 16-byte Summary: the bytes it read
//     and the nanoseconds from its first byte to EOF (8 bytes each,
//     big-endian). Both sides report the receiver's figures.
//   - request/response: the client writes one message and reads the
//     server's echo of it, timing each round trip, until its duration has
//     passed, then sends FIN; the server echoes each whole message until
//     EOF.
package tcpperf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/siwtun/siwtun/ctl"
)

// Mode is the workload.
type Mode uint8

// The workloads.
const (
	// Bulk is a one-way transfer measured at the receiver.
	Bulk Mode = 1
	// RR is request/response: one message there, the same back.
	RR Mode = 2
)

// String names the mode as the command line does: "bulk" or "rr".
func (m Mode) String() string {
	switch m {
	case Bulk:
		return "bulk"
	case RR:
		return "rr"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode parses "bulk" or "rr".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "bulk":
		return Bulk, nil
	case "rr":
		return RR, nil
	}
	return 0, fmt.Errorf("mode %q: want bulk or rr", s)
}

// Limits of the header.
const (
	// HeaderLen is the length of the client's header.
	HeaderLen = 12
	// SummaryLen is the length of the bulk server's answer.
	SummaryLen = 16
	// MaxSize is the largest message size: 16 MiB.
	MaxSize = ctl.TCPPerfMaxSize
)

var magic = [4]byte{'S', 'T', 'P', 'F'}

// Header is what the client asks for.
type Header struct {
	Mode Mode
	// Size is the message size in bytes, 1..MaxSize.
	Size int
}

// Marshal encodes h.
func (h Header) Marshal() [HeaderLen]byte {
	var b [HeaderLen]byte
	copy(b[:4], magic[:])
	b[4] = byte(h.Mode)
	binary.BigEndian.PutUint32(b[8:], uint32(h.Size))
	return b
}

// ParseHeader decodes and checks a header.
func ParseHeader(b []byte) (Header, error) {
	if len(b) != HeaderLen {
		return Header{}, fmt.Errorf("tcpperf header: %d bytes, want %d", len(b), HeaderLen)
	}
	if [4]byte(b[:4]) != magic {
		return Header{}, fmt.Errorf("tcpperf header: magic %q, want %q", b[:4], magic[:])
	}
	h := Header{Mode: Mode(b[4]), Size: int(binary.BigEndian.Uint32(b[8:]))}
	if h.Mode != Bulk && h.Mode != RR {
		return Header{}, fmt.Errorf("tcpperf header: unknown mode %d", b[4])
	}
	if b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return Header{}, errors.New("tcpperf header: reserved bytes not zero")
	}
	if h.Size < 1 || h.Size > MaxSize {
		return Header{}, fmt.Errorf("tcpperf header: size %d, want 1..%d", h.Size, MaxSize)
	}
	return h, nil
}

// Summary is the bulk receiver's account, sent back to the client.
type Summary struct {
	Bytes uint64
	Nanos uint64
}

// Marshal encodes s.
func (s Summary) Marshal() [SummaryLen]byte {
	var b [SummaryLen]byte
	binary.BigEndian.PutUint64(b[:8], s.Bytes)
	binary.BigEndian.PutUint64(b[8:], s.Nanos)
	return b
}

// ParseSummary decodes a summary.
func ParseSummary(b []byte) (Summary, error) {
	if len(b) != SummaryLen {
		return Summary{}, fmt.Errorf("tcpperf summary: %d bytes, want %d", len(b), SummaryLen)
	}
	return Summary{Bytes: binary.BigEndian.Uint64(b[:8]), Nanos: binary.BigEndian.Uint64(b[8:])}, nil
}

// Conn is a TCP connection: net.TCPConn and netstack.Conn both are one.
type Conn interface {
	io.ReadWriter
	// CloseWrite sends FIN; reading goes on.
	CloseWrite() error
}

// Result is what a run measured. Bulk fills Bytes, Seconds and MBps (the
// receiver's figures); request/response fills RoundTrips and the round
// trip times in microseconds.
type Result struct {
	Mode       string  `json:"mode"`
	Size       int     `json:"size"`
	Bytes      uint64  `json:"bytes"`
	Seconds    float64 `json:"seconds"`
	MBps       float64 `json:"mb_per_s,omitempty"`
	RoundTrips uint64  `json:"round_trips,omitempty"`
	RTTMedian  float64 `json:"rtt_median_us,omitempty"`
	RTTAvg     float64 `json:"rtt_avg_us,omitempty"`
	RTTP99     float64 `json:"rtt_p99_us,omitempty"`
}

// Run is the client: it sends h, runs the workload for d and returns the
// result. It does not close c.
func Run(c Conn, h Header, d time.Duration) (Result, error) {
	hb := h.Marshal()
	if _, err := ParseHeader(hb[:]); err != nil {
		return Result{}, err
	}
	if _, err := c.Write(hb[:]); err != nil {
		return Result{}, fmt.Errorf("tcpperf: send header: %w", err)
	}
	buf := make([]byte, h.Size)
	for i := range buf {
		buf[i] = byte(i)
	}
	if h.Mode == Bulk {
		return runBulk(c, buf, d)
	}
	return runRR(c, buf, d)
}

func runBulk(c Conn, buf []byte, d time.Duration) (Result, error) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if _, err := c.Write(buf); err != nil {
			return Result{}, fmt.Errorf("tcpperf: bulk write: %w", err)
		}
	}
	if err := c.CloseWrite(); err != nil {
		return Result{}, fmt.Errorf("tcpperf: close write: %w", err)
	}
	var sb [SummaryLen]byte
	if _, err := io.ReadFull(c, sb[:]); err != nil {
		return Result{}, fmt.Errorf("tcpperf: read the receiver's summary: %w", err)
	}
	s, _ := ParseSummary(sb[:])
	return bulkResult(len(buf), s), nil
}

func bulkResult(size int, s Summary) Result {
	r := Result{Mode: Bulk.String(), Size: size, Bytes: s.Bytes, Seconds: float64(s.Nanos) / 1e9}
	if s.Nanos > 0 {
		r.MBps = float64(s.Bytes) / r.Seconds / 1e6
	}
	return r
}

func runRR(c Conn, buf []byte, d time.Duration) (Result, error) {
	in := make([]byte, len(buf))
	var rtts []time.Duration
	start := time.Now()
	end := start.Add(d)
	for t := start; t.Before(end); {
		if _, err := c.Write(buf); err != nil {
			return Result{}, fmt.Errorf("tcpperf: request %d: %w", len(rtts), err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return Result{}, fmt.Errorf("tcpperf: response %d: %w", len(rtts), err)
		}
		now := time.Now()
		rtts = append(rtts, now.Sub(t))
		t = now
	}
	total := time.Since(start)
	if err := c.CloseWrite(); err != nil {
		return Result{}, fmt.Errorf("tcpperf: close write: %w", err)
	}
	// The server closes after our FIN; wait for it so its process ends
	// having served everything.
	io.Copy(io.Discard, c)
	return rrResult(len(buf), rtts, total), nil
}

func rrResult(size int, rtts []time.Duration, total time.Duration) Result {
	r := Result{Mode: RR.String(), Size: size, RoundTrips: uint64(len(rtts)),
		Bytes: 2 * uint64(size) * uint64(len(rtts)), Seconds: total.Seconds()}
	if len(rtts) == 0 {
		return r
	}
	s := slices.Clone(rtts)
	slices.Sort(s)
	var sum time.Duration
	for _, v := range s {
		sum += v
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	n := len(s)
	if n%2 == 0 {
		r.RTTMedian = (us(s[n/2-1]) + us(s[n/2])) / 2
	} else {
		r.RTTMedian = us(s[n/2])
	}
	r.RTTAvg = us(sum) / float64(n)
	r.RTTP99 = us(s[min(n-1, n*99/100)])
	return r
}

// Serve is the server for one connection: it reads the header, runs the
// workload until the client's FIN and returns what it saw. It does not
// close c.
func Serve(c Conn) (Result, error) {
	var hb [HeaderLen]byte
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		return Result{}, fmt.Errorf("tcpperf: read header: %w", err)
	}
	h, err := ParseHeader(hb[:])
	if err != nil {
		return Result{}, err
	}
	buf := make([]byte, h.Size)
	if h.Mode == Bulk {
		return serveBulk(c, buf)
	}
	return serveRR(c, buf)
}

func serveBulk(c Conn, buf []byte) (Result, error) {
	var s Summary
	var first time.Time
	for {
		n, err := c.Read(buf)
		if n > 0 && s.Bytes == 0 {
			first = time.Now()
		}
		s.Bytes += uint64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return Result{}, fmt.Errorf("tcpperf: bulk read after %d bytes: %w", s.Bytes, err)
		}
	}
	if s.Bytes > 0 {
		s.Nanos = uint64(time.Since(first))
	}
	sb := s.Marshal()
	if _, err := c.Write(sb[:]); err != nil {
		return Result{}, fmt.Errorf("tcpperf: send summary: %w", err)
	}
	return bulkResult(len(buf), s), c.CloseWrite()
}

func serveRR(c Conn, buf []byte) (Result, error) {
	var n uint64
	start := time.Now()
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			if err == io.EOF {
				break
			}
			return Result{}, fmt.Errorf("tcpperf: request %d: %w", n, err)
		}
		if _, err := c.Write(buf); err != nil {
			return Result{}, fmt.Errorf("tcpperf: response %d: %w", n, err)
		}
		n++
	}
	r := Result{Mode: RR.String(), Size: len(buf), RoundTrips: n, Bytes: 2 * n * uint64(len(buf)),
		Seconds: time.Since(start).Seconds()}
	return r, c.CloseWrite()
}
