package perftest

import (
	"context"
	"errors"
	"fmt"

	"github.com/siwtun/siwtun/verbs"
)

// control is perftest's control connection (-R implies -z): an RC queue
// pair connected by rdma_cm before the test, over which every exchange is
// one Send each way, the client first. Each side keeps one receive posted
// (perftest's post_one_recv_wqe: 56 bytes, wr_id SYNC_SPEC_ID); a side only
// sends after it has received the other's previous message, so one is
// always enough.
type control struct {
	client bool
	trace  func(sent bool, n int)
	// lastExchange: a flushed Send completion is taken as sent (the peer
	// closes once it has the message, and a request not yet all with TCP
	// when the connection ends under it is flushed).
	lastExchange bool
	qp           *verbs.QP
	scq          *verbs.CQ
	rcq          *verbs.CQ
	mem          *region
	wcs          [1]verbs.WorkCompletion
}

const (
	syncSpecID = 5 // perftest's SYNC_SPEC_ID, the control requests' wr_id
	ctrlSend   = 0 // offsets in the control region
	ctrlRecv   = maxCtrlMsg
)

// newControl creates the control queue pair in INIT with its receive posted.
func newControl(dev *verbs.Device, pd *verbs.PD, client bool) (*control, error) {
	c := &control{client: client}
	var err error
	if c.scq, err = dev.CreateCQ(4); err != nil {
		return nil, fmt.Errorf("control CQ: %w", err)
	}
	if c.rcq, err = dev.CreateCQ(4); err != nil {
		c.close()
		return nil, fmt.Errorf("control CQ: %w", err)
	}
	if c.mem, err = newRegion(dev, pd, 2*maxCtrlMsg); err != nil {
		c.close()
		return nil, fmt.Errorf("control buffer: %w", err)
	}
	c.qp, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: c.scq, RecvCQ: c.rcq, MaxSendWR: 2, MaxRecvWR: 2})
	if err != nil {
		c.close()
		return nil, fmt.Errorf("control QP: %w", err)
	}
	if err := c.qp.Modify(verbs.QPInit); err != nil {
		c.close()
		return nil, fmt.Errorf("control QP: %w", err)
	}
	if err := c.postRecv(); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *control) postRecv() error {
	_, err := c.qp.PostRecv([]verbs.RecvWR{{ID: syncSpecID, SGL: []verbs.SGE{c.mem.mr.SGE(ctrlRecv, maxCtrlMsg)}}})
	if err != nil {
		return fmt.Errorf("control: post receive: %w", err)
	}
	return nil
}

// close destroys the control queue pair and its resources.
func (c *control) close() {
	if c.qp != nil {
		c.qp.Destroy()
	}
	if c.mem != nil {
		c.mem.free()
	}
	for _, cq := range []*verbs.CQ{c.scq, c.rcq} {
		if cq != nil {
			cq.Destroy()
		}
	}
}

// errPeerGone is returned when the control connection ends under an
// exchange.
var errPeerGone = errors.New("the peer closed the control connection")

// send sends msg and waits until it has been handed to the RNIC's TCP.
func (c *control) send(ctx context.Context, msg []byte) error {
	copy(c.mem.buf[ctrlSend:], msg)
	wr := verbs.SendWR{ID: syncSpecID, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{c.mem.mr.SGE(ctrlSend, len(msg))}}
	if _, err := c.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		return fmt.Errorf("control: send: %w", err)
	}
	wc, err := c.wait(ctx, c.scq)
	if err != nil {
		return fmt.Errorf("control: send: %w", err)
	}
	if wc.Status != verbs.WCSuccess && !(c.lastExchange && wc.Status == verbs.WCFlushErr) {
		return fmt.Errorf("control: send: %v: %w", wc.Status, errPeerGone)
	}
	if c.trace != nil {
		c.trace(true, len(msg))
	}
	return nil
}

// recv waits for the peer's next message, returns a copy and posts the
// receive again.
func (c *control) recv(ctx context.Context) ([]byte, error) {
	wc, err := c.wait(ctx, c.rcq)
	if err != nil {
		return nil, fmt.Errorf("control: receive: %w", err)
	}
	if wc.Status != verbs.WCSuccess {
		return nil, fmt.Errorf("control: receive: %v: %w", wc.Status, errPeerGone)
	}
	msg := append([]byte(nil), c.mem.buf[ctrlRecv:ctrlRecv+int(wc.ByteLen)]...)
	if c.trace != nil {
		c.trace(false, len(msg))
	}
	return msg, c.postRecv()
}

func (c *control) wait(ctx context.Context, cq *verbs.CQ) (verbs.WorkCompletion, error) {
	if _, err := cq.Wait(ctx, c.wcs[:]); err != nil {
		return verbs.WorkCompletion{}, err
	}
	return c.wcs[0], nil
}

// exchange is ctx_xchg_data: the client sends mine then receives, the
// server receives then sends. The peer's message must be at least min
// bytes long.
func (c *control) exchange(ctx context.Context, mine []byte, min int, what string) ([]byte, error) {
	var theirs []byte
	var err error
	if c.client {
		if err = c.send(ctx, mine); err == nil {
			theirs, err = c.recv(ctx)
		}
	} else {
		if theirs, err = c.recv(ctx); err == nil {
			err = c.send(ctx, mine)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("exchanging %s: %w", what, err)
	}
	if len(theirs) < min {
		return nil, fmt.Errorf("exchanging %s: the peer sent %d bytes, want %d: %w", what, len(theirs), min, errShortMessage)
	}
	return theirs, nil
}

// handshake is ctx_hand_shake: an exchange of pingpong_dest.
func (c *control) handshake(ctx context.Context, mine *Dest) (Dest, error) {
	b, err := c.exchange(ctx, mine.Marshal(), destLen, "queue pair information")
	if err != nil {
		return Dest{}, err
	}
	return UnmarshalDest(b)
}
