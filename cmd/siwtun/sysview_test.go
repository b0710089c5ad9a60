package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/verbs"
)

// TestSysView: the files of the /sys/class/infiniband view, as Linux shows
// a siw device, with an iWARP GID (the MAC whose EUI-64 is the node GUID,
// then zeros) and device/net/<interface>.
func TestSysView(t *testing.T) {
	dir := t.TempDir()
	guid := ctl.FormatGUID(verbs.NodeGUID("siwtun0"))
	devs := []viewDev{{Name: "siwtun0", Netdev: "siwtun0", GUID: guid, FW: "0.1.0"},
		{Name: "siwtun1", Netdev: "eth1", GUID: ctl.FormatGUID(verbs.NodeGUID("siwtun1")), FW: "0.1.0"}}
	if err := writeSysView(dir, devs); err != nil {
		t.Fatal(err)
	}
	mac := verbs.NodeMAC("siwtun0")
	want := map[string]string{
		"infiniband/siwtun0/node_type":                 "4: RNIC",
		"infiniband/siwtun0/node_guid":                 guid,
		"infiniband/siwtun0/fw_ver":                    "0.1.0",
		"infiniband/siwtun0/ports/1/state":             "4: ACTIVE",
		"infiniband/siwtun0/ports/1/link_layer":        "Ethernet",
		"infiniband/siwtun0/ports/1/gids/0":            gidString(mac),
		"infiniband/siwtun0/ports/1/gid_attrs/types/0": "IB/RoCE v1",
		"infiniband/siwtun0/ports/1/gid_attrs/ndevs/0": "siwtun0",
		"infiniband/siwtun1/ports/1/gid_attrs/ndevs/0": "eth1",
		"infiniband_verbs/uverbs0/ibdev":               "siwtun0",
		"infiniband_verbs/uverbs1/ibdev":               "siwtun1",
		"infiniband_verbs/abi_version":                 "6",
	}
	for p, v := range want {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || strings.TrimSpace(string(b)) != v {
			t.Errorf("%s = %q (%v), want %q", p, b, err, v)
		}
	}
	if g := gidString(mac); !strings.HasSuffix(g, ":0000:0000:0000:0000:0000") || g[:4] != "02"+g[2:4] {
		t.Errorf("GID %s: want a locally administered MAC, then zeros", g)
	}
	for dev, nd := range map[string]string{"siwtun0": "siwtun0", "siwtun1": "eth1"} {
		l, err := os.Readlink(filepath.Join(dir, "infiniband", dev, "device", "net", nd))
		if err != nil || l != "/sys/class/net/"+nd {
			t.Errorf("%s device/net/%s -> %q (%v)", dev, nd, l, err)
		}
	}
	if _, err := macOfGUID("12:34"); err == nil {
		t.Error("a short GUID was taken")
	}
}
