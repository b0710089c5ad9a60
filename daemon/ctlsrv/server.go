package ctlsrv

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
	"github.com/siwtun/siwtun/ctl"
)

// Defaults of the control socket.
const (
	// SocketMode is the control socket's file mode: the owner (root) and
	// its group may query the daemon.
	SocketMode = 0o660
	// DirMode is the mode of a socket directory Listen creates.
	DirMode = 0o755
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
	br := bufio.NewReaderSize(c, ctl.MaxRequestSize)
	for {
		c.SetReadDeadline(time.Now().Add(timeout))
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			s.log.Debug("ctl: request too long", "path", s.path)
			if !s.reply(c, errorResponse(fmt.Errorf("request longer than %d bytes", ctl.MaxRequestSize))) {
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
func (s *Server) reply(c net.Conn, r ctl.Response) bool {
	c.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := writeResponse(c, r); err != nil {
		s.log.Debug("ctl: write response", "path", s.path, "err", err)
		return false
	}
	return true
}

func writeResponse(w io.Writer, r ctl.Response) error {
	b, err := json.Marshal(r)
	if err != nil {
		b, _ = json.Marshal(errorResponse(fmt.Errorf("encode response: %w", err)))
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func errorResponse(err error) ctl.Response { return ctl.Response{Error: err.Error()} }

// handle answers one request line. A panic in the provider is answered as
// an internal error rather than taking the daemon down.
func (s *Server) handle(line []byte) (resp ctl.Response) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("ctl: provider panic", "path", s.path, "panic", v)
			resp = errorResponse(fmt.Errorf("internal error: %v", v))
		}
	}()
	req, err := ctl.ParseRequest(line)
	if err != nil {
		return errorResponse(err)
	}
	switch req.Op {
	case ctl.OpDevInfo:
		d := s.p.DevInfo()
		return ctl.Response{OK: true, DevInfo: &d}
	case ctl.OpLink:
		l := s.p.Link()
		return ctl.Response{OK: true, Link: &l}
	case ctl.OpQP:
		qps := s.p.QPs()
		if req.QP == nil {
			return ctl.Response{OK: true, QPs: qps}
		}
		for _, q := range qps {
			if q.LQPN == *req.QP {
				return ctl.Response{OK: true, QPs: []ctl.QP{q}}
			}
		}
		return errorResponse(fmt.Errorf("no queue pair %d", *req.QP))
	case ctl.OpStats:
		st := s.p.Stats()
		return ctl.Response{OK: true, Stats: &st}
	case ctl.OpTCPPerf:
		return s.tcpPerf(*req.TCPPerf)
	case ctl.OpMR:
		return s.mrs()
	case ctl.OpProc:
		return s.proc(req.GC)
	case ctl.OpAnatomy:
		return s.anatomyOp(*req.Anatomy)
	}
	return errorResponse(fmt.Errorf("unknown op %q", req.Op))
}
