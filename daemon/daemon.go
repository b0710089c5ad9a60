package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/daemon/ctlsrv"
	"github.com/siwtun/siwtun/daemon/uverbs"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/tun"
)

// Config is one device's daemon: the TUN device, the RNIC on it and the
// sockets that serve it, as `siwtun up`'s flags give them (parsed and
// checked).
type Config struct {
	// Dev names the TUN device and the device; MTU is the link's MTU.
	Dev string
	MTU int
	// Offload creates the TUN device with segmentation offload
	// (tun.CreateOffload).
	Offload bool
	// Addrs are the RNIC's addresses in its own stack (with a shared
	// address: none, or its private IPv4 address); HostAddrs the host
	// side's addresses on the TUN device.
	Addrs, HostAddrs []netip.Prefix
	// Shared is the shared-address mode's plan (PlanShared); its Addr is
	// not valid when the RNIC has addresses of its own.
	Shared SharedPlan
	// Stack has the RNIC's stack's options other than its addresses, MTU
	// and shared address, which Start fills in.
	Stack netstack.Options
	// Impair impairs the link both ways.
	Impair netstack.Impairments
	// Engine configures the RNIC's iWARP engine.
	Engine offload.Config
	// SocketDir holds the device's verbs socket (<dev>.sock), control
	// socket (<dev>.ctl) and lock (<dev>.lock); SocketGroup, if set, is
	// the sockets' group (their mode is 0660).
	SocketDir, SocketGroup string
	// Limits bound each verbs client.
	Limits uverbs.Limits
	// Log receives the daemon's log.
	Log *slog.Logger
}

// Daemon is a running device.
type Daemon struct {
	// Stack is the RNIC's TCP/IP stack.
	Stack *netstack.Stack
	// HostAddrs are the host side's addresses on the TUN device (a
	// shared address on it included).
	HostAddrs []netip.Prefix
	// VerbsPath and CtlPath are the sockets' paths.
	VerbsPath, CtlPath string

	cfg    Config
	dev    tun.Device       // the TUN device
	netdev string           // the interface the RNIC's traffic crosses
	shared *netstack.Shared // nil: the RNIC has addresses of its own
	view   func() *ctl.SharedLink
	undo   []func() // what Close gives back, the last taken first
}

// Start brings the device up: it takes the device's lock, creates and
// configures the TUN device, sets up the shared address, starts the RNIC
// and serves its verbs and control sockets. If a step fails, what the
// steps before it took is given back.
func Start(cfg Config) (d *Daemon, err error) {
	d = &Daemon{cfg: cfg, netdev: cfg.Dev, HostAddrs: cfg.HostAddrs}
	defer func() {
		if err != nil {
			d.Close()
			d = nil
		}
	}()
	for _, step := range []func() error{d.lock, d.makeTUN, d.share} {
		if err := step(); err != nil {
			return d, err
		}
	}
	r, err := d.startRNIC()
	if err != nil {
		return d, err
	}
	return d, d.serve(r)
}

// Close stops the device in order: verbs clients are told and their QPs
// closed, every connection gets an orderly close, the control socket
// goes, the stack stops, the shared address is given back, the TUN
// device is deleted and the lock released.
func (d *Daemon) Close() {
	for i := len(d.undo) - 1; i >= 0; i-- {
		d.undo[i]()
	}
	d.undo = nil
}

// lock takes the device's lock file in the socket directory.
func (d *Daemon) lock() error {
	if err := os.MkdirAll(d.cfg.SocketDir, 0o755); err != nil {
		return needsRoot(fmt.Errorf("socket directory: %w", err))
	}
	lock, err := lockDevice(d.cfg.SocketDir, d.cfg.Dev)
	if err != nil {
		return needsRoot(err)
	}
	d.undo = append(d.undo, func() {
		os.Remove(lock.Name())
		lock.Close()
	})
	return nil
}

// makeTUN creates the TUN device and gives the host side its addresses.
func (d *Daemon) makeTUN() error {
	create := tun.Create
	if d.cfg.Offload {
		create = tun.CreateOffload
	}
	dev, err := create(d.cfg.Dev, d.cfg.MTU)
	if err != nil {
		return err // it says that it needs CAP_NET_ADMIN
	}
	d.dev = dev
	d.undo = append(d.undo, func() {
		dev.Close()
		tun.Delete(d.cfg.Dev) // a non-persistent TUN goes with its fd; make sure
	})
	if d.cfg.Shared.OnTUN {
		d.HostAddrs = append(d.HostAddrs, d.cfg.Shared.Addr)
	}
	return tun.Configure(d.cfg.Dev, d.cfg.MTU, d.HostAddrs)
}

// share sets up the shared address, if there is one: the host's NAT and
// port reservations (portmap), and the RNIC's private address.
func (d *Daemon) share() error {
	plan := d.cfg.Shared
	if !plan.Addr.IsValid() {
		return nil
	}
	private, err := privateAddr(d.cfg.Addrs, d.cfg.Dev)
	if err != nil {
		return err
	}
	sh, m, err := shareAddress(plan, d.cfg.Dev, private, d.cfg.Log)
	if err != nil {
		return err
	}
	d.undo = append(d.undo, func() { m.Close() }) // after the RNIC's Close: its ports are given back first
	d.shared, d.netdev = sh, plan.Dev
	d.cfg.Addrs = []netip.Prefix{netip.PrefixFrom(private, 32)}
	if mac, ok := interfaceMAC(plan.Dev); ok && !plan.OnTUN {
		// The RNIC stands on the shared interface: its node GUID and
		// GID are that interface's, as an iWARP card's are its port's,
		// so two hosts' RNICs of one name tell each other apart.
		d.cfg.Engine.MAC = mac
	}
	d.view = sharedLink(d.cfg.Dev, private, m)
	return nil
}

// startRNIC starts the RNIC on the TUN device's link.
func (d *Daemon) startRNIC() (*rnic.RNIC, error) {
	link := netstack.Impair(netstack.NewDeviceLink(tun.NewPacketDevice(d.dev)), d.cfg.Impair)
	if d.cfg.Impair.Active() {
		d.cfg.Log.Warn("link impaired", "impairments", d.cfg.Impair.String())
	}
	opts := d.cfg.Stack
	opts.Addrs, opts.MTU, opts.Shared = d.cfg.Addrs, d.cfg.MTU, d.shared
	r, err := rnic.New(link, rnic.Config{Stack: opts, Engine: d.cfg.Engine})
	if err != nil {
		return nil, err
	}
	d.undo = append(d.undo, func() { r.Close() })
	d.Stack = r.Stack
	return r, nil
}

// serve serves the RNIC on the control socket and the verbs socket.
func (d *Daemon) serve(r *rnic.RNIC) error {
	vsrv, err := uverbs.NewServer(r.Device, d.cfg.Log)
	if err != nil {
		return fmt.Errorf("verbs socket: %w", err)
	}
	vsrv.SetLimits(d.cfg.Limits)
	d.CtlPath = ctl.SocketPath(d.cfg.SocketDir, d.cfg.Dev)
	prov := ctlsrv.NewProvider(d.netdev, r.Engine, d.HostAddrs, vsrv.Counters)
	if d.view != nil {
		prov = ctlsrv.WithShared(prov, d.view)
	}
	cs, err := ctlsrv.Listen(d.CtlPath, prov, d.cfg.Log)
	if err != nil {
		return err
	}
	d.undo = append(d.undo, func() { cs.Close() })
	cs.TCPPerf = TCPPerfOnStack(r.Stack)
	cs.Anatomy = r.Stack.Anatomy()
	if err := socketOwnership(d.CtlPath, d.cfg.SocketGroup); err != nil {
		return err
	}
	go cs.Serve()
	stop, path, err := serveVerbs(vsrv, d.cfg.SocketDir, d.cfg.Dev, d.cfg.SocketGroup, d.cfg.Log)
	if err != nil {
		return err
	}
	d.undo = append(d.undo, stop)
	d.VerbsPath = path
	return nil
}

// serveVerbs serves the device dev to applications on the verbs socket,
// <dir>/<dev>.sock, with srv. The returned stop tells every client the
// device is gone, destroys their objects and removes the socket.
func serveVerbs(srv *uverbs.Server, dir, dev, group string, log *slog.Logger) (stop func(), path string, err error) {
	path = filepath.Join(dir, dev+".sock")
	gid := -1
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			return nil, "", fmt.Errorf("--socket-group %q: %w", group, err)
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	l, err := uverbs.Listen(path, gid)
	if err != nil {
		return nil, "", fmt.Errorf("verbs socket: %w", err)
	}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, uverbs.ErrServerClosed) {
			log.Error("verbs socket", "err", err)
		}
	}()
	return func() {
		srv.Close()
		l.Close()
		os.Remove(path)
	}, path, nil
}

// lockDevice takes the per-device lock file, so a second siwtun up on the
// same name fails with a clear message instead of fighting over the device.
func lockDevice(dir, dev string) (*os.File, error) {
	path := filepath.Join(dir, dev+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			p := strings.TrimSpace(string(pid))
			if otherNetns(p) {
				return nil, fmt.Errorf("device %s is already up in another network namespace (siwtun up pid %s): %s is shared by every namespace; give each namespace's daemons and clients their own --socket-dir (or SIWTUN_SOCKET_DIR)", dev, p, dir)
			}
			return nil, fmt.Errorf("device %s is already up (siwtun up pid %s); stop it first", dev, p)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f.Truncate(0)
	f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	return f, nil
}

// otherNetns reports whether process pid runs in another network namespace
// than this one.
func otherNetns(pid string) bool {
	theirs, err := os.Readlink("/proc/" + pid + "/ns/net")
	if err != nil {
		return false
	}
	ours, err := os.Readlink("/proc/self/ns/net")
	return err == nil && ours != theirs
}

// needsRoot adds what siwtun up needs to a permission error.
func needsRoot(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w (siwtun up needs root, or CAP_NET_ADMIN and write access to --socket-dir)", err)
	}
	return err
}

// socketOwnership applies the socket group and mode 0660 to a socket file.
func socketOwnership(path, group string) error {
	if err := os.Chmod(path, 0o660); err != nil {
		return err
	}
	if group == "" {
		return nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return fmt.Errorf("--socket-group %q: %w", group, err)
	}
	gid, _ := strconv.Atoi(g.Gid)
	return os.Chown(path, -1, gid)
}
