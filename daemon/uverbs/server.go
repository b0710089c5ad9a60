// Package uverbs is the daemon side of the verbs socket: it serves a local
// (in-process) verbs.Device to applications in other processes, which open
// it with verbs.Dial. See package internal/uabi for the ABI.
//
// Each client connection is a session with its own objects; handles are
// unique across the server, so a client that names another client's object
// gets a clear error (StForeign), and a client that exits or crashes has
// every object destroyed: its QPs disconnected towards their peers, its
// regions deregistered and unmapped, its rings freed.
package uverbs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// Server serves one device on any number of listeners.
type Server struct {
	dev *verbs.Device
	eng *offload.Device
	log *slog.Logger

	mu         sync.Mutex
	lns        map[net.Listener]struct{}
	sessions   map[*session]struct{}
	owners     map[uint32]*session
	nextHandle uint32
	limits     Limits
	closed     bool
	// sendTimeout is how long a message to a client may wait for room
	// in its socket (session.send), in nanoseconds; tests shorten it.
	sendTimeout atomic.Int64
	wg          sync.WaitGroup

	// rxSpin is rxIdle's watch in nanoseconds (rxSpinFor; tests change
	// it).
	rxSpin             atomic.Int64
	rxWatches, rxTaken atomic.Uint64
	ringFull           atomic.Uint64

	// sqScratch and rqScratch lend the buffers a QP decodes a batch of
	// ring entries into (*sqBatch, *rqBatch) while it drains its rings:
	// an idle QP holds none.
	sqScratch, rqScratch sync.Pool

	// sleepers wakes the ring goroutines of idle QPs (created with the
	// first QP, closed by Close).
	sleepersOnce sync.Once
	sleepers     *uabi.Sleepers
	sleepersErr  error
}

// doorbell makes the QP doorbell of eventfd fd, on the server's Sleepers.
func (s *Server) doorbell(fd int) (*uabi.Doorbell, error) {
	s.sleepersOnce.Do(func() {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			s.sleepersErr = ErrServerClosed
			return
		}
		s.sleepers, s.sleepersErr = uabi.NewSleepers()
	})
	if s.sleepersErr != nil {
		uabi.Close(fd)
		return nil, s.sleepersErr
	}
	return s.sleepers.NewDoorbell(fd)
}

// Stats are a server's counters.
type Stats struct {
	// RxWatches counts the times an engine receive goroutine watched a
	// QP's rings after placing incoming data (the QP's ring goroutine
	// asleep); RxTaken the watches that found a request the client had
	// posted, and moved it to the engine without a doorbell.
	RxWatches, RxTaken uint64
	// RingFull counts the drains of a QP's rings that the engine's queue
	// could not take whole: its ring goroutine then retries after a pause
	// (20 µs, doubling to 1 ms), during which a post rings no doorbell.
	// A client that keeps within its queue depths never causes one.
	RingFull uint64
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return Stats{RxWatches: s.rxWatches.Load(), RxTaken: s.rxTaken.Load(), RingFull: s.ringFull.Load()}
}

// Counters returns the server's counters by their stable names, for the
// control plane's stats (ctlsrv.NewProvider).
func (s *Server) Counters() []offload.Counter {
	st := s.Stats()
	return []offload.Counter{{Name: "verbsRxWatches", Value: st.RxWatches}, {Name: "verbsRxTaken", Value: st.RxTaken},
		{Name: "verbsRingFull", Value: st.RingFull}}
}

// NewServer returns a server of dev, which must be in-process (package rnic),
// with the DefaultLimits per client (SetLimits changes them).
func NewServer(dev *verbs.Device, log *slog.Logger) (*Server, error) {
	eng := rnic.Engine(dev)
	if eng == nil {
		return nil, errors.New("uverbs: the served device must be in-process")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{dev: dev, eng: eng, log: log.With("dev", dev.Name()),
		lns: make(map[net.Listener]struct{}), sessions: make(map[*session]struct{}),
		owners: make(map[uint32]*session), nextHandle: 1, limits: DefaultLimits()}
	s.sendTimeout.Store(int64(clientSendTimeout))
	s.rxSpin.Store(int64(rxSpinFor))
	s.sqScratch.New = func() any { return new(sqBatch) }
	s.rqScratch.New = func() any { return new(rqBatch) }
	return s, nil
}

// Serve serves dev on l until l is closed; see Server.Serve.
func Serve(l net.Listener, dev *verbs.Device, log *slog.Logger) error {
	s, err := NewServer(dev, log)
	if err != nil {
		return err
	}
	return s.Serve(l)
}

// Listen creates the verbs socket at path (a SOCK_SEQPACKET Unix socket),
// replacing a stale one, with mode 0660 and, if gid >= 0, group gid.
func Listen(path string, gid int) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, err
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// clientSendTimeout is how long a reply or an event may wait for room in
// a client's socket before the client, which does not read it, is cut off.
// Every client reads its socket all the time (libsiwtun and the Go client
// have a reader thread), so only a stuck or hostile one waits this long.
const clientSendTimeout = 10 * time.Second

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("uverbs: server closed")

// Serve accepts clients on l (a Unix listener of network "unixpacket")
// until l fails or the server is closed; each client is served by its own
// goroutines.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.lns[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lns, l)
		s.mu.Unlock()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			return err
		}
		uc, ok := c.(*net.UnixConn)
		if !ok {
			c.Close()
			continue
		}
		s.start(uc)
	}
}

// Close stops every listener, tells every client the device is removed
// (they see ErrDeviceRemoved and flushed work), ends every session and
// destroys its objects. It returns when all is cleaned up.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for l := range s.lns {
		l.Close()
	}
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	for _, ss := range sessions {
		ss.removed("daemon stopped")
	}
	s.wg.Wait()
	s.sleepersOnce.Do(func() { s.sleepersErr = ErrServerClosed })
	if s.sleepers != nil {
		return s.sleepers.Close()
	}
	return nil
}

// Sessions is the number of connected clients.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

func (s *Server) start(c *net.UnixConn) {
	ss := newSession(s, c)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.sessions[ss] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		ss.serve()
		s.mu.Lock()
		delete(s.sessions, ss)
		s.mu.Unlock()
	}()
}

// handle allocates a server-wide object handle for ss.
func (s *Server) handle(ss *session) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.owners[s.nextHandle] != nil || s.nextHandle == 0 {
		s.nextHandle++
	}
	h := s.nextHandle
	s.nextHandle++
	s.owners[h] = ss
	return h
}

func (s *Server) release(h uint32) {
	s.mu.Lock()
	delete(s.owners, h)
	s.mu.Unlock()
}

func (s *Server) owner(h uint32) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.owners[h]
}

// peerCred reads SO_PEERCRED of c.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	err = rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil {
		return nil, err
	}
	return cred, cerr
}

// statusError is a failed request's reply.
type statusError struct{ st uabi.Status }

func (e *statusError) Error() string { return e.st.Msg }

func fail(st uint32, format string, args ...any) error {
	return &statusError{uabi.Status{Code: st, Msg: fmt.Sprintf(format, args...)}}
}

// statusOf maps an engine or verbs error to a reply status.
func statusOf(err error) uabi.Status {
	var se *statusError
	var rej *ibv.RejectedError
	st := uabi.Status{Code: uabi.StError, Msg: err.Error()}
	switch {
	case errors.As(err, &se):
		return se.st
	case errors.As(err, &rej):
		// The reason only: the client rebuilds the RejectedError around it.
		st = uabi.Status{Code: uabi.StRejected, Detail: rej.PrivateData}
		if rej.Err != nil {
			st.Msg = rej.Err.Error()
		}
	case errors.Is(err, ibv.ErrQPState):
		st.Code = uabi.StQPState
	case errors.Is(err, verbs.ErrBusy):
		st.Code = uabi.StBusy
	case errors.Is(err, context.Canceled):
		st.Code = uabi.StCanceled
	case errors.Is(err, offload.ErrDeviceClosed), errors.Is(err, verbs.ErrDestroyed):
		st.Code = uabi.StRemoved
	default:
		// A system error (connection refused, timed out, ...) travels as
		// its errno, so the client's error still matches it with errors.Is.
		var errno syscall.Errno
		if errors.As(err, &errno) {
			st.Detail = uabi.ErrnoDetail(errno)
		}
	}
	return st
}

func dupFD(fd int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}
