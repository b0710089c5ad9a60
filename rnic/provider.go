package rnic

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// device is the in-process verbs provider: every call goes to the engine.
type device struct {
	eng    *offload.Device
	mu     sync.Mutex
	nextPD uint32
}

var (
	_ verbs.Provider   = (*device)(nil)
	_ verbs.ProviderQP = (*offload.QP)(nil) // the engine's QP is the backend as it is
)

func (d *device) Name() string            { return d.eng.Config().Name }
func (d *device) Query() verbs.DeviceAttr { return Query(d.eng) }
func (d *device) Close() error            { return nil }

func (d *device) AllocPD() (verbs.ProviderPD, uint32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.nextPD
	d.nextPD++
	return &pd{dev: d, handle: h}, h, nil
}

func (d *device) CreateCQ(depth int) (verbs.ProviderCQ, error) { return newCQ(depth), nil }

func (d *device) AllocBuffer(n int) ([]byte, error) { return make([]byte, n), nil }

func (d *device) Listen(addr netip.AddrPort, backlog int) (verbs.ProviderListener, error) {
	l, err := d.eng.Listen(addr, backlog)
	if err != nil {
		return nil, err
	}
	return listener{l}, nil
}

type pd struct {
	dev    *device
	handle uint32
}

func (p *pd) Dealloc() error { return nil }

func (p *pd) RegMR(buf []byte, iova uint64, access verbs.Access) (verbs.ProviderMR, uint32, error) {
	reg, err := p.dev.eng.Regions().Register(p.handle, buf, iova, access)
	if err != nil {
		return nil, 0, err
	}
	return &mr{regions: p.dev.eng.Regions(), stag: reg.STag()}, reg.STag(), nil
}

func (p *pd) CreateQP(send, recv verbs.ProviderCQ, attr verbs.QPInitAttr) (verbs.ProviderQP, error) {
	scq, ok1 := send.(*cqRing)
	rcq, ok2 := recv.(*cqRing)
	if !ok1 || !ok2 {
		return nil, errors.New("create QP: completion queue of another device")
	}
	var s *offload.SRQ
	if attr.SRQ != nil {
		rs, ok := attr.SRQ.Provider().(srq)
		if !ok {
			return nil, errors.New("create QP: SRQ of another device")
		}
		s = rs.SRQ
	}
	return p.dev.eng.CreateQP(p.handle, scq, rcq, offload.QPAttr{
		MaxSendWR: attr.MaxSendWR, MaxRecvWR: attr.MaxRecvWR, SignalAll: attr.SignalAll, SRQ: s,
	})
}

func (p *pd) CreateSRQ(attr verbs.SRQAttr) (verbs.ProviderSRQ, error) {
	s, err := p.dev.eng.CreateSRQ(p.handle, attr)
	if err != nil {
		return nil, err
	}
	return srq{s}, nil
}

// srq is the engine's SRQ as a verbs backend.
type srq struct{ *offload.SRQ }

func (s srq) Query() (verbs.SRQAttr, error) { return s.SRQ.Query(), nil }

func (p *pd) AllocMW(typ verbs.MWType) (verbs.ProviderMW, uint32, error) {
	w, err := p.dev.eng.Regions().AllocMW(p.handle, typ)
	if err != nil {
		return nil, 0, err
	}
	return &mw{regions: p.dev.eng.Regions(), stag: w.STag()}, w.STag(), nil
}

// mw is a memory window of the engine's table, named by its index.
type mw struct {
	regions *offload.Regions
	stag    uint32
}

func (m *mw) Dealloc() error { return m.regions.DeallocMW(m.stag) }

type mr struct {
	regions *offload.Regions
	stag    uint32
}

func (m *mr) Dereg() error { return m.regions.Deregister(m.stag) }

func (m *mr) Rereg(_ verbs.ProviderPD, pd uint32, buf []byte, iova uint64, access verbs.Access) error {
	_, err := m.regions.Reregister(m.stag, pd, buf, iova, access)
	return err
}

type listener struct{ l *offload.Listener }

func (l listener) Addr() netip.AddrPort { return l.l.Addr() }
func (l listener) Close() error         { return l.l.Close() }

func (l listener) Accept(ctx context.Context) (verbs.ProviderConnReq, error) {
	r, err := l.l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return connReq{r}, nil
}

type connReq struct{ r *offload.ConnRequest }

func (r connReq) Peer() (netip.AddrPort, []byte, uint16, uint16) {
	return r.r.Remote, r.r.PrivateData, r.r.IRD, r.r.ORD
}

func (r connReq) Accept(qp verbs.ProviderQP, p verbs.ConnParam) error {
	q, ok := qp.(*offload.QP)
	if !ok {
		return fmt.Errorf("accept %v: QP %d is not on this device", r.r.Remote, qp.Num())
	}
	return r.r.Accept(q, p)
}

func (r connReq) Reject(pd []byte) error { return r.r.Reject(pd) }
