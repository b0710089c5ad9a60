package portmap

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Owner is an interface that has an address.
type Owner struct {
	// Dev is the interface's name.
	Dev string
	// Prefix is the address with its prefix length there.
	Prefix netip.Prefix
}

// FindAddr returns the interfaces that have address a (usually one).
func FindAddr(a netip.Addr) ([]Owner, error) {
	fam := netlink.FAMILY_V4
	if a.Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(nil, fam)
	if err != nil {
		return nil, fmt.Errorf("list the host's addresses: %w", err)
	}
	var out []Owner
	for _, x := range addrs {
		ip, ok := netip.AddrFromSlice(x.IP)
		if !ok || ip.Unmap() != a {
			continue
		}
		link, err := netlink.LinkByIndex(x.LinkIndex)
		if err != nil {
			return nil, fmt.Errorf("interface %d of %v: %w", x.LinkIndex, a, err)
		}
		bits, _ := x.Mask.Size()
		out = append(out, Owner{Dev: link.Attrs().Name, Prefix: netip.PrefixFrom(a, bits)})
	}
	return out, nil
}

// PrivateAddr is the RNIC's private address for a TUN device of interface
// index ifindex: an IPv4 link-local address (169.254.0.0/16, RFC 3927),
// as it only ever appears on the link between the host and its RNIC,
// and unique per device within a network namespace. It avoids
// 169.254.169.0/24, where clouds put their metadata service.
func PrivateAddr(ifindex int) netip.Addr {
	n := uint(ifindex) % (253 * 254)
	hi, lo := byte(1+n/254), byte(1+n%254)
	if hi >= 169 {
		hi++
	}
	return netip.AddrFrom4([4]byte{169, 254, hi, lo})
}
