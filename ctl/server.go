package ctl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/siwtun/siwtun/anatomy"
)

// Defaults of the control socket.
const (
	// DefaultSocketDir holds the control sockets, one per device.
	DefaultSocketDir = "/run/siwtun"
	// SocketSuffix ends a control socket's name: <dev>.ctl.
	SocketSuffix = ".ctl"
	// SocketMode is the control socket's file mode: the owner (root) and
	// its group may query the daemon.
	SocketMode = 0o660
	// DirMode is the mode of a socket directory Listen creates.
	DirMode = 0o755
	// MaxRequestSize bounds a request line, newline included.
	MaxRequestSize = 4096
	// DefaultReadTimeout is how long a connection may take to send a
	// complete request before the server closes it.
	DefaultReadTimeout = 10 * time.Second
	// writeTimeout bounds writing one response to a client that does not
	// read.
	writeTimeout = 10 * time.Second
	// MaxConns bounds the connections served at once; more are answered
	// with an error and closed.
	MaxConns = 64
	// probeTimeout bounds the check whether an existing socket is alive.
	probeTimeout = time.Second
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

// Server serves a Provider on a control socket.
type Server struct {
	// ReadTimeout bounds the time a connection may take to send each
	// complete request (DefaultReadTimeout). Set it before Serve.
	ReadTimeout time.Duration
	// TCPPerf runs the tcpperf op; nil answers that the daemon cannot run
	// TCP workloads. Set it before Serve.
	TCPPerf TCPPerfFunc
	// Anatomy is the device's recorder of hop stamps (the stack's) for
	// the anatomy op; nil answers that the daemon records none. Set it
	// before Serve.
	Anatomy *anatomy.Recorder

	ln   *net.UnixListener
	path string
	p    Provider
	log  *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // guarded by mu
	closed bool                  // guarded by mu
	wg     sync.WaitGroup
}

// Listen creates the control socket at path for p: it creates the directory
// (mode 0755) if needed, replaces a stale socket (one nothing answers on)
// but refuses to take over a live one or to remove anything that is not a
// socket, and sets the socket's mode to 0660. log may be nil.
func Listen(path string, p Provider, log *slog.Logger) (*Server, error) {
	if p == nil {
		return nil, errors.New("ctl: listen: nil provider")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Dir(path), DirMode); err != nil {
		return nil, fmt.Errorf("ctl: listen: %w", err)
	}
	if err := removeStale(path); err != nil {
		return nil, fmt.Errorf("ctl: listen on %s: %w", path, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("ctl: listen: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, SocketMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("ctl: listen: %w", err)
	}
	return &Server{
		ReadTimeout: DefaultReadTimeout,
		ln:          ln, path: path, p: p, log: log,
		conns: make(map[net.Conn]struct{}),
	}, nil
}

// removeStale removes the socket at path if no process answers on it.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; not removing it", path)
	}
	c, err := net.DialTimeout("unix", path, probeTimeout)
	if err == nil {
		c.Close()
		return errors.New("another siwtun daemon is serving this socket")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("probe existing socket: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Serve accepts and serves connections until Close; it then returns nil.
func (s *Server) Serve() error {
	var backoff time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.isClosed() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors and the like: wait, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("ctl: accept", "path", s.path, "err", err)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if !s.track(c) {
			continue
		}
		go s.serveConn(c)
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// track registers a new connection, or refuses it when the server is
// closed or has MaxConns connections.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		c.Close()
		return false
	case len(s.conns) >= MaxConns:
		s.mu.Unlock()
		s.log.Warn("ctl: too many connections", "path", s.path, "max", MaxConns)
		c.SetWriteDeadline(time.Now().Add(time.Second))
		writeResponse(c, errorResponse(fmt.Errorf("too many control connections (at most %d)", MaxConns)))
		c.Close()
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	return true
}

// Close stops the server: it closes the socket (removing its file) and
// every connection, and waits for their goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if err != nil {
		return fmt.Errorf("ctl: close %s: %w", s.path, err)
	}
	return nil
}

// serveConn answers the requests of one connection, in order.
func (s *Server) serveConn(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	timeout := s.ReadTimeout
	if timeout <= 0 {
		timeout = DefaultReadTimeout
	}
	br := bufio.NewReaderSize(c, MaxRequestSize)
	for {
		c.SetReadDeadline(time.Now().Add(timeout))
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			s.log.Debug("ctl: request too long", "path", s.path)
			if !s.reply(c, errorResponse(fmt.Errorf("request longer than %d bytes", MaxRequestSize))) {
				return
			}
			if err := skipLine(br); err != nil {
				return
			}
			continue
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.log.Debug("ctl: read timeout", "path", s.path)
			s.reply(c, errorResponse(fmt.Errorf("no complete request within %v; closing the connection", timeout)))
			return
		case err != nil && (err != io.EOF || len(bytes.TrimSpace(line)) == 0):
			// EOF or a broken connection: nothing more to answer.
			return
		}
		// A last request without its newline (err == io.EOF) is answered
		// too: the client may have half-closed its side.
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if isWatch(line) {
			s.watch(c, br, line)
			return
		}
		if !s.reply(c, s.handle(line)) || err != nil {
			return
		}
	}
}

// skipLine discards the rest of an overlong line.
func skipLine(br *bufio.Reader) error {
	for {
		_, err := br.ReadSlice('\n')
		if !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
	}
}

// reply writes one response; it reports whether the connection is usable.
func (s *Server) reply(c net.Conn, r Response) bool {
	c.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := writeResponse(c, r); err != nil {
		s.log.Debug("ctl: write response", "path", s.path, "err", err)
		return false
	}
	return true
}

func writeResponse(w io.Writer, r Response) error {
	b, err := json.Marshal(r)
	if err != nil {
		b, _ = json.Marshal(errorResponse(fmt.Errorf("encode response: %w", err)))
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func errorResponse(err error) Response { return Response{Error: err.Error()} }

// handle answers one request line. A panic in the provider is answered as
// an internal error rather than taking the daemon down.
func (s *Server) handle(line []byte) (resp Response) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("ctl: provider panic", "path", s.path, "panic", v)
			resp = errorResponse(fmt.Errorf("internal error: %v", v))
		}
	}()
	req, err := ParseRequest(line)
	if err != nil {
		return errorResponse(err)
	}
	switch req.Op {
	case OpDevInfo:
		d := s.p.DevInfo()
		return Response{OK: true, DevInfo: &d}
	case OpLink:
		l := s.p.Link()
		return Response{OK: true, Link: &l}
	case OpQP:
		qps := s.p.QPs()
		if req.QP == nil {
			return Response{OK: true, QPs: qps}
		}
		for _, q := range qps {
			if q.LQPN == *req.QP {
				return Response{OK: true, QPs: []QP{q}}
			}
		}
		return errorResponse(fmt.Errorf("no queue pair %d", *req.QP))
	case OpStats:
		st := s.p.Stats()
		return Response{OK: true, Stats: &st}
	case OpTCPPerf:
		return s.tcpPerf(*req.TCPPerf)
	case OpMR:
		return s.mrs()
	case OpProc:
		return s.proc(req.GC)
	case OpAnatomy:
		return s.anatomyOp(*req.Anatomy)
	}
	return errorResponse(fmt.Errorf("unknown op %q", req.Op))
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
