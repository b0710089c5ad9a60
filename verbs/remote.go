package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/verbs/ibv"
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
// ErrDeviceRemoved (except those that release, see ErrDeviceRemoved) and
// outstanding work completes with flush errors.
func DialPath(path string) (*Device, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("verbs: dial %s: %w", path, err)
	}
	rd := &remoteDevice{conn: uabi.NewConn(c), calls: make(map[uint32]chan rreply),
		qps: make(map[uint32]*remoteQP), cqs: make(map[*remoteCQ]struct{}), srqs: make(map[uint32]*remoteSRQ),
		removed: make(chan struct{}), readerDone: make(chan struct{})}
	go rd.reader()
	var h uabi.HelloReply
	if _, err := rd.call(context.Background(), uabi.OpHello, &uabi.Hello{Version: uabi.Version}, &h); err != nil {
		rd.Close()
		return nil, fmt.Errorf("verbs: hello to %s: %w", path, err)
	}
	rd.devName = h.Name
	rd.attr = DeviceAttr{FWVersion: h.FWVersion, NodeGUID: h.NodeGUID, VendorID: h.VendorID, VendorPartID: h.VendorPartID,
		MaxQP: int(h.MaxQP), MaxQPWR: int(h.MaxQPWR), MaxSGE: int(h.MaxSGE), MaxSGERead: int(h.MaxSGERead),
		MaxCQ: int(h.MaxCQ), MaxCQE: int(h.MaxCQE), MaxMR: int(h.MaxMR), MaxPD: int(h.MaxPD),
		MaxQPRdAtom: int(h.MaxQPRdAtom), MaxQPInitRdAtom: int(h.MaxQPInitRdAtom), MaxInline: int(h.MaxInline), MTU: int(h.MTU),
		MaxSRQ: int(h.MaxSRQ), MaxSRQWR: int(h.MaxSRQWR), MaxSRQSGE: int(h.MaxSRQSGE),
		AtomicCap: AtomicCap(h.AtomicCap), MaxMW: int(h.MaxMW)}
	return NewDevice(rd), nil
}

type rreply struct {
	st     uint32
	msg    string
	detail []byte // an error's detail (uabi.Status)
	body   []byte
	fds    []int
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
	qps        map[uint32]*remoteQP  // by handle
	srqs       map[uint32]*remoteSRQ // by handle
	cqs        map[*remoteCQ]struct{}
	bufs       []sharedBuf
	closing    bool
	removing   string // the daemon's reason, once it said the device is removed
	gone       error  // why the device is removed
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
	reason := "daemon gone: verbs socket closed"
	for {
		h, body, fds, err := d.conn.Recv()
		if err != nil && !errors.Is(err, uabi.ErrBadMessage) {
			d.mu.Lock()
			announced := d.removing != ""
			d.mu.Unlock()
			if !uabi.IsEOF(err) && !announced {
				reason = "verbs socket: " + err.Error()
			}
			break
		}
		switch {
		case err != nil:
			uabi.CloseFDs(fds)
			d.badMessage(h, err)
		case h.Op == uabi.OpEvent:
			uabi.CloseFDs(fds)
			d.event(body, &reason)
		default:
			d.replyTo(h, body, fds)
		}
	}
	d.remove(reason)
}

// badMessage fails the call a reply answers that came without its
// descriptors (the kernel could not pass them: this process is at its
// open-file limit) or malformed, instead of letting it wait for ever.
// (What the daemon made for it stays in the session until the device is
// closed.)
func (d *remoteDevice) badMessage(h uabi.Header, err error) {
	if h.Op&uabi.ReplyBit == 0 {
		return
	}
	d.mu.Lock()
	ch := d.calls[h.Seq]
	delete(d.calls, h.Seq)
	d.mu.Unlock()
	if ch != nil {
		ch <- rreply{st: uabi.StBadMessage, msg: fmt.Sprintf("%s reply: %v", uabi.OpName(h.Op), err)}
	}
}

// event delivers an event of the daemon's to its QP or SRQ; a device
// removal sets the reason the device will be removed for.
func (d *remoteDevice) event(body []byte, reason *string) {
	_, ev, _ := uabi.DecodeEvent(body)
	switch ev := ev.(type) {
	case *uabi.QPEvent:
		d.mu.Lock()
		qp := d.qps[ev.QP]
		d.mu.Unlock()
		if qp == nil {
			return
		}
		if ev.Type == uint32(EventEstablished) {
			qp.ext.Store(uint32(ev.Ext))
		}
		e := Event{Type: EventType(ev.Type), Code: codeOf(ev.Code)}
		if len(ev.PrivateData) > 0 {
			e.PrivateData = ev.PrivateData
		}
		if ev.Err != "" {
			e.Err = errors.New(ev.Err)
		}
		qp.emit(e)
	case *uabi.SRQEvent:
		d.mu.Lock()
		s := d.srqs[ev.SRQ]
		d.mu.Unlock()
		if s != nil {
			s.emit(Event{Type: EventType(ev.Type)})
		}
	case *uabi.DeviceRemoved:
		if ev.Reason != "" {
			*reason = ev.Reason
		}
		// The daemon now ends the session: its answers to calls in
		// flight (canceled, removed) mean the removal.
		d.mu.Lock()
		d.removing = *reason
		d.mu.Unlock()
	}
}

// replyTo hands a reply to the call waiting for it (its descriptors
// included); a message that answers no call is dropped.
func (d *remoteDevice) replyTo(h uabi.Header, body []byte, fds []int) {
	d.mu.Lock()
	ch := d.calls[h.Seq]
	delete(d.calls, h.Seq)
	d.mu.Unlock()
	if ch == nil || h.Op&uabi.ReplyBit == 0 {
		uabi.CloseFDs(fds)
		return
	}
	var st uabi.Status
	dec := &uabi.Dec{B: body}
	if err := st.Decode(dec); err != nil {
		st = uabi.Status{Code: uabi.StBadMessage, Msg: fmt.Sprintf("%s reply: %v", uabi.OpName(h.Op), err)}
	}
	ch <- rreply{st: st.Code, msg: st.Msg, detail: st.Detail, body: append([]byte(nil), dec.B...), fds: fds}
}

// remove marks the device removed: pending and later calls fail, QPs get a
// Disconnected event, CQs wake up and flush.
func (d *remoteDevice) remove(reason string) {
	d.mu.Lock()
	if d.gone == nil {
		if d.closing {
			d.gone = fmt.Errorf("device %s: %w", d.devName, ErrDestroyed)
		} else {
			d.gone = &RemovedError{Device: d.devName, Reason: reason}
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

// removalWait bounds how long a call that met the daemon's end waits for
// the socket to close (the daemon first destroys the session's objects).
const removalWait = 5 * time.Second

// removedErr waits for the removal the daemon announced or the socket's
// end revealed (a reply saying so, a write to a closed socket) and returns
// the device's removal error; it returns nil if the socket stays up.
func (d *remoteDevice) removedErr() error {
	t := time.NewTimer(removalWait)
	defer t.Stop()
	select {
	case <-d.removed:
		return d.goneErr()
	case <-t.C:
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gone != nil {
		return d.gone
	}
	if d.removing != "" {
		return &RemovedError{Device: d.devName, Reason: d.removing}
	}
	return nil
}

// removedNow is the removal error once the daemon has announced the
// removal or the socket has ended, without waiting; nil before.
func (d *remoteDevice) removedNow() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gone != nil && errors.Is(d.gone, ErrDeviceRemoved) {
		return d.gone
	}
	if d.removing != "" {
		return &RemovedError{Device: d.devName, Reason: d.removing}
	}
	return nil
}

// RemovedError is a device's removal: its daemon stopped, crashed or
// removed the device. It matches ErrDeviceRemoved with errors.Is and reads
// "device siwtun1 removed (daemon stopped)".
type RemovedError struct {
	Device string // the device name
	Reason string // the daemon's reason, or how the socket ended
}

func (e *RemovedError) Error() string {
	return fmt.Sprintf("device %s removed (%s)", e.Device, e.Reason)
}

// Unwrap returns ErrDeviceRemoved.
func (e *RemovedError) Unwrap() error { return ErrDeviceRemoved }

// removalAnnounced reports whether the daemon said the device is removed.
func (d *remoteDevice) removalAnnounced() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.removing != "" || d.gone != nil
}

// call sends request req of op and waits for its reply, which it decodes
// into rep (nil: an empty reply) and whose descriptors it checks against
// uabi.Ops; when ctx ends first, it asks the daemon to cancel and still
// waits for the (prompt) reply.
func (d *remoteDevice) call(ctx context.Context, op uint16, req, rep uabi.Msg, fds ...int) (rreply, error) {
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
	err := d.conn.Send(d.enc.Message(op, seq, req, len(fds)), fds...)
	d.wmu.Unlock()
	if err != nil {
		d.mu.Lock()
		delete(d.calls, seq)
		d.mu.Unlock()
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ENOTCONN) {
			// The daemon closed the socket; the reader is about to
			// see it.
			if gone := d.removedErr(); gone != nil {
				return rreply{}, gone
			}
		} else if gone := d.goneErr(); gone != nil {
			return rreply{}, gone
		}
		return rreply{}, fmt.Errorf("verbs socket: %w", err)
	}
	var r rreply
	select {
	case r = <-ch:
	case <-ctx.Done():
		d.wmu.Lock()
		d.conn.Send(d.enc.Message(uabi.OpCancel, 0, &uabi.Cancel{Seq: seq}, 0))
		d.wmu.Unlock()
		r = <-ch
	}
	if r.st != uabi.StOK {
		uabi.CloseFDs(r.fds)
		if (r.st == uabi.StCanceled && ctx.Err() == nil) || r.st == uabi.StRemoved {
			// Canceled by the daemon, not by ctx: its session is ending.
			if d.removalAnnounced() || r.st == uabi.StRemoved {
				if gone := d.removedErr(); gone != nil {
					return r, gone
				}
			}
		}
		return r, d.statusErr(ctx, r)
	}
	if err := decodeReply(op, r, rep); err != nil {
		uabi.CloseFDs(r.fds)
		return r, err
	}
	return r, nil
}

// decodeReply decodes r's body into rep and checks its descriptors.
func decodeReply(op uint16, r rreply, rep uabi.Msg) error {
	in, _ := uabi.Lookup(op)
	if rep == nil {
		rep = &uabi.Empty{}
	}
	if err := uabi.Decode(r.body, rep); err != nil {
		return fmt.Errorf("%s reply: %w", in.Name, err)
	}
	if len(r.fds) != in.ReplyFDs {
		return fmt.Errorf("%s reply: %w: %d descriptors, want %d", in.Name, uabi.ErrBadMessage, len(r.fds), in.ReplyFDs)
	}
	return nil
}

func (d *remoteDevice) statusErr(ctx context.Context, r rreply) error {
	switch r.st {
	case uabi.StRemoved:
		if g := d.goneErr(); g != nil {
			return g
		}
		return &RemovedError{Device: d.devName, Reason: r.msg}
	case uabi.StBusy:
		return fmt.Errorf("%w: %s", ErrBusy, r.msg)
	case uabi.StQPState:
		return fmt.Errorf("%w: %s", ibv.ErrQPState, r.msg)
	case uabi.StCanceled:
		if ctx.Err() != nil {
			return ctx.Err()
		}
	case uabi.StRejected:
		rej := &ibv.RejectedError{PrivateData: r.detail}
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
	switch r.st {
	case uabi.StError:
		re.Errno = uabi.DetailErrno(r.detail)
	case uabi.StLimit:
		re.Errno = syscall.ENOMEM
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

// Is reports whether the error is ErrLimit: a request refused for a
// per-client limit of the daemon.
func (e *RemoteError) Is(target error) bool {
	return target == ErrLimit && e.Status == uabi.StLimit
}

func (d *remoteDevice) AllocBuffer(n int) ([]byte, error) {
	if gone := d.goneErr(); gone != nil {
		return nil, fmt.Errorf("alloc buffer: %w", gone)
	}
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
	var rep uabi.AllocPDReply
	if _, err := d.call(context.Background(), uabi.OpAllocPD, nil, &rep); err != nil {
		return nil, 0, err
	}
	return &remotePD{dev: d, h: rep.Handle}, rep.PDNum, nil
}

func (d *remoteDevice) Listen(addr netip.AddrPort, backlog int) (ProviderListener, error) {
	var rep uabi.ListenReply
	if _, err := d.call(context.Background(), uabi.OpListen, &uabi.Listen{Addr: addr, Backlog: uint32(max(backlog, 0))}, &rep); err != nil {
		return nil, err // the daemon's error names the address
	}
	return &remoteListener{dev: d, h: rep.Handle, a: rep.Addr}, nil
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
	srqs := make([]*remoteSRQ, 0, len(d.srqs))
	for _, s := range d.srqs {
		srqs = append(srqs, s)
	}
	bufs := d.bufs
	d.bufs = nil
	d.mu.Unlock()
	d.conn.C.Close()
	<-d.readerDone
	for _, q := range qps {
		q.release()
	}
	for _, s := range srqs {
		s.release()
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
	_, err := pd.dev.call(context.Background(), uabi.OpDeallocPD, &uabi.Ref{Handle: pd.h}, nil)
	return releaseErr(err)
}

// releaseErr is the error of a call that releases an object (destroy,
// dereg, dealloc, close): on a removed device the daemon has already
// released it, so the call succeeds and frees what the process holds.
func releaseErr(err error) error {
	if errors.Is(err, ErrDeviceRemoved) {
		return nil
	}
	return err
}

func (pd *remotePD) RegMR(buf []byte, iova uint64, access Access) (ProviderMR, uint32, error) {
	fd, off, ok := pd.dev.shared(buf)
	if !ok {
		return nil, 0, ErrNotShared
	}
	var rep uabi.RegMRReply
	req := &uabi.RegMR{PD: pd.h, Offset: off, Length: uint64(len(buf)), IOVA: iova, Access: uint32(access)}
	if _, err := pd.dev.call(context.Background(), uabi.OpRegMR, req, &rep, fd); err != nil {
		return nil, 0, err
	}
	return &remoteMR{dev: pd.dev, h: rep.Handle}, rep.STag, nil
}

func (pd *remotePD) AllocMW(typ MWType) (ProviderMW, uint32, error) {
	var rep uabi.AllocMWReply
	if _, err := pd.dev.call(context.Background(), uabi.OpAllocMW, &uabi.AllocMW{PD: pd.h, Type: uint32(typ)}, &rep); err != nil {
		return nil, 0, err
	}
	return &remoteMW{dev: pd.dev, h: rep.Handle}, rep.RKey, nil
}

type remoteMW struct {
	dev *remoteDevice
	h   uint32
}

func (mw *remoteMW) Dealloc() error {
	_, err := mw.dev.call(context.Background(), uabi.OpDeallocMW, &uabi.Ref{Handle: mw.h}, nil)
	return releaseErr(err)
}

type remoteMR struct {
	dev *remoteDevice
	h   uint32
}

func (mr *remoteMR) Rereg(pd ProviderPD, _ uint32, buf []byte, iova uint64, access Access) error {
	rpd, ok := pd.(*remotePD)
	if !ok || rpd.dev != mr.dev {
		return errors.New("PD of another device")
	}
	fd, off, ok := mr.dev.shared(buf)
	if !ok {
		return ErrNotShared
	}
	req := &uabi.ReregMR{Handle: mr.h, PD: rpd.h, Offset: off, Length: uint64(len(buf)), IOVA: iova, Access: uint32(access)}
	_, err := mr.dev.call(context.Background(), uabi.OpReregMR, req, nil, fd)
	return err
}

func (mr *remoteMR) Dereg() error {
	_, err := mr.dev.call(context.Background(), uabi.OpDeregMR, &uabi.Ref{Handle: mr.h}, nil)
	return releaseErr(err)
}

type remoteListener struct {
	dev *remoteDevice
	h   uint32
	a   netip.AddrPort
}

func (l *remoteListener) Addr() netip.AddrPort { return l.a }

func (l *remoteListener) Close() error {
	_, err := l.dev.call(context.Background(), uabi.OpCloseListener, &uabi.Ref{Handle: l.h}, nil)
	return releaseErr(err)
}

func (l *remoteListener) Accept(ctx context.Context) (ProviderConnReq, error) {
	var rep uabi.ConnRequest
	if _, err := l.dev.call(ctx, uabi.OpGetRequest, &uabi.Ref{Handle: l.h}, &rep); err != nil {
		return nil, err
	}
	return &remoteConnReq{dev: l.dev, h: rep.Handle, remote: rep.Remote, pdata: rep.PrivateData, ird: rep.IRD, ord: rep.ORD}, nil
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

func (r *remoteConnReq) Accept(qp ProviderQP, p ConnParam) error {
	q, ok := qp.(*remoteQP)
	if !ok || q.dev != r.dev {
		return fmt.Errorf("accept: QP %d is not on this device", qp.Num())
	}
	var est uabi.Established
	_, err := r.dev.call(context.Background(), uabi.OpAccept, &uabi.Accept{Request: r.h, QP: q.h, Param: uabi.ConnParamOf(p)}, &est)
	if err == nil {
		q.ext.Store(uint32(est.Ext))
		q.postOK.Store(true)
		q.inited.Store(true) // connected: receives may be posted, as after Connect
	}
	return err
}

func (r *remoteConnReq) Reject(pd []byte) error {
	_, err := r.dev.call(context.Background(), uabi.OpReject, &uabi.Reject{Request: r.h, PrivateData: pd}, nil)
	return err
}
