package ctl

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/siwtun/siwtun/apps/tcpperf"
	"github.com/siwtun/siwtun/netstack"
)

// The tcpperf op makes the daemon's own TCP/IP stack (gVisor's netstack,
// the one its RNIC runs on) the endpoint of a plain TCP workload: `siwtun
// bench` measures raw gVisor TCP through the same TUN devices and stacks
// as the RNIC's traffic, the engine's floor. The request blocks until the
// workload is over and answers with its tcpperf.Result.

// Roles of a TCPPerfRequest.
const (
	// TCPPerfServer listens on Addr, serves one connection and answers.
	TCPPerfServer = "server"
	// TCPPerfClient connects to Addr, runs the workload and answers.
	TCPPerfClient = "client"
)

// Bounds of the tcpperf op.
const (
	// TCPPerfMaxDuration bounds a client's run.
	TCPPerfMaxDuration = 60 * time.Second
	// tcpPerfAcceptTimeout bounds a server's wait for its client.
	tcpPerfAcceptTimeout = 20 * time.Second
	// tcpPerfConnectTimeout bounds a client's attempts to reach a server
	// that is not listening yet.
	tcpPerfConnectTimeout = 10 * time.Second
	// tcpPerfSlack is added to the run's duration for the server's read
	// deadline and the client's wait for the answer.
	tcpPerfSlack = 30 * time.Second
)

// TCPPerfRequest is the workload of an OpTCPPerf request.
type TCPPerfRequest struct {
	// Role is TCPPerfServer or TCPPerfClient.
	Role string `json:"role"`
	// Addr is the address and port on the RNIC's stack to listen on
	// (server) or the server's (client).
	Addr string `json:"addr"`
	// Mode is "bulk" or "rr" (client only; the server follows the client).
	Mode string `json:"mode,omitempty"`
	// Size is the message size in bytes (client only).
	Size int `json:"size,omitempty"`
	// DurationMS is the client's run time in milliseconds.
	DurationMS int `json:"duration_ms,omitempty"`
}

// Check validates r.
func (r TCPPerfRequest) Check() error {
	if _, err := netip.ParseAddrPort(r.Addr); err != nil {
		return fmt.Errorf("tcpperf: addr %q: want address:port", r.Addr)
	}
	switch r.Role {
	case TCPPerfServer:
		if r.Mode != "" || r.Size != 0 || r.DurationMS != 0 {
			return errors.New("tcpperf: a server takes only addr (the client chooses the workload)")
		}
		return nil
	case TCPPerfClient:
	default:
		return fmt.Errorf("tcpperf: role %q: want server or client", r.Role)
	}
	if _, err := tcpperf.ParseMode(r.Mode); err != nil {
		return fmt.Errorf("tcpperf: %w", err)
	}
	if r.Size < 1 || r.Size > tcpperf.MaxSize {
		return fmt.Errorf("tcpperf: size %d: want 1..%d", r.Size, tcpperf.MaxSize)
	}
	if r.DurationMS < 1 || time.Duration(r.DurationMS)*time.Millisecond > TCPPerfMaxDuration {
		return fmt.Errorf("tcpperf: duration_ms %d: want 1..%d", r.DurationMS, TCPPerfMaxDuration.Milliseconds())
	}
	return nil
}

// TCPPerfProvider is a Provider whose device can run the tcpperf op; the
// engine's provider is one.
type TCPPerfProvider interface {
	// TCPPerf runs r (already checked) and returns what it measured.
	TCPPerf(r TCPPerfRequest) (tcpperf.Result, error)
}

func (s *Server) tcpPerf(r TCPPerfRequest) Response {
	p, ok := s.p.(TCPPerfProvider)
	if !ok {
		return errorResponse(errors.New("tcpperf: this device cannot run TCP workloads"))
	}
	res, err := p.TCPPerf(r)
	if err != nil {
		return errorResponse(err)
	}
	return Response{OK: true, TCPPerf: &res}
}

// TCPPerf implements TCPPerfProvider on the engine's TCP/IP stack.
func (p *engineProvider) TCPPerf(r TCPPerfRequest) (tcpperf.Result, error) {
	addr, _ := netip.ParseAddrPort(r.Addr)
	st := p.eng.Stack()
	if r.Role == TCPPerfServer {
		return tcpPerfServe(st, addr)
	}
	mode, _ := tcpperf.ParseMode(r.Mode)
	d := time.Duration(r.DurationMS) * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), tcpPerfConnectTimeout)
	defer cancel()
	c, err := tcpPerfDial(ctx, st, addr)
	if err != nil {
		return tcpperf.Result{}, err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(d + tcpPerfSlack))
	return tcpperf.Run(c, tcpperf.Header{Mode: mode, Size: r.Size}, d)
}

func tcpPerfServe(st *netstack.Stack, addr netip.AddrPort) (tcpperf.Result, error) {
	l, err := st.Listen(addr)
	if err != nil {
		return tcpperf.Result{}, fmt.Errorf("tcpperf: listen on %v: %w", addr, err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), tcpPerfAcceptTimeout)
	defer cancel()
	c, err := l.Accept(ctx)
	if err != nil {
		return tcpperf.Result{}, fmt.Errorf("tcpperf: accept on %v: %w", addr, err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(TCPPerfMaxDuration + tcpPerfSlack))
	return tcpperf.Serve(c)
}

// tcpPerfDial connects, trying again while the server is not listening
// yet (it is started by another request, on another daemon).
func tcpPerfDial(ctx context.Context, st *netstack.Stack, addr netip.AddrPort) (*netstack.Conn, error) {
	for {
		c, err := st.Dial(ctx, netip.Addr{}, addr)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
			return nil, fmt.Errorf("tcpperf: connect to %v: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("tcpperf: connect to %v: %w", addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TCPPerf asks the daemon to run a TCP workload on its own stack and waits
// for the result (a server's request returns once its client is done).
func (c *Client) TCPPerf(r TCPPerfRequest) (tcpperf.Result, error) {
	if err := r.Check(); err != nil {
		return tcpperf.Result{}, err
	}
	timeout := tcpPerfConnectTimeout + time.Duration(r.DurationMS)*time.Millisecond + tcpPerfSlack
	if r.Role == TCPPerfServer {
		timeout = tcpPerfAcceptTimeout + TCPPerfMaxDuration + tcpPerfSlack
	}
	resp, err := c.call(Request{Op: OpTCPPerf, TCPPerf: &r}, timeout)
	if err != nil {
		return tcpperf.Result{}, err
	}
	if resp.TCPPerf == nil {
		return tcpperf.Result{}, fmt.Errorf("%s: response without tcpperf", c.dev)
	}
	return *resp.TCPPerf, nil
}
