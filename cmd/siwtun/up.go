package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/siwtun/siwtun/apps/tcpperf"
	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/sdnotify"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/portmap"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/tun"
	"github.com/siwtun/siwtun/verbs/uverbs"
)

// upOptions are the flags of siwtun up.
type upOptions struct {
	offload       bool
	gso           bool
	rack          bool
	delayedACK    bool
	dev           string
	addrs         []string
	hostAddrs     []string
	shared        string
	sharedDev     string
	mtu           int
	mtuSet        bool // --mtu was given
	mpaRev        uint8
	crc           bool
	rdmapExt      bool
	markers       string
	p2p           string
	ird, ord      uint16
	peerTimeout   time.Duration
	firstFPDU     time.Duration
	startupHold   time.Duration
	finDelay      time.Duration
	acceptTimeout time.Duration
	impair        string
	socketDir     string
	socketGroup   string
	logLevel      string
	logFormat     string
	cpuProfile    string
	perWrite      int
	nice          int
	limits        uverbs.Limits
	maxQP         int
}

func newUpCmd() *cobra.Command {
	o := upOptions{}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run an RNIC on a TUN device (in the foreground)",
		Long: `up creates the TUN device (siwtun0), gives the host side its address
(--host-addr) and the RNIC's own TCP/IP stack its address (--addr), and
serves verbs applications on the verbs socket and ctl on the control
socket, until SIGINT or SIGTERM. Then every connection is closed in order,
clients are told, the sockets are removed and the TUN device deleted.
Started by systemd (siwtun@.service, Type=notify), it tells the service
manager once the device and both sockets are up (READY=1 on $NOTIFY_SOCKET).

The verbs socket, <socket-dir>/<dev>.sock, has mode 0660: root and the
members of --socket-group (default: root's group) can connect, no one else.
Each client (one connection to the socket) gets at most the --max-client-*
limits; a call past one fails with ENOMEM (verbs.ErrLimit in Go) and
changes nothing, and 0 is no limit.

With --shared the RNIC answers on an address the host already has, as a
hardware iWARP RNIC shares its host's address: a LAN interface's
(--shared 198.18.0.1, the interface found by its address) or one up puts
on the TUN device itself (--shared 198.18.2.2/24 --shared-dev siwtun0).
TCP to that address reaches the RNIC for the ports it uses (its
listeners, its connections' local ports, reserved in the host's port
space) and the host's sockets for every other port. The host's NAT does
it, in an nftables table of siwtun's own, "ip siwtun-<dev>", which up
removes on exit and the next up of the device removes after a SIGKILL.
IPv4 forwarding is turned on for the two interfaces (and off again on
exit); where it was off, the table forwards only the RNIC's traffic.

  siwtun up --dev siwtun0 --addr 198.18.0.2/24 --host-addr 198.18.0.1/24 --mtu 9000
  siwtun up --shared 198.18.0.1      # the address of eth0, say; eth0's MTU`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.mtuSet = cmd.Flags().Changed("mtu")
			return runUp(cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dev, "dev", "siwtun0", "TUN device name")
	f.StringSliceVar(&o.addrs, "addr", nil, "the RNIC's address(es) in its own stack, CIDR (IPv4 and/or IPv6; required without --shared; with it, the RNIC's private IPv4 address on the TUN device, default a link-local one)")
	f.StringSliceVar(&o.hostAddrs, "host-addr", nil, "the host side's address(es) on the TUN device, CIDR")
	f.StringVar(&o.shared, "shared", "", "shared-address mode: the RNIC answers on this IPv4 address of the host's (an interface has it, or --shared-dev names the TUN device), for the ports it uses; the host keeps the others")
	f.StringVar(&o.sharedDev, "shared-dev", "", "with --shared: the interface that has the address (default: the one that has it); the TUN device's own name (--dev) puts the address on it")
	f.IntVar(&o.mtu, "mtu", 9000, "link MTU (with --shared on another interface: that interface's MTU unless given)")
	f.Uint8Var(&o.mpaRev, "mpa-rev", 2, "MPA revision requested: 1 (RFC 5044) or 2 (RFC 6581)")
	switchVar(f, &o.crc, "crc", true, "request MPA CRC32c: on or off (--crc off, --crc=off; --crc alone is on)")
	switchVar(f, &o.rdmapExt, "rdmap-ext", true, "offer and accept RFC 7306 Immediate Data (RDMA Write and Send with Immediate Data) to peers that announce it in the MPA private data (other siwtuns): on or off; off, the MPA frames carry exactly the application's private data")
	choiceVar(f, &o.markers, "markers", "off", "on", []string{"on", "off", "prefer", "true", "false"}, 3,
		"ask peers to send MPA markers: on, off, or prefer (ask, and connect again without them when the peer rejects markers; as responder ask only initiators that asked); --markers alone is on")
	f.StringVar(&o.p2p, "p2p", "auto", "RFC 6581 peer-to-peer mode: the RTR types offered as initiator and accepted as responder, write, read, send or a comma list of them (write,read), or off (no offer, every type accepted); auto offers write,read and accepts every type")
	f.Uint16Var(&o.ird, "ird", 16, "default inbound RDMA Read depth (IRD)")
	f.Uint16Var(&o.ord, "ord", 16, "default outbound RDMA Read depth (ORD)")
	f.DurationVar(&o.firstFPDU, "first-fpdu-delay", offload.DefaultFirstFPDUDelay, "as initiator, wait this long after the MPA Reply before the first FPDU or RTR, unless the Reply says its sender reads at once, as a siwtun responder does in its extension block (Linux siw leaves an FPDU or RTR that arrives right after its Reply unread); 0 sends at once to every peer")
	f.DurationVar(&o.startupHold, "startup-hold", offload.DefaultStartupHold, "as responder without peer-to-peer mode, hold the application's sends after the MPA Reply until the initiator's first FPDU (RFC 5044 §7.1.2), or until the Reply has been acknowledged and this long has passed (an initiator such as Linux siw without peer_to_peer sends none before a server that speaks first); negative waits for the first FPDU however long")
	f.DurationVar(&o.finDelay, "fin-delay", offload.DefaultFINDelay, "hold the FIN of a connection back this long after the application disconnects or destroys its QP, unless the peer said it is siwtun (Linux siw fails a Send it has already sent when the FIN comes before its send call returns: perftest's \"Bad wc status 2\"); 0 closes at once")
	f.DurationVar(&o.acceptTimeout, "mpa-accept-timeout", offload.DefaultAcceptTimeout, "MPA accept timeout: a connection to a listener whose whole MPA Request has not arrived this long after the TCP handshake (nothing sent, or a Request cut off) is reset unanswered and counted in mpaAcceptTimeouts")
	f.DurationVar(&o.peerTimeout, "peer-timeout", netstack.DefaultPeerTimeout, "end a connection whose peer stays silent this long (TCP user timeout and keepalive); 0 disables")
	f.StringVar(&o.impair, "impair", "", "impair the link, both directions, reproducibly from the seed: e.g. loss=0.5%,reorder=2%,dup=0.5%,delay=200us,jitter=50us,corrupt=0.01%,seed=7 (corrupt fixes the TCP checksum: only MPA's CRC can catch it)")
	socketDirFlag(f, &o.socketDir, "verbs and control sockets, this daemon's among them; one per network namespace")
	f.StringVar(&o.socketGroup, "socket-group", "", "group owning the sockets (mode 0660); default: root's")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	f.IntVar(&o.maxQP, "max-qp", offload.DefaultConfig("").MaxQP, "most queue pairs the device holds at once")
	f.IntVar(&o.perWrite, "fpdus-per-write", offload.DefaultConfig("").FPDUsPerWrite, "most FPDUs one TCP write carries (1: one FPDU per write; 0: as many as fit 64 KiB); each segment still starts with an FPDU")
	f.BoolVar(&o.offload, "offload", true, "segmentation offload through the TUN device (IFF_VNET_HDR, TSO, checksum): TCP super-segments cross the device whole both ways, cut by the kernel where the RNIC's segments end")
	f.BoolVar(&o.delayedACK, "delayed-ack", true, "hold the RNIC's pure ACKs up to 1 ms for the next segment of their connection to carry them (an answer, in a ping-pong), sending every second one at once, as Linux delays ACKs; off, gVisor acknowledges every segment at once with a packet of its own")
	f.BoolVar(&o.rack, "rack", false, "RACK loss detection and tail loss probes in the RNIC's TCP (off: gVisor's probes, at twice the round trip with no floor, fire for segments a busy host's ACKs are late for, and each halves the window)")
	f.BoolVar(&o.gso, "gso", true, "with --offload, let the RNIC's TCP build super-segments itself (host GSO; --gso=false: it builds every segment, and the device joins runs of them)")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile (pprof) of the daemon's whole run to this file")
	f.IntVar(&o.nice, "nice", 0, "scheduling priority (nice, -20..19) of the daemon's threads, 0 leaving it as started; -10 lets them take the processor from applications that busy-poll without yielding (perftest's latency tests), as an RNIC's hardware does not wait for them; below the current value needs CAP_SYS_NICE (root has it)")
	limitFlags(f, &o.limits)
	return cmd
}

// limitFlags defines the --max-client-* flags of l, with the defaults of
// uverbs.DefaultLimits.
func limitFlags(f *pflag.FlagSet, l *uverbs.Limits) {
	def := uverbs.DefaultLimits()
	f.IntVar(&l.QPs, "max-client-qps", def.QPs, "most QPs one verbs client may hold (0: no limit)")
	f.IntVar(&l.CQs, "max-client-cqs", def.CQs, "most CQs one verbs client may hold (0: no limit)")
	f.IntVar(&l.MRs, "max-client-mrs", def.MRs, "most memory regions one verbs client may hold (0: no limit)")
	f.IntVar(&l.PDs, "max-client-pds", def.PDs, "most PDs one verbs client may hold (0: no limit)")
	f.IntVar(&l.Listeners, "max-client-listeners", def.Listeners, "most listeners one verbs client may hold (0: no limit)")
	sizeVar(f, &l.MRBytes, "max-client-mr-bytes", def.MRBytes, "most bytes one verbs client may have registered, all its regions together, e.g. 64G (0: no limit)")
	f.IntVar(&l.WRs, "max-client-wrs", def.WRs, "most outstanding work requests of one verbs client: its QPs' send and receive queue depths together, each rounded up to a power of two (0: no limit)")
	f.IntVar(&l.CQEs, "max-client-cqes", def.CQEs, "most completion queue entries of one verbs client, its CQs together, each rounded up to a power of two (0: no limit)")
	f.IntVar(&l.SRQs, "max-client-srqs", def.SRQs, "most shared receive queues one verbs client may hold; their depths count in --max-client-wrs (0: no limit)")
}

// checkLimits refuses negative --max-client-* values.
func checkLimits(l uverbs.Limits) error {
	for _, v := range []struct {
		flag string
		n    int
	}{{"qps", l.QPs}, {"cqs", l.CQs}, {"mrs", l.MRs}, {"pds", l.PDs}, {"listeners", l.Listeners}, {"wrs", l.WRs}, {"cqes", l.CQEs}, {"srqs", l.SRQs}} {
		if v.n < 0 {
			return fmt.Errorf("--max-client-%s %d: want 0 (no limit) or more", v.flag, v.n)
		}
	}
	return nil
}

// peerTimeoutOption maps --peer-timeout (0: off) to netstack.Options.
func peerTimeoutOption(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// parseP2P maps the --p2p flag to the RTR types offered as initiator and
// accepted as responder (0: every type).
func parseP2P(s string) (offer, accept mpa.RTR, err error) {
	switch s {
	case "auto":
		return mpa.RTRWrite | mpa.RTRRead, 0, nil
	case "off", "":
		return 0, 0, nil
	}
	for _, t := range strings.Split(s, ",") {
		switch strings.TrimSpace(t) {
		case "write":
			offer |= mpa.RTRWrite
		case "read":
			offer |= mpa.RTRRead
		case "send":
			offer |= mpa.RTRSend
		default:
			return 0, 0, fmt.Errorf("--p2p %q: want auto, off, or write, read, send or a comma list of them", s)
		}
	}
	return offer, offer, nil
}

// parseMarkers maps the --markers flag to the engine's Markers and
// MarkersPrefer.
func parseMarkers(s string) (markers, prefer bool, err error) {
	switch s {
	case "off", "false":
		return false, false, nil
	case "on", "true":
		return true, false, nil
	case "prefer":
		return true, true, nil
	}
	return false, false, fmt.Errorf("--markers %q: want on, off or prefer", s)
}

func parsePrefixes(flag string, in []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(in))
	for _, s := range in {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: want an address with a prefix length, like 198.18.0.2/24", flag, s)
		}
		out = append(out, p)
	}
	return out, nil
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
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

// socketOwnership applies --socket-group and mode 0660 to a socket file.
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

func runUp(stderr io.Writer, o upOptions) (err error) {
	log, err := newLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	if o.nice < -20 || o.nice > 19 {
		return fmt.Errorf("--nice %d: want -20..19", o.nice)
	}
	// Early, while the runtime has few threads; again once everything is
	// started (reniceThreads).
	renice := func() error { return nil }
	if cur, err := threadNice(); err == nil && o.nice != 0 && cur != o.nice {
		renice = func() error { return reniceThreads(o.nice) }
	}
	niceErr := renice()
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			if cerr := f.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("--cpuprofile: %w", cerr)
			}
		}()
	}
	addrs, err := parsePrefixes("addr", o.addrs)
	if err != nil {
		return err
	}
	var plan sharedPlan
	switch {
	case o.shared != "":
		if plan, err = planShared(o.shared, o.sharedDev, o.dev); err != nil {
			return err
		}
		if o.mtu, err = sharedMTU(plan, o.mtu, o.mtuSet, log); err != nil {
			return err
		}
	case o.sharedDev != "":
		return errors.New("--shared-dev needs --shared")
	case len(addrs) == 0:
		return errors.New("--addr is required: the RNIC's own address, e.g. --addr 198.18.0.2/24 (or --shared with an address of this host's)")
	}
	hostAddrs, err := parsePrefixes("host-addr", o.hostAddrs)
	if err != nil {
		return err
	}
	p2p, p2pAccept, err := parseP2P(o.p2p)
	if err != nil {
		return err
	}
	imp, err := netstack.ParseImpairments(o.impair)
	if err != nil {
		return fmt.Errorf("--impair: %w", err)
	}
	if imp.Corrupt > 0 && !o.crc {
		log.Warn("--impair corrupt with --crc off: nothing will detect the corrupted payload bytes unless the peer asks for CRC; they are placed as good data")
	}
	markers, markersPrefer, err := parseMarkers(o.markers)
	if err != nil {
		return err
	}
	mtuAddrs := addrs
	if plan.addr.IsValid() {
		mtuAddrs = append(mtuAddrs, plan.addr)
	}
	if err := offload.CheckMTU(o.mtu, mtuAddrs); err != nil {
		return fmt.Errorf("--mtu: %w", err)
	}
	cfg := offload.DefaultConfig(o.dev)
	cfg.MPARev, cfg.CRC, cfg.P2P, cfg.IRD, cfg.ORD = o.mpaRev, o.crc, p2p, o.ird, o.ord
	cfg.RDMAPExt = o.rdmapExt
	cfg.Markers, cfg.MarkersPrefer = markers, markersPrefer
	cfg.FirstFPDUDelay = o.firstFPDU
	cfg.StartupHold = o.startupHold
	cfg.P2PAccept = p2pAccept
	cfg.FINDelay = o.finDelay
	if o.acceptTimeout <= 0 {
		return fmt.Errorf("--mpa-accept-timeout %v: must be positive", o.acceptTimeout)
	}
	cfg.AcceptTimeout = o.acceptTimeout
	if o.perWrite < 0 {
		return fmt.Errorf("--fpdus-per-write %d: want 0 or more", o.perWrite)
	}
	cfg.FPDUsPerWrite = o.perWrite
	if o.maxQP < 1 {
		return fmt.Errorf("--max-qp %d: at least 1", o.maxQP)
	}
	cfg.MaxQP = o.maxQP
	cfg.Logger = log
	if err := checkLimits(o.limits); err != nil {
		return err
	}
	if err := os.MkdirAll(o.socketDir, 0o755); err != nil {
		return needsRoot(fmt.Errorf("socket directory: %w", err))
	}
	lock, err := lockDevice(o.socketDir, o.dev)
	if err != nil {
		return needsRoot(err)
	}
	defer func() {
		os.Remove(lock.Name())
		lock.Close()
	}()

	create := tun.Create
	if o.offload {
		create = tun.CreateOffload
	}
	dev, err := create(o.dev, o.mtu)
	if err != nil {
		return err // it says that it needs CAP_NET_ADMIN
	}
	defer func() {
		dev.Close()
		tun.Delete(o.dev) // a non-persistent TUN goes with its fd; make sure
	}()
	if plan.onTUN {
		hostAddrs = append(hostAddrs, plan.addr)
	}
	if err := tun.Configure(o.dev, o.mtu, hostAddrs); err != nil {
		return err
	}
	var shared *netstack.Shared
	var mapper *portmap.Mapper
	netdev := o.dev
	if plan.addr.IsValid() {
		private, err := privateAddr(addrs, o.dev)
		if err != nil {
			return err
		}
		sh, m, err := shareAddress(plan, o.dev, private, log)
		if err != nil {
			return err
		}
		defer m.Close() // after the RNIC's Close: its ports are given back first
		shared, mapper, netdev, addrs = sh, m, plan.dev, []netip.Prefix{netip.PrefixFrom(private, 32)}
	}
	link := netstack.Impair(netstack.NewDeviceLink(tun.NewPacketDevice(dev)), imp)
	if imp.Active() {
		log.Warn("link impaired", "impairments", imp.String())
	}
	r, err := rnic.New(link, rnic.Config{
		Stack: netstack.Options{Addrs: addrs, MTU: o.mtu, PeerTimeout: peerTimeoutOption(o.peerTimeout), NoGSO: !o.gso, NoRACK: !o.rack,
			DelayedACK: o.delayedACK, Shared: shared},
		Engine: cfg,
	})
	if err != nil {
		return err
	}
	defer r.Close()
	stack, eng, vdev := r.Stack, r.Engine, r.Device

	vsrv, err := uverbs.NewServer(vdev, log)
	if err != nil {
		return fmt.Errorf("verbs socket: %w", err)
	}
	vsrv.SetLimits(o.limits)
	ctlPath := ctl.SocketPath(o.socketDir, o.dev)
	prov := ctl.NewProvider(netdev, eng, hostAddrs, vsrv.Counters)
	if shared != nil {
		prov = ctl.WithShared(prov, sharedLink(o.dev, shared.Private, mapper))
	}
	cs, err := ctl.Listen(ctlPath, prov, log)
	if err != nil {
		return err
	}
	defer cs.Close()
	cs.TCPPerf = tcpperf.OnStack(stack)
	cs.Anatomy = stack.Anatomy()
	if err := socketOwnership(ctlPath, o.socketGroup); err != nil {
		return err
	}
	go cs.Serve()

	stopVerbs, verbsPath, err := serveVerbs(vsrv, o, log)
	if err != nil {
		return err
	}
	defer stopVerbs()

	if niceErr == nil {
		niceErr = renice()
	}
	if niceErr != nil {
		log.Warn("could not set the threads' scheduling priority; busy-polling applications will slow the RNIC down",
			"nice", o.nice, "err", niceErr)
	}
	log.Info("siwtun up", "dev", o.dev, "addr", prefixStrs(stack.Addrs()), "host_addr", prefixStrs(hostAddrs), "mtu", o.mtu,
		"mpa_rev", o.mpaRev, "crc", o.crc, "rdmap_ext", o.rdmapExt, "markers", o.markers, "p2p", o.p2p, "ird", o.ird, "ord", o.ord,
		"nice", o.nice, "verbs_socket", verbsPath, "ctl_socket", ctlPath, "client_limits", o.limits.String())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	// Under systemd (siwtun@.service, Type=notify), the unit is started now.
	if _, err := sdnotify.Notify(sdnotify.Ready); err != nil {
		log.Warn("could not tell the service manager the device is up", "err", err)
	}
	s := <-sig
	log.Info("shutting down", "signal", s.String())
	sdnotify.Notify(sdnotify.Stopping)
	// The deferred calls run in reverse: verbs clients are told and their
	// QPs closed, every connection gets an orderly close, ctl and the
	// sockets go, the stack stops and the TUN device is deleted.
	return nil
}

// serveVerbs serves the device to applications on the verbs socket,
// <socket-dir>/<dev>.sock, with srv. The returned stop tells every client
// the device is gone, destroys their objects and removes the socket.
func serveVerbs(srv *uverbs.Server, o upOptions, log *slog.Logger) (stop func(), path string, err error) {
	path = filepath.Join(o.socketDir, o.dev+".sock")
	gid := -1
	if o.socketGroup != "" {
		g, err := user.LookupGroup(o.socketGroup)
		if err != nil {
			return nil, "", fmt.Errorf("--socket-group %q: %w", o.socketGroup, err)
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

// prefixStrs writes prefixes for the log.
func prefixStrs(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}
