package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/siwtun/siwtun/apps/tcpperf"
	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/daemon/ctlsrv"
	"github.com/siwtun/siwtun/netstack"
)

// TCPPerfOnStack returns the control plane's tcpperf op on st, the daemon's own
// TCP/IP stack (the one its RNIC runs on): `siwtun bench` measures raw
// gVisor TCP through the same TUN devices and stacks as the RNIC's
// traffic, the engine's floor. The daemon sets ctlsrv.Server.TCPPerf to it.
func TCPPerfOnStack(st *netstack.Stack) ctlsrv.TCPPerfFunc {
	return func(r ctl.TCPPerfRequest) (any, error) {
		addr, err := netip.ParseAddrPort(r.Addr)
		if err != nil {
			return nil, fmt.Errorf("tcpperf: addr %q: %w", r.Addr, err)
		}
		if r.Role == ctl.TCPPerfServer {
			return serveStack(st, addr)
		}
		mode, err := tcpperf.ParseMode(r.Mode)
		if err != nil {
			return nil, fmt.Errorf("tcpperf: %w", err)
		}
		if r.Size < 1 || r.Size > tcpperf.MaxSize {
			return nil, fmt.Errorf("tcpperf: size %d: want 1..%d", r.Size, tcpperf.MaxSize)
		}
		d := time.Duration(r.DurationMS) * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), ctl.TCPPerfConnectTimeout)
		defer cancel()
		c, err := dialStack(ctx, st, addr)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(d + ctl.TCPPerfSlack))
		return tcpperf.Run(c, tcpperf.Header{Mode: mode, Size: r.Size}, d)
	}
}

func serveStack(st *netstack.Stack, addr netip.AddrPort) (tcpperf.Result, error) {
	l, err := st.Listen(addr)
	if err != nil {
		return tcpperf.Result{}, fmt.Errorf("tcpperf: listen on %v: %w", addr, err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), ctl.TCPPerfAcceptTimeout)
	defer cancel()
	c, err := l.Accept(ctx)
	if err != nil {
		return tcpperf.Result{}, fmt.Errorf("tcpperf: accept on %v: %w", addr, err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(ctl.TCPPerfMaxDuration + ctl.TCPPerfSlack))
	return tcpperf.Serve(c)
}

// dialStack connects, trying again while the server is not listening yet
// (it is started by another request, on another daemon).
func dialStack(ctx context.Context, st *netstack.Stack, addr netip.AddrPort) (*netstack.Conn, error) {
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
