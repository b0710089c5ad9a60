package offload

import (
	"fmt"
	"net/netip"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
)

// MaxControlULPDU is the largest ULPDU the engine sends as one FPDU that it
// cannot split: a Terminate carrying the DDP header and the Read Request
// header it copies (untagged DDP header 18, Terminate control 4, DDP
// segment length 2, copied untagged DDP header 18, copied Read Request
// 28). A Read Request (18 + 28) and the smallest data FPDU (an untagged
// header and 4 octets of payload) are smaller.
const MaxControlULPDU = ddp.UntaggedHeaderLen + rdmap.TerminateHeaderLen + rdmap.DDPSegLenLen +
	ddp.UntaggedHeaderLen + rdmap.ReadRequestLen

// MinEMSS is the smallest effective MSS at which every FPDU the engine
// sends fits one TCP segment: the FPDU of MaxControlULPDU octets with its
// ULPDU_Length (2), pad and CRC (4), and a Marker (4) where one falls into
// it (the peer may ask for Markers whatever this side asks).
func MinEMSS() int {
	n := 0
	for off := range uint64(mpa.MarkerInterval) {
		n = max(n, mpa.FPDUWireLen(off, MaxControlULPDU, true))
	}
	return n
}

// MinMTU is the smallest link MTU an RNIC works at: MinEMSS after the most
// the IP and TCP headers and options take (netstack.MaxHeaderLen), and not
// below what IP needs. For IPv4 it is 82 + 20 + 20 + 40 = 162; for IPv6
// the IPv6 minimum, 1280. The MPA Request and Reply are not bound by it:
// they go to TCP as a byte stream before FPDU framing starts.
func MinMTU(v6 bool) int {
	return max(MinEMSS()+netstack.MaxHeaderLen(v6), netstack.MinLinkMTU(v6))
}

// CheckMTU refuses a link MTU too small for an RNIC with the addresses
// addrs (the IPv6 minimum applies when one of them is IPv6), saying which
// MTU is the smallest that works.
func CheckMTU(mtu int, addrs []netip.Prefix) error {
	v6 := false
	for _, a := range addrs {
		v6 = v6 || (a.Addr().Is6() && !a.Addr().Is4In6())
	}
	min := MinMTU(v6)
	if mtu >= min {
		return nil
	}
	if v6 {
		return fmt.Errorf("MTU %d is too small: IPv6 needs at least %d", mtu, min)
	}
	return fmt.Errorf("MTU %d is too small for iWARP: the smallest that works is %d (an FPDU of up to %d octets must fit one TCP segment after %d octets of IP and TCP headers and options)",
		mtu, min, MinEMSS(), netstack.MaxHeaderLen(false))
}
