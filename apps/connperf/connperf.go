// Package connperf is the connection set-up workload of `siwtun bench`: a
// client that opens connections one after the other and keeps them, and a
// server that accepts them, over an RNIC's verbs (a new queue pair per
// connection, connected with MPA over the RNIC's TCP) or over the kernel's
// TCP (a socket per connection), so both are measured the same way.
//
// A client times each connect, from the call until the connection is
// established (verbs: QP.Connect's return, after the TCP handshake, the
// MPA Request and the server application's Accept; kernel TCP: Dial's
// return, after the TCP handshake), and reports the median and the rate:
// connections divided by the time from the first connect's start to the
// last one's end, which for verbs includes creating each queue pair. The
// connections stay open until the caller closes them, so that many
// clients at once add up and the daemons' memory can be read with every
// connection idle.
package connperf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// Transports a Result names.
const (
	// TransportVerbs is an RNIC's connection: a queue pair connected with
	// MPA over the RNIC's own TCP.
	TransportVerbs = "verbs"
	// TransportTCP is a kernel TCP socket.
	TransportTCP = "tcp"
)

// Result is what a client measured.
type Result struct {
	Transport   string `json:"transport"`
	Connections int    `json:"connections"`
	// Start and End are the wall-clock times (Unix nanoseconds) at which
	// the first connect began and the last one ended, so that the rates of
	// clients in several processes add up over their common span.
	Start int64 `json:"start_unix_ns"`
	End   int64 `json:"end_unix_ns"`
	// Seconds is End - Start; PerSecond is Connections / Seconds.
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	// MedianUS, P99US and MaxUS are the connect times in microseconds.
	MedianUS float64 `json:"connect_median_us"`
	P99US    float64 `json:"connect_p99_us"`
	MaxUS    float64 `json:"connect_max_us"`
}

// result summarises the connect times of a run that began at start.
func result(transport string, start time.Time, times []time.Duration) Result {
	end := time.Now()
	r := Result{Transport: transport, Connections: len(times), Start: start.UnixNano(), End: end.UnixNano(),
		Seconds: end.Sub(start).Seconds()}
	if r.Seconds > 0 {
		r.PerSecond = float64(len(times)) / r.Seconds
	}
	if len(times) > 0 {
		s := slices.Clone(times)
		slices.Sort(s)
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		r.MedianUS, r.P99US, r.MaxUS = us(s[len(s)/2]), us(s[min(len(s)-1, len(s)*99/100)]), us(s[len(s)-1])
	}
	return r
}

// Span is the rate of several clients' results together: their
// connections over the time from the earliest start to the latest end.
func Span(rs []Result) (connections int, perSecond float64) {
	if len(rs) == 0 {
		return 0, 0
	}
	start, end := rs[0].Start, rs[0].End
	for _, r := range rs {
		connections += r.Connections
		start, end = min(start, r.Start), max(end, r.End)
	}
	if end > start {
		perSecond = float64(connections) / (float64(end-start) / 1e9)
	}
	return connections, perSecond
}

// qpAttr is the queue pair of every connection: one work request each
// way, which nothing posts (the connections stay idle).
func qpAttr(cq *verbs.CQ) verbs.QPInitAttr {
	return verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1}
}

// VerbsConns are the queue pairs of a verbs client or server, with the
// protection domain and completion queue they share.
type VerbsConns struct {
	pd  *verbs.PD
	cq  *verbs.CQ
	qps []*verbs.QP
}

func newVerbsConns(dev *verbs.Device) (*VerbsConns, error) {
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	cq, err := dev.CreateCQ(16)
	if err != nil {
		pd.Dealloc()
		return nil, err
	}
	return &VerbsConns{pd: pd, cq: cq}, nil
}

// Len is the number of queue pairs.
func (c *VerbsConns) Len() int { return len(c.qps) }

// Close destroys every queue pair (disconnecting it), the completion
// queue and the protection domain.
func (c *VerbsConns) Close() error {
	var errs []error
	for _, qp := range c.qps {
		errs = append(errs, qp.Destroy())
	}
	c.qps = nil
	errs = append(errs, c.cq.Destroy(), c.pd.Dealloc())
	return errors.Join(errs...)
}

// DialVerbs connects n new queue pairs of dev to addr, one after the
// other, and returns them connected with the times.
func DialVerbs(ctx context.Context, dev *verbs.Device, addr netip.AddrPort, n int) (*VerbsConns, Result, error) {
	c, err := newVerbsConns(dev)
	if err != nil {
		return nil, Result{}, err
	}
	times := make([]time.Duration, 0, n)
	start := time.Now()
	for i := range n {
		qp, err := c.pd.CreateQP(qpAttr(c.cq))
		if err != nil {
			c.Close()
			return nil, Result{}, fmt.Errorf("connection %d: create QP: %w", i, err)
		}
		c.qps = append(c.qps, qp)
		t0 := time.Now()
		if err := qp.Connect(ctx, addr, verbs.ConnParam{}); err != nil {
			c.Close()
			return nil, Result{}, fmt.Errorf("connection %d: %w", i, err)
		}
		times = append(times, time.Since(t0))
	}
	return c, result(TransportVerbs, start, times), nil
}

// AcceptVerbs accepts n connections on l, each with a new queue pair of
// dev, and returns them.
func AcceptVerbs(ctx context.Context, dev *verbs.Device, l *verbs.Listener, n int) (*VerbsConns, error) {
	c, err := newVerbsConns(dev)
	if err != nil {
		return nil, err
	}
	for i := range n {
		req, err := l.Accept(ctx)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		qp, err := c.pd.CreateQP(qpAttr(c.cq))
		if err != nil {
			req.Reject(nil)
			c.Close()
			return nil, fmt.Errorf("connection %d: create QP: %w", i, err)
		}
		c.qps = append(c.qps, qp)
		if err := req.Accept(qp, verbs.ConnParam{}); err != nil {
			c.Close()
			return nil, fmt.Errorf("connection %d: accept: %w", i, err)
		}
	}
	return c, nil
}

// WaitDisconnected waits until every queue pair has been disconnected (its
// peer went), or ctx ends.
func (c *VerbsConns) WaitDisconnected(ctx context.Context) error {
	left := slices.Clone(c.qps)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for len(left) > 0 {
		left = slices.DeleteFunc(left, func(qp *verbs.QP) bool {
			for {
				select {
				case e := <-qp.Events():
					if e.Type == verbs.EventDisconnected {
						return true
					}
					continue
				default:
				}
				return false
			}
		})
		if len(left) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d connections still up: %w", len(left), len(c.qps), ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// TCPConns are the sockets of a kernel TCP client or server.
type TCPConns struct {
	conns []net.Conn
}

// Len is the number of connections.
func (c *TCPConns) Len() int { return len(c.conns) }

// Close closes every connection.
func (c *TCPConns) Close() error {
	var errs []error
	for _, x := range c.conns {
		errs = append(errs, x.Close())
	}
	c.conns = nil
	return errors.Join(errs...)
}

// DialTCP opens n kernel TCP connections to addr, one after the other.
func DialTCP(ctx context.Context, addr string, n int) (*TCPConns, Result, error) {
	c := &TCPConns{}
	var d net.Dialer
	times := make([]time.Duration, 0, n)
	start := time.Now()
	for i := range n {
		t0 := time.Now()
		x, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			c.Close()
			return nil, Result{}, fmt.Errorf("connection %d: %w", i, err)
		}
		times = append(times, time.Since(t0))
		c.conns = append(c.conns, x)
	}
	return c, result(TransportTCP, start, times), nil
}

// AcceptTCP accepts n connections on l.
func AcceptTCP(l net.Listener, n int) (*TCPConns, error) {
	c := &TCPConns{}
	for i := range n {
		x, err := l.Accept()
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		c.conns = append(c.conns, x)
	}
	return c, nil
}

// WaitClosed waits until the peer has closed every connection (each
// reads to EOF), or ctx ends.
func (c *TCPConns) WaitClosed(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, x := range c.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.Copy(io.Discard, x)
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		c.Close() // ends the readers
		<-done
		return ctx.Err()
	}
}
