package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/portmap"
)

// SharedPlan is what --shared and --shared-dev ask for, checked before the
// TUN device exists.
type SharedPlan struct {
	// Addr is the shared address with its prefix length on Dev (not
	// valid: the RNIC has addresses of its own).
	Addr netip.Prefix
	// Dev is the interface that has it; OnTUN: the RNIC's own TUN
	// device, to which Start adds it.
	Dev   string
	OnTUN bool
}

// PlanShared checks --shared and --shared-dev (tun is --dev). An address
// that no interface has is refused with the command that adds it.
func PlanShared(shared, sharedDev, tun string) (SharedPlan, error) {
	p, given, err := parseShared(shared)
	if err != nil {
		return SharedPlan{}, err
	}
	if sharedDev == tun {
		return SharedPlan{Addr: p, Dev: tun, OnTUN: true}, nil
	}
	owners, err := portmap.FindAddr(p.Addr())
	if err != nil {
		return SharedPlan{}, err
	}
	for _, o := range owners {
		if sharedDev == "" || o.Dev == sharedDev {
			return SharedPlan{Addr: o.Prefix, Dev: o.Dev}, nil
		}
	}
	fix := fixCommand(p, given, sharedDev)
	if sharedDev != "" {
		return SharedPlan{}, fmt.Errorf("--shared %v: %s does not have this address; add it (%s), or leave --shared-dev out to use the interface that has it", p.Addr(), sharedDev, fix)
	}
	return SharedPlan{}, fmt.Errorf("--shared %v: no interface of this host has this address; add it to the interface on its network (%s), or give it to the RNIC's own device with --shared-dev %s", p.Addr(), fix, tun)
}

// parseShared reads --shared: an IPv4 address, with or without a prefix
// length (given says whether it had one; /32 if not).
func parseShared(s string) (p netip.Prefix, given bool, err error) {
	if s == "" {
		return p, false, errors.New("--shared: want an IPv4 address of this host, like 198.18.0.1 or 198.18.0.1/24")
	}
	if p, err = netip.ParsePrefix(s); err == nil {
		given = true
	} else if a, aerr := netip.ParseAddr(s); aerr == nil {
		p = netip.PrefixFrom(a, a.BitLen())
	} else {
		return p, false, fmt.Errorf("--shared %q: want an IPv4 address of this host, like 198.18.0.1 or 198.18.0.1/24", s)
	}
	a := p.Addr()
	if a.Is6() {
		// IPv6 forwarding is one switch for the whole host in Linux
		// (ip6_forward reads net.ipv6.conf.all.forwarding), and turning
		// it on makes the host a router: it stops taking router
		// advertisements. Shared mode never changes that.
		return p, false, fmt.Errorf("--shared %v: IPv4 only (IPv6 would need the host-wide net.ipv6.conf.all.forwarding, which turns the host into a router); give an IPv6 RNIC its own address with --addr and --host-addr", a)
	}
	if a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return p, false, fmt.Errorf("--shared %v: want a unicast address of an interface (not loopback)", a)
	}
	return p, given, nil
}

// fixCommand is the ip(8) command that gives dev (or the interface whose
// network has the address) the address p.
func fixCommand(p netip.Prefix, given bool, dev string) string {
	if dev == "" || !given {
		if d, bits, ok := networkOf(p.Addr(), dev); ok {
			if dev == "" {
				dev = d
			}
			if !given {
				p = netip.PrefixFrom(p.Addr(), bits)
			}
		}
	}
	if dev == "" {
		dev = "<interface>"
	}
	return fmt.Sprintf("ip addr add %v dev %s", p, dev)
}

// networkOf finds an interface (dev, if not empty) with an IPv4 address
// whose network holds a, and that network's prefix length.
func networkOf(a netip.Addr, dev string) (string, int, bool) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", 0, false
	}
	for _, ifc := range ifs {
		if dev != "" && ifc.Name != dev {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, x := range addrs {
			n, ok := x.(*net.IPNet)
			if !ok {
				continue
			}
			pa, ok := netip.AddrFromSlice(n.IP)
			bits, _ := n.Mask.Size()
			if ok && pa.Unmap().Is4() && netip.PrefixFrom(pa.Unmap(), bits).Masked().Contains(a) {
				return ifc.Name, bits, true
			}
		}
	}
	return "", 0, false
}

// SharedMTU is the RNIC's MTU in shared mode: the RNIC's segments cross
// the shared address's interface as they are, so without --mtu it takes
// that interface's MTU (capped at mtu, the default), and a larger --mtu
// is warned about.
func SharedMTU(plan SharedPlan, mtu int, given bool, log *slog.Logger) (int, error) {
	if plan.OnTUN {
		return mtu, nil
	}
	ifc, err := net.InterfaceByName(plan.Dev)
	if err != nil {
		return 0, fmt.Errorf("--shared: %s: %w", plan.Dev, err)
	}
	switch {
	case !given:
		return min(mtu, ifc.MTU), nil
	case mtu > ifc.MTU:
		log.Warn("--mtu is larger than the MTU of the shared address's interface: the RNIC's larger segments cannot cross it",
			"mtu", mtu, "dev", plan.Dev, "dev_mtu", ifc.MTU)
	}
	return mtu, nil
}

// privateAddr is the RNIC's private address in shared mode: --addr if
// given (one IPv4 address), else portmap.PrivateAddr of the TUN device.
func privateAddr(addrs []netip.Prefix, tun string) (netip.Addr, error) {
	if len(addrs) > 1 || (len(addrs) == 1 && !addrs[0].Addr().Is4()) {
		return netip.Addr{}, fmt.Errorf("--addr with --shared: one IPv4 address, the RNIC's private address on %s (default: a link-local one)", tun)
	}
	if len(addrs) == 1 {
		return addrs[0].Addr(), nil
	}
	ifc, err := net.InterfaceByName(tun)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s: %w", tun, err)
	}
	a := portmap.PrivateAddr(ifc.Index)
	if owners, err := portmap.FindAddr(a); err == nil && len(owners) > 0 {
		return netip.Addr{}, fmt.Errorf("the RNIC's private address %v is an address of %s already; choose another with --addr", a, owners[0].Dev)
	}
	return a, nil
}

// shareAddress sets up the host's side of shared mode for the RNIC on tun
// (portmap.Setup) and returns the stack's Shared and the mapper, which the
// caller closes after the RNIC.
func shareAddress(plan SharedPlan, tun string, private netip.Addr, log *slog.Logger) (*netstack.Shared, *portmap.Mapper, error) {
	m, err := portmap.Setup(portmap.Config{Dev: tun, Shared: plan.Addr, SharedDev: plan.Dev, Private: private, Logger: log})
	if err != nil {
		if strings.Contains(err.Error(), "operation not permitted") {
			err = fmt.Errorf("%w (shared mode needs CAP_NET_ADMIN)", err)
		}
		return nil, nil, err
	}
	return &netstack.Shared{Public: plan.Addr, Private: private, Ports: m}, m, nil
}

// sharedLink is the ctl view of the mapper's state.
func sharedLink(tun string, private netip.Addr, m *portmap.Mapper) func() *ctl.SharedLink {
	return func() *ctl.SharedLink {
		return &ctl.SharedLink{TUN: tun, Private: private.String(), Table: m.Table(),
			Reserved: m.Held(), Published: m.Published()}
	}
}

// interfaceMAC returns the Ethernet address of interface name, if it has
// one (a TUN device or a loopback has none).
func interfaceMAC(name string) ([6]byte, bool) {
	var mac [6]byte
	ifi, err := net.InterfaceByName(name)
	if err != nil || len(ifi.HardwareAddr) != len(mac) {
		return mac, false
	}
	copy(mac[:], ifi.HardwareAddr)
	return mac, mac != [6]byte{}
}
