package ctl

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/verbs/ibv"
)

func fixtureDevInfo() DevInfo {
	return DevInfo{
		HCAID: "siwtun0", Transport: "iWARP", TransportNum: 1, FWVer: "0.1.0",
		NodeGUID: FormatGUID(0x3a5fc2e90d14b7a6), SysImageGUID: FormatGUID(0x3a5fc2e90d14b7a6),
		VendorID: 0x736977, VendorPartID: 1, PhysPortCnt: 1, MaxMRSize: math.MaxInt,
		MaxQP: 4096, MaxQPWR: 16384, MaxSGE: 6, MaxSGERd: 1, MaxCQ: 8192, MaxCQE: 1048576,
		MaxMR: 65536, MaxPD: 4096, MaxQPRdAtom: 128, MaxQPInitRdAtom: 128, MaxInline: 256, MaxSRQ: 4096, MaxSRQWR: 16384, MaxSRQSGE: 6,
		AtomicCap: "ATOMIC_HCA (1)",
		Port: Port{
			Port: 1, State: "PORT_ACTIVE", StateNum: 4, MaxMTU: 3, ActiveMTU: 3, LinkLayer: "Ethernet",
			NetdevMTU: 1500, EMSS: 1420, MPARev: 2, CRC: true, P2P: "none", IRD: 16, ORD: 16,
		},
	}
}

func fixtureLinks() []Link {
	return []Link{
		{Link: "siwtun0/1", State: "ACTIVE", PhysicalState: "LINK_UP", Netdev: "siwtun0",
			Addrs: []string{"198.18.0.2/24"}, HostAddrs: []string{"198.18.0.1/24"}},
		{Link: "siwtun1/1", State: "ACTIVE", PhysicalState: "LINK_UP", Netdev: "siwtun1",
			Addrs: []string{"198.19.0.2/24", "fd00:5157::2/64"}},
	}
}

// TestGoldenText: what `siwtun ctl devinfo` and `siwtun ctl link` print,
// against rdma-core's layouts. The queue pairs' and counters' tables are
// the daemon's control server's goldens (daemon/ctlsrv), which builds them
// from the engine's counters.
func TestGoldenText(t *testing.T) {
	tests := []struct {
		name  string
		write func(*bytes.Buffer) error
	}{
		{"devinfo.golden", func(b *bytes.Buffer) error { return WriteDevInfo(b, fixtureDevInfo(), false) }},
		{"devinfo-verbose.golden", func(b *bytes.Buffer) error { return WriteDevInfo(b, fixtureDevInfo(), true) }},
		{"links.golden", func(b *bytes.Buffer) error { return WriteLinks(b, fixtureLinks()) }},
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
		name   string
		v      any
		pretty bool
	}{
		{"devinfo.json.golden", fixtureDevInfo(), true},
		{"links.json.golden", fixtureLinks(), true},
		{"devinfo-compact.json.golden", fixtureDevInfo(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteJSON(&b, tt.v, tt.pretty); err != nil {
				t.Fatal(err)
			}
			testkit.Golden(t, filepath.Join("testdata", tt.name), b.Bytes())
		})
	}
}

// TestDevInfoLayout checks the non-verbose lines against the printf formats
// of rdma-core's libibverbs/examples/devinfo.c, character for character.
func TestDevInfoLayout(t *testing.T) {
	var b bytes.Buffer
	if err := WriteDevInfo(&b, fixtureDevInfo(), false); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"hca_id:\tsiwtun0",
		"\ttransport:\t\t\tiWARP (1)",
		"\tfw_ver:\t\t\t\t0.1.0",
		"\tnode_guid:\t\t\t3a5f:c2e9:0d14:b7a6",
		"\tsys_image_guid:\t\t\t3a5f:c2e9:0d14:b7a6",
		"\tvendor_id:\t\t\t0x736977",
		"\tvendor_part_id:\t\t\t1",
		"\thw_ver:\t\t\t\t0x0",
		"\tphys_port_cnt:\t\t\t1",
		"\t\tport:\t1",
		"\t\t\tstate:\t\t\tPORT_ACTIVE (4)",
		"\t\t\tmax_mtu:\t\t1024 (3)",
		"\t\t\tactive_mtu:\t\t1024 (3)",
		"\t\t\tsm_lid:\t\t\t0",
		"\t\t\tport_lid:\t\t0",
		"\t\t\tport_lmc:\t\t0x00",
		"\t\t\tlink_layer:\t\tEthernet",
		"",
		"",
	}
	if got := strings.Split(b.String(), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	b.Reset()
	if err := WriteDevInfo(&b, fixtureDevInfo(), true); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"\tmax_mr_size:\t\t\t0x7fffffffffffffff\n",
		"\tmax_qp:\t\t\t\t4096\n",
		"\tmax_qp_wr:\t\t\t16384\n",
		"\tmax_sge_rd:\t\t\t1\n",
		"\tmax_qp_init_rd_atom:\t\t128\n",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("verbose output lacks %q", line)
		}
	}
}

func TestMTUEnum(t *testing.T) {
	tests := []struct{ mtu, enum, bytes int }{
		{68, 1, 256}, {256, 1, 256}, {511, 1, 256}, {512, 2, 512}, {1023, 2, 512},
		{1024, 3, 1024}, {1500, 3, 1024}, {2048, 4, 2048}, {4095, 4, 2048},
		{4096, 5, 4096}, {9000, 5, 4096}, {65535, 5, 4096},
	}
	for _, tt := range tests {
		if got := ibv.MTUEnum(tt.mtu); got != tt.enum || ibv.MTUEnumBytes(got) != tt.bytes {
			t.Errorf("ibv.MTUEnum(%d) = %d (%d bytes), want %d (%d bytes)", tt.mtu, got, ibv.MTUEnumBytes(got), tt.enum, tt.bytes)
		}
	}
}

func TestFormatGUID(t *testing.T) {
	if got, want := FormatGUID(0x0123456789abcdef), "0123:4567:89ab:cdef"; got != want {
		t.Errorf("FormatGUID = %q, want %q", got, want)
	}
	if got, want := FormatGUID(0), "0000:0000:0000:0000"; got != want {
		t.Errorf("FormatGUID(0) = %q, want %q", got, want)
	}
}
