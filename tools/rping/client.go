package rping

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// disconnectWait bounds the wait for DISCONNECTED after the client's own
// disconnect (rping's CM thread prints "client DISCONNECT EVENT..." then).
const disconnectWait = 5 * time.Second

// Ping is rping -c: it connects to the server at addr through dev, pings
// Options.Count times (until the server goes with 0) and disconnects. The
// result is nil when the pings are done or the server disconnected (rping
// exits 0 then), an *ExitError when the connection or the protocol failed
// (a byte that did not come back as sent, with Options.Validate), and ctx's
// error when ctx ended first.
func Ping(ctx context.Context, dev *verbs.Device, addr netip.AddrPort, o Options) error {
	out := newOutput(&o)
	if err := o.check(out); err != nil {
		return err
	}
	out.debugf("client\n")
	mem, err := dev.AllocBuffer(bufLen(o.Size))
	if err != nil {
		out.errf("rping_setup_buffers failed: %d\n", -1)
		out.cause(err)
		return failed(err)
	}
	c, err := newConn(ctx, out, &o, dev, false, mem)
	if err != nil {
		return err
	}
	defer c.close()
	if err := c.postRecv(); err != nil {
		out.errf("ibv_post_recv failed: %d\n", int(postErrno(err)))
		out.cause(err)
		return failed(err)
	}
	c.startWatch()
	if err := c.connect(addr); err != nil {
		return err
	}
	err = c.testClient()
	var ee *ExitError
	if errors.As(err, &ee) {
		out.errf("rping client failed: %d\n", -1)
	}
	c.disconnect()
	return err
}

// connect is rping_connect_client: rdma_connect with responder resources
// and initiator depth 1 (an MPA rev 2 Request with IRD 1, ORD 1).
func (c *conn) connect(addr netip.AddrPort) error {
	err := c.qp.Connect(c.ctx, addr, verbs.ConnParam{ResponderResources: 1, InitiatorDepth: 1})
	if err != nil {
		if c.run.Err() != nil {
			return c.run.Err()
		}
		c.connectFailed(err)
		return failed(err)
	}
	c.state = stateConnected
	c.out.debugf("rdma_connect successful\n")
	return nil
}

// connectFailed prints what rping prints when its connect fails on siw:
// a TCP failure makes rdma_connect itself fail (siw connects the socket
// synchronously); an MPA reject comes as a REJECTED event with -ECONNRESET,
// a Reply siw cannot take as one with -ECONNREFUSED; other MPA failures as
// CONNECT_ERROR.
func (c *conn) connectFailed(err error) {
	var rej *verbs.RejectedError
	var me *verbs.MPAError
	switch {
	case errors.As(err, &rej):
		c.out.errf("cma event RDMA_CM_EVENT_REJECTED, error %d\n", -int(syscall.ECONNRESET))
	case errors.As(err, &me):
		c.out.errf("cma event RDMA_CM_EVENT_REJECTED, error %d\n", -int(syscall.ECONNREFUSED))
	case errnoOf(err) != 0:
		c.out.errf("rdma_connect: %s\n", strerror(errnoOf(err)))
		c.out.errf("connect error %d\n", -1)
	default:
		c.out.errf("cma event RDMA_CM_EVENT_CONNECT_ERROR, error %d\n", -int(syscall.EPROTO))
	}
	c.out.cause(err)
}

// disconnect is rping_disconnect, then the wait for the DISCONNECTED event
// it brings.
func (c *conn) disconnect() {
	c.qp.Disconnect()
	t := time.NewTimer(disconnectWait)
	defer t.Stop()
	select {
	case <-c.gone:
	case <-t.C:
	}
}

// advertise puts the advert of buffer b (registered as mr) in sendBuf:
// rping_format_send.
func (c *conn) advertise(mr *verbs.MR) {
	a := Advert{Addr: mr.Addr(), RKey: mr.RKey(), Size: uint32(c.o.Size)}
	a.Put(c.sendBuf)
	c.out.debugf("RDMA addr %x rkey %x len %d\n", a.Addr, a.RKey, a.Size)
}

// testClient is rping_test_client: per ping, fill the source buffer, Send
// its advert, wait for "go ahead", Send the sink's advert, wait for "go
// ahead", then compare (-V) and print (-v).
func (c *conn) testClient() error {
	var err error
	done := 0 // pings completed
	for ping := 0; c.o.Count == 0 || ping < c.o.Count; ping++ {
		c.state = stateReadAdv
		Fill(c.startBuf, ping)
		// Not in rping: a sink emptied before each ping, so -V also catches
		// data that never came back.
		clear(c.rdmaBuf)
		c.advertise(c.startMR)
		if err = c.send(); err != nil {
			break
		}
		if st := c.wait(); st != stateWriteAdv {
			c.out.errf("wait for RDMA_WRITE_ADV state %d\n", st)
			err = fmt.Errorf("protocol state %d, want RDMA_WRITE_ADV", st)
			break
		}
		c.advertise(c.rdmaMR)
		if err = c.send(); err != nil {
			break
		}
		if st := c.wait(); st != stateWriteComplete {
			c.out.errf("wait for RDMA_WRITE_COMPLETE state %d\n", st)
			err = fmt.Errorf("protocol state %d, want RDMA_WRITE_COMPLETE", st)
			break
		}
		if c.o.Validate {
			if i := firstDiff(c.startBuf, c.rdmaBuf); i >= 0 {
				c.out.errf("data mismatch!\n")
				err = fmt.Errorf("ping %d: byte %d of %d came back as 0x%02x, was sent as 0x%02x",
					ping, i, len(c.startBuf), c.rdmaBuf[i], c.startBuf[i])
				c.out.cause(err)
				break
			}
		}
		if c.o.Verbose {
			c.out.outf("ping data: %s\n", cString(c.rdmaBuf))
		}
		done++
	}
	switch {
	case c.state == stateDisconnected && done == 0:
		// Not rping (which exits 0): a server that hangs up before the
		// first ping is done refused this client, most often because
		// its buffer (-S) is smaller than the one advertised. Say so.
		err = fmt.Errorf("the server disconnected before the first ping completed: is its -S smaller than this client's -S %d? (it reads the whole buffer the client advertises)", c.o.Size)
		c.out.cause(err)
		return failed(err)
	case c.state == stateDisconnected:
		return nil
	case c.run.Err() != nil:
		return c.run.Err()
	case err != nil:
		return failed(err)
	}
	return nil
}
