package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// The tcpperf op makes the daemon's own TCP/IP stack (gVisor's netstack,
// the one its RNIC runs on) the endpoint of a plain TCP workload: `siwtun
// bench` measures raw gVisor TCP through the same TUN devices and stacks
// as the RNIC's traffic, the engine's floor. The request blocks until the
// workload is over and answers with what the workload measured (apps/tcpperf's Result).

// Roles of a TCPPerfRequest.
const (
	// TCPPerfServer listens on Addr, serves one connection and answers.
	TCPPerfServer = "server"
	// TCPPerfClient connects to Addr, runs the workload and answers.
	TCPPerfClient = "client"
)

// Bounds of the tcpperf op.
const (
	// TCPPerfMaxSize is the largest message of a client's run: 16 MiB.
	TCPPerfMaxSize = 16 << 20
	// TCPPerfMaxDuration bounds a client's run.
	TCPPerfMaxDuration = 60 * time.Second
	// TCPPerfAcceptTimeout bounds a server's wait for its client.
	TCPPerfAcceptTimeout = 20 * time.Second
	// TCPPerfConnectTimeout bounds a client's attempts to reach a server
	// that is not listening yet.
	TCPPerfConnectTimeout = 10 * time.Second
	// TCPPerfSlack is added to the run's duration for the server's read
	// deadline and the client's wait for the answer.
	TCPPerfSlack = 30 * time.Second
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
	if r.Mode != "bulk" && r.Mode != "rr" {
		return fmt.Errorf("tcpperf: mode %q: want bulk or rr", r.Mode)
	}
	if r.Size < 1 || r.Size > TCPPerfMaxSize {
		return fmt.Errorf("tcpperf: size %d: want 1..%d", r.Size, TCPPerfMaxSize)
	}
	if r.DurationMS < 1 || time.Duration(r.DurationMS)*time.Millisecond > TCPPerfMaxDuration {
		return fmt.Errorf("tcpperf: duration_ms %d: want 1..%d", r.DurationMS, TCPPerfMaxDuration.Milliseconds())
	}
	return nil
}

// TCPPerf asks the daemon to run a TCP workload on its own stack, waits
// for the result (a server's request returns once its client is done) and
// decodes it into result (a *tcpperf.Result).
func (c *Client) TCPPerf(r TCPPerfRequest, result any) error {
	if err := r.Check(); err != nil {
		return err
	}
	timeout := TCPPerfConnectTimeout + time.Duration(r.DurationMS)*time.Millisecond + TCPPerfSlack
	if r.Role == TCPPerfServer {
		timeout = TCPPerfAcceptTimeout + TCPPerfMaxDuration + TCPPerfSlack
	}
	resp, err := c.call(Request{Op: OpTCPPerf, TCPPerf: &r}, timeout)
	if err != nil {
		return err
	}
	if resp.TCPPerf == nil {
		return fmt.Errorf("%s: response without tcpperf", c.dev)
	}
	if err := json.Unmarshal(resp.TCPPerf, result); err != nil {
		return fmt.Errorf("%s: tcpperf result: %w", c.dev, err)
	}
	return nil
}
