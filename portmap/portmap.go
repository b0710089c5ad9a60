package portmap

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Config is what Setup shares.
type Config struct {
	// Dev is the RNIC's TUN device; it exists and is up.
	Dev string
	// Shared is the shared address, with its prefix length on SharedDev.
	Shared netip.Prefix
	// SharedDev is the interface that has the shared address (Dev itself
	// or another, such as a LAN interface).
	SharedDev string
	// Private is the RNIC stack's own address on Dev.
	Private netip.Addr
	// Logger gets what Setup and Close change on the host; nil: discarded.
	Logger *slog.Logger
}

// Mapper holds an RNIC's ports in the host's port space of the shared
// address and publishes its listeners' ports (netstack.PortMapper). Close
// undoes all of Setup.
type Mapper struct {
	cfg   Config
	log   *slog.Logger
	table *nftables.Table
	// turnedOn are the interfaces whose forwarding Setup turned on;
	// fwdOff those the table records as off before an RNIC needed them.
	turnedOn, fwdOff []string

	mu        sync.Mutex
	closed    bool             // guarded by mu
	nft       *nftables.Conn   // guarded by mu
	ports     *nftables.Set    // guarded by mu
	held      map[uint16]*held // guarded by mu
	published map[uint16]bool  // guarded by mu
	_         [0]func()        // not comparable
}

// held is one reserved port: the kernel socket bound to it and how many
// reserves it has.
type held struct {
	fd   int
	refs int
}

// Setup shares cfg.Shared with the RNIC on cfg.Dev: it removes a table
// that an earlier run on the same device left behind (a daemon killed
// with SIGKILL), turns IPv4 forwarding on where the RNIC's traffic needs
// it (cfg.SharedDev and cfg.Dev), routes the private address to cfg.Dev
// and creates the device's table. It changes nothing else of the host's.
func Setup(cfg Config) (m *Mapper, err error) {
	if !cfg.Shared.Addr().Is4() || !cfg.Private.Is4() {
		return nil, fmt.Errorf("share %v: IPv4 only", cfg.Shared)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	m = &Mapper{cfg: cfg, log: log, nft: c, held: map[uint16]*held{}, published: map[uint16]bool{}}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	name := TableName(cfg.Dev)
	if err := m.removeLeftover(name); err != nil {
		return nil, err
	}
	for _, dev := range slices.Compact([]string{cfg.SharedDev, cfg.Dev}) {
		on, err := forwarding(dev)
		if err != nil {
			return nil, err
		}
		recorded, err := recordedOff(c, name, dev)
		if err != nil {
			return nil, err
		}
		if !on {
			if err := setForwarding(dev, true); err != nil {
				return nil, err
			}
			m.turnedOn = append(m.turnedOn, dev)
		}
		// The TUN device is the RNIC's own and goes with it: nothing of
		// the host's to keep.
		if dev != cfg.Dev && (!on || recorded) {
			m.fwdOff = append(m.fwdOff, dev)
		}
	}
	if err := routePrivate(cfg.Dev, cfg.Private); err != nil {
		return nil, err
	}
	ports, err := addTable(c, tableSpec{name: name, shared: cfg.Shared.Addr(), private: cfg.Private, fwdOff: m.fwdOff})
	if err != nil {
		return nil, fmt.Errorf("nftables table %s: %w", name, err)
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables table %s: %w", name, err)
	}
	m.table, m.ports = ports.Table, ports
	log.Info("shared address", "addr", cfg.Shared, "dev", cfg.SharedDev, "rnic_private", cfg.Private,
		"nft_table", "ip "+name, "forwarding_turned_on", m.turnedOn)
	return m, nil
}

// removeLeftover deletes the table name that an earlier run left, and
// turns off the forwarding it had turned on, unless another RNIC's table
// still needs it.
func (m *Mapper) removeLeftover(name string) error {
	t, err := m.nft.ListTableOfFamily(name, nftables.TableFamilyIPv4)
	if err != nil {
		return nil // no such table
	}
	devs, err := fwdOffOf(m.nft, t)
	if err != nil {
		return err
	}
	m.nft.DelTable(t)
	if err := m.nft.Flush(); err != nil {
		return fmt.Errorf("remove the table an earlier run left (nft delete table ip %s): %w", name, err)
	}
	m.log.Warn("removed the nftables table an earlier run of the device left behind", "table", "ip "+name)
	m.restore(name, devs)
	return nil
}

// restore turns forwarding off on devs, the interfaces table name
// recorded as off, unless another siwtun table records them too.
func (m *Mapper) restore(name string, devs []string) {
	for _, dev := range devs {
		if other, err := recordedOff(m.nft, name, dev); err != nil || other {
			continue
		}
		if err := setForwarding(dev, false); err != nil {
			if _, gone := netlink.LinkByName(dev); gone == nil {
				m.log.Warn("could not turn IPv4 forwarding off again", "dev", dev, "err", err)
			}
			continue
		}
		m.log.Info("IPv4 forwarding off again", "dev", dev)
	}
}

// routePrivate routes the RNIC's private address to its TUN device.
func routePrivate(dev string, private netip.Addr) error {
	link, err := netlink.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("route %v to %s: %w", private, dev, err)
	}
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: private.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("route %v to %s: %w", private, dev, err)
	}
	return nil
}

// Reserve implements netstack.PortMapper: it binds a kernel TCP socket to
// the shared address and port (0: the kernel picks a free ephemeral port)
// without SO_REUSEADDR, so no other socket can bind it while the RNIC
// uses it.
func (m *Mapper) Reserve(port uint16) (uint16, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, net.ErrClosed
	}
	if h := m.held[port]; port != 0 && h != nil {
		h.refs++
		return port, nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("reserve port %d: socket: %w", port, err)
	}
	sa := &unix.SockaddrInet4{Port: int(port), Addr: m.cfg.Shared.Addr().As4()}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		if errors.Is(err, syscall.EADDRINUSE) && port == 0 {
			return 0, fmt.Errorf("no TCP port of %v is free in the host's ephemeral range (sysctl net.ipv4.ip_local_port_range): %w", m.cfg.Shared.Addr(), err)
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			return 0, fmt.Errorf("a socket of the host holds TCP port %d of %v (ss -tanp 'sport = :%d' shows it): %w", port, m.cfg.Shared.Addr(), port, err)
		}
		if errors.Is(err, syscall.EADDRNOTAVAIL) {
			return 0, fmt.Errorf("reserve port %d: %v is no longer an address of this host (ip addr add %v dev %s): %w", port, m.cfg.Shared.Addr(), m.cfg.Shared, m.cfg.SharedDev, err)
		}
		return 0, fmt.Errorf("reserve port %d of %v: %w", port, m.cfg.Shared.Addr(), err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return 0, fmt.Errorf("reserve port %d: %w", port, err)
	}
	p := uint16(got.(*unix.SockaddrInet4).Port)
	m.held[p] = &held{fd: fd, refs: 1}
	return p, nil
}

// Release implements netstack.PortMapper.
func (m *Mapper) Release(port uint16) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.held[port]
	if m.closed || h == nil {
		return
	}
	if h.refs--; h.refs == 0 {
		unix.Close(h.fd)
		delete(m.held, port)
	}
}

// Publish implements netstack.PortMapper: it adds port to the table's set
// of ports whose new connections go to the RNIC.
func (m *Mapper) Publish(port uint16) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return net.ErrClosed
	}
	if err := m.nft.SetAddElements(m.ports, []nftables.SetElement{{Key: portKey(port)}}); err != nil {
		return err
	}
	if err := m.nft.Flush(); err != nil {
		return fmt.Errorf("nftables set %s of table %s: %w", portsSet, m.table.Name, err)
	}
	m.published[port] = true
	return nil
}

// Unpublish implements netstack.PortMapper.
func (m *Mapper) Unpublish(port uint16) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || !m.published[port] {
		return
	}
	delete(m.published, port)
	if err := m.nft.SetDeleteElements(m.ports, []nftables.SetElement{{Key: portKey(port)}}); err == nil {
		err = m.nft.Flush()
		if err != nil {
			m.log.Warn("could not unpublish a port", "port", port, "table", m.table.Name, "err", err)
		}
	}
}

// Held returns the ports reserved now, in order.
func (m *Mapper) Held() []uint16 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]uint16, 0, len(m.held))
	for p := range m.held {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Published returns the ports published now, in order.
func (m *Mapper) Published() []uint16 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]uint16, 0, len(m.published))
	for p := range m.published {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Table is the device's nftables table, as nft names it ("ip siwtun-siwtun0").
func (m *Mapper) Table() string { return "ip " + TableName(m.cfg.Dev) }

// Close removes the table, gives every port back and turns off the
// forwarding Setup turned on (unless another RNIC's table still needs it).
// It is idempotent.
func (m *Mapper) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	for p, h := range m.held {
		unix.Close(h.fd)
		delete(m.held, p)
	}
	var err error
	if m.table != nil {
		m.nft.DelTable(m.table)
		if ferr := m.nft.Flush(); ferr != nil {
			err = fmt.Errorf("remove nftables table %s: %w", m.table.Name, ferr)
		}
	}
	name := TableName(m.cfg.Dev)
	m.restore(name, m.fwdOff)
	// The TUN device's forwarding goes with the device.
	m.nft.CloseLasting()
	return err
}
