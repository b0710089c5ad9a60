package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
)

// floodKinds are the connection attempts of a flood, in turn: a TCP
// connect closed at once; one reset at once (SO_LINGER 0); one that sends
// nothing and waits; one that sends the first 10 octets of an MPA Request
// (inside its key) and waits; one that sends the whole 20-octet header of
// a Request announcing 64 octets of private data, and 16 of them, then
// waits. The last three are the half-open handshakes the responder must
// reap on its own timer without answering them.
var floodKinds = []string{"close", "reset", "silent", "cut-key", "cut-private"}

// floodHeld reports whether a kind waits for the responder to end it.
func floodHeld(kind string) bool { return kind != "close" && kind != "reset" }

// floodResult is what one attempt saw.
type floodResult struct {
	kind      string
	connErr   error
	answered  int           // octets the responder sent
	closed    bool          // the responder closed or reset the connection
	heldFor   time.Duration // until it did
	timedOut  bool          // still open after hold
	otherFail error
}

// flood makes n connection attempts to addr, conc at a time, of each kind
// in turn, holding the half-open ones up to hold for the responder to end
// them, and prints per kind: attempts, connects that failed, connections
// answered (must be 0), closed by the responder, still open after hold
// (must be 0), and how long the responder took (min, median, max). It
// exits 1 if any half-open connection was answered or outlived hold.
func flood(args []string) error {
	if len(args) != 4 {
		return errors.New("flood needs N CONCURRENCY HOLD ADDR:PORT")
	}
	n, err1 := strconv.Atoi(args[0])
	conc, err2 := strconv.Atoi(args[1])
	hold, err3 := time.ParseDuration(args[2])
	if err := errors.Join(err1, err2, err3); err != nil || n < 1 || conc < 1 || hold <= 0 {
		return fmt.Errorf("flood %v: bad N, CONCURRENCY or HOLD (%v)", args[:3], err)
	}
	addr := args[3]
	req, _ := (&mpa.Frame{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PrivateData: make([]byte, 56)}).Append(nil)
	results := make([]floodResult, n)
	work := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for i := range work {
				results[i] = floodOne(floodKinds[i%len(floodKinds)], addr, req, hold)
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	fmt.Printf("attempts: %d\nconcurrency: %d\nelapsed: %.1fs\n", n, conc, time.Since(start).Seconds())
	var bad []string
	for _, k := range floodKinds {
		if msg := reportKind(k, results, hold); msg != "" {
			bad = append(bad, msg)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("half-open connections not reaped unanswered: %v", bad)
	}
	return nil
}

// reportKind prints what the attempts of kind k saw, and says what went
// wrong ("" if nothing): an attempt the responder must end (floodHeld)
// that it answered, or left open past hold.
func reportKind(k string, results []floodResult, hold time.Duration) string {
	var att, connFail, answered, closed, open, other int
	var held []time.Duration
	var firstErr error
	for _, r := range results {
		if r.kind != k {
			continue
		}
		att++
		switch {
		case r.connErr != nil:
			connFail++
			if firstErr == nil {
				firstErr = r.connErr
			}
			continue
		case r.otherFail != nil:
			other++
			if firstErr == nil {
				firstErr = r.otherFail
			}
		}
		if r.answered > 0 {
			answered++
		}
		if r.closed {
			closed++
			held = append(held, r.heldFor)
		}
		if r.timedOut {
			open++
		}
	}
	fmt.Printf("%s: attempts %d connect_failed %d answered %d closed_by_responder %d still_open %d other_errors %d", k, att, connFail, answered, closed, open, other)
	if len(held) > 0 {
		sort.Slice(held, func(i, j int) bool { return held[i] < held[j] })
		fmt.Printf(" held_min %.2fs held_median %.2fs held_max %.2fs", held[0].Seconds(), held[len(held)/2].Seconds(), held[len(held)-1].Seconds())
	}
	fmt.Println()
	if firstErr != nil {
		fmt.Printf("%s: first error: %v\n", k, firstErr)
	}
	if floodHeld(k) && (answered > 0 || open > 0 || closed+connFail+other != att) {
		return fmt.Sprintf("%s: %d answered, %d still open after %v", k, answered, open, hold)
	}
	return ""
}

func floodOne(kind, addr string, req []byte, hold time.Duration) floodResult {
	r := floodResult{kind: kind}
	c, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		r.connErr = err
		return r
	}
	defer c.Close()
	switch kind {
	case "close":
		return r
	case "reset":
		c.(*net.TCPConn).SetLinger(0)
		return r
	case "cut-key":
		_, err = c.Write(req[:10])
	case "cut-private":
		_, err = c.Write(req[:mpa.FrameHeaderLen+16])
	}
	if err != nil {
		r.otherFail = fmt.Errorf("write: %w", err)
		return r
	}
	t0 := time.Now()
	c.SetReadDeadline(t0.Add(hold))
	got, err := io.ReadAll(c)
	r.answered = len(got)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		r.timedOut = true
	case err == nil, isReset(err):
		r.closed, r.heldFor = true, time.Since(t0)
	default:
		r.otherFail = err
	}
	return r
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
