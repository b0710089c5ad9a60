package ctlsrv

import (
	"strings"
	"testing"

	"github.com/siwtun/siwtun/ctl"
)

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
	if err := (ctl.TCPPerfRequest{Role: "client", Addr: "x"}).Check(); err == nil || !strings.Contains(err.Error(), "addr") {
		t.Fatalf("Check: %v", err)
	}
}
