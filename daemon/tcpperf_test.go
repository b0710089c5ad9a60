package daemon

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/siwtun/siwtun/apps/tcpperf"
	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/daemon/ctlsrv"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/rnic/rnictest"
)

// engineServer is a control socket over an engine on its own stack.
func engineServer(t *testing.T, link *netstack.Link, addr string) *ctlsrv.Server {
	t.Helper()
	r := rnictest.New(t, link, netip.MustParsePrefix(addr), 1500, "siwtun0", nil)
	st, eng := r.Stack, r.Engine
	s, err := ctlsrv.Listen(filepath.Join(t.TempDir(), "ctl.sock"), ctlsrv.NewProvider("", eng, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.TCPPerf = TCPPerfOnStack(st)
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	return s
}

// TestTCPPerfEngines: the tcpperf op between two engines' stacks joined by
// an in-memory link, both workloads, through the control sockets.
func TestTCPPerfEngines(t *testing.T) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	s0 := engineServer(t, la, "198.18.0.1/24")
	s1 := engineServer(t, lb, "198.18.0.2/24")
	for i, tc := range []struct {
		mode string
		size int
	}{{"bulk", 65536}, {"rr", 64}} {
		// A port of its own: the previous run's connection may still hold
		// its port (TIME-WAIT), and the server's listen would fail.
		addr := fmt.Sprintf("198.18.0.2:%d", 5201+i)
		t.Run(tc.mode, func(t *testing.T) {
			srv := make(chan tcpperf.Result, 1)
			errc := make(chan error, 1)
			go func() {
				c, err := ctl.Dial(s1.Path())
				if err != nil {
					errc <- err
					return
				}
				defer c.Close()
				var r tcpperf.Result
				if err := c.TCPPerf(ctl.TCPPerfRequest{Role: ctl.TCPPerfServer, Addr: addr}, &r); err != nil {
					errc <- err
					return
				}
				srv <- r
			}()
			c, err := ctl.Dial(s0.Path())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var got tcpperf.Result
			err = c.TCPPerf(ctl.TCPPerfRequest{Role: ctl.TCPPerfClient, Addr: addr,
				Mode: tc.mode, Size: tc.size, DurationMS: 200}, &got)
			if err != nil {
				select {
				case serr := <-errc:
					t.Fatalf("client: %v; server: %v", err, serr)
				default:
					t.Fatal(err)
				}
			}
			var s tcpperf.Result
			select {
			case s = <-srv:
			case err := <-errc:
				t.Fatal(err)
			}
			if got.Mode != tc.mode || got.Bytes == 0 || got.Bytes != s.Bytes || got.Seconds <= 0 {
				t.Fatalf("client %+v, server %+v", got, s)
			}
			if tc.mode == "rr" && (got.RoundTrips == 0 || got.RTTMedian <= 0) {
				t.Fatalf("client %+v", got)
			}
			if tc.mode == "bulk" && got.MBps <= 0 {
				t.Fatalf("client %+v", got)
			}
		})
	}
}
