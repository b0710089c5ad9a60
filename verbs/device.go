package verbs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"unsafe"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// Errors of the verbs calls.
var (
	// ErrDestroyed is returned by calls on a destroyed object or closed device.
	ErrDestroyed = errors.New("verbs: object destroyed")
	// ErrBusy is returned when destroying an object still in use (EBUSY).
	ErrBusy = ibv.ErrBusy
	// ErrDeviceRemoved is returned by every call on a device reached over
	// the verbs socket once the daemon has gone (it exited, crashed or
	// removed the device): IBV_EVENT_DEVICE_FATAL. That includes calls
	// waiting in the daemon when it went (Listener.Accept, QP.Connect)
	// and, once the flushed completions are polled, CQ.Poll and CQ.Wait.
	// The calls that release (QP.Destroy, CQ.Destroy, MR.Dereg,
	// PD.Dealloc, Listener.Close, Device.Close) succeed instead: the
	// daemon has released everything, and they free what the process
	// holds. Posting and polling work through shared rings, without a
	// round trip: they fail once the process has seen the removal (the
	// QP's EventDisconnected carries it); work posted just before that
	// completes with flush errors.
	ErrDeviceRemoved = errors.New("verbs: device removed")
	// ErrNotShared is returned by RegMR over the verbs socket for memory
	// that did not come from Device.AllocBuffer.
	ErrNotShared = errors.New("verbs: memory not allocated with Device.AllocBuffer")
	// ErrLimit is returned over the verbs socket when a call would take
	// the client past one of the daemon's per-client limits (QPs, CQs,
	// MRs, registered bytes, queued work requests, ...: siwtun up
	// --max-client-*). The error also matches syscall.ENOMEM, which C
	// programs get from libsiwtun. Destroying objects makes room again.
	ErrLimit = errors.New("verbs: per-client limit of the daemon reached")
)

// Device is an open RNIC (ibv_context). It is reached over the daemon's
// verbs socket (Dial, DialPath) or runs in-process (package rnic: the
// application embeds the engine); both have the same API.
type Device struct {
	be Provider

	mu     sync.Mutex
	pds    map[*PD]struct{}
	cqs    map[*CQ]struct{}
	closed bool
}

// NewDevice returns the device that p provides. Applications get devices
// from Dial or from package rnic; providers call NewDevice.
func NewDevice(p Provider) *Device {
	return &Device{be: p, pds: make(map[*PD]struct{}), cqs: make(map[*CQ]struct{})}
}

// Name is the device name (siwtun0).
func (d *Device) Name() string { return d.be.Name() }

// Remote reports whether the device is reached over the verbs socket.
func (d *Device) Remote() bool { _, ok := d.be.(*remoteDevice); return ok }

// Provider is the device's backend (the in-process engine's provider gives
// access to the engine).
func (d *Device) Provider() Provider { return d.be }

// Removed returns nil while the device is there. Once the daemon behind a
// device reached over the verbs socket has announced its removal (it is
// stopping) or its socket has ended, it returns the removal, a
// *RemovedError matching ErrDeviceRemoved ("device siwtun1 removed
// (daemon stopped)"). It never blocks. Tools use it to tell a run ended
// by the device's removal from one ended by the peer: a QP's
// EventDisconnected may come from the daemon destroying the QP before the
// socket closes. An in-process device is never removed.
func (d *Device) Removed() error {
	if r, ok := d.be.(interface{ removedNow() error }); ok {
		return r.removedNow()
	}
	return nil
}

func (d *Device) check() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("device %s: %w", d.Name(), ErrDestroyed)
	}
	return nil
}

// DeviceAttr are the device's capabilities (ibv_device_attr, the fields an
// iWARP RNIC fills).
type DeviceAttr struct {
	FWVersion       string
	NodeGUID        uint64
	VendorID        uint32
	VendorPartID    uint32
	MaxQP           int
	MaxQPWR         int
	MaxSGE          int
	MaxSGERead      int
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int // ORD: outbound RDMA Reads per QP
	MaxQPInitRdAtom int // IRD: inbound RDMA Reads per QP
	MaxInline       int
	MTU             int // the link MTU (the verbs MTU enum cannot express it)
	MaxSRQ          int // shared receive queues
	MaxSRQWR        int // receives one SRQ holds
	MaxSRQSGE       int // SGEs of an SRQ receive
	// AtomicCap is AtomicHCA when the device performs RFC 7306 atomics
	// (toward peers that announce them), AtomicNone when its RDMAP
	// extensions are off.
	AtomicCap AtomicCap
	// MaxMW is the memory windows (types 1 and 2) the device holds; they
	// share the region table with the memory regions (MaxMR).
	MaxMW int
}

// VendorID is siwtun's vendor id in DeviceAttr ("siw" in ASCII: a software
// RNIC, kept apart from Linux siw's 0x626d74).
const VendorID = 0x736977

// Query returns the device's capabilities (ibv_query_device). Over the
// verbs socket they are the daemon's, fetched once at Dial.
func (d *Device) Query() DeviceAttr { return d.be.Query() }

// NodeMAC is the hardware address a device stands for, derived from its
// name: iWARP devices build their GID from their interface's MAC (Linux
// siw, cxgb4, irdma), and siwtun0 is a TUN without one. It is a locally
// administered unicast address (first octet 0x02) followed by five octets
// of the name's FNV-1a hash, so it is the same for the same name on every
// start and host.
func NodeMAC(name string) [6]byte {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return [6]byte{0x02, byte(h >> 32), byte(h >> 24), byte(h >> 16), byte(h >> 8), byte(h)}
}

// NodeGUID is a device's stable GUID: GUIDOfMAC of NodeMAC.
func NodeGUID(name string) uint64 { return GUIDOfMAC(NodeMAC(name)) }

// GUIDOfMAC is the node GUID of a device whose interface has hardware
// address m: its modified EUI-64 (ff:fe in the middle, the
// universal/local bit flipped), as Linux siw derives its node GUID (and
// with it its GID) from its interface's MAC.
func GUIDOfMAC(m [6]byte) uint64 {
	return uint64(m[0]^0x02)<<56 | uint64(m[1])<<48 | uint64(m[2])<<40 | 0xff<<32 | 0xfe<<24 |
		uint64(m[3])<<16 | uint64(m[4])<<8 | uint64(m[5])
}

// AllocBuffer returns n bytes of memory to register with RegMR. In-process
// it is ordinary Go memory. Over the verbs socket it is shared with the
// daemon (a sealed memfd mapped by both, its size rounded up to whole
// pages), so the engine places incoming data straight into it and reads
// outgoing data from it; over the socket RegMR accepts only such memory.
// The memory lives until the device is closed.
func (d *Device) AllocBuffer(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("alloc buffer: size %d", n)
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	return d.be.AllocBuffer(n)
}

// Close destroys every object of the device and closes it. Over the verbs
// socket it ends the session: the daemon destroys whatever is left.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	pds := slices.Collect(maps.Keys(d.pds))
	d.mu.Unlock()
	for _, pd := range pds {
		pd.destroyAll()
	}
	return d.be.Close()
}

// PD is a protection domain (ibv_pd): memory regions and queue pairs of one
// PD only work together.
type PD struct {
	dev    *Device
	be     ProviderPD
	handle uint32
	mrs    map[*MR]struct{}
	qps    map[*QP]struct{}
	srqs   map[*SRQ]struct{}
	mws    map[*MW]struct{}
	freed  bool // guarded by dev.mu
}

// attach records an object of the PD, unless the PD was freed.
func (pd *PD) attach(add func()) error {
	pd.dev.mu.Lock()
	defer pd.dev.mu.Unlock()
	if pd.freed || pd.dev.closed {
		return fmt.Errorf("PD %d: %w", pd.handle, ErrDestroyed)
	}
	add()
	return nil
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (*PD, error) {
	if err := d.check(); err != nil {
		return nil, fmt.Errorf("alloc PD: %w", ErrDestroyed)
	}
	be, handle, err := d.be.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("alloc PD: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		be.Dealloc()
		return nil, fmt.Errorf("alloc PD: %w", ErrDestroyed)
	}
	pd := &PD{dev: d, be: be, handle: handle, mrs: make(map[*MR]struct{}), qps: make(map[*QP]struct{}), srqs: make(map[*SRQ]struct{}), mws: make(map[*MW]struct{})}
	d.pds[pd] = struct{}{}
	return pd, nil
}

// Handle is the PD's number.
func (pd *PD) Handle() uint32 { return pd.handle }

// Dealloc frees the PD; it fails with ErrBusy while regions, windows, QPs or SRQs
// remain.
func (pd *PD) Dealloc() error {
	d := pd.dev
	d.mu.Lock()
	if pd.freed {
		d.mu.Unlock()
		return fmt.Errorf("dealloc PD %d: %w", pd.handle, ErrDestroyed)
	}
	if len(pd.mrs) > 0 || len(pd.qps) > 0 || len(pd.srqs) > 0 || len(pd.mws) > 0 {
		d.mu.Unlock()
		return fmt.Errorf("dealloc PD %d: %w (%d MRs, %d MWs, %d QPs, %d SRQs)", pd.handle, ErrBusy, len(pd.mrs), len(pd.mws), len(pd.qps), len(pd.srqs))
	}
	pd.freed = true
	delete(d.pds, pd)
	d.mu.Unlock()
	if err := pd.be.Dealloc(); err != nil {
		return fmt.Errorf("dealloc PD %d: %w", pd.handle, err)
	}
	return nil
}

func (pd *PD) destroyAll() {
	d := pd.dev
	d.mu.Lock()
	qps := slices.Collect(maps.Keys(pd.qps))
	mrs := slices.Collect(maps.Keys(pd.mrs))
	d.mu.Unlock()
	for _, qp := range qps {
		qp.Destroy()
	}
	d.mu.Lock()
	srqs := slices.Collect(maps.Keys(pd.srqs))
	d.mu.Unlock()
	for _, s := range srqs {
		s.Destroy()
	}
	d.mu.Lock()
	mws := slices.Collect(maps.Keys(pd.mws))
	d.mu.Unlock()
	for _, mw := range mws { // before the regions they are bound to
		mw.Dealloc()
	}
	for _, mr := range mrs {
		mr.Dereg()
	}
	pd.Dealloc()
}

// MR is a registered memory region (ibv_mr). The engine places incoming
// RDMA data straight into its bytes and reads outgoing data from them.
type MR struct {
	pd     *PD // guarded by pd.dev.mu once registered (Rereg)
	be     ProviderMR
	stag   uint32
	addr   uint64
	buf    []byte
	access Access
}

// RegMR registers buf with the given access rights. The region's address
// (the tagged offset of buf[0], what a peer uses with the rkey) is buf's
// address in memory, as with ibv_reg_mr. Over the verbs socket buf must lie
// in memory from Device.AllocBuffer (ErrNotShared otherwise).
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("reg MR: empty buffer")
	}
	return pd.RegMRAt(buf, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), access)
}

// RegMRAt registers buf with buf[0] at tagged offset iova (ibv_reg_mr_iova).
func (pd *PD) RegMRAt(buf []byte, iova uint64, access Access) (*MR, error) {
	if err := pd.attach(func() {}); err != nil {
		return nil, fmt.Errorf("reg MR: %w", err)
	}
	be, stag, err := pd.be.RegMR(buf, iova, access)
	if err != nil {
		return nil, fmt.Errorf("reg MR: %w", err)
	}
	mr := &MR{pd: pd, be: be, stag: stag, addr: iova, buf: buf, access: access}
	if err := pd.attach(func() { pd.mrs[mr] = struct{}{} }); err != nil {
		be.Dereg()
		return nil, fmt.Errorf("reg MR: %w", err)
	}
	return mr, nil
}

// LKey is the key local work requests name the region by.
func (mr *MR) LKey() uint32 { return mr.stag }

// RKey is the STag a peer names the region by.
func (mr *MR) RKey() uint32 { return mr.stag }

// Addr is the tagged offset of the region's first byte.
func (mr *MR) Addr() uint64 { return mr.addr }

// Len is the region's length.
func (mr *MR) Len() int { return len(mr.buf) }

// Bytes is the registered memory.
func (mr *MR) Bytes() []byte { return mr.buf }

// SGE returns the element for n bytes at offset off of the region.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.addr + uint64(off), Length: uint32(n), LKey: mr.stag}
}

// Dereg deregisters the region (ibv_dereg_mr): its STag is invalid from now
// on, for local requests and for peers. A region with memory windows bound
// to it stays registered (ErrBusy).
func (mr *MR) Dereg() error {
	if err := mr.be.Dereg(); err != nil {
		return fmt.Errorf("dereg MR: %w", err)
	}
	d := mr.pd.dev
	d.mu.Lock()
	delete(mr.pd.mrs, mr)
	d.mu.Unlock()
	return nil
}

// QPInitAttr describes a queue pair to create (ibv_qp_init_attr).
type QPInitAttr struct {
	SendCQ, RecvCQ *CQ
	// MaxSendWR and MaxRecvWR are the queue depths.
	MaxSendWR, MaxRecvWR int
	// SignalAll completes every send request (sq_sig_all).
	SignalAll bool
	// SRQ, if set, is the shared receive queue (of the same device) the
	// QP takes its receives from (ibv_qp_init_attr.srq): MaxRecvWR is
	// then ignored, and QP.PostRecv fails with ErrInvalidWR.
	SRQ *SRQ
}

// QP is a reliable-connected queue pair (ibv_qp + its rdma_cm_id).
type QP struct {
	pd        *PD
	be        ProviderQP
	att       QPInitAttr
	destroyed bool // guarded by pd.dev.mu
}

// CreateQP creates a queue pair in RESET.
func (pd *PD) CreateQP(attr QPInitAttr) (*QP, error) {
	if attr.SendCQ == nil || attr.RecvCQ == nil {
		return nil, fmt.Errorf("create QP: send and receive CQs are required")
	}
	if attr.SendCQ.dev != pd.dev || attr.RecvCQ.dev != pd.dev {
		return nil, fmt.Errorf("create QP: completion queue of another device")
	}
	if attr.SRQ != nil {
		if attr.SRQ.pd.dev != pd.dev {
			return nil, fmt.Errorf("create QP: SRQ of another device")
		}
		// The SRQ is held from now on: it cannot be destroyed while
		// the QP is being created.
		pd.dev.mu.Lock()
		destroyed := attr.SRQ.destroyed
		if !destroyed {
			attr.SRQ.users++
		}
		pd.dev.mu.Unlock()
		if destroyed {
			return nil, fmt.Errorf("create QP: SRQ: %w", ErrDestroyed)
		}
		if attr.MaxRecvWR <= 0 {
			attr.MaxRecvWR = 1 // the provider's check; an SRQ QP has no receive queue of its own
		}
	}
	qp, err := pd.createQP(attr)
	if err != nil && attr.SRQ != nil {
		pd.dev.mu.Lock()
		attr.SRQ.users--
		pd.dev.mu.Unlock()
	}
	return qp, err
}

func (pd *PD) createQP(attr QPInitAttr) (*QP, error) {
	if err := pd.attach(func() {}); err != nil {
		return nil, fmt.Errorf("create QP: %w", err)
	}
	be, err := pd.be.CreateQP(attr.SendCQ.be, attr.RecvCQ.be, attr)
	if err != nil {
		return nil, err
	}
	qp := &QP{pd: pd, be: be, att: attr}
	err = pd.attach(func() {
		pd.qps[qp] = struct{}{}
		attr.SendCQ.users++
		attr.RecvCQ.users++
	})
	if err != nil {
		be.Destroy()
		return nil, fmt.Errorf("create QP: %w", err)
	}
	return qp, nil
}

// Num is the queue pair number.
func (qp *QP) Num() uint32 { return qp.be.Num() }

// State is the current state.
func (qp *QP) State() QPState { return qp.be.State() }

// Modify changes the state by hand (ibv_modify_qp): RESET→INIT, →ERR,
// ERR→RESET. Connection management moves it to RTR and RTS.
func (qp *QP) Modify(s QPState) error { return qp.be.Modify(s) }

// PostSend posts send requests (ibv_post_send); see offload.QP.PostSend.
// Over the verbs socket the requests are written into the send queue ring
// shared with the daemon (no message per request).
func (qp *QP) PostSend(wrs []SendWR) (int, error) { return qp.be.PostSend(wrs) }

// PostRecv posts receive requests (ibv_post_recv).
func (qp *QP) PostRecv(wrs []RecvWR) (int, error) { return qp.be.PostRecv(wrs) }

// Events delivers the queue pair's connection events.
func (qp *QP) Events() <-chan Event { return qp.be.Events() }

// Connect connects to a listening peer (rdma_connect); on return the QP is
// in RTS.
func (qp *QP) Connect(ctx context.Context, remote netip.AddrPort, p ConnParam) error {
	return qp.be.Connect(ctx, remote, p)
}

// Disconnect ends the connection (rdma_disconnect): outstanding work is
// flushed and the TCP connection closed.
func (qp *QP) Disconnect() { qp.be.Disconnect() }

// Info is a snapshot for the control plane.
func (qp *QP) Info() Info { return qp.be.Info() }

// Provider is the queue pair's backend (in-process: the engine's QP).
func (qp *QP) Provider() ProviderQP { return qp.be }

// Destroy disconnects and destroys the queue pair (ibv_destroy_qp).
func (qp *QP) Destroy() error {
	d := qp.pd.dev
	d.mu.Lock()
	if qp.destroyed {
		d.mu.Unlock()
		return fmt.Errorf("destroy QP %d: %w", qp.Num(), ErrDestroyed)
	}
	qp.destroyed = true
	d.mu.Unlock()
	err := qp.be.Destroy()
	d.mu.Lock()
	delete(qp.pd.qps, qp)
	qp.att.SendCQ.users--
	qp.att.RecvCQ.users--
	if qp.att.SRQ != nil {
		qp.att.SRQ.users--
	}
	d.mu.Unlock()
	return err
}

// Listener accepts connections (rdma_listen on an rdma_cm_id).
type Listener struct{ be ProviderListener }

// Listen listens on addr (port 0: ephemeral); backlog bounds the requests
// waiting for Accept.
func (d *Device) Listen(addr netip.AddrPort, backlog int) (*Listener, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	be, err := d.be.Listen(addr, backlog)
	if err != nil {
		return nil, err
	}
	return &Listener{be: be}, nil
}

// Addr is the listening address.
func (l *Listener) Addr() netip.AddrPort { return l.be.Addr() }

// Accept waits for a connection request (rdma_get_request).
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	be, err := l.be.Accept(ctx)
	if err != nil {
		return nil, err
	}
	r := &ConnRequest{be: be}
	r.Remote, r.PrivateData, r.IRD, r.ORD = be.Peer()
	return r, nil
}

// Close stops listening.
func (l *Listener) Close() error { return l.be.Close() }

// ConnRequest is a peer's connection request (a CONNECT_REQUEST event).
type ConnRequest struct {
	be ProviderConnReq
	// Remote is the peer's address.
	Remote netip.AddrPort
	// PrivateData is the peer's private data.
	PrivateData []byte
	// IRD and ORD are the peer's (responder resources, initiator depth).
	IRD, ORD uint16
}

// Accept connects qp to the peer (rdma_accept).
func (r *ConnRequest) Accept(qp *QP, p ConnParam) error { return r.be.Accept(qp.be, p) }

// Reject refuses the request with private data (rdma_reject).
func (r *ConnRequest) Reject(privateData []byte) error { return r.be.Reject(privateData) }
