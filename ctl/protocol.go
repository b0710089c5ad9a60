package ctl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
)

// Where the control sockets are and how long a request may be.
const (
	// DefaultSocketDir holds the control sockets, one per device.
	DefaultSocketDir = "/run/siwtun"
	// SocketSuffix ends a control socket's name: <dev>.ctl.
	SocketSuffix = ".ctl"
	// MaxRequestSize bounds a request line, newline included.
	MaxRequestSize = 4096
)

// Operations of a Request.
const (
	// OpDevInfo asks for the DevInfo.
	OpDevInfo = "devinfo"
	// OpLink asks for the Link.
	OpLink = "link"
	// OpQP asks for the queue pairs, or the one Request.QP names.
	OpQP = "qp"
	// OpStats asks for the Stats.
	OpStats = "stats"
	// OpWatch turns the connection into a stream of WatchEvents (see
	// watch.go).
	OpWatch = "watch"
	// OpTCPPerf runs a TCP workload on the RNIC's own TCP/IP stack (see
	// tcpperf.go): the benchmarks' raw gVisor TCP baseline.
	OpTCPPerf = "tcpperf"
	// OpMR asks for the registered memory regions (see mr.go).
	OpMR = "mr"
	// OpProc asks for the daemon process's footprint: goroutines, RSS,
	// descriptors, mappings (see proc.go).
	OpProc = "proc"
	// OpAnatomy drives the recorder of hop stamps (see anatomy.go).
	OpAnatomy = "anatomy"
)

// SocketPath is the control socket of device dev in directory dir (empty:
// DefaultSocketDir).
func SocketPath(dir, dev string) string {
	if dir == "" {
		dir = DefaultSocketDir
	}
	return filepath.Join(dir, dev+SocketSuffix)
}

// Request is one line a client sends.
type Request struct {
	// Op is the query: OpDevInfo, OpLink, OpQP or OpStats.
	Op string `json:"op"`
	// QP selects one queue pair for OpQP (absent: every queue pair).
	QP *uint32 `json:"qp,omitempty"`
	// TCPPerf is the workload of OpTCPPerf.
	TCPPerf *TCPPerfRequest `json:"tcpperf,omitempty"`
	// GC, with OpProc, first runs a garbage collection and returns the
	// freed memory to the operating system (debug.FreeOSMemory), so that
	// the resident set says what the daemon still holds.
	GC bool `json:"gc,omitempty"`
	// Headers, with OpWatch, leaves the segments' payloads out of the
	// stream (WatchSegment.Len says how long they were): a viewer that
	// only matches the segments of a second device sends its daemon a
	// fraction of the data, and falls behind much later.
	Headers bool `json:"headers,omitempty"`
	// Anatomy is the action of OpAnatomy.
	Anatomy *AnatomyRequest `json:"anatomy,omitempty"`
}

// Response is one line the server answers with: OK and one payload, or
// !OK and Error.
type Response struct {
	// OK says whether the request succeeded.
	OK bool `json:"ok"`
	// Error says why it did not.
	Error string `json:"error,omitempty"`
	// DevInfo answers OpDevInfo.
	DevInfo *DevInfo `json:"devinfo,omitempty"`
	// Link answers OpLink.
	Link *Link `json:"link,omitempty"`
	// QPs answers OpQP (absent when there are none).
	QPs []QP `json:"qps,omitempty"`
	// Stats answers OpStats.
	Stats *Stats `json:"stats,omitempty"`
	// TCPPerf answers OpTCPPerf.
	TCPPerf json.RawMessage `json:"tcpperf,omitempty"`
	// MRs answers OpMR (absent when there are none).
	MRs []MR `json:"mrs,omitempty"`
	// Proc answers OpProc.
	Proc *Proc `json:"proc,omitempty"`
	// Anatomy answers OpAnatomy.
	Anatomy *AnatomyState `json:"anatomy,omitempty"`
}

// ParseRequest decodes and checks one request line: one JSON object with
// known fields only, a known op, and qp only with op "qp".
func ParseRequest(line []byte) (Request, error) {
	var req Request
	if len(line) > MaxRequestSize {
		return req, fmt.Errorf("request longer than %d bytes", MaxRequestSize)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Request{}, fmt.Errorf("malformed request: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Request{}, errors.New("malformed request: data after the JSON object")
	}
	if req.GC && req.Op != OpProc {
		return Request{}, fmt.Errorf("field gc is only valid with op %q", OpProc)
	}
	if req.TCPPerf != nil && req.Op != OpTCPPerf {
		return Request{}, fmt.Errorf("field tcpperf is only valid with op %q", OpTCPPerf)
	}
	if req.Anatomy != nil && req.Op != OpAnatomy {
		return Request{}, fmt.Errorf("field anatomy is only valid with op %q", OpAnatomy)
	}
	switch req.Op {
	case OpDevInfo, OpLink, OpStats, OpWatch, OpTCPPerf, OpMR, OpProc, OpAnatomy:
		if req.QP != nil {
			return Request{}, fmt.Errorf("field qp is only valid with op %q", OpQP)
		}
		if req.Op == OpTCPPerf {
			if req.TCPPerf == nil {
				return Request{}, fmt.Errorf("op %q needs the field tcpperf", OpTCPPerf)
			}
			if err := req.TCPPerf.Check(); err != nil {
				return Request{}, err
			}
		}
		if req.Op == OpAnatomy {
			if req.Anatomy == nil {
				return Request{}, fmt.Errorf("op %q needs the field anatomy", OpAnatomy)
			}
			if err := req.Anatomy.Check(); err != nil {
				return Request{}, err
			}
		}
	case OpQP:
	case "":
		return Request{}, errors.New(`malformed request: missing "op"`)
	default:
		return Request{}, fmt.Errorf("unknown op %q (want devinfo, link, qp, stats, watch, tcpperf, mr, proc or anatomy)", req.Op)
	}
	return req, nil
}
