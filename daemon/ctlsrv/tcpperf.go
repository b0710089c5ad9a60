package ctlsrv

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/siwtun/siwtun/ctl"
)

// TCPPerfFunc runs a checked tcpperf request on the daemon's stack and
// returns what it measured, encoded as JSON in the response. The daemon
// sets Server.TCPPerf to one (package apps/tcpperf provides it); the
// control plane itself knows nothing of the workload.
type TCPPerfFunc func(r ctl.TCPPerfRequest) (any, error)

func (s *Server) tcpPerf(r ctl.TCPPerfRequest) ctl.Response {
	if s.TCPPerf == nil {
		return errorResponse(errors.New("tcpperf: this device cannot run TCP workloads"))
	}
	res, err := s.TCPPerf(r)
	if err != nil {
		return errorResponse(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return errorResponse(fmt.Errorf("tcpperf: result: %w", err))
	}
	return ctl.Response{OK: true, TCPPerf: b}
}
