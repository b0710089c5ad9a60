package verbs

import (
	"context"
	"net/netip"
)

// A Device is a thin front over a provider, as a libibverbs context is a
// front over its provider's ops: the front keeps the bookkeeping every
// provider shares (which objects a PD holds, which QPs use a CQ, destroyed
// flags) and the provider does the work. There are two: the daemon's verbs
// socket (Dial, in this package) and the in-process engine (package rnic),
// which hands its provider to NewDevice.

// Provider is a device's backend (libibverbs' provider ops).
type Provider interface {
	// Name is the device's name (siwtun0).
	Name() string
	// Query returns the device's capabilities.
	Query() DeviceAttr
	// AllocPD allocates a protection domain and returns its handle.
	AllocPD() (ProviderPD, uint32, error)
	// CreateCQ creates a completion queue of depth entries.
	CreateCQ(depth int) (ProviderCQ, error)
	// Listen listens for connection requests on addr.
	Listen(addr netip.AddrPort, backlog int) (ProviderListener, error)
	// AllocBuffer returns n bytes of memory RegMR accepts.
	AllocBuffer(n int) ([]byte, error)
	// Close releases the device; the front has destroyed its objects.
	Close() error
}

// ProviderPD is a protection domain's backend.
type ProviderPD interface {
	// RegMR registers buf at tagged offset iova and returns the STag.
	RegMR(buf []byte, iova uint64, access Access) (ProviderMR, uint32, error)
	// CreateQP creates a queue pair completing into send and recv, which
	// are completion queues of the same provider; attr.SRQ, if set, is a
	// shared receive queue of the same provider (its backend:
	// attr.SRQ.Provider()).
	CreateQP(send, recv ProviderCQ, attr QPInitAttr) (ProviderQP, error)
	// CreateSRQ creates a shared receive queue.
	CreateSRQ(attr SRQAttr) (ProviderSRQ, error)
	// AllocMW allocates a memory window of type typ and returns its rkey.
	AllocMW(typ MWType) (ProviderMW, uint32, error)
	// Dealloc frees the PD; the front has checked it is unused.
	Dealloc() error
}

// ProviderMR is a memory region's backend.
type ProviderMR interface {
	// Dereg invalidates the region's STag and releases it.
	Dereg() error
	// Rereg makes the region's STag name buf at tagged offset iova in pd
	// (whose handle is pdHandle) with access (MR.Rereg).
	Rereg(pd ProviderPD, pdHandle uint32, buf []byte, iova uint64, access Access) error
}

// ProviderMW is a memory window's backend.
type ProviderMW interface {
	// Dealloc invalidates the window's STag and frees it.
	Dealloc() error
}

// ProviderCQ is a completion queue's backend. One that the in-process
// engine fills also implements CompletionQueue, which CQ.Push calls.
type ProviderCQ interface {
	// Poll moves up to len(wcs) completions into wcs without allocating.
	Poll(wcs []WorkCompletion) (int, error)
	// ReqNotify arms the queue for one notification.
	ReqNotify(solicitedOnly bool) error
	// NotifyChan delivers the notifications.
	NotifyChan() <-chan struct{}
	// Destroy releases the queue; the front has checked it is unused.
	Destroy() error
}

// ProviderQP is a queue pair's backend; its methods are QP's.
type ProviderQP interface {
	Num() uint32
	State() QPState
	Modify(s QPState) error
	PostSend(wrs []SendWR) (int, error)
	PostRecv(wrs []RecvWR) (int, error)
	Events() <-chan Event
	Connect(ctx context.Context, remote netip.AddrPort, p ConnParam) error
	Disconnect()
	Info() Info
	Destroy() error
}

// ProviderSRQ is a shared receive queue's backend; its methods are SRQ's.
type ProviderSRQ interface {
	PostRecv(wrs []RecvWR) (int, error)
	Modify(attr SRQAttr, mask SRQAttrMask) error
	Query() (SRQAttr, error)
	Events() <-chan Event
	// Destroy frees the queue; the front has checked no QP uses it.
	Destroy() error
}

// ProviderListener is a listener's backend.
type ProviderListener interface {
	// Addr is the listening address.
	Addr() netip.AddrPort
	// Accept waits for the next connection request.
	Accept(ctx context.Context) (ProviderConnReq, error)
	// Close stops listening.
	Close() error
}

// ProviderConnReq is a connection request's backend.
type ProviderConnReq interface {
	// Peer describes the request: the peer's address, its private data
	// and its IRD and ORD.
	Peer() (remote netip.AddrPort, privateData []byte, ird, ord uint16)
	// Accept connects qp, a queue pair of the same provider.
	Accept(qp ProviderQP, p ConnParam) error
	// Reject refuses the request with private data.
	Reject(privateData []byte) error
}
