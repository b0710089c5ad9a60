package rping

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/siwtun/siwtun/verbs"
)

// Work request ids (rping leaves them 0; ours name the buffer).
const (
	wrRecv uint64 = iota + 1
	wrSend
	wrRDMA
)

// conn is one connection: its verbs objects, buffers and protocol state
// (rping's struct rping_cb for one QP).
type conn struct {
	out    *output
	o      *Options
	server bool
	dev    *verbs.Device
	pd     *verbs.PD
	cq     *verbs.CQ
	qp     *verbs.QP
	mrs    []*verbs.MR

	// recvBuf takes the peer's messages, sendBuf holds ours; the server
	// reads the ping data into rdmaBuf and writes it back from there; the
	// client sends from startBuf (the source) and gets the data back in
	// rdmaBuf (the sink).
	recvBuf, sendBuf, rdmaBuf, startBuf []byte
	recvMR, sendMR, rdmaMR, startMR     *verbs.MR

	state  state
	remote Advert // the server's copy of the client's last advert
	served int    // pings the server has served (for -V)

	run         context.Context // the whole run
	ctx         context.Context // ends with the connection, or the run
	cancel      context.CancelFunc
	established chan struct{} // closed at ESTABLISHED
	gone        chan struct{} // closed at DISCONNECTED
	removed     atomic.Bool   // the device went away
	stop        chan struct{} // ends watch
	watched     chan struct{} // closed when watch has returned
	estOnce     sync.Once

	wc [1]verbs.WorkCompletion
}

// bufLen is the memory newConn needs for ping size size.
func bufLen(size int) int {
	return 2*align(size) + 2*64
}

func align(n int) int { return (n + 63) &^ 63 }

// newConn creates the connection's PD, CQ and QP (moved to INIT) and
// registers its buffers in mem (bufLen(o.Size) bytes from dev.AllocBuffer).
// It prints rping's line for what failed.
func newConn(run context.Context, out *output, o *Options, dev *verbs.Device, server bool, mem []byte) (*conn, error) {
	c := &conn{out: out, o: o, server: server, dev: dev, state: stateIdle, run: run,
		established: make(chan struct{}), gone: make(chan struct{}), stop: make(chan struct{}), watched: make(chan struct{})}
	if server {
		c.state = stateConnectRequest
	}
	c.ctx, c.cancel = context.WithCancel(run)
	if err := c.setupQP(); err != nil {
		out.errf("setup_qp failed: %d\n", -1)
		out.cause(err)
		c.close()
		return nil, failed(err)
	}
	if err := c.setupBuffers(mem); err != nil {
		out.errf("rping_setup_buffers failed: %d\n", -1)
		out.cause(err)
		c.close()
		return nil, failed(err)
	}
	if err := c.qp.Modify(verbs.QPInit); err != nil {
		out.errf("setup_qp failed: %d\n", -1)
		out.cause(err)
		c.close()
		return nil, failed(err)
	}
	return c, nil
}

func (c *conn) setupQP() error {
	var err error
	if c.pd, err = c.dev.AllocPD(); err != nil {
		c.out.errf("ibv_alloc_pd failed\n")
		return err
	}
	c.out.debugf("created pd %d\n", c.pd.Handle())
	if c.cq, err = c.dev.CreateCQ(cqDepth); err != nil {
		c.out.errf("ibv_create_cq failed\n")
		return err
	}
	c.out.debugf("created cq of %d entries\n", cqDepth)
	c.qp, err = c.pd.CreateQP(verbs.QPInitAttr{SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: sqDepth, MaxRecvWR: rqDepth})
	if err != nil {
		c.out.errf("rdma_create_qp: %s\n", errText(err))
		return err
	}
	c.out.debugf("created qp %d\n", c.qp.Num())
	return nil
}

func (c *conn) setupBuffers(mem []byte) error {
	c.out.debugf("rping_setup_buffers called on %s qp %d\n", c.role(), c.qp.Num())
	size := c.o.Size
	c.rdmaBuf = mem[:size:size]
	c.startBuf = mem[align(size) : align(size)+size : align(size)+size]
	off := 2 * align(size)
	c.recvBuf = mem[off : off+AdvertLen : off+AdvertLen]
	c.sendBuf = mem[off+64 : off+64+AdvertLen : off+64+AdvertLen]
	clear(c.sendBuf) // the server's "go ahead" carries zeros, as rping's
	clear(c.rdmaBuf)
	reg := func(b []byte, access verbs.Access, what string) (*verbs.MR, error) {
		mr, err := c.pd.RegMR(b, access)
		if err != nil {
			c.out.errf("%s reg_mr failed\n", what)
			return nil, err
		}
		c.mrs = append(c.mrs, mr)
		return mr, nil
	}
	remote := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	var err error
	if c.recvMR, err = reg(c.recvBuf, verbs.AccessLocalWrite, "recv_buf"); err != nil {
		return err
	}
	if c.sendMR, err = reg(c.sendBuf, 0, "send_buf"); err != nil {
		return err
	}
	if c.rdmaMR, err = reg(c.rdmaBuf, remote, "rdma_buf"); err != nil {
		return err
	}
	if !c.server {
		if c.startMR, err = reg(c.startBuf, remote, "start_buf"); err != nil {
			return err
		}
	}
	c.out.debugf("allocated & registered buffers...\n")
	return nil
}

// close stops watching and destroys every object (the QP first, which
// disconnects it).
func (c *conn) close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	if c.qp != nil {
		c.qp.Destroy()
	}
	for _, mr := range c.mrs {
		mr.Dereg()
	}
	if c.cq != nil {
		c.cq.Destroy()
	}
	if c.pd != nil {
		c.pd.Dealloc()
	}
	c.cancel()
}

func (c *conn) role() string {
	if c.server {
		return "server"
	}
	return "client"
}

// idName is rping's name for the connection's cm_id in debug lines.
func (c *conn) idName() string {
	if c.server {
		return "child"
	}
	return "parent"
}

// startWatch runs rping's CM event thread for the connection's QP.
func (c *conn) startWatch() { go c.watch() }

func (c *conn) watch() {
	defer close(c.watched)
	for {
		select {
		case ev := <-c.qp.Events():
			switch ev.Type {
			case verbs.EventEstablished:
				c.out.debugf("cma_event type RDMA_CM_EVENT_ESTABLISHED qp %d (%s)\n", c.qp.Num(), c.idName())
				c.out.debugf("ESTABLISHED\n")
				c.estOnce.Do(func() { close(c.established) })
			case verbs.EventDisconnected:
				c.out.debugf("cma_event type RDMA_CM_EVENT_DISCONNECTED qp %d (%s)\n", c.qp.Num(), c.idName())
				// The daemon destroys its QPs as it stops, so the engine's
				// own Disconnected may come before the device's: the
				// device says whether it was removed.
				removed := ev.Err
				if !errors.Is(removed, verbs.ErrDeviceRemoved) {
					removed = c.dev.Removed()
				}
				if removed != nil {
					c.removed.Store(true)
					c.out.errf("cma detected device removal!!!!\n")
					c.out.cause(removed)
				} else {
					c.out.errf("%s DISCONNECT EVENT...\n", c.role())
				}
				close(c.gone)
				c.cancel()
				return
			case verbs.EventTerminateSent, verbs.EventTerminateReceived:
				// rping sees these only as failed completions; say why.
				c.out.cause(fmt.Errorf("QP %d: %v", c.qp.Num(), ev))
			}
		case <-c.stop:
			return
		}
	}
}

// disconnected reports whether DISCONNECTED has been seen.
func (c *conn) disconnected() bool {
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

func (c *conn) postRecv() error {
	_, err := c.qp.PostRecv([]verbs.RecvWR{{ID: wrRecv, SGL: []verbs.SGE{c.recvMR.SGE(0, AdvertLen)}}})
	return err
}

// post posts one send work request, printing rping's line if that fails.
func (c *conn) post(wr verbs.SendWR) error {
	if _, err := c.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		c.out.errf("post send error %d\n", int(postErrno(err)))
		c.out.cause(err)
		return err
	}
	return nil
}

// send posts the 16-byte message in sendBuf.
func (c *conn) send() error {
	return c.post(verbs.SendWR{ID: wrSend, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{c.sendMR.SGE(0, AdvertLen)}})
}

// wait handles completions until one moves the protocol on (where rping's
// completion thread posts its semaphore) and returns the state then. A
// connection that ended gives DISCONNECTED (ERROR if the device went away).
func (c *conn) wait() state {
	for {
		n, err := c.cq.Wait(c.ctx, c.wc[:])
		if err != nil {
			switch {
			case c.disconnected() && !c.removed.Load():
				c.state = stateDisconnected
			case c.disconnected():
				c.state = stateError
			case c.run.Err() != nil:
				c.state = stateError // stopped: the caller says so
			default:
				c.out.errf("Failed to get cq event!\n")
				c.out.cause(err)
				c.state = stateError
			}
			return c.state
		}
		if n == 1 && c.completion(&c.wc[0]) {
			return c.state
		}
	}
}

// completion handles one completion as rping's CQ handler does: flushed
// requests are ignored, failed ones end the run; it reports whether the
// completion moved the protocol on.
func (c *conn) completion(wc *verbs.WorkCompletion) bool {
	if wc.Status != verbs.WCSuccess {
		if wc.Status == verbs.WCFlushErr {
			return false
		}
		c.out.errf("cq completion failed status %d\n", int(wc.Status))
		c.out.cause(fmt.Errorf("QP %d: %v completion: %v", c.qp.Num(), wc.Opcode, wc.Status))
		c.state = stateError
		return true
	}
	switch wc.Opcode {
	case verbs.WCSend:
		c.out.debugf("send completion\n")
		return false
	case verbs.WCWrite:
		c.out.debugf("rdma write completion\n")
		c.state = stateWriteComplete
		return true
	case verbs.WCRead:
		c.out.debugf("rdma read completion\n")
		c.state = stateReadComplete
		return true
	case verbs.WCRecv:
		c.out.debugf("recv completion\n")
		if !c.recv(wc) {
			c.out.errf("recv wc error: %d\n", -1)
			c.state = stateError
			return true
		}
		if err := c.postRecv(); err != nil {
			c.out.errf("post recv error: %d\n", int(postErrno(err)))
			c.out.cause(err)
			c.state = stateError
		}
		return true
	default:
		c.out.debugf("unknown!!!!! completion\n")
		c.state = stateError
		return true
	}
}

// recv takes a received message: server_recv and client_recv of rping.
func (c *conn) recv(wc *verbs.WorkCompletion) bool {
	if wc.ByteLen != AdvertLen {
		c.out.errf("Received bogus data, size %d\n", wc.ByteLen)
		return false
	}
	if !c.server {
		if c.state == stateReadAdv {
			c.state = stateWriteAdv
		} else {
			c.state = stateWriteComplete
		}
		return true
	}
	a, _ := ParseAdvert(c.recvBuf)
	c.remote = a
	c.out.debugf("Received rkey %x addr %x len %d from peer\n", a.RKey, a.Addr, a.Size)
	if c.state <= stateConnected || c.state == stateWriteComplete {
		c.state = stateReadAdv
	} else {
		c.state = stateWriteAdv
	}
	return true
}

// postErrno is the errno ibv_post_send or ibv_post_recv would return for
// err: ENOMEM for a full queue, EINVAL for the rest.
func postErrno(err error) syscall.Errno {
	if e := errnoOf(err); e != 0 {
		return e
	}
	if errors.Is(err, verbs.ErrQueueFull) {
		return syscall.ENOMEM
	}
	return syscall.EINVAL
}

// errText is perror's text for err: the errno's words if there is one.
func errText(err error) string {
	if e := errnoOf(err); e != 0 {
		return strerror(e)
	}
	return err.Error()
}
