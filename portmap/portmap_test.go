package portmap

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// addLink adds an interface name (a veth pair: the kernel may lack the
// dummy driver) and sets it up.
func addLink(name string) error {
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		return err
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// inNewNetns runs f on a thread of its own in a new network namespace,
// with an interface lan0 that has 198.18.60.1/24 (forwarding off) and an
// interface rnic0 standing for the TUN device. The thread is thrown away
// afterwards. f reports with t.Error and returns: t.Fatal belongs to the
// test's goroutine.
func inNewNetns(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace of its own, nftables)")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		for _, name := range []string{"lan0", "rnic0"} {
			if err := addLink(name); err != nil {
				t.Errorf("add %s: %v", name, err)
				return
			}
		}
		lan, _ := netlink.LinkByName("lan0")
		addr, _ := netlink.ParseAddr("198.18.60.1/24")
		if err := netlink.AddrAdd(lan, addr); err != nil {
			t.Errorf("address: %v", err)
			return
		}
		f()
	}()
	<-done
}

func testConfig() Config {
	return Config{Dev: "rnic0", Shared: netip.MustParsePrefix("198.18.60.1/24"), SharedDev: "lan0", Private: PrivateAddr(7)}
}

// TestSetupAndClose: Setup creates the table, turns forwarding on,
// reserves and publishes ports; a port a host socket holds is refused;
// Close removes it all and turns forwarding off again.
func TestSetupAndClose(t *testing.T) {
	inNewNetns(t, func() {
		owners, err := FindAddr(netip.MustParseAddr("198.18.60.1"))
		if err != nil || len(owners) != 1 || owners[0].Dev != "lan0" || owners[0].Prefix.Bits() != 24 {
			t.Errorf("FindAddr: %v %v", owners, err)
		}
		m, err := Setup(testConfig())
		if err != nil {
			t.Errorf("Setup: %v", err)
			return
		}
		for _, dev := range []string{"lan0", "rnic0"} {
			if on, _ := forwarding(dev); !on {
				t.Errorf("%s: forwarding off after Setup", dev)
			}
		}
		c, _ := nftables.New()
		if _, err := c.ListTableOfFamily("siwtun-rnic0", nftables.TableFamilyIPv4); err != nil {
			t.Errorf("no table after Setup: %v", err)
		}
		if devs, _ := recordedOff(c, "", "lan0"); !devs {
			t.Error("the table does not record lan0's forwarding as off before")
		}

		// A host socket on port 7300: the RNIC cannot have it.
		fd, _ := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 7300, Addr: [4]byte{198, 18, 60, 1}}); err != nil {
			t.Error(err)
			return
		}
		if _, err := m.Reserve(7300); !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("Reserve of a port a host socket holds: %v, want EADDRINUSE", err)
		}
		// A port the RNIC has: no host socket can bind it; counted.
		p, err := m.Reserve(0)
		if err != nil || p == 0 {
			t.Errorf("Reserve(0): %d %v", p, err)
			return
		}
		if _, err := m.Reserve(p); err != nil {
			t.Errorf("second Reserve of the RNIC's own port: %v", err)
		}
		if _, err := net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr("198.18.60.1"), p).String()); err == nil {
			t.Errorf("a host socket could listen on reserved port %d", p)
		}
		m.Release(p)
		if got := m.Held(); len(got) != 1 || got[0] != p {
			t.Errorf("held after one of two releases: %v, want [%d]", got, p)
		}
		if err := m.Publish(p); err != nil {
			t.Error(err)
			return
		}
		set, _ := c.GetSetByName(&nftables.Table{Name: "siwtun-rnic0", Family: nftables.TableFamilyIPv4}, portsSet)
		if elems, err := c.GetSetElements(set); err != nil || len(elems) != 1 || int(elems[0].Key[0])<<8|int(elems[0].Key[1]) != int(p) {
			t.Errorf("published ports %v %v, want [%d]", elems, err, p)
		}
		m.Unpublish(p)
		if elems, _ := c.GetSetElements(set); len(elems) != 0 {
			t.Errorf("published ports after Unpublish: %v", elems)
		}
		if err := m.Close(); err != nil {
			t.Error(err)
			return
		}
		if _, err := c.ListTableOfFamily("siwtun-rnic0", nftables.TableFamilyIPv4); err == nil {
			t.Error("table left after Close")
		}
		if on, _ := forwarding("lan0"); on {
			t.Error("lan0 forwarding still on after Close")
		}
		if _, err := net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr("198.18.60.1"), p).String()); err != nil {
			t.Errorf("port %d still held after Close: %v", p, err)
		}
	})
}

// TestLeftover: a table a killed daemon left behind is removed by the
// next Setup of its device; another device's table that still needs the
// interface keeps its forwarding on.
func TestLeftover(t *testing.T) {
	inNewNetns(t, func() {
		first, err := Setup(testConfig())
		if err != nil {
			t.Error(err)
			return
		}
		// The daemon dies: its table stays (no Close).
		first.nft.CloseLasting()
		second, err := Setup(testConfig())
		if err != nil {
			t.Errorf("Setup over a leftover table: %v", err)
			return
		}
		if len(second.fwdOff) != 1 || second.fwdOff[0] != "lan0" {
			t.Errorf("the second run records %v as off before, want [lan0] (as the leftover did)", second.fwdOff)
		}
		if err := addLink("rnic1"); err != nil {
			t.Error(err)
			return
		}
		other := testConfig()
		other.Dev, other.Private = "rnic1", PrivateAddr(8)
		third, err := Setup(other)
		if err != nil {
			t.Error(err)
			return
		}
		second.Close()
		if on, _ := forwarding("lan0"); !on {
			t.Error("lan0 forwarding turned off while another RNIC's table still needs it")
		}
		third.Close()
		if on, _ := forwarding("lan0"); on {
			t.Error("lan0 forwarding on after the last RNIC's Close")
		}
	})
}

// TestPrivateAddr: link-local, never the metadata network, distinct for
// neighbouring interface indexes.
func TestPrivateAddr(t *testing.T) {
	seen := map[netip.Addr]int{}
	for i := 1; i < 70000; i++ {
		a := PrivateAddr(i)
		b := a.As4()
		if !a.IsLinkLocalUnicast() || b[2] == 169 || b[2] == 0 || b[2] == 255 || b[3] == 0 || b[3] == 255 {
			t.Errorf("PrivateAddr(%d) = %v", i, a)
			return
		}
		if j, ok := seen[a]; ok && i-j < 253*254 {
			t.Errorf("PrivateAddr(%d) = PrivateAddr(%d) = %v", i, j, a)
			return
		}
		seen[a] = i
	}
}
