package verbs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/siwtun/siwtun/offload"
)

// localDevice is the in-process backend: the engine runs in the
// application.
type localDevice struct {
	eng    *offload.Device
	mu     sync.Mutex
	nextPD uint32
}

func (d *localDevice) name() string      { return d.eng.Config().Name }
func (d *localDevice) query() DeviceAttr { return QueryEngine(d.eng) }
func (d *localDevice) close() error      { return nil }

func (d *localDevice) allocPD() (pdBackend, uint32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.nextPD
	d.nextPD++
	return &localPD{dev: d, handle: h}, h, nil
}

func (d *localDevice) createCQ(depth int) (cqBackend, error) {
	return newLocalCQ(depth), nil
}

func (d *localDevice) allocBuffer(n int) ([]byte, error) { return make([]byte, n), nil }

func (d *localDevice) listen(addr netip.AddrPort, backlog int) (listenerBackend, error) {
	l, err := d.eng.Listen(addr, backlog)
	if err != nil {
		return nil, err
	}
	return &localListener{l: l}, nil
}

type localPD struct {
	dev    *localDevice
	handle uint32
}

func (pd *localPD) dealloc() error { return nil }

func (pd *localPD) regMR(buf []byte, iova uint64, access Access) (mrBackend, uint32, error) {
	reg, err := pd.dev.eng.Regions().Register(pd.handle, buf, iova, access)
	if err != nil {
		return nil, 0, err
	}
	return &localMR{regions: pd.dev.eng.Regions(), stag: reg.STag()}, reg.STag(), nil
}

func (pd *localPD) createQP(send, recv cqBackend, attr QPInitAttr) (qpBackend, *offload.QP, error) {
	scq, ok1 := send.(*localCQ)
	rcq, ok2 := recv.(*localCQ)
	if !ok1 || !ok2 {
		return nil, nil, errors.New("create QP: completion queue of another device")
	}
	eng, err := pd.dev.eng.CreateQP(pd.handle, scq, rcq, offload.QPAttr{
		MaxSendWR: attr.MaxSendWR, MaxRecvWR: attr.MaxRecvWR, SignalAll: attr.SignalAll,
	})
	if err != nil {
		return nil, nil, err
	}
	return eng, eng, nil
}

type localMR struct {
	regions *offload.Regions
	stag    uint32
}

func (mr *localMR) dereg() error { return mr.regions.Deregister(mr.stag) }

type localListener struct{ l *offload.Listener }

func (l *localListener) addr() netip.AddrPort { return l.l.Addr() }
func (l *localListener) close() error         { return l.l.Close() }

func (l *localListener) accept(ctx context.Context) (*ConnRequest, error) {
	r, err := l.l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &ConnRequest{be: localConnReq{r}, Remote: r.Remote, PrivateData: r.PrivateData, IRD: r.IRD, ORD: r.ORD}, nil
}

type localConnReq struct{ r *offload.ConnRequest }

func (r localConnReq) accept(qp *QP, p ConnParam) error {
	if qp.eng == nil {
		return fmt.Errorf("accept %v: QP %d is not on this device", r.r.Remote, qp.Num())
	}
	return r.r.Accept(qp.eng, p)
}

func (r localConnReq) reject(pd []byte) error { return r.r.Reject(pd) }
