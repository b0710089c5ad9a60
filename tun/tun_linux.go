package tun

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/songgao/water"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// eventQueueLen is the capacity of a nativeTun's Events channel.
const eventQueueLen = 16

// nativeTun is a Linux TUN device opened through water: IFF_TUN|IFF_NO_PI,
// one packet per read(2) and write(2).
type nativeTun struct {
	file   *os.File
	name   string
	index  int
	events chan Event

	nlMu sync.Mutex      // nlMu guards nl
	nl   *netlink.Handle // route socket in the device's namespace; nil once closed

	done      chan struct{} // closed by Close: stops the link watcher
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

var _ Device = (*nativeTun)(nil)

// Create opens a TUN device (IFF_TUN|IFF_NO_PI) named name in the calling
// thread's network namespace and sets its MTU. It goes through water, one
// packet per read and write (BatchSize 1). The link is left down and
// without addresses: see Configure. The device disappears when it is
// closed (it is not persistent). A persistent TUN of that name that no
// process holds is attached to, and water clears its persist flag. An empty
// name lets the kernel choose one (tunN); Name reports it.
//
// The errors say what to do and wrap the system error (test them with
// errors.Is against syscall.EBUSY, fs.ErrPermission, fs.ErrNotExist, ...):
// a missing /dev/net/tun ("load the tun module: modprobe tun"), EPERM
// ("needs CAP_NET_ADMIN: run as root"), and a name held by another process
// (EBUSY: "device %q is in use (is another siwtun up running?)").
func Create(name string, mtu int) (Device, error) {
	nl, err := prepare(name, mtu)
	if err != nil {
		return nil, err
	}
	ifce, err := water.New(water.Config{
		DeviceType:             water.TUN,
		PlatformSpecificParams: water.PlatformSpecificParams{Name: name},
	})
	if err != nil {
		nl.Close()
		return nil, createError(name, err)
	}
	file, ok := ifce.ReadWriteCloser.(*os.File)
	if !ok {
		_ = ifce.Close()
		nl.Close()
		return nil, fmt.Errorf("tun: create %q: water returned a %T, not an *os.File", name, ifce.ReadWriteCloser)
	}
	return newNativeTun(file, ifce.Name(), nl, mtu)
}

// prepare checks Create's arguments and opens the route socket the device
// keeps. A named link must be free: water leaks its /dev/net/tun
// descriptor when TUNSETIFF fails, so the usual failures (a live TUN or
// another kind of link of that name) are refused before opening.
func prepare(name string, mtu int) (*netlink.Handle, error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("tun: create %q: %w", name, err)
	}
	if mtu < MinMTU || mtu > MaxMTU {
		return nil, fmt.Errorf("tun: create %q: MTU %d out of range [%d,%d]", name, mtu, MinMTU, MaxMTU)
	}
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("tun: create %q: open netlink socket: %w", name, err)
	}
	if name != "" {
		if err := checkFree(nl, name); err != nil {
			nl.Close()
			return nil, createError(name, err)
		}
	}
	return nl, nil
}

// newNativeTun wraps an open TUN descriptor: it sets the MTU and starts
// the link watcher. On failure it closes file (which removes the link) and
// nl.
func newNativeTun(file *os.File, name string, nl *netlink.Handle, mtu int) (*nativeTun, error) {
	t := &nativeTun{
		file:   file,
		name:   name,
		events: make(chan Event, eventQueueLen),
		nl:     nl,
		done:   make(chan struct{}),
	}
	if err := t.init(mtu); err != nil {
		_ = file.Close()
		nl.Close()
		return nil, fmt.Errorf("tun: create %q: %w", name, err)
	}
	return t, nil
}

// init sets the MTU and starts the link watcher.
func (t *nativeTun) init(mtu int) error {
	link, err := t.nl.LinkByName(t.name)
	if err != nil {
		return fmt.Errorf("look up the new link: %w", err)
	}
	t.index = link.Attrs().Index
	if err := t.nl.LinkSetMTU(link, mtu); err != nil {
		return fmt.Errorf("set MTU %d: %w", mtu, err)
	}
	// The watcher starts from the state just read (a new link is down; a
	// persistent one Create attached to may be up) and the MTU just set.
	// Nobody else knows of a new link yet, so no change falls between the
	// two. The subscription socket is opened on this thread, so in the
	// device's namespace.
	updates := make(chan netlink.LinkUpdate, 32)
	if err := netlink.LinkSubscribeWithOptions(updates, t.done, netlink.LinkSubscribeOptions{}); err != nil {
		return fmt.Errorf("subscribe to link updates: %w", err)
	}
	t.wg.Add(1)
	go t.watch(updates, link.Attrs().RawFlags&unix.IFF_RUNNING != 0, mtu)
	return nil
}

// watch turns netlink link updates for the device into Events until the
// subscription ends (Close closes done, which closes the socket and then
// updates).
func (t *nativeTun) watch(updates <-chan netlink.LinkUpdate, running bool, mtu int) {
	defer t.wg.Done()
	for u := range updates {
		if int(u.Index) != t.index {
			continue
		}
		if u.Header.Type == unix.RTM_DELLINK {
			if running {
				running = false
				t.send(EventDown)
			}
			continue
		}
		if r := u.Flags&unix.IFF_RUNNING != 0; r != running {
			running = r
			if r {
				t.send(EventUp)
			} else {
				t.send(EventDown)
			}
		}
		if m := u.Attrs().MTU; m != mtu {
			mtu = m
			t.send(EventMTUUpdate)
		}
	}
}

// send queues e without blocking: an event that finds the channel full is
// dropped, so a device nobody watches never stalls its watcher (MTU reads
// the current value at any time).
func (t *nativeTun) send(e Event) {
	select {
	case t.events <- e:
	default:
	}
}

// File returns the TUN file descriptor.
func (t *nativeTun) File() *os.File { return t.file }

// Read reads one packet into bufs[0][offset:] (BatchSize is 1).
func (t *nativeTun) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(bufs) == 0 || len(sizes) == 0 {
		return 0, fmt.Errorf("tun: read %s: no buffers", t.name)
	}
	if offset < 0 || offset > len(bufs[0]) {
		return 0, fmt.Errorf("tun: read %s: offset %d outside a %d-byte buffer", t.name, offset, len(bufs[0]))
	}
	n, err := t.file.Read(bufs[0][offset:])
	if err != nil {
		return 0, t.ioError("read", err)
	}
	sizes[0] = n
	return 1, nil
}

// Write writes each bufs[i][offset:] as one packet.
func (t *nativeTun) Write(bufs [][]byte, offset int) (int, error) {
	var errs error
	n := 0
	for _, b := range bufs {
		if offset < 0 || offset > len(b) {
			errs = errors.Join(errs, fmt.Errorf("tun: write %s: offset %d outside a %d-byte buffer", t.name, offset, len(b)))
			continue
		}
		if _, err := t.file.Write(b[offset:]); err != nil {
			err = t.ioError("write", err)
			if errors.Is(err, os.ErrClosed) {
				return n, errors.Join(errs, err)
			}
			errs = errors.Join(errs, err)
			continue
		}
		n++
	}
	return n, errs
}

// ioError wraps a read or write error; EBADFD (the link was deleted under
// the open descriptor) becomes os.ErrClosed, as in wireguard-go.
func (t *nativeTun) ioError(op string, err error) error {
	if errors.Is(err, unix.EBADFD) {
		return fmt.Errorf("tun: %s %s: link removed: %w", op, t.name, os.ErrClosed)
	}
	return fmt.Errorf("tun: %s %s: %w", op, t.name, err)
}

// MTU returns the link's current MTU, asked of the kernel through a route
// socket in the device's namespace.
func (t *nativeTun) MTU() (int, error) {
	t.nlMu.Lock()
	defer t.nlMu.Unlock()
	if t.nl == nil {
		return 0, fmt.Errorf("tun: mtu %s: %w", t.name, os.ErrClosed)
	}
	link, err := t.nl.LinkByIndex(t.index)
	if err != nil {
		return 0, fmt.Errorf("tun: mtu %s: %w", t.name, err)
	}
	return link.Attrs().MTU, nil
}

// Name returns the interface name.
func (t *nativeTun) Name() (string, error) { return t.name, nil }

// Events returns the link state changes; see send for the drop policy.
func (t *nativeTun) Events() <-chan Event { return t.events }

// BatchSize is 1: one packet per read and write.
func (t *nativeTun) BatchSize() int { return 1 }

// Close closes the descriptor (which removes the link), stops the watcher
// and closes the Events channel.
func (t *nativeTun) Close() error {
	t.closeOnce.Do(func() {
		close(t.done)
		if err := t.file.Close(); err != nil {
			t.closeErr = fmt.Errorf("tun: close %s: %w", t.name, err)
		}
		t.wg.Wait()
		close(t.events)
		t.nlMu.Lock()
		t.nl.Close()
		t.nl = nil
		t.nlMu.Unlock()
	})
	return t.closeErr
}

// Configure sets the MTU of the link name and its transmit queue length
// (HostQueueLen), adds the host-side addresses (IPv4 and IPv6; IPv6 ones
// without duplicate address detection, so they are usable at once) and
// brings the link up, through netlink in the calling thread's namespace.
// Addresses already present are kept, so Configure can be repeated.
func Configure(name string, mtu int, hostAddrs []netip.Prefix) error {
	if mtu < MinMTU || mtu > MaxMTU {
		return fmt.Errorf("tun: configure %q: MTU %d out of range [%d,%d]", name, mtu, MinMTU, MaxMTU)
	}
	addrs := make([]*netlink.Addr, 0, len(hostAddrs))
	for _, p := range hostAddrs {
		a := p.Addr()
		if !p.IsValid() || a.Is4In6() || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("tun: configure %q: invalid address %v", name, p)
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(p.Bits(), a.BitLen())}}
		if a.Is6() {
			if mtu < MinMTUIPv6 {
				return fmt.Errorf("tun: configure %q: IPv6 address %v needs an MTU of at least %d, not %d", name, p, MinMTUIPv6, mtu)
			}
			addr.Flags = unix.IFA_F_NODAD
		}
		addrs = append(addrs, addr)
	}
	link, err := linkByName(name)
	if err != nil {
		return fmt.Errorf("tun: configure %q: %w", name, err)
	}
	if err := netlink.LinkSetMTU(link, mtu); err != nil {
		return fmt.Errorf("tun: configure %q: set MTU %d: %w", name, mtu, err)
	}
	if err := netlink.LinkSetTxQLen(link, HostQueueLen); err != nil {
		return fmt.Errorf("tun: configure %q: set transmit queue length %d: %w", name, HostQueueLen, err)
	}
	for i, addr := range addrs {
		if err := netlink.AddrReplace(link, addr); err != nil {
			if hostAddrs[i].Addr().Is6() && errors.Is(err, syscall.EACCES) {
				return fmt.Errorf("tun: configure %q: add %v: IPv6 is disabled on the link (sysctl net.ipv6.conf.%s.disable_ipv6): %w", name, hostAddrs[i], name, err)
			}
			return fmt.Errorf("tun: configure %q: add %v: %w", name, hostAddrs[i], err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("tun: configure %q: set up: %w", name, err)
	}
	return nil
}

// Delete removes the link name from the calling thread's namespace. An open
// Device on it then fails its reads and writes with os.ErrClosed. Deleting
// a link that does not exist is an error satisfying errors.Is(err,
// fs.ErrNotExist).
func Delete(name string) error {
	link, err := linkByName(name)
	if err != nil {
		return fmt.Errorf("tun: delete %q: %w", name, err)
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("tun: delete %q: %w", name, err)
	}
	return nil
}

// Exists reports whether a link (of any kind) named name exists in the
// calling thread's namespace.
func Exists(name string) (bool, error) {
	_, err := linkByName(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("tun: exists %q: %w", name, err)
	}
	return true, nil
}

// linkByName looks up a link; a missing link is an error satisfying
// errors.Is(err, fs.ErrNotExist).
func linkByName(name string) (netlink.Link, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
			return nil, fmt.Errorf("no link named %q: %w", name, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("look up link %q: %w", name, err)
	}
	return link, nil
}

// checkFree returns the error TUNSETIFF would give for name, as far as
// netlink can tell: EBUSY for a TUN with a queue attached, EINVAL for a TAP
// or a multi-queue TUN, EEXIST for another kind of link. A missing link or
// a persistent TUN without a queue (which Create attaches to) is free.
func checkFree(nl *netlink.Handle, name string) error {
	link, err := nl.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
			return nil
		}
		return fmt.Errorf("look up link %q: %w", name, err)
	}
	tt, ok := link.(*netlink.Tuntap)
	switch {
	case !ok:
		return fmt.Errorf("it is a %s link: %w", link.Type(), syscall.EEXIST)
	case tt.Mode != netlink.TUNTAP_MODE_TUN:
		return fmt.Errorf("it is a TAP link: %w", syscall.EINVAL)
	case tt.Flags&netlink.TUNTAP_MULTI_QUEUE != 0:
		return fmt.Errorf("it is a multi-queue TUN: %w", syscall.EINVAL)
	case tt.Queues > 0 || tt.NonPersist:
		// A non-persistent TUN exists only while a descriptor holds it.
		return syscall.EBUSY
	}
	return nil
}

// createError turns an error from opening /dev/net/tun or TUNSETIFF into
// one that says what to do, wrapping the original.
func createError(name string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENODEV), errors.Is(err, syscall.ENXIO):
		return fmt.Errorf("tun: create %q: /dev/net/tun is missing or has no driver: load the tun module: modprobe tun: %w", name, err)
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return fmt.Errorf("tun: create %q: needs CAP_NET_ADMIN: run as root: %w", name, err)
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("tun: create %q: device %q is in use (is another siwtun up running?): %w", name, name, err)
	case errors.Is(err, syscall.EEXIST), errors.Is(err, syscall.EINVAL):
		return fmt.Errorf("tun: create %q: the name is taken by a link that is not a free TUN (delete it or choose another name): %w", name, err)
	}
	return fmt.Errorf("tun: create %q: %w", name, err)
}

// validName checks name the way the kernel's dev_valid_name does; the
// empty name is allowed (the kernel picks tunN).
func validName(name string) error {
	switch {
	case name == "":
		return nil
	case len(name) >= unix.IFNAMSIZ:
		return fmt.Errorf("interface name longer than %d bytes: %w", unix.IFNAMSIZ-1, syscall.EINVAL)
	case name == "." || name == "..":
		return fmt.Errorf("invalid interface name: %w", syscall.EINVAL)
	case strings.ContainsAny(name, "/: \t\n\v\f\r"):
		return fmt.Errorf("interface name contains '/', ':' or a space: %w", syscall.EINVAL)
	}
	return nil
}
