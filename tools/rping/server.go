package rping

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/siwtun/siwtun/verbs"
)

// listenBacklog is rping's rdma_listen backlog.
const listenBacklog = 3

// Server is rping -s: it listens, accepts a client, and serves its pings
// until the client disconnects; with Options.Persistent it goes on serving
// one client after another (several at once if they come together).
type Server struct {
	dev *verbs.Device
	o   Options
	out *output
	l   *verbs.Listener

	mu   sync.Mutex
	pool [][]byte // buffer memory of finished connections, for the next ones
}

// Listen binds addr on dev (rdma_bind_addr and rdma_listen); an invalid
// address listens on every address of the device. It prints rping's line
// when that fails.
func Listen(dev *verbs.Device, addr netip.AddrPort, o Options) (*Server, error) {
	out := newOutput(&o)
	if err := o.check(out); err != nil {
		return nil, err
	}
	out.debugf("server\n")
	l, err := dev.Listen(addr, listenBacklog)
	if err != nil {
		out.errf("rdma_bind_addr: %s\n", errText(err))
		out.cause(err)
		return nil, failed(err)
	}
	out.debugf("rdma_bind_addr successful\n")
	out.debugf("rdma_listen\n")
	return &Server{dev: dev, o: o, out: out, l: l}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() netip.AddrPort { return s.l.Addr() }

// Close stops listening.
func (s *Server) Close() error { return s.l.Close() }

// Serve serves clients until the (first) client has gone, or with
// Options.Persistent until ctx ends. It closes the listener when it returns.
// The result is nil when the client disconnected (even before its count was
// done: rping exits 0 then), an *ExitError when the connection or the
// protocol failed, and ctx's error when ctx ended first.
func (s *Server) Serve(ctx context.Context) error {
	defer s.l.Close()
	if s.o.Persistent {
		return s.servePersistent(ctx)
	}
	req, err := s.l.Accept(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.out.errf("wait for CONNECT_REQUEST state %d\n", stateIdle)
		s.out.cause(err)
		return failed(err)
	}
	// rping serves one client; later ones are refused rather than left
	// waiting on a listener nobody accepts from.
	s.l.Close()
	err = s.serveOne(ctx, req)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (s *Server) servePersistent(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		req, err := s.l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.out.errf("wait for CONNECT_REQUEST state %d\n", stateIdle)
			s.out.cause(err)
			return failed(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveOne(ctx, req) // its lines are printed; the server goes on
		}()
	}
}

// getMem returns buffer memory for one connection.
func (s *Server) getMem() ([]byte, error) {
	s.mu.Lock()
	if n := len(s.pool); n > 0 {
		m := s.pool[n-1]
		s.pool = s.pool[:n-1]
		s.mu.Unlock()
		return m, nil
	}
	s.mu.Unlock()
	return s.dev.AllocBuffer(bufLen(s.o.Size))
}

func (s *Server) putMem(m []byte) {
	s.mu.Lock()
	s.pool = append(s.pool, m)
	s.mu.Unlock()
}

// serveOne accepts req on a new QP and serves its pings: rping_run_server
// (and rping_persistent_server_thread) for one client.
func (s *Server) serveOne(ctx context.Context, req *verbs.ConnRequest) error {
	s.out.debugf("cma_event type RDMA_CM_EVENT_CONNECT_REQUEST from %v (parent)\n", req.Remote)
	mem, err := s.getMem()
	if err != nil {
		s.out.errf("rping_setup_buffers failed: %d\n", -1)
		s.out.cause(err)
		req.Reject(nil)
		return failed(err)
	}
	c, err := newConn(ctx, s.out, &s.o, s.dev, true, mem)
	if err != nil {
		req.Reject(nil)
		s.putMem(mem)
		return err
	}
	defer s.putMem(mem)
	defer c.close()
	if err := c.postRecv(); err != nil {
		s.out.errf("ibv_post_recv failed: %d\n", int(postErrno(err)))
		s.out.cause(err)
		req.Reject(nil)
		return failed(err)
	}
	c.startWatch()
	if err := c.accept(req); err != nil {
		s.out.errf("connect error %d\n", -1)
		return failed(err)
	}
	err = c.testServer()
	var ee *ExitError
	if errors.As(err, &ee) && !s.o.Persistent {
		// A persistent server's connections end without this line.
		s.out.errf("rping server failed: %d\n", -1)
	}
	c.out.debugf("disconnecting qp %d\n", c.qp.Num())
	return err
}

// accept answers the request as rdma_accept(id, NULL) does: the Reply's
// IRD and ORD mirror the Request's ORD and IRD (devices defaults where the
// Request has none, MPA rev 1), then waits for ESTABLISHED.
func (c *conn) accept(req *verbs.ConnRequest) error {
	c.out.debugf("accepting client connection request\n")
	p := verbs.ConnParam{ResponderResources: req.ORD, InitiatorDepth: req.IRD}
	if err := req.Accept(c.qp, p); err != nil {
		c.out.errf("rdma_accept: %s\n", errText(err))
		c.out.cause(err)
		return err
	}
	select {
	case <-c.established:
		return nil
	case <-c.gone:
		// The client went at once: the test loop sees DISCONNECTED.
		return nil
	case <-c.ctx.Done():
		return c.ctx.Err()
	}
}

// testServer is rping_test_server: per ping, wait for the source advert,
// READ the data, Send "go ahead", wait for the sink advert, WRITE the data
// back, Send "go ahead"; until the client disconnects.
func (c *conn) testServer() error {
	var err error
	for {
		if st := c.wait(); st != stateReadAdv {
			c.out.errf("wait for RDMA_READ_ADV state %d\n", st)
			err = fmt.Errorf("protocol state %d, want RDMA_READ_ADV", st)
			break
		}
		c.out.debugf("server received sink adv\n")
		if int(c.remote.Size) > len(c.rdmaBuf) {
			// rping would post the Read and fail its completion; say why.
			err = fmt.Errorf("the client's buffer is %d bytes, more than this server's %d (-S): run the server with -S %d or more",
				c.remote.Size, len(c.rdmaBuf), c.remote.Size)
			c.out.cause(err)
			break
		}
		if err = c.post(verbs.SendWR{ID: wrRDMA, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled,
			SGL:        []verbs.SGE{c.rdmaMR.SGE(0, int(c.remote.Size))},
			RemoteAddr: c.remote.Addr, RKey: c.remote.RKey}); err != nil {
			break
		}
		c.out.debugf("server posted rdma read req \n")
		if st := c.wait(); st != stateReadComplete {
			c.out.errf("wait for RDMA_READ_COMPLETE state %d\n", st)
			err = fmt.Errorf("protocol state %d, want RDMA_READ_COMPLETE", st)
			break
		}
		c.out.debugf("server received read complete\n")
		if c.o.Validate {
			if err = c.checkRead(); err != nil {
				c.out.errf("data mismatch!\n")
				c.out.cause(err)
				c.state = stateError
				break
			}
		}
		c.served++
		if c.o.Verbose {
			c.out.outf("server ping data: %s\n", cString(c.rdmaBuf))
		}
		if err = c.send(); err != nil {
			break
		}
		c.out.debugf("server posted go ahead\n")
		if st := c.wait(); st != stateWriteAdv {
			c.out.errf("wait for RDMA_WRITE_ADV state %d\n", st)
			err = fmt.Errorf("protocol state %d, want RDMA_WRITE_ADV", st)
			break
		}
		c.out.debugf("server received sink adv\n")
		// rping writes strlen(rdma_buf) + 1 bytes: the data and its NUL.
		n := min(len(cString(c.rdmaBuf))+1, len(c.rdmaBuf))
		if err = c.post(verbs.SendWR{ID: wrRDMA, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled,
			SGL:        []verbs.SGE{c.rdmaMR.SGE(0, n)},
			RemoteAddr: c.remote.Addr, RKey: c.remote.RKey}); err != nil {
			break
		}
		c.out.debugf("rdma write from lkey %x laddr %x len %d\n", c.rdmaMR.LKey(), c.rdmaMR.Addr(), n)
		if st := c.wait(); st != stateWriteComplete {
			c.out.errf("wait for RDMA_WRITE_COMPLETE state %d\n", st)
			err = fmt.Errorf("protocol state %d, want RDMA_WRITE_COMPLETE", st)
			break
		}
		c.out.debugf("server rdma write complete \n")
		if err = c.send(); err != nil {
			break
		}
		c.out.debugf("server posted go ahead\n")
	}
	if c.state == stateDisconnected {
		return nil
	}
	if c.run.Err() != nil {
		return c.run.Err()
	}
	return failed(err)
}

// checkRead checks the data the server read against rping's pattern for
// the ping it is serving (the server's -V, an addition to rping).
func (c *conn) checkRead() error {
	got := c.rdmaBuf[:c.remote.Size]
	want := make([]byte, len(got))
	Fill(want, c.served)
	if i := firstDiff(got, want); i >= 0 {
		return fmt.Errorf("ping %d: byte %d of the %d read is 0x%02x, rping's pattern has 0x%02x", c.served, i, len(got), got[i], want[i])
	}
	return nil
}

// firstDiff is the index of the first byte where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
