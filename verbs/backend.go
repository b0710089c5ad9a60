package verbs

import (
	"context"
	"net/netip"

	"github.com/siwtun/siwtun/offload"
)

// The verbs objects are thin fronts over a backend: the in-process engine
// (local.go) or the daemon's verbs socket (remote.go). The fronts keep the
// bookkeeping both share (which objects a PD holds, which QPs use a CQ,
// destroyed flags); the backends do the work.

type deviceBackend interface {
	name() string
	query() DeviceAttr
	allocPD() (pdBackend, uint32, error)
	createCQ(depth int) (cqBackend, error)
	listen(addr netip.AddrPort, backlog int) (listenerBackend, error)
	allocBuffer(n int) ([]byte, error)
	close() error
}

type pdBackend interface {
	// regMR registers buf at iova and returns the region's STag.
	regMR(buf []byte, iova uint64, access Access) (mrBackend, uint32, error)
	// createQP returns the backend and, in-process, the engine's QP.
	createQP(send, recv cqBackend, attr QPInitAttr) (qpBackend, *offload.QP, error)
	dealloc() error
}

type mrBackend interface {
	dereg() error
}

type cqBackend interface {
	poll(wcs []WorkCompletion) (int, error)
	reqNotify(solicitedOnly bool) error
	notifyChan() <-chan struct{}
	destroy() error
}

// qpBackend has the method set of *offload.QP, which is the in-process
// backend as it is.
type qpBackend interface {
	Num() uint32
	State() QPState
	Modify(s QPState) error
	PostSend(wrs []SendWR) (int, error)
	PostRecv(wrs []RecvWR) (int, error)
	Events() <-chan Event
	Connect(ctx context.Context, remote netip.AddrPort, p ConnParam) error
	Disconnect()
	Info() offload.Info
	Destroy() error
}

var _ qpBackend = (*offload.QP)(nil)

type listenerBackend interface {
	addr() netip.AddrPort
	accept(ctx context.Context) (*ConnRequest, error)
	close() error
}

type connReqBackend interface {
	accept(qp *QP, p ConnParam) error
	reject(privateData []byte) error
}
