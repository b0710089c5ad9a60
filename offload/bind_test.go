package offload

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// TestBinding: rdma_bind_addr's port, held before it is used. A binding
// of port 0 says its port at once; listening on it takes connections
// there; a QP connecting from a binding leaves from its port; an unused
// binding given back frees its port for another bind.
func TestBinding(t *testing.T) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	devs := make([]*Device, 2)
	for i, l := range []*netstack.Link{la, lb} {
		s, err := netstack.New(l, netstack.Options{Addrs: []netip.Prefix{netip.MustParsePrefix([]string{"10.9.0.1/24", "10.9.0.2/24"}[i])}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if devs[i], err = NewDevice(s, DefaultConfig([]string{"siwtun0", "siwtun1"}[i])); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { devs[i].Close() })
	}
	a, b := devs[0], devs[1]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	newQP := func(d *Device) *QP {
		qp, err := d.CreateQP(1, &countCQ{}, &countCQ{}, QPAttr{MaxSendWR: 4, MaxRecvWR: 4})
		if err != nil {
			t.Fatal(err)
		}
		return qp
	}

	lbind, err := b.Bind(netip.MustParseAddrPort("10.9.0.2:0"))
	if err != nil {
		t.Fatal(err)
	}
	lport := lbind.Addr().Port()
	if lport == 0 {
		t.Fatalf("Bind(port 0).Addr() = %v: no port", lbind.Addr())
	}
	l, err := lbind.Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Addr() != lbind.Addr() {
		t.Errorf("listener on %v, bound %v", l.Addr(), lbind.Addr())
	}

	cbind, err := a.Bind(netip.MustParseAddrPort("10.9.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	qa, qb := newQP(a), newQP(b)
	done := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			err = req.Accept(qb, ibv.ConnParam{})
		}
		done <- err
	}()
	if err := qa.ConnectFrom(ctx, cbind, netip.AddrPortFrom(netip.MustParseAddr("10.9.0.2"), lport), ibv.ConnParam{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := qa.Info().Local, cbind.Addr(); got != want {
		t.Errorf("connection from %v, bound %v", got, want)
	}
	if got := qb.Info().Remote; got != cbind.Addr() {
		t.Errorf("the listener's side sees %v, bound %v", got, cbind.Addr())
	}

	// Bound and given back unused: the port can be bound again.
	spare, err := a.Bind(netip.MustParseAddrPort("10.9.0.1:7300"))
	if err != nil {
		t.Fatal(err)
	}
	spare.Close()
	again, err := a.Bind(netip.MustParseAddrPort("10.9.0.1:7300"))
	if err != nil {
		t.Fatalf("bind after Close: %v", err)
	}
	again.Close()
}
