package ctlsrv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
)

// fakeProvider answers with the golden fixtures: the device and its links
// as ctl's goldens have them, the queue pairs and counters below.
type fakeProvider struct{ panicOn string }

func (f fakeProvider) DevInfo() ctl.DevInfo {
	if f.panicOn == ctl.OpDevInfo {
		panic("provider bug")
	}
	return fixtureDevInfo()
}
func (fakeProvider) Link() ctl.Link   { return fixtureLinks()[0] }
func (fakeProvider) QPs() []ctl.QP    { return fixtureQPs() }
func (fakeProvider) Stats() ctl.Stats { return fixtureStats() }

// ctlGolden decodes one of ctl's JSON goldens (what `siwtun ctl ... -j`
// prints) into v: the fixtures of the device and its links are defined
// once, there.
func ctlGolden(name string, v any) {
	b, err := os.ReadFile(filepath.Join("..", "..", "ctl", "testdata", name))
	if err != nil {
		panic(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		panic(fmt.Sprintf("%s: %v", name, err))
	}
}

func fixtureDevInfo() ctl.DevInfo {
	var d ctl.DevInfo
	ctlGolden("devinfo.json.golden", &d)
	return d
}

func fixtureLinks() []ctl.Link {
	var l []ctl.Link
	ctlGolden("links.json.golden", &l)
	return l
}

func fixtureQPStats() *offload.QPStats {
	s := new(offload.QPStats)
	s.FPDUsTx.Store(5)
	s.FPDUsRx.Store(3)
	s.BytesTx.Store(4200)
	s.BytesRx.Store(120)
	s.SegmentsTx.Store(9)
	s.SegmentsRx.Store(8)
	s.DataSegmentsTx.Store(5)
	s.DataSegmentsRx.Store(3)
	s.WritesTx.Store(1)
	s.WriteBytesTx.Store(4096)
	s.SQPosted.Store(2)
	s.SQCompleted.Store(2)
	s.RQPosted.Store(4)
	return s
}

func fixtureQPs() []ctl.QP {
	var cs []ctl.Counter
	for _, c := range fixtureQPStats().Counters() {
		cs = append(cs, ctl.Counter{Name: c.Name, Value: c.Value})
	}
	return []ctl.QP{
		{Link: "siwtun0/1", LQPN: 1, Type: "RC", State: "RTS", PDN: 1,
			Src: "198.18.0.2:49152", Dst: "198.18.0.3:7174", MPARev: 2, CRC: true, P2P: "none",
			IRD: 16, ORD: 4, SQDepth: 64, SQUsed: 1, RQDepth: 64, RQUsed: 4, EMSS: 1420,
			BytesTx: 4200, BytesRx: 120, FPDUsTx: 5, FPDUsRx: 3, Counters: cs},
		{Link: "siwtun0/1", LQPN: 2, Type: "RC", State: "RESET", PDN: 1, P2P: "none",
			SQDepth: 16, RQDepth: 16},
	}
}

func fixtureStats() ctl.Stats {
	tcp := netstack.TCPStats{ActiveOpens: 1, PassiveOpens: 2, CurrEstab: 3, InSegs: 120, OutSegs: 130, RetransSegs: 1, OutRsts: 1}
	return buildStats("siwtun0/1", tcp, fixtureQPStats().Counters(), 2, 3)
}

// TestGoldenText: what `siwtun ctl qp` and `siwtun ctl stats` print for
// the engine's counters.
func TestGoldenText(t *testing.T) {
	tests := []struct {
		name  string
		write func(*bytes.Buffer) error
	}{
		{"qps.golden", func(b *bytes.Buffer) error { return ctl.WriteQPs(b, fixtureQPs()) }},
		{"qp-counters.golden", func(b *bytes.Buffer) error { return ctl.WriteQPCounters(b, fixtureQPs()[0]) }},
		{"stats.golden", func(b *bytes.Buffer) error { return ctl.WriteStats(b, fixtureStats()) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tt.write(&b); err != nil {
				t.Fatal(err)
			}
			testkit.Golden(t, filepath.Join("testdata", tt.name), b.Bytes())
		})
	}
}

func TestGoldenJSON(t *testing.T) {
	tests := []struct {
		name string
		v    any
	}{
		{"qps.json.golden", fixtureQPs()},
		{"stats.json.golden", fixtureStats()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := ctl.WriteJSON(&b, tt.v, true); err != nil {
				t.Fatal(err)
			}
			testkit.Golden(t, filepath.Join("testdata", tt.name), b.Bytes())
		})
	}
}

func TestDefaultEMSS(t *testing.T) {
	tests := []struct {
		mtu     int
		ipv4    bool
		maxFPDU int
		want    int
	}{
		{1500, true, 16384, 1420},
		{1500, false, 16384, 1400},
		{9000, true, 16384, 8920},
		{65535, true, 16384, 16384},
		{65535, true, 0, 65455},
		{68, true, 0, 1},
	}
	for _, tt := range tests {
		if got := DefaultEMSS(tt.mtu, tt.ipv4, tt.maxFPDU); got != tt.want {
			t.Errorf("DefaultEMSS(%d, %v, %d) = %d, want %d", tt.mtu, tt.ipv4, tt.maxFPDU, got, tt.want)
		}
	}
}
