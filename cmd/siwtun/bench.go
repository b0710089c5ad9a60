package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/apps/tcpperf"
	"github.com/siwtun/siwtun/bench"
)

// benchOptions are the flags of siwtun bench.
type benchOptions struct {
	mtus        []int
	duration    int
	out         string
	quick       bool
	rounds      int
	suites      []string
	ops         []string
	connections int
	clients     int
	scaleQPs    []int
	idleQPs     []int
	nice        int
	upFlags     []string
	kernelTools []string
}

func newBenchCmd() *cobra.Command {
	o := benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure siwtun next to kernel TCP and raw gVisor TCP (make bench; root)",
		Long: `bench builds, in network namespaces it creates and removes, two RNICs on
TUN devices (each its own siwtun up) and a veth pair, and measures in one run:
kernel TCP over the veth pair (bulk and request/response) with siwtun's
own tcpperf and, beside it, Debian's iperf3 (bulk) and qperf (tcp_bw,
tcp_lat; --kernel-tools), the best of them the anchor of every ratio to
kernel TCP; raw gVisor TCP between the two daemons' own stacks through
their TUN devices (the engine's floor), and siwtun's RDMA WRITE, READ and SEND bandwidth (64 KiB, 1 MiB)
and latency (4 B, 64 KiB), RFC 7306 RDMA WRITE with Immediate Data the
same way (siwtun perf write --imm) and Fetch-and-Add operations per second
(siwtun perf atomic), with MPA CRC on and off, at each MTU (the perf
suite; --ops picks its tests); connect time and connections per second between the daemons, one
client and several at once, next to kernel TCP over the veth pair
(connect); aggregate RDMA WRITE bandwidth over several queue pairs
(scale); the daemons' memory per idle connected queue pair (memory, at
the first MTU); Debian's perftest through libsiwtun (ib_write_lat -R 2 B,
ib_write_bw -R 64 KiB), each next to siwtun perf with the same arguments,
ib_write_lat also next to siwtun perf --spin, which busy-waits as it does
(clib; skipped, with a note, without perftest or the library). It prints
one table with the figures, their ratios to both baselines and the
receiving application's CPU seconds per GB, a table of set-up, scale and
memory, judges the targets, and writes the same as JSON to --out.`,
		Example: `  siwtun bench                       # everything, about 15 minutes
  siwtun bench --mtu 9000 -D 2 --out /tmp
  siwtun bench --suites connect,memory --mtu 1500 --rounds 1 --idle-qps 1000
  siwtun bench --suites clib --mtu 9000 --rounds 5 --out ''   # perftest through libsiwtun`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd, o)
		},
	}
	f := cmd.Flags()
	f.IntSliceVar(&o.mtus, "mtu", []int{1500, 9000}, "link MTUs to measure")
	f.IntVarP(&o.duration, "duration", "D", 3, "seconds per bandwidth and request/response run")
	f.StringVar(&o.out, "out", "bench/results", "directory for the JSON results (<time>.json); empty: none")
	f.IntVar(&o.rounds, "rounds", 3, "take every measurement this many times, one whole round after another, and show medians (the machine is noisy)")
	f.BoolVar(&o.quick, "quick", false, "one size per test (1 MiB bandwidth, 4 B latency), RDMA WRITE only, 200 round trips (CRC on and off); 200 connections, 1 and 64 QPs, memory at 1,000 idle QPs")
	f.StringSliceVar(&o.ops, "ops", nil, "perf suite tests: some of write, read, send, write-imm, atomic (default all; write with --quick)")
	f.StringSliceVar(&o.suites, "suites", bench.AllSuites, "what to measure: perf (the main table), clib (Debian's ib_write_lat and ib_write_bw -R through libsiwtun next to siwtun perf), connect, scale, memory, shared (shared-address mode next to routed mode: RDMA WRITE 1 MiB, 4 B round trip, connections per second)")
	f.IntVar(&o.nice, "nice", 0, "run the daemons with siwtun up --nice N (0: as started)")
	f.StringSliceVar(&o.upFlags, "up-flag", nil, "one more flag for the daemons' siwtun up, such as --up-flag=--gso=false (repeatable)")
	f.StringSliceVar(&o.kernelTools, "kernel-tools", bench.AllKernelTools, "tools that measure kernel TCP beside tcpperf: some of iperf3, qperf (empty: tcpperf only); one not installed is skipped with a note")
	f.IntVar(&o.connections, "connections", 0, "connections per connect run (default 1000; 200 with --quick)")
	f.IntVar(&o.clients, "clients", 4, "client processes of the second connect run, connecting at once")
	f.IntSliceVar(&o.scaleQPs, "scale-qps", nil, "queue pairs of the aggregate RDMA WRITE runs (default 1,4,16,64; 1,64 with --quick)")
	f.IntSliceVar(&o.idleQPs, "idle-qps", nil, "idle connected queue pairs at which the daemons' memory is read (default 1000,10000; 1000 with --quick)")
	cmd.AddCommand(newBenchTCPCmd(), newBenchConnCmd())
	return cmd
}

func runBench(cmd *cobra.Command, o benchOptions) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if o.duration < 1 {
		return fmt.Errorf("--duration %d: at least 1 second", o.duration)
	}
	if o.rounds < 1 {
		return fmt.Errorf("--rounds %d: at least 1", o.rounds)
	}
	for _, m := range o.mtus {
		if m < 1280 || m > 65535 {
			return fmt.Errorf("--mtu %d: want 1280..65535", m)
		}
	}
	cfg := bench.DefaultConfig(self)
	cfg.MTUs, cfg.Duration, cfg.Rounds, cfg.Log = o.mtus, time.Duration(o.duration)*time.Second, o.rounds, cmd.ErrOrStderr()
	if o.quick {
		cfg.BWSizes, cfg.LatSizes, cfg.Ops = []int{1 << 20}, []int{4}, []string{"write"}
		cfg.LatIters = func(int) int { return 200 }
		cfg.Connections, cfg.ScaleQPs, cfg.IdleQPs = 200, []int{1, 64}, []int{1000}
	}
	if err := benchSuiteFlags(&cfg, o); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, runErr := bench.Run(ctx, cfg)
	if res == nil {
		return runErr
	}
	out := cmd.OutOrStdout()
	if err := res.WriteTable(out); err != nil {
		return err
	}
	if o.out != "" {
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return err
		}
		path := filepath.Join(o.out, res.Started.Format("20060102-150405")+".json")
		if err := createFile(path, res.WriteJSON); err != nil {
			return err
		}
		fmt.Fprintf(out, "results: %s\n", path)
	}
	return runErr
}

// benchSuiteFlags applies the suite flags of siwtun bench to cfg.
func benchSuiteFlags(cfg *bench.Config, o benchOptions) error {
	for _, s := range o.suites {
		if !slices.Contains(bench.AllSuites, s) {
			return fmt.Errorf("--suites: %q: want some of %s", s, strings.Join(bench.AllSuites, ", "))
		}
	}
	cfg.Suites = o.suites
	for _, t := range o.kernelTools {
		if !slices.Contains(bench.AllKernelTools, t) {
			return fmt.Errorf("--kernel-tools: %q: want some of %s", t, strings.Join(bench.AllKernelTools, ", "))
		}
	}
	cfg.KernelTools = o.kernelTools
	cfg.DaemonNice = o.nice
	cfg.UpFlags = o.upFlags
	for _, op := range o.ops {
		if !slices.Contains(bench.AllOps, op) {
			return fmt.Errorf("--ops: %q: want some of %s", op, strings.Join(bench.AllOps, ", "))
		}
	}
	if o.ops != nil {
		cfg.Ops = o.ops
	}
	if slices.Contains(o.suites, bench.SuiteCLib) {
		cfg.CLibSkip = clibMissing()
	}
	if o.connections != 0 {
		cfg.Connections = o.connections
	}
	if o.clients < 1 || cfg.Connections < o.clients {
		return fmt.Errorf("--clients %d: want 1..%d (the connections)", o.clients, cfg.Connections)
	}
	cfg.Clients = o.clients
	if o.scaleQPs != nil {
		cfg.ScaleQPs = o.scaleQPs
	}
	if o.idleQPs != nil {
		cfg.IdleQPs = o.idleQPs
	}
	for _, n := range append(slices.Clone(cfg.ScaleQPs), cfg.IdleQPs...) {
		if n < 1 {
			return fmt.Errorf("--scale-qps, --idle-qps: %d: at least 1", n)
		}
	}
	return nil
}

// clibMissing says what the comparison of perftest through libsiwtun
// lacks: Debian's perftest programs or the library; "" if nothing.
func clibMissing() string {
	var missing []string
	for _, p := range bench.CLibPrograms {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return strings.Join(missing, " and ") + " not installed (Debian's perftest package: apt-get install perftest)"
	}
	if _, err := findLib(); err != nil {
		return "libsiwtun: " + err.Error()
	}
	return ""
}

// benchTCPOptions are the flags of siwtun bench tcp.
type benchTCPOptions struct {
	listen string
	mode   string
	size   int
	time   time.Duration
	json   bool
}

func newBenchTCPCmd() *cobra.Command {
	o := benchTCPOptions{}
	cmd := &cobra.Command{
		Use:   "tcp [server-address:port]",
		Short: "Kernel TCP bulk or request/response (the benchmark's socket baseline)",
		Long: `tcp runs apps/tcpperf's workload over the kernel's TCP: with --listen it
serves one connection and exits, printing what it received; with the
server's address it is the client: --mode bulk writes --size bytes at a time
for --time and reports the receiver's throughput, --mode rr sends --size
bytes and waits for them back, and reports the round trip times.`,
		Example: `  siwtun bench tcp --listen 198.18.3.2:5201
  siwtun bench tcp 198.18.3.2:5201 --mode rr --size 64 --time 3s`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBenchTCP(cmd.Context(), cmd.OutOrStdout(), o, args)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "", "serve one connection on this address:port")
	f.StringVar(&o.mode, "mode", "bulk", "client: bulk or rr")
	f.IntVarP(&o.size, "size", "s", bench.BulkSize, "client: message size in bytes")
	f.DurationVarP(&o.time, "time", "t", 3*time.Second, "client: run time")
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	return cmd
}

func runBenchTCP(ctx context.Context, w io.Writer, o benchTCPOptions, args []string) error {
	var res tcpperf.Result
	switch {
	case o.listen != "" && len(args) > 0:
		return errors.New("give either --listen (server) or the server's address (client), not both")
	case o.listen != "":
		l, err := net.Listen("tcp", o.listen)
		if err != nil {
			return err
		}
		c, err := l.Accept()
		l.Close()
		if err != nil {
			return err
		}
		defer c.Close()
		if res, err = tcpperf.Serve(c.(*net.TCPConn)); err != nil {
			return err
		}
	case len(args) == 1:
		mode, err := tcpperf.ParseMode(o.mode)
		if err != nil {
			return fmt.Errorf("--mode: %w", err)
		}
		if o.size < 1 || o.size > tcpperf.MaxSize {
			return fmt.Errorf("--size %d: want 1..%d", o.size, tcpperf.MaxSize)
		}
		if o.time <= 0 {
			return fmt.Errorf("--time %v: must be positive", o.time)
		}
		c, err := dialRetry(ctx, args[0], 10*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		// Go's TCP connections have TCP_NODELAY on, as the RNIC's stack does.
		if res, err = tcpperf.Run(c.(*net.TCPConn), tcpperf.Header{Mode: mode, Size: o.size}, o.time); err != nil {
			return err
		}
	default:
		return errors.New("give --listen address:port (server) or the server's address:port (client)")
	}
	if o.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	if res.Mode == "bulk" {
		_, err := fmt.Fprintf(w, "bulk %d B writes: %d bytes in %.3f s, %.1f MB/s\n", res.Size, res.Bytes, res.Seconds, res.MBps)
		return err
	}
	_, err := fmt.Fprintf(w, "rr %d B: %d round trips in %.3f s, median %.1f us, avg %.1f us, p99 %.1f us\n",
		res.Size, res.RoundTrips, res.Seconds, res.RTTMedian, res.RTTAvg, res.RTTP99)
	return err
}

// dialRetry connects to addr, trying again while nothing listens there
// yet (the server is another process, started just before).
func dialRetry(ctx context.Context, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to %s: %w", addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
