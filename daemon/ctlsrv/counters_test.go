package ctlsrv

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/daemon/uverbs"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic/rnictest"
)

// TestQPCountersDocumented checks that every offload.QPStats counter has a
// layer and a doc, and that the table names no counter the engine lacks.
func TestQPCountersDocumented(t *testing.T) {
	table := ctl.QPCounters()
	seen := map[string]bool{}
	for _, c := range new(offload.QPStats).Counters() {
		if c.Name == "" {
			t.Errorf("a QPStats field has no stat tag")
			continue
		}
		if seen[c.Name] {
			t.Errorf("QPStats counter %s appears twice", c.Name)
		}
		seen[c.Name] = true
		info, ok := table[c.Name]
		switch {
		case !ok:
			t.Errorf("QPStats counter %s: no entry in QPCounters (layer and doc)", c.Name)
		case info.Doc == "":
			t.Errorf("QPStats counter %s: empty doc", c.Name)
		case info.Layer != ctl.LayerTCP && info.Layer != ctl.LayerMPA && info.Layer != ctl.LayerDDP &&
			info.Layer != ctl.LayerRDMAP && info.Layer != ctl.LayerVerbs:
			t.Errorf("QPStats counter %s: unknown layer %q", c.Name, info.Layer)
		}
	}
	for name := range table {
		if !seen[name] {
			t.Errorf("QPCounters names %s, which QPStats does not have", name)
		}
	}
}

// TestTCPCountersDocumented checks that tcpCounters lists every
// netstack.TCPStats field, in order, documented, and reading that field.
func TestTCPCountersDocumented(t *testing.T) {
	table := tcpCounters()
	st := reflect.TypeFor[netstack.TCPStats]()
	if len(table) != st.NumField() {
		t.Errorf("tcpCounters has %d entries, netstack.TCPStats %d fields", len(table), st.NumField())
	}
	for i := 0; i < min(len(table), st.NumField()); i++ {
		c, f := table[i], st.Field(i)
		if c.field != f.Name {
			t.Errorf("tcpCounters[%d] is %s, TCPStats field %d is %s", i, c.field, i, f.Name)
			continue
		}
		if c.doc == "" || c.name == "" {
			t.Errorf("TCPStats.%s: name %q doc %q", f.Name, c.name, c.doc)
		}
		var s netstack.TCPStats
		reflect.ValueOf(&s).Elem().Field(i).SetUint(uint64(1000 + i))
		if got := c.get(&s); got != uint64(1000+i) {
			t.Errorf("tcpCounters[%d] (%s) reads %d, want field %s = %d", i, c.name, got, f.Name, 1000+i)
		}
	}
}

// TestStatsLayers checks that every counter of a device's Stats has a
// name, a doc and a unique name, and that no engine counter is lost except
// the per-QP tcpInSegs/tcpOutSegs the stack-wide MIB counters replace.
func TestStatsLayers(t *testing.T) {
	s := fixtureStats()
	names := map[string]bool{}
	for _, l := range s.Layers() {
		if l.Name == ctl.LayerOther {
			t.Errorf("counters in layer other: %+v", l.Counters)
		}
		for _, c := range l.Counters {
			if c.Doc == "" {
				t.Errorf("%s/%s: no doc", l.Name, c.Name)
			}
			if names[c.Name] {
				t.Errorf("%s appears twice", c.Name)
			}
			names[c.Name] = true
		}
	}
	for _, c := range new(offload.QPStats).Counters() {
		if !names[c.Name] {
			t.Errorf("QPStats counter %s missing from Stats", c.Name)
		}
	}
	for _, c := range tcpCounters() {
		if !names[c.name] {
			t.Errorf("TCP counter %s missing from Stats", c.name)
		}
	}
	if got := s.TCP[5]; got.Name != "tcpInSegs" || got.Value != 120 {
		t.Errorf("tcp[5] = %+v, want the stack's tcpInSegs 120", got)
	}
	if n := len(s.Verbs); n < 2 || s.Verbs[n-2].Name != nameQPActive || s.Verbs[n-2].Value != 2 || s.Verbs[n-1].Value != 3 {
		t.Errorf("verbs object counts = %+v", s.Verbs)
	}
}

// TestSocketCounters: the verbs socket's counters, added by the daemon as
// an extra source, land documented in the verbs layer with their values.
func TestSocketCounters(t *testing.T) {
	la, _ := netstack.Pipe(1500, netstack.Impairments{})
	r := rnictest.New(t, la, netip.MustParsePrefix("198.18.0.1/24"), 1500, "siwtun0", nil)
	eng, vdev := r.Engine, r.Device
	srv, err := uverbs.NewServer(vdev, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	source := func() []offload.Counter {
		cs := srv.Counters()
		for i := range cs {
			cs[i].Value = uint64(70 + i) // as if counted
		}
		return cs
	}
	s := NewProvider("", eng, nil, source).Stats()
	if len(s.Other) != 0 {
		t.Errorf("counters in layer other: %+v", s.Other)
	}
	verbsLayer := map[string]ctl.Counter{}
	for _, c := range s.Verbs {
		verbsLayer[c.Name] = c
	}
	for i, want := range srv.Counters() {
		got, ok := verbsLayer[want.Name]
		if !ok || got.Doc == "" || got.Value != uint64(70+i) {
			t.Errorf("%s in the verbs layer: %+v (present %v), want value %d and a doc", want.Name, got, ok, 70+i)
		}
	}
	if len(ctl.SocketCounters()) != len(srv.Counters()) {
		t.Errorf("SocketCounters documents %d counters, the server has %d", len(ctl.SocketCounters()), len(srv.Counters()))
	}
}
