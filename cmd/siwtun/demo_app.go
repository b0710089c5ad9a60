package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// demoEnd is one side of a demo application's connection: on dev a PD, a
// send and a receive CQ and a QP in INIT.
type demoEnd struct {
	dev      *verbs.Device
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	qp       *verbs.QP
}

// newDemoEnd creates a demoEnd on d.
func newDemoEnd(d *verbs.Device) (*demoEnd, error) {
	pd, err := d.AllocPD()
	if err != nil {
		return nil, err
	}
	scq, err := d.CreateCQ(64)
	if err != nil {
		return nil, err
	}
	rcq, err := d.CreateCQ(64)
	if err != nil {
		return nil, err
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		return nil, err
	}
	if err := qp.Modify(verbs.QPInit); err != nil {
		return nil, err
	}
	return &demoEnd{d, pd, scq, rcq, qp}, nil
}

// region allocates n bytes on the end's device and registers them with
// access.
func (e *demoEnd) region(n int, access verbs.Access) ([]byte, *verbs.MR, error) {
	buf, err := e.dev.AllocBuffer(n)
	if err != nil {
		return nil, nil, err
	}
	buf = buf[:n]
	mr, err := e.pd.RegMR(buf, access)
	if err != nil {
		return nil, nil, err
	}
	return buf, mr, nil
}

// newDemoEnds creates the client's demoEnd on cdev and the server's on
// sdev.
func newDemoEnds(cdev, sdev *verbs.Device) (c, s *demoEnd, err error) {
	if c, err = newDemoEnd(cdev); err != nil {
		return nil, nil, err
	}
	if s, err = newDemoEnd(sdev); err != nil {
		return nil, nil, err
	}
	return c, s, nil
}

// acceptOne accepts the first connection request on l into qp with p, in
// a goroutine; the channel gives the result.
func acceptOne(ctx context.Context, l *verbs.Listener, qp *verbs.QP, p verbs.ConnParam) <-chan error {
	acc := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			acc <- err
			return
		}
		acc <- req.Accept(qp, p)
	}()
	return acc
}

// connectDemo connects c's queue pair with cp to addr, where l listens,
// and accepts the request there into s's queue pair with sp, telling it
// as step. It returns how long the connection took from the Connect call.
func connectDemo(ctx context.Context, w io.Writer, step int, l *verbs.Listener, addr netip.AddrPort, c, s *demoEnd, cp, sp verbs.ConnParam) (time.Duration, error) {
	acc := acceptOne(ctx, l, s.qp, sp)
	fmt.Fprintf(w, "%d. connect siwtun0 -> %v:%d (TCP, then MPA Request/Reply)\n", step, addr.Addr(), addr.Port())
	t0 := time.Now()
	if err := c.qp.Connect(ctx, addr, cp); err != nil {
		return 0, err
	}
	if err := <-acc; err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// runApp is the demo's verbs application: it connects a QP on cdev to one
// accepted on sdev at srv:7174 and does a Send, an RDMA Write and an RDMA
// Read with every byte verified, telling what it does. It returns the
// client QP, still connected.
func runApp(w io.Writer, cdev, sdev *verbs.Device, srv netip.Addr, size int) (*verbs.QP, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, s, err := newDemoEnds(cdev, sdev)
	if err != nil {
		return nil, err
	}
	a := &demoApp{w: w, ctx: ctx, c: c, s: s, size: size, wcs: make([]verbs.WorkCompletion, 4)}
	if err := a.serverMemory(sdev); err != nil {
		return nil, err
	}
	at := netip.AddrPortFrom(srv, 7174)
	l, err := sdev.Listen(at, 1)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	for _, step := range []func() error{func() error { return a.connect(l, at) }, a.send, a.write, a.read} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return c.qp, nil
}

// demoApp is the demo's application between its client and server ends:
// the server's receive buffer and the region the client writes and
// reads, and the client's own region.
type demoApp struct {
	w             io.Writer
	ctx           context.Context
	c, s          *demoEnd
	size          int
	recvBuf       []byte
	recvMR        *verbs.MR
	target, cbuf  []byte
	targetMR, cmr *verbs.MR
	wcs           []verbs.WorkCompletion
}

// serverMemory registers the server's receive buffer and the region the
// client may write and read, and posts the first receive.
func (a *demoApp) serverMemory(sdev *verbs.Device) error {
	var err error
	if a.recvBuf, err = sdev.AllocBuffer(256); err != nil {
		return err
	}
	if a.recvMR, err = a.s.pd.RegMR(a.recvBuf, verbs.AccessLocalWrite); err != nil {
		return err
	}
	if a.target, a.targetMR, err = a.s.region(a.size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		return err
	}
	_, err = a.s.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{a.recvMR.SGE(0, len(a.recvBuf))}}})
	return err
}

// connect is step 1: the client connects to the server's listener.
func (a *demoApp) connect(l *verbs.Listener, at netip.AddrPort) error {
	took, err := connectDemo(a.ctx, a.w, 1, l, at, a.c, a.s,
		verbs.ConnParam{PrivateData: []byte("siwtun demo client"), InitiatorDepth: 4, ResponderResources: 4},
		verbs.ConnParam{PrivateData: []byte("siwtun demo server")})
	if err != nil {
		return err
	}
	p := a.c.qp.Info()
	fmt.Fprintf(a.w, "   established in %v: MPA rev %d, CRC %v, markers tx/rx %v/%v, IRD %d ORD %d, EMSS %d\n\n",
		took.Round(time.Microsecond), p.Params.Rev, onOff(p.Params.CRC), onOff(p.Params.MarkersTx), onOff(p.Params.MarkersRx), p.IRD, p.ORD, p.EMSS)
	return nil
}

// wait waits for one successful completion on cq.
func (a *demoApp) wait(cq *verbs.CQ, what string) (verbs.WorkCompletion, error) {
	n, err := cq.Wait(a.ctx, a.wcs[:1])
	if err != nil {
		return verbs.WorkCompletion{}, fmt.Errorf("%s: %w", what, err)
	}
	if n != 1 || a.wcs[0].Status != verbs.WCSuccess {
		return a.wcs[0], fmt.Errorf("%s: completion status %v", what, a.wcs[0].Status)
	}
	return a.wcs[0], nil
}

// send is step 2: the client tells the server where its buffer is,
// rping-style.
func (a *demoApp) send() error {
	var err error
	if a.cbuf, a.cmr, err = a.c.region(a.size, verbs.AccessLocalWrite|verbs.AccessRemoteRead); err != nil {
		return err
	}
	for i := range a.cbuf {
		a.cbuf[i] = byte('A' + i%58)
	}
	msg := make([]byte, 16)
	binary.BigEndian.PutUint64(msg, a.cmr.Addr())
	binary.BigEndian.PutUint32(msg[8:], a.cmr.RKey())
	binary.BigEndian.PutUint32(msg[12:], uint32(a.size))
	fmt.Fprintf(a.w, "2. Send 16 bytes (address 0x%x, rkey 0x%08x, size %d)\n", a.cmr.Addr(), a.cmr.RKey(), a.size)
	t0 := time.Now()
	if _, err := a.c.qp.PostSend([]verbs.SendWR{{ID: 10, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: msg}}); err != nil {
		return err
	}
	if _, err := a.wait(a.c.scq, "send"); err != nil {
		return err
	}
	rwc, err := a.wait(a.s.rcq, "receive")
	if err != nil {
		return err
	}
	if !bytes.Equal(a.recvBuf[:rwc.ByteLen], msg) {
		return fmt.Errorf("send: received bytes differ")
	}
	fmt.Fprintf(a.w, "   received %d bytes in %v, verified\n\n", rwc.ByteLen, time.Since(t0).Round(time.Microsecond))
	return nil
}

// write is step 3: an RDMA Write from the client into the server's
// target region, and a Send behind it.
func (a *demoApp) write() error {
	fmt.Fprintf(a.w, "3. RDMA Write %d bytes to rkey 0x%08x\n", a.size, a.targetMR.RKey())
	t0 := time.Now()
	if _, err := a.s.qp.PostRecv([]verbs.RecvWR{{ID: 2, SGL: []verbs.SGE{a.recvMR.SGE(0, len(a.recvBuf))}}}); err != nil {
		return err
	}
	if _, err := a.c.qp.PostSend([]verbs.SendWR{
		{ID: 11, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.cmr.SGE(0, a.size)}, RemoteAddr: a.targetMR.Addr(), RKey: a.targetMR.RKey()},
		{ID: 12, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("written")},
	}); err != nil {
		return err
	}
	if _, err := a.wait(a.c.scq, "write"); err != nil {
		return err
	}
	if _, err := a.wait(a.s.rcq, "write notice"); err != nil {
		return err
	}
	if !bytes.Equal(a.target, a.cbuf) {
		return fmt.Errorf("RDMA Write: target bytes differ")
	}
	fmt.Fprintf(a.w, "   placed and verified in %v (the Send behind it arrived: RDMAP keeps order)\n\n", time.Since(t0).Round(time.Microsecond))
	return nil
}

// read is step 4: the server's region, changed, read back into a fresh
// client buffer.
func (a *demoApp) read() error {
	for i := range a.target {
		a.target[i] = byte('z' - i%26)
	}
	sink, smr, err := a.c.region(a.size, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.w, "4. RDMA Read %d bytes from rkey 0x%08x\n", a.size, a.targetMR.RKey())
	t0 := time.Now()
	if _, err := a.c.qp.PostSend([]verbs.SendWR{{ID: 13, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, a.size)}, RemoteAddr: a.targetMR.Addr(), RKey: a.targetMR.RKey()}}); err != nil {
		return err
	}
	if _, err := a.wait(a.c.scq, "read"); err != nil {
		return err
	}
	if !bytes.Equal(sink, a.target) {
		return fmt.Errorf("RDMA Read: bytes differ")
	}
	fmt.Fprintf(a.w, "   read and verified in %v\n\n", time.Since(t0).Round(time.Microsecond))
	return nil
}
