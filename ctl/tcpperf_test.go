package ctl

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/apps/tcpperf"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
)

// engineServer is a control socket over an engine on its own stack.
func engineServer(t *testing.T, link *netstack.Link, addr string) *Server {
	t.Helper()
	st, err := netstack.New(link, netstack.Options{Addrs: []netip.Prefix{netip.MustParsePrefix(addr)}, MTU: 1500})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eng, err := offload.NewDevice(st, offload.DefaultConfig("siwtun0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return startServer(t, NewProvider("", eng, nil))
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
				c, err := Dial(s1.Path())
				if err != nil {
					errc <- err
					return
				}
				defer c.Close()
				r, err := c.TCPPerf(TCPPerfRequest{Role: TCPPerfServer, Addr: addr})
				if err != nil {
					errc <- err
					return
				}
				srv <- r
			}()
			c := dial(t, s0.Path())
			got, err := c.TCPPerf(TCPPerfRequest{Role: TCPPerfClient, Addr: addr,
				Mode: tc.mode, Size: tc.size, DurationMS: 200})
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

func TestTCPPerfRequestErrors(t *testing.T) {
	s := startServer(t, fakeProvider{})
	r := dialRaw(t, s.Path())
	for _, tt := range []struct{ name, line, err string }{
		{"no workload", `{"op":"tcpperf"}`, "needs the field tcpperf"},
		{"workload with stats", `{"op":"stats","tcpperf":{"role":"server","addr":"198.18.0.2:1"}}`, "only valid with op"},
		{"bad role", `{"op":"tcpperf","tcpperf":{"role":"both","addr":"198.18.0.2:1"}}`, `role "both"`},
		{"bad addr", `{"op":"tcpperf","tcpperf":{"role":"server","addr":"198.18.0.2"}}`, "want address:port"},
		{"server with mode", `{"op":"tcpperf","tcpperf":{"role":"server","addr":"198.18.0.2:1","mode":"rr"}}`, "takes only addr"},
		{"bad mode", `{"op":"tcpperf","tcpperf":{"role":"client","addr":"198.18.0.2:1","mode":"udp","size":1,"duration_ms":1}}`, `mode "udp"`},
		{"size 0", `{"op":"tcpperf","tcpperf":{"role":"client","addr":"198.18.0.2:1","mode":"rr","duration_ms":1}}`, "size 0"},
		{"too long", `{"op":"tcpperf","tcpperf":{"role":"client","addr":"198.18.0.2:1","mode":"rr","size":1,"duration_ms":600000}}`, "duration_ms 600000"},
		{"not supported", `{"op":"tcpperf","tcpperf":{"role":"server","addr":"198.18.0.2:1"}}`, "cannot run TCP workloads"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r.t = t
			r.send(tt.line + "\n")
			r.wantError(tt.err)
			r.wantLink()
		})
	}
	if err := (TCPPerfRequest{Role: "client", Addr: "x"}).Check(); err == nil || !strings.Contains(err.Error(), "addr") {
		t.Fatalf("Check: %v", err)
	}
}
