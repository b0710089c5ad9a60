package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/apps/perftest"
	"github.com/siwtun/siwtun/verbs"
)

// perfDevice selects the device: flags of `siwtun perf` itself.
type perfDevice struct{ dev, dir string }

// perfOptions are the flags of `siwtun perf <test>`, named as perftest's.
type perfOptions struct {
	*perfDevice
	lat           bool
	size          int
	all           bool
	iters         int
	duration      int
	port          int
	qps           int
	txDepth       int
	rxDepth       int
	inline        int
	outs          int
	bidir         bool
	gbits         bool
	legacyUnits   bool
	imm           bool
	spin          bool
	anatomy       bool
	peerDir       string
	atomicType    string
	json          bool
	rdmaCM        bool
	settle        time.Duration
	connectTries  int
	connectPeriod time.Duration
}

func newPerfCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "perf",
		Short: "perftest-style bandwidth and latency tests (like ib_write_bw -R, ib_send_lat -R)",
		Long: `perf runs perftest's tests over a siwtun device: write, read and send,
bandwidth by default or latency with --lat. Without an address it is the
server and waits for a client; with the server's address it is the client.

It speaks perftest's rdma_cm control exchange (ib_*_bw/lat -R, perftest
4.5's protocol, version 6.06), so either side may be the unmodified
perftest tools of another RNIC, and prints perftest's report: the
parameter banner, then a bandwidth table in MiB/sec (--report_gbits for
Gb/sec) or a latency table in microseconds. Send bandwidth tests use
perftest's iWARP receive credits: no Send ever meets an empty receive
queue.`,
		Example: `  siwtun perf write                      # server on siwtun0, port 18515
  siwtun perf write 198.18.2.2           # client
  siwtun perf send --lat -a 198.18.2.2   # send latency, every size 2..8 MiB
  siwtun perf write --imm 198.18.2.2     # RDMA Write with Immediate Data bandwidth (server: siwtun perf write --imm)
  siwtun perf atomic -A CMP_AND_SWAP 198.18.2.2   # RFC 7306 atomics, operations per second (ib_atomic_bw)
  siwtun perf read -b -q 2 -D 5 198.18.2.2 --json`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unknown test %q: want write, read, send or atomic", args[0])
			}
			return cmd.Help()
		},
	}
	d := &perfDevice{}
	pf := cmd.PersistentFlags()
	pf.StringVar(&d.dev, "dev", defaultDev, "siwtun device (its daemon's verbs socket)")
	socketDirFlag(pf, &d.dir, "verbs sockets")
	cmd.RegisterFlagCompletionFunc("dev", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return verbsSocketDevs(d.dir), cobra.ShellCompDirectiveNoFileComp
	})
	for _, v := range []perftest.Verb{perftest.Write, perftest.Read, perftest.Send, perftest.Atomic} {
		cmd.AddCommand(newPerfTestCmd(v, d))
	}
	return cmd
}

func newPerfTestCmd(verb perftest.Verb, d *perfDevice) *cobra.Command {
	o := &perfOptions{perfDevice: d}
	name := strings.ToLower(strings.TrimPrefix(verb.String(), "RDMA_"))
	short := map[perftest.Verb]string{
		perftest.Write:  "RDMA Write bandwidth or latency (ib_write_bw, ib_write_lat)",
		perftest.Read:   "RDMA Read bandwidth or latency (ib_read_bw, ib_read_lat)",
		perftest.Send:   "Send bandwidth or latency (ib_send_bw, ib_send_lat)",
		perftest.Atomic: "RFC 7306 Fetch-and-Add or Compare-and-Swap rate (ib_atomic_bw; siwtun peers only)",
	}[verb]
	cmd := &cobra.Command{
		Use:   name + " [server-address]",
		Short: short,
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPerf(cmd, verb, o, args)
		},
	}
	f := cmd.Flags()
	f.SortFlags = false
	f.BoolVar(&o.lat, "lat", false, "measure latency instead of bandwidth")
	f.IntVarP(&o.size, "size", "s", 0, "message size in bytes (default 65536, 2 with --lat)")
	f.BoolVarP(&o.all, "all", "a", false, "run sizes from 2 to 2^23")
	f.IntVarP(&o.iters, "iters", "n", 0, "messages per size (default 1000; 5000 for write bandwidth)")
	f.IntVarP(&o.duration, "duration", "D", 0, "run for this many seconds instead of --iters")
	f.IntVarP(&o.port, "port", "p", perftest.DefaultPort, "port to listen on or connect to")
	f.IntVarP(&o.qps, "qp", "q", 1, "number of queue pairs (bandwidth tests)")
	f.IntVarP(&o.txDepth, "tx-depth", "t", 0, "send queue depth (default 128, 1 with --lat)")
	f.IntVarP(&o.rxDepth, "rx-depth", "r", 0, "receive queue depth of send and write --imm tests (default 512)")
	f.IntVarP(&o.inline, "inline_size", "I", -1, "largest message sent inline; -1: perftest's default (0, or 220/236 with --lat)")
	f.IntVarP(&o.outs, "outs", "o", 0, "outstanding RDMA Reads (default: the device maximum)")
	f.BoolVarP(&o.bidir, "bidirectional", "b", false, "measure both directions at once (bandwidth tests)")
	if verb == perftest.Atomic {
		f.StringVarP(&o.atomicType, "atomic_type", "A", "FETCH_AND_ADD", "the atomic operation: FETCH_AND_ADD or CMP_AND_SWAP")
	}
	if verb == perftest.Write {
		f.BoolVar(&o.imm, "imm", false, "RDMA Write with Immediate Data (RFC 7306, perftest's --write_with_imm): the receiver consumes a receive per message; both sides siwtun")
		f.BoolVar(&o.spin, "spin", false, "with --lat: wait for the peer's Write in a pure busy loop, never yielding the processor, as ib_write_lat does")
		f.BoolVar(&o.anatomy, "anatomy", false, "with --lat: take the round trip apart hop by hop (median and 99th percentile of each, both directions) from both daemons' stamps; both daemons on this host, the server run with --anatomy too; the client prints the table")
		f.StringVar(&o.peerDir, "peer-socket-dir", "", "with --anatomy: the directory of the server's daemon's control socket (default: --socket-dir)")
	}
	f.BoolVar(&o.gbits, "report_gbits", false, "report bandwidth in Gb/sec instead of MiB/sec")
	f.BoolVar(&o.legacyUnits, "legacy-units", false, "name the columns MB/sec as perftest 4.5 did (the figures stay MiB/sec)")
	f.BoolVar(&o.json, "json", false, "print one JSON document instead of the text report")
	f.BoolVarP(&o.rdmaCM, "rdma_cm", "R", true, "connect the test queue pairs with rdma_cm (always on; accepted for perftest's command lines)")
	f.DurationVar(&o.settle, "settle", 100*time.Millisecond, "client: pause after the control connection before the first message")
	f.IntVar(&o.connectTries, "connect-tries", 10, "client: attempts to connect while the server is not listening yet")
	f.DurationVar(&o.connectPeriod, "connect-interval", 100*time.Millisecond, "client: time between connection attempts")
	f.MarkHidden("settle")
	f.MarkHidden("connect-tries")
	f.MarkHidden("connect-interval")
	return cmd
}

// config turns the flags into a perftest.Config, rejecting what perftest
// rejects with a message naming the flag.
func (o *perfOptions) config(verb perftest.Verb) (perftest.Config, error) {
	c := perftest.Config{Verb: verb, Latency: o.lat, Size: o.size, All: o.all, Iters: o.iters,
		QPs: o.qps, TxDepth: o.txDepth, RxDepth: o.rxDepth, Inline: o.inline, OutReads: o.outs,
		Bidirectional: o.bidir, Imm: o.imm, Spin: o.spin, Gbits: o.gbits, LegacyUnits: o.legacyUnits, JSON: o.json,
		SettleDelay: o.settle, ConnectRetries: o.connectTries, ConnectRetryDelay: o.connectPeriod}
	switch {
	case !o.rdmaCM:
		return c, errors.New("--rdma_cm=false: siwtun perf always connects with rdma_cm (iWARP queue pairs reach RTS only through it)")
	case o.size < 0:
		return c, fmt.Errorf("--size %d: must be positive", o.size)
	case o.iters < 0:
		return c, fmt.Errorf("--iters %d: must be positive", o.iters)
	case o.duration < 0:
		return c, fmt.Errorf("--duration %d: must be positive", o.duration)
	case o.port < 1 || o.port > 65535:
		return c, fmt.Errorf("--port %d: want 1..65535", o.port)
	case o.qps < 1:
		return c, fmt.Errorf("--qp %d: at least 1", o.qps)
	case o.txDepth < 0, o.rxDepth < 0, o.outs < 0:
		return c, errors.New("--tx-depth, --rx-depth and --outs must be positive")
	case o.inline < -1:
		return c, fmt.Errorf("--inline_size %d: must be 0 or more", o.inline)
	case o.connectTries < 1:
		return c, fmt.Errorf("--connect-tries %d: at least 1", o.connectTries)
	}
	c.Duration = time.Duration(o.duration) * time.Second
	if verb == perftest.Atomic {
		t, err := perftest.ParseAtomicType(o.atomicType)
		if err != nil {
			return c, err
		}
		c.AtomicType = t
	}
	return c, nil
}

func runPerf(cmd *cobra.Command, verb perftest.Verb, o *perfOptions, args []string) error {
	// 0 stands for "the default" in these options: refuse it when given,
	// rather than run the default silently.
	for _, name := range []string{"size", "iters", "tx-depth", "rx-depth", "duration", "outs"} {
		if f := cmd.Flags().Lookup(name); f.Changed && f.Value.String() == "0" {
			return fmt.Errorf("--%s (-%s) 0: must be at least 1 (leave it out for the default)", name, f.Shorthand)
		}
	}
	cfg, err := o.config(verb)
	if err != nil {
		return err
	}
	var server netip.AddrPort
	if len(args) == 1 {
		a, err := netip.ParseAddr(strings.Trim(args[0], "[]"))
		if err != nil {
			return fmt.Errorf("server address %q: want an IPv4 or IPv6 address", args[0])
		}
		server = netip.AddrPortFrom(a, uint16(o.port))
	}
	if o.dev == "" || strings.ContainsAny(o.dev, "/\x00") || o.dev == "." || o.dev == ".." {
		return fmt.Errorf("invalid device name %q", o.dev)
	}
	// Check the parameters before opening anything: a mistake is reported
	// the same with or without a daemon.
	if _, err := cfg.Normalize(perftest.NominalDeviceAttr()); err != nil {
		return err
	}
	var anat *perfAnatomy
	if o.anatomy {
		if o.json {
			return errors.New("--anatomy prints a table of its own: leave out --json")
		}
		anat = newPerfAnatomy(o.dir, o.peerDir, o.dev, server.IsValid())
		cfg.Stamps = &anat.stamps
		if server.IsValid() {
			if err := anat.prepare(server.Addr()); err != nil {
				return err
			}
		}
		if _, err := cfg.Normalize(perftest.NominalDeviceAttr()); err != nil {
			return err
		}
	}
	dev, err := verbs.DialPath(filepath.Join(o.dir, o.dev+".sock"))
	if err != nil {
		return fmt.Errorf("%s: %w (is `siwtun up --dev %s` running?)", o.dev, err, o.dev)
	}
	defer dev.Close()
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := cmd.OutOrStdout()
	var rep *perftest.Report
	if server.IsValid() {
		rep, err = perftest.RunClient(ctx, dev, server, cfg, out)
	} else {
		rep, err = perftest.RunServer(ctx, dev, uint16(o.port), cfg, out)
	}
	if err != nil {
		if rerr := removal(dev); rerr != nil {
			return rerr // the cause, not what it broke
		}
		return err
	}
	if anat != nil {
		return anat.finish(out)
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return nil
}

// removal returns dev's removal ("device siwtun1 removed (daemon
// stopped)") if the daemon has stopped: a run that failed because of it
// says so instead of blaming the peer. The daemon announces its removal
// on the verbs socket before it destroys the session's queue pairs, so a
// failure it caused is followed by the announcement at once; removal waits
// briefly for it.
func removal(dev *verbs.Device) error {
	for range 10 {
		if err := dev.Removed(); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// verbsSocketDevs lists the devices with a verbs socket in dir.
func verbsSocketDevs(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
	var devs []string
	for _, p := range m {
		devs = append(devs, strings.TrimSuffix(filepath.Base(p), ".sock"))
	}
	return devs
}
