package ctlsrv

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/rnic/rnictest"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// TestMRs lists an engine's regions over the control socket: every valid
// region with its bounds and rights, none that was deregistered or
// invalidated; a Provider without regions answers with an error.
func TestMRs(t *testing.T) {
	la, _ := netstack.Pipe(1500, netstack.Impairments{})
	eng := rnictest.New(t, la, netip.MustParsePrefix("198.18.0.1/24"), 1500, "siwtun0", nil).Engine
	regs := []struct {
		pd     uint32
		n      int
		addr   uint64
		access ibv.Access
		drop   string // "", "dereg" or "inval"
	}{
		{1, 4096, 0x10000, ibv.AccessLocalWrite, ""},
		{1, 100, 0x20000, ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead, ""},
		{2, 64, 0x30000, ibv.AccessRemoteRead, "dereg"},
		{2, 8, 0x40000, ibv.AccessLocalWrite | ibv.AccessRemoteWrite, "inval"},
		{3, 1, 0x50000, 0, ""},
	}
	var want []ctl.MR
	for _, r := range regs {
		reg, err := eng.Regions().Register(r.pd, make([]byte, r.n), r.addr, r.access)
		if err != nil {
			t.Fatal(err)
		}
		switch r.drop {
		case "dereg":
			err = eng.Regions().Deregister(reg.STag())
		case "inval":
			err = eng.Regions().Invalidate(reg.STag(), r.pd)
		default:
			want = append(want, ctl.MR{STag: reg.STag(), PDN: r.pd, Addr: r.addr, Len: r.n, Access: r.access.String()})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	s := startServer(t, NewProvider("", eng, nil))
	got, err := dial(t, s.Path()).MRs()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("MRs:\n got %+v\nwant %+v", got, want)
	}
	f := startServer(t, fakeProvider{})
	if _, err := dial(t, f.Path()).MRs(); err == nil || !strings.Contains(err.Error(), "cannot list") {
		t.Errorf("fake provider: %v", err)
	}
}
