package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"unsafe"

	"github.com/siwtun/siwtun/verbs/ibv"
	"github.com/siwtun/siwtun/verbs/internal/uabi"
)

// SocketDir is where Dial looks for a device's verbs socket,
// <SocketDir>/<device>.sock; the SIWTUN_SOCKET_DIR environment variable
// overrides it.
var SocketDir = "/run/siwtun"

// Dial opens the device named dev (siwtun0) of the daemon through its
// verbs socket.
func Dial(dev string) (*Device, error) {
	dir := SocketDir
	if d := os.Getenv("SIWTUN_SOCKET_DIR"); d != "" {
		dir = d
	}
	return DialPath(filepath.Join(dir, dev+".sock"))
}

// DialPath opens the device served on the verbs socket at path. The device
// has the API of an in-process one, with these differences: RegMR accepts
// only memory from AllocBuffer; work requests and completions move through
// rings shared with the daemon; once the daemon goes, every call fails with
// ErrDeviceRemoved and outstanding work completes with flush errors.
func DialPath(path string) (*Device, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("verbs: dial %s: %w", path, err)
	}
	rd := &remoteDevice{conn: uabi.NewConn(c), calls: make(map[uint32]chan rreply),
		qps: make(map[uint32]*remoteQP), cqs: make(map[*remoteCQ]struct{}),
		removed: make(chan struct{}), readerDone: make(chan struct{})}
	go rd.reader()
	r, err := rd.call(context.Background(), uabi.OpHello, func(e *uabi.Enc) { e.U32(uabi.Version) })
	if err != nil {
		rd.Close()
		return nil, fmt.Errorf("verbs: hello to %s: %w", path, err)
	}
	d := &uabi.Dec{B: r.body}
	d.U32()
	rd.devName = d.String()
	a := &rd.attr
	a.FWVersion = d.String()
	a.NodeGUID = d.U64()
	for _, p := range []*int{&a.MaxQP, &a.MaxQP, &a.MaxQP, &a.MaxQPWR, &a.MaxSGE, &a.MaxSGERead, &a.MaxCQ, &a.MaxCQE,
		&a.MaxMR, &a.MaxPD, &a.MaxQPRdAtom, &a.MaxQPInitRdAtom, &a.MaxInline, &a.MTU} {
		*p = int(d.U32())
	}
	if err := d.End(); err != nil {
		rd.Close()
		return nil, fmt.Errorf("verbs: hello to %s: %w", path, err)
	}
	a.VendorID, a.VendorPartID = VendorID, 1
	return NewDevice(rd), nil
}

type rreply struct {
	st   uint32
	msg  string
	body []byte
	fds  []int
}

// remoteDevice is the backend over the verbs socket.
type remoteDevice struct {
	conn    *uabi.Conn
	devName string
	attr    DeviceAttr

	wmu sync.Mutex
	enc uabi.Enc

	mu         sync.Mutex
	seq        uint32
	calls      map[uint32]chan rreply
	qps        map[uint32]*remoteQP // by handle
	cqs        map[*remoteCQ]struct{}
	bufs       []sharedBuf
	closing    bool
	gone       error // why the device is removed
	removed    chan struct{}
	readerDone chan struct{}
}

type sharedBuf struct {
	mem []byte
	fd  int
}

func (d *remoteDevice) Name() string      { return d.devName }
func (d *remoteDevice) Query() DeviceAttr { return d.attr }

// reader dispatches replies and events until the socket ends.
func (d *remoteDevice) reader() {
	defer close(d.readerDone)
	reason := "verbs socket closed by the daemon"
	for {
		h, body, fds, err := d.conn.Recv()
		if err != nil && !errors.Is(err, uabi.ErrBadMessage) {
			if !uabi.IsEOF(err) {
				reason = err.Error()
			}
			break
		}
		if err != nil {
			uabi.CloseFDs(fds)
			continue
		}
		if h.Op == uabi.OpEvent {
			uabi.CloseFDs(fds)
			dec := &uabi.Dec{B: body}
			switch dec.U32() {
			case uabi.EvQP:
				qh, typ, code, msg := dec.U32(), EventType(dec.U32()), dec.U16(), dec.String()
				d.mu.Lock()
				qp := d.qps[qh]
				d.mu.Unlock()
				if qp != nil && dec.Err == nil {
					e := Event{Type: typ, Code: codeOf(code)}
					if msg != "" {
						e.Err = errors.New(msg)
					}
					qp.emit(e)
				}
			case uabi.EvDeviceRemoved:
				if r := dec.String(); r != "" {
					reason = r
				}
			}
			continue
		}
		d.mu.Lock()
		ch := d.calls[h.Seq]
		delete(d.calls, h.Seq)
		d.mu.Unlock()
		if ch == nil || h.Op&uabi.ReplyBit == 0 {
			uabi.CloseFDs(fds)
			continue
		}
		r := rreply{fds: fds}
		dec := &uabi.Dec{B: body}
		r.st = dec.U32()
		if r.st != uabi.StOK {
			r.msg = dec.String()
		}
		r.body = append([]byte(nil), dec.B...)
		ch <- r
	}
	d.remove(reason)
}

// remove marks the device removed: pending and later calls fail, QPs get a
// Disconnected event, CQs wake up and flush.
func (d *remoteDevice) remove(reason string) {
	d.mu.Lock()
	if d.gone == nil {
		if d.closing {
			d.gone = fmt.Errorf("device %s: %w", d.devName, ErrDestroyed)
		} else {
			d.gone = fmt.Errorf("device %s: %w: %s", d.devName, ErrDeviceRemoved, reason)
		}
		close(d.removed)
	}
	calls := d.calls
	d.calls = make(map[uint32]chan rreply)
	qps := make([]*remoteQP, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	cqs := make([]*remoteCQ, 0, len(d.cqs))
	for c := range d.cqs {
		cqs = append(cqs, c)
	}
	closing := d.closing
	d.mu.Unlock()
	for _, ch := range calls {
		ch <- rreply{st: uabi.StRemoved, msg: reason}
	}
	if closing {
		return
	}
	for _, q := range qps {
		q.emit(Event{Type: EventDisconnected, Err: d.gone})
	}
	for _, c := range cqs {
		c.wake()
	}
}

func (d *remoteDevice) goneErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gone
}

// call sends a request and waits for its reply; when ctx ends first, it
// asks the daemon to cancel and still waits for the (prompt) reply.
func (d *remoteDevice) call(ctx context.Context, op uint16, body func(*uabi.Enc), fds ...int) (rreply, error) {
	ch := make(chan rreply, 1)
	d.mu.Lock()
	if d.gone != nil {
		err := d.gone
		d.mu.Unlock()
		return rreply{}, err
	}
	d.seq++
	seq := d.seq
	d.calls[seq] = ch
	d.mu.Unlock()
	d.wmu.Lock()
	d.enc.Begin(op, seq)
	if body != nil {
		body(&d.enc)
	}
	err := d.conn.Send(d.enc.Finish(len(fds)), fds...)
	d.wmu.Unlock()
	if err != nil {
		d.mu.Lock()
		delete(d.calls, seq)
		gone := d.gone
		d.mu.Unlock()
		if gone != nil {
			return rreply{}, gone
		}
		return rreply{}, fmt.Errorf("verbs socket: %w", err)
	}
	var r rreply
	select {
	case r = <-ch:
	case <-ctx.Done():
		d.wmu.Lock()
		d.enc.Begin(uabi.OpCancel, 0)
		d.enc.U32(seq)
		d.conn.Send(d.enc.Finish(0))
		d.wmu.Unlock()
		r = <-ch
	}
	if r.st == uabi.StOK {
		return r, nil
	}
	uabi.CloseFDs(r.fds)
	return r, d.statusErr(ctx, r)
}

func (d *remoteDevice) statusErr(ctx context.Context, r rreply) error {
	switch r.st {
	case uabi.StRemoved:
		if g := d.goneErr(); g != nil {
			return g
		}
		return fmt.Errorf("%w: %s", ErrDeviceRemoved, r.msg)
	case uabi.StBusy:
		return fmt.Errorf("%w: %s", ErrBusy, r.msg)
	case uabi.StQPState:
		return fmt.Errorf("%w: %s", ibv.ErrQPState, r.msg)
	case uabi.StCanceled:
		if ctx.Err() != nil {
			return ctx.Err()
		}
	case uabi.StRejected:
		dec := &uabi.Dec{B: r.body}
		rej := &ibv.RejectedError{PrivateData: dec.Bytes()}
		switch r.msg {
		case "":
		case ibv.ErrMarkersRejected.Error():
			rej.Err = ibv.ErrMarkersRejected
		default:
			rej.Err = errors.New(r.msg)
		}
		return rej
	}
	re := &RemoteError{Status: r.st, Msg: r.msg}
	if r.st == uabi.StError {
		if b := (&uabi.Dec{B: r.body}).Bytes(); len(b) == 4 {
			re.Errno = syscall.Errno(binary.BigEndian.Uint32(b))
		}
	}
	return re
}

// RemoteError is a request the daemon refused; Status is the verbs
// socket's status code (uabi.St*).
type RemoteError struct {
	Status uint32
	Msg    string
	// Errno is the system error behind a failure (ECONNREFUSED,
	// ETIMEDOUT, ...), or 0.
	Errno syscall.Errno
}

func (e *RemoteError) Error() string { return "verbs daemon: " + e.Msg }

// Unwrap returns Errno, so errors.Is(err, syscall.ECONNREFUSED) holds for a
// refused Connect over the verbs socket as it does in-process.
func (e *RemoteError) Unwrap() error {
	if e.Errno == 0 {
		return nil
	}
	return e.Errno
}

func (d *remoteDevice) AllocBuffer(n int) ([]byte, error) {
	fd, mem, err := uabi.NewShared("siwtun-mr", n, false)
	if err != nil {
		return nil, fmt.Errorf("alloc buffer: %w", err)
	}
	d.mu.Lock()
	d.bufs = append(d.bufs, sharedBuf{mem: mem, fd: fd})
	d.mu.Unlock()
	return mem[:n:n], nil
}

// shared finds the AllocBuffer memory holding buf: its memfd and offset.
func (d *remoteDevice) shared(buf []byte) (int, uint64, bool) {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, b := range d.bufs {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(b.mem)))
		if p >= base && p+uintptr(len(buf)) <= base+uintptr(len(b.mem)) {
			return b.fd, uint64(p - base), true
		}
	}
	return -1, 0, false
}

func (d *remoteDevice) AllocPD() (ProviderPD, uint32, error) {
	r, err := d.call(context.Background(), uabi.OpAllocPD, nil)
	if err != nil {
		return nil, 0, err
	}
	dec := &uabi.Dec{B: r.body}
	h, num := dec.U32(), dec.U32()
	return &remotePD{dev: d, h: h}, num, dec.End()
}

func (d *remoteDevice) Listen(addr netip.AddrPort, backlog int) (ProviderListener, error) {
	r, err := d.call(context.Background(), uabi.OpListen, func(e *uabi.Enc) { e.AddrPort(addr); e.U32(uint32(max(backlog, 0))) })
	if err != nil {
		return nil, fmt.Errorf("listen on %v: %w", addr, err)
	}
	dec := &uabi.Dec{B: r.body}
	h, a := dec.U32(), dec.AddrPort()
	return &remoteListener{dev: d, h: h, a: a}, dec.End()
}

// close ends the session: the daemon destroys what is left. Rings and
// buffers are unmapped.
func (d *remoteDevice) Close() error {
	d.mu.Lock()
	d.closing = true
	cqs := make([]*remoteCQ, 0, len(d.cqs))
	for c := range d.cqs {
		cqs = append(cqs, c)
	}
	qps := make([]*remoteQP, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	bufs := d.bufs
	d.bufs = nil
	d.mu.Unlock()
	d.conn.C.Close()
	<-d.readerDone
	for _, q := range qps {
		q.release()
	}
	for _, c := range cqs {
		c.release(errPollDestroyed)
	}
	for _, b := range bufs {
		uabi.Unmap(b.mem)
		uabi.Close(b.fd)
	}
	return nil
}

type remotePD struct {
	dev *remoteDevice
	h   uint32
}

func (pd *remotePD) Dealloc() error {
	_, err := pd.dev.call(context.Background(), uabi.OpDeallocPD, func(e *uabi.Enc) { e.U32(pd.h) })
	return err
}

func (pd *remotePD) RegMR(buf []byte, iova uint64, access Access) (ProviderMR, uint32, error) {
	fd, off, ok := pd.dev.shared(buf)
	if !ok {
		return nil, 0, ErrNotShared
	}
	r, err := pd.dev.call(context.Background(), uabi.OpRegMR, func(e *uabi.Enc) {
		e.U32(pd.h)
		e.U64(off)
		e.U64(uint64(len(buf)))
		e.U64(iova)
		e.U32(uint32(access))
	}, fd)
	if err != nil {
		return nil, 0, err
	}
	dec := &uabi.Dec{B: r.body}
	h, stag := dec.U32(), dec.U32()
	return &remoteMR{dev: pd.dev, h: h}, stag, dec.End()
}

type remoteMR struct {
	dev *remoteDevice
	h   uint32
}

func (mr *remoteMR) Dereg() error {
	_, err := mr.dev.call(context.Background(), uabi.OpDeregMR, func(e *uabi.Enc) { e.U32(mr.h) })
	return err
}

type remoteListener struct {
	dev *remoteDevice
	h   uint32
	a   netip.AddrPort
}

func (l *remoteListener) Addr() netip.AddrPort { return l.a }

func (l *remoteListener) Close() error {
	_, err := l.dev.call(context.Background(), uabi.OpCloseListener, func(e *uabi.Enc) { e.U32(l.h) })
	return err
}

func (l *remoteListener) Accept(ctx context.Context) (ProviderConnReq, error) {
	r, err := l.dev.call(ctx, uabi.OpGetRequest, func(e *uabi.Enc) { e.U32(l.h) })
	if err != nil {
		return nil, err
	}
	dec := &uabi.Dec{B: r.body}
	h, remote, pdata, ird, ord := dec.U32(), dec.AddrPort(), dec.Bytes(), dec.U16(), dec.U16()
	if err := dec.End(); err != nil {
		return nil, err
	}
	if len(pdata) == 0 {
		pdata = nil
	}
	return &remoteConnReq{dev: l.dev, h: h, remote: remote, pdata: pdata, ird: ird, ord: ord}, nil
}

type remoteConnReq struct {
	dev      *remoteDevice
	h        uint32
	remote   netip.AddrPort
	pdata    []byte
	ird, ord uint16
}

func (r *remoteConnReq) Peer() (netip.AddrPort, []byte, uint16, uint16) {
	return r.remote, r.pdata, r.ird, r.ord
}

func encParam(e *uabi.Enc, p ConnParam) {
	e.Bytes(p.PrivateData)
	e.U16(p.ResponderResources)
	e.U16(p.InitiatorDepth)
}

func (r *remoteConnReq) Accept(qp ProviderQP, p ConnParam) error {
	q, ok := qp.(*remoteQP)
	if !ok || q.dev != r.dev {
		return fmt.Errorf("accept: QP %d is not on this device", qp.Num())
	}
	_, err := r.dev.call(context.Background(), uabi.OpAccept, func(e *uabi.Enc) { e.U32(r.h); e.U32(q.h); encParam(e, p) })
	if err == nil {
		q.postOK.Store(true)
	}
	return err
}

func (r *remoteConnReq) Reject(pd []byte) error {
	_, err := r.dev.call(context.Background(), uabi.OpReject, func(e *uabi.Enc) { e.U32(r.h); e.Bytes(pd) })
	return err
}
