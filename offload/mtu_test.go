package offload

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/rdmap"
)

// TestMinMTU: the smallest MTU follows from the headers. The largest
// unsplittable ULPDU is a Terminate that copies a DDP header and a Read
// Request header; its FPDU with a Marker is 80 octets; with 20 + 20 + 40
// octets of IPv4, TCP and TCP options the MTU is 160. Below it CheckMTU
// refuses and names 160, rather than letting --mtu 100 connect with an
// EMSS of 20 and then flush work requests without saying why.
func TestMinMTU(t *testing.T) {
	term := rdmap.Terminate{HasDDPHeader: true, HasRDMAPHeader: true, DDPHeader: make([]byte, ddp.UntaggedHeaderLen)}
	if got := ddp.UntaggedHeaderLen + term.Len(); got != MaxControlULPDU {
		t.Errorf("largest Terminate ULPDU %d, MaxControlULPDU %d", got, MaxControlULPDU)
	}
	if MaxControlULPDU != 70 || MinEMSS() != 80 || MinMTU(false) != 160 || MinMTU(true) != 1280 {
		t.Errorf("MaxControlULPDU %d MinEMSS %d MinMTU %d / %d, want 70 80 160 1280", MaxControlULPDU, MinEMSS(), MinMTU(false), MinMTU(true))
	}
	v4 := []netip.Prefix{netip.MustParsePrefix("198.18.0.2/24")}
	v6 := append(v4, netip.MustParsePrefix("fd00::2/64"))
	if err := CheckMTU(160, v4); err != nil {
		t.Errorf("CheckMTU(160): %v", err)
	}
	for _, mtu := range []int{159, 100, 0} {
		err := CheckMTU(mtu, v4)
		if err == nil || !strings.Contains(err.Error(), "the smallest that works is 160") {
			t.Errorf("CheckMTU(%d) = %v", mtu, err)
		}
	}
	if err := CheckMTU(1279, v6); err == nil || !strings.Contains(err.Error(), "1280") {
		t.Errorf("CheckMTU(1279, IPv6) = %v", err)
	}
	if err := CheckMTU(1280, v6); err != nil {
		t.Errorf("CheckMTU(1280, IPv6) = %v", err)
	}
}
