package portmap

import (
	"fmt"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ipv4DevconfForwarding is IPV4_DEVCONF_FORWARDING, the index of
// "forwarding" in an interface's IPv4 configuration (include/uapi/linux/ip.h).
const ipv4DevconfForwarding = 1

// forwarding reads net.ipv4.conf.<dev>.forwarding. The kernel forwards an
// IPv4 packet if forwarding is on for the interface it came in on
// (ip_route_input_slow checks the input device), so each interface counts
// on its own.
func forwarding(dev string) (bool, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + dev + "/forwarding")
	if err != nil {
		return false, fmt.Errorf("read IPv4 forwarding of %s: %w", dev, err)
	}
	return strings.TrimSpace(string(b)) == "1", nil
}

// setForwarding turns IPv4 forwarding of dev on or off. It goes through
// rtnetlink (the interface's AF_INET configuration, IFLA_INET_CONF), not
// /proc/sys: a container runtime mounts /proc/sys read-only, while
// CAP_NET_ADMIN in the namespace is all rtnetlink asks for.
func setForwarding(dev string, on bool) error {
	link, err := netlink.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("set IPv4 forwarding of %s: %w", dev, err)
	}
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(link.Attrs().Index)
	req.AddData(msg)
	v := uint32(0)
	if on {
		v = 1
	}
	conf := nl.NewRtAttr(unix.IFLA_INET_CONF, nil)
	conf.AddRtAttr(ipv4DevconfForwarding, nl.Uint32Attr(v))
	af := nl.NewRtAttr(unix.AF_INET, conf.Serialize())
	req.AddData(nl.NewRtAttr(unix.IFLA_AF_SPEC, af.Serialize()))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("set IPv4 forwarding of %s to %d: %w", dev, v, err)
	}
	return nil
}
