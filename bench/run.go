package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/siwtun/siwtun/apps/perftest"
	"github.com/siwtun/siwtun/apps/tcpperf"
	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/netns"
)

// Config is what a run measures.
type Config struct {
	// Bin is the siwtun binary: the daemons, `siwtun perf` and `siwtun
	// bench tcp` are its subcommands.
	Bin string
	// MTUs are the link MTUs, each measured in full.
	MTUs []int
	// Duration is the length of each bandwidth and request/response run
	// (whole seconds: perftest's -D).
	Duration time.Duration
	// BWSizes are the message sizes of the RDMA bandwidth runs, LatSizes
	// those of the latency runs.
	BWSizes  []int
	LatSizes []int
	// LatIters gives the number of round trips of a latency run by size.
	LatIters func(size int) int
	// Ops are the perftest tests: "write", "read", "send", "write-imm"
	// (siwtun perf write --imm: RFC 7306 RDMA Write with Immediate Data,
	// bandwidth and latency at the sizes) and "atomic" (siwtun perf
	// atomic: RFC 7306 Fetch-and-Add, operations per second, KindOps).
	Ops []string
	// CRCs are the MPA CRC settings measured.
	CRCs []bool
	// Rounds is how many times every measurement is taken (the whole set
	// once per round); the table shows medians. 0 means 1.
	Rounds int
	// Suites are what to measure (SuitePerf, SuiteConnect, SuiteScale,
	// SuiteMemory); empty means all.
	Suites []string
	// Connections is how many connections a connect run opens, and
	// Clients how many client processes open them at once in the second
	// connect run (the first has one).
	Connections, Clients int
	// ScaleQPs are the queue pair counts of the aggregate RDMA WRITE runs
	// (1 MiB messages, CRC on); the first should be 1.
	ScaleQPs []int
	// IdleQPs are the idle connected queue pair counts at which the
	// daemons' memory is read (at the first MTU only: an idle QP holds
	// nothing that depends on it).
	IdleQPs []int
	// CLibSkip, if not empty, says why the comparison of Debian's perftest
	// through libsiwtun with siwtun perf (SuiteCLib) cannot run: perftest
	// or the library is missing. Its targets are then marked skipped.
	CLibSkip string
	// DaemonNice, if not 0, is passed to the daemons as `siwtun up --nice`.
	DaemonNice int
	// UpFlags are more flags for the daemons' `siwtun up` (such as
	// --gso=false), for comparing its options with the same workloads.
	UpFlags []string
	// KernelTools are the tools that measure kernel TCP beside
	// apps/tcpperf (ToolIperf3, ToolQperf), in the perf suite; one that is
	// not installed is skipped with a note (Results.KernelSkipped).
	KernelTools []string
	// Log receives a line per step (nil: discarded).
	Log io.Writer
}

// DefaultConfig is `make bench`: MTU 1500 and 9000, 3 s per run, RDMA
// WRITE, READ and SEND at 64 KiB and 1 MiB, latency at 4 B and 64 KiB,
// with CRC on and off; 1,000 connections by one client and by four at
// once; RDMA WRITE over 1, 4, 16 and 64 queue pairs; memory with 1,000
// and 10,000 idle queue pairs.
func DefaultConfig(bin string) Config {
	return Config{
		Bin: bin, MTUs: []int{1500, 9000}, Duration: 3 * time.Second,
		BWSizes: []int{64 << 10, 1 << 20}, LatSizes: []int{4, 64 << 10},
		LatIters: func(size int) int {
			if size <= 4096 {
				return 2000
			}
			return 500
		},
		Ops: AllOps, CRCs: []bool{true, false},
		Connections: 1000, Clients: 4, ScaleQPs: []int{1, 4, 16, 64}, IdleQPs: []int{1000, 10000},
		KernelTools: AllKernelTools,
	}
}

// The topology. The daemons share one namespace, whose kernel routes
// between their TUN devices, as in the integration tests; kernel TCP runs
// between two more namespaces joined by a veth pair.
const (
	dev0, dev1     = "siwtun0", "siwtun1"
	rnic0, host0   = "198.18.1.2/24", "198.18.1.1/24"
	rnic1, host1   = "198.18.2.2/24", "198.18.2.1/24"
	rnic1Addr      = "198.18.2.2"
	veth0, veth1   = "sbench0", "sbench1"
	vethA0, vethA1 = "198.18.3.1/24", "198.18.3.2/24"
	veth1Addr      = "198.18.3.2"
)

// runner holds what one run created, to remove it all at the end.
type runner struct {
	cfg     Config
	ctx     context.Context
	log     io.Writer
	id      string
	nsRNIC  string
	nsK0    string
	nsK1    string
	dir     string
	nsMade  []string
	procs   []*proc
	d0, d1  *proc
	port    int
	round   int
	res     *Results
	rowErrs []string
	// tools are the installed kernel TCP tools of Config.KernelTools, by
	// name: their paths (kernel.go).
	tools map[string]string
	// sharedMode: startDaemons starts them sharing addresses of the host's
	// (SuiteShared).
	sharedMode bool
}

// Run builds the topology, measures everything cfg asks for and removes
// what it created, on every path: when ctx ends (Ctrl-C) every process it
// started gets SIGINT and every namespace is deleted before Run returns.
// A measurement that fails is reported in the error after the others ran;
// the results hold what was measured.
func Run(ctx context.Context, cfg Config) (res *Results, err error) {
	if err := netns.CanRun(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Duration < time.Second || cfg.Duration%time.Second != 0 {
		return nil, fmt.Errorf("duration %v: want whole seconds, at least 1", cfg.Duration)
	}
	start := time.Now()
	r := &runner{cfg: cfg, ctx: ctx, log: cfg.Log, id: fmt.Sprintf("siwtun-bench-%d", os.Getpid()),
		port: 18515, res: &Results{Started: start.UTC().Round(time.Second), CPUs: runtime.NumCPU(), DurationS: cfg.Duration.Seconds(),
			DaemonNice: cfg.DaemonNice, UpFlags: cfg.UpFlags}}
	r.nsRNIC, r.nsK0, r.nsK1 = r.id, r.id+"-k0", r.id+"-k1"
	defer func() {
		if e := r.cleanup(); e != nil && err == nil {
			err = e
		}
	}()
	if err := r.setup(); err != nil {
		return nil, err
	}
	r.res.Rounds = max(cfg.Rounds, 1)
	r.res.Suites = r.suites()
	if r.on(SuitePerf) {
		r.kernelTools()
	}
	if r.on(SuiteCLib) {
		r.res.CLib = &CLibInfo{Skipped: cfg.CLibSkip}
		if cfg.CLibSkip != "" {
			r.logf("perftest through libsiwtun: skipped: %s", cfg.CLibSkip)
		}
	}
	for round := range r.res.Rounds {
		r.round = round
		if r.res.Rounds > 1 {
			r.logf("round %d of %d", round+1, r.res.Rounds)
		}
		for i, mtu := range cfg.MTUs {
			if err := r.measureMTU(mtu, i == 0); err != nil {
				return nil, err
			}
		}
	}
	r.res.MergeRounds()
	r.sortRows()
	r.res.ElapsedS = time.Since(start).Seconds()
	r.res.Analyze()
	if len(r.rowErrs) > 0 {
		return r.res, fmt.Errorf("%d measurement(s) failed:\n%s", len(r.rowErrs), strings.Join(r.rowErrs, "\n"))
	}
	return r.res, nil
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.log, "bench: "+format+"\n", args...)
}

// setup creates the namespaces, the veth pair and the socket directory.
func (r *runner) setup() error {
	var err error
	if r.dir, err = os.MkdirTemp("", "siwtun-bench-"); err != nil {
		return err
	}
	for _, ns := range []string{r.nsRNIC, r.nsK0, r.nsK1} {
		if err := netns.IP("netns", "add", ns); err != nil {
			return err
		}
		r.nsMade = append(r.nsMade, ns)
		if err := netns.IP("-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	// The RNICs' namespace routes between their TUN devices.
	if err := netns.IP("netns", "exec", r.nsRNIC, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"); err != nil {
		return err
	}
	steps := [][]string{
		{"-n", r.nsK0, "link", "add", veth0, "type", "veth", "peer", "name", veth1, "netns", r.nsK1},
		{"-n", r.nsK0, "addr", "add", vethA0, "dev", veth0},
		{"-n", r.nsK1, "addr", "add", vethA1, "dev", veth1},
		{"-n", r.nsK0, "link", "set", veth0, "up"},
		{"-n", r.nsK1, "link", "set", veth1, "up"},
	}
	for _, s := range steps {
		if err := netns.IP(s...); err != nil {
			return err
		}
	}
	r.logf("namespaces %s (two daemons), %s and %s (kernel TCP over veth)", r.nsRNIC, r.nsK0, r.nsK1)
	return nil
}

// cleanup stops every process still running (by PID) and deletes the
// namespaces and the socket directory.
func (r *runner) cleanup() error {
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].stop()
	}
	var errs []error
	for _, ns := range r.nsMade {
		if err := netns.IP("netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	if r.dir != "" {
		os.RemoveAll(r.dir)
	}
	if len(errs) == 0 {
		r.logf("removed the namespaces")
	}
	return errors.Join(errs...)
}

func (r *runner) start(name, ns string, args ...string) (*proc, error) {
	p, err := startProc(r.ctx, name, ns, append([]string{r.cfg.Bin}, args...)...)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, p)
	return p, nil
}

func (r *runner) nextPort() string {
	r.port++
	return fmt.Sprint(r.port)
}

// failed records a measurement that did not work; the run goes on.
func (r *runner) failed(what string, err error) {
	msg := fmt.Sprintf("%s: %v", what, err)
	r.rowErrs = append(r.rowErrs, msg)
	r.logf("FAILED %s", msg)
}

// measureMTU takes one round's measurements at mtu: those of each suite
// asked for (memory at the first MTU only).
func (r *runner) measureMTU(mtu int, first bool) error {
	for _, l := range [][]string{{"-n", r.nsK0, "link", "set", veth0, "mtu", fmt.Sprint(mtu)},
		{"-n", r.nsK1, "link", "set", veth1, "mtu", fmt.Sprint(mtu)}} {
		if err := netns.IP(l...); err != nil {
			return err
		}
	}
	if r.on(SuitePerf) {
		if err := r.measurePerf(mtu); err != nil {
			return err
		}
	}
	if r.on(SuiteCLib) && r.cfg.CLibSkip == "" {
		if err := r.startDaemons(mtu, true); err != nil {
			return err
		}
		if err := r.clibCompare(mtu, true); err != nil {
			return err
		}
		if err := r.stopDaemons(); err != nil {
			return err
		}
	}
	if err := r.measureSetupScale(mtu); err != nil {
		return err
	}
	if r.on(SuiteShared) {
		if err := r.measureShared(mtu); err != nil {
			return err
		}
	}
	if r.on(SuiteMemory) && first {
		for _, n := range r.cfg.IdleQPs {
			if err := r.ctx.Err(); err != nil {
				return err
			}
			if err := r.idleMemory(mtu, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// measurePerf is the main table at mtu: kernel TCP, raw gVisor TCP and
// perftest between the daemons, with each CRC setting.
func (r *runner) measurePerf(mtu int) error {
	for _, w := range r.tcpWorkloads() {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		r.kernelTCP(mtu, w)
	}
	r.kernelToolRuns(mtu)
	// The CRC settings take turns going first from round to round, so a
	// drift of the machine within a round does not favour one of them in
	// every round (the CRC cost target compares them).
	crcs := slices.Clone(r.cfg.CRCs)
	if r.round%2 == 1 {
		slices.Reverse(crcs)
	}
	for i, crc := range crcs {
		if err := r.startDaemons(mtu, crc); err != nil {
			return err
		}
		if i == 0 {
			for _, w := range r.tcpWorkloads() {
				if err := r.ctx.Err(); err != nil {
					return err
				}
				r.gvisorTCP(mtu, w)
			}
		}
		for _, op := range r.cfg.Ops {
			if op == "atomic" {
				if err := r.ctx.Err(); err != nil {
					return err
				}
				r.siwtunAtomic(mtu, crc)
				continue
			}
			for _, size := range r.cfg.BWSizes {
				if err := r.ctx.Err(); err != nil {
					return err
				}
				r.siwtunBW(mtu, crc, op, size)
			}
		}
		for _, op := range r.cfg.Ops {
			if op == "atomic" {
				continue // ib_atomic_bw has no latency test here
			}
			for _, size := range r.cfg.LatSizes {
				if err := r.ctx.Err(); err != nil {
					return err
				}
				r.siwtunLat(mtu, crc, op, size)
			}
		}
		if err := r.stopDaemons(); err != nil {
			return err
		}
	}
	return nil
}

// tcpWorkload is one TCP baseline run.
type tcpWorkload struct {
	mode tcpperf.Mode
	size int
}

// tcpWorkloads are the baselines: bulk, 64-byte request/response, and
// request/response at each larger latency size.
func (r *runner) tcpWorkloads() []tcpWorkload {
	ws := []tcpWorkload{{tcpperf.Bulk, BulkSize}, {tcpperf.RR, RRSmall}}
	for _, s := range r.cfg.LatSizes {
		if s > RRSmall {
			ws = append(ws, tcpWorkload{tcpperf.RR, s})
		}
	}
	return ws
}

func tcpRow(mtu int, stack string, w tcpWorkload, res tcpperf.Result) Row {
	row := Row{MTU: mtu, Stack: stack, Kind: KindBW, Test: TestTCPBulk, Size: w.size, Value: res.MBps}
	if w.mode == tcpperf.RR {
		row.Kind, row.Test, row.Value = KindLat, TestTCPRR, res.RTTMedian
	}
	return row
}

func perGB(cpu time.Duration, bytes float64) float64 {
	if bytes <= 0 {
		return 0
	}
	return cpu.Seconds() / (bytes / 1e9)
}

// kernelTCP runs one workload between `siwtun bench tcp` processes in the
// veth namespaces; the server is the bulk receiver.
func (r *runner) kernelTCP(mtu int, w tcpWorkload) {
	what := fmt.Sprintf("MTU %d kernel TCP %s %s", mtu, w.mode, FormatSize(w.size))
	r.logf("%s", what)
	addr := veth1Addr + ":" + r.nextPort()
	srv, err := r.start("bench tcp server", r.nsK1, "bench", "tcp", "--listen", addr, "--json")
	if err != nil {
		r.failed(what, err)
		return
	}
	cli, err := r.start("bench tcp client", r.nsK0, "bench", "tcp", addr, "--mode", w.mode.String(),
		"--size", fmt.Sprint(w.size), "--time", r.cfg.Duration.String(), "--json")
	if err != nil {
		srv.stop()
		r.failed(what, err)
		return
	}
	cerr := cli.wait(r.cfg.Duration + time.Minute)
	serr := srv.wait(30 * time.Second)
	if err := errors.Join(cerr, serr); err != nil {
		r.failed(what, err)
		return
	}
	var res, sres tcpperf.Result
	if err := decodeJSON(cli.stdout.String(), &res); err != nil {
		r.failed(what, fmt.Errorf("client output: %w", err))
		return
	}
	if err := decodeJSON(srv.stdout.String(), &sres); err != nil {
		r.failed(what, fmt.Errorf("server output: %w", err))
		return
	}
	row := tcpRow(mtu, StackKernel, w, res)
	if w.mode == tcpperf.Bulk {
		row.AppCPUPerGB = perGB(srv.cpu(), float64(sres.Bytes))
	}
	r.res.Rows = append(r.res.Rows, row)
}

// startDaemons starts the two daemons at mtu with CRC on or off and the
// extra flags of `siwtun up`, and waits for their sockets.
func (r *runner) startDaemons(mtu int, crc bool, extra ...string) error {
	r.logf("MTU %d: siwtun up %s and %s, CRC %s %s", mtu, dev0, dev1, onOff(crc), strings.Join(extra, " "))
	for _, d := range []struct {
		dev, addr, host string
		p               **proc
	}{{dev0, rnic0, host0, &r.d0}, {dev1, rnic1, host1, &r.d1}} {
		args := append(append([]string{"up", "--dev", d.dev}, r.daemonAddrArgs(d.dev, d.addr, d.host)...),
			"--mtu", fmt.Sprint(mtu), fmt.Sprintf("--crc=%v", crc), "--socket-dir", r.dir, "--log-level", "warn")
		if r.cfg.DaemonNice != 0 {
			args = append(args, "--nice", fmt.Sprint(r.cfg.DaemonNice))
		}
		args = append(args, r.cfg.UpFlags...)
		p, err := r.start("siwtun up "+d.dev, r.nsRNIC, append(args, extra...)...)
		if err != nil {
			return err
		}
		*d.p = p
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, e1 := os.Stat(filepath.Join(r.dir, d.dev+".sock"))
			_, e2 := os.Stat(ctl.SocketPath(r.dir, d.dev))
			if e1 == nil && e2 == nil {
				break
			}
			if p.exited() {
				return fmt.Errorf("siwtun up %s exited: %v\n%s", d.dev, p.err, p.stderr.String())
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("siwtun up %s: sockets not ready after 20 s\n%s", d.dev, p.stderr.String())
			}
			select {
			case <-r.ctx.Done():
				return r.ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func (r *runner) stopDaemons() error {
	var errs []error
	for _, d := range []*proc{r.d1, r.d0} {
		if d == nil {
			continue
		}
		d.stop()
		if d.err != nil {
			errs = append(errs, fmt.Errorf("%s exited with %v\n%s", d.name, d.err, d.stderr.String()))
		}
	}
	r.d0, r.d1 = nil, nil
	return errors.Join(errs...)
}

// gvisorTCP runs one workload between the two daemons' own stacks (ctl
// tcpperf): siwtun1 serves, siwtun0 is the client.
func (r *runner) gvisorTCP(mtu int, w tcpWorkload) {
	what := fmt.Sprintf("MTU %d raw gVisor TCP %s %s", mtu, w.mode, FormatSize(w.size))
	r.logf("%s", what)
	addr := rnic1Addr + ":" + r.nextPort()
	type result struct {
		res tcpperf.Result
		err error
	}
	srvDone := make(chan result, 1)
	before, err := procCPU(r.d1.pid())
	if err != nil {
		r.failed(what, err)
		return
	}
	go func() {
		c, err := ctl.Dial(ctl.SocketPath(r.dir, dev1))
		if err != nil {
			srvDone <- result{err: err}
			return
		}
		defer c.Close()
		var res tcpperf.Result
		err = c.TCPPerf(ctl.TCPPerfRequest{Role: ctl.TCPPerfServer, Addr: addr}, &res)
		srvDone <- result{res, err}
	}()
	c, err := ctl.Dial(ctl.SocketPath(r.dir, dev0))
	if err != nil {
		r.failed(what, err)
		<-srvDone
		return
	}
	var res tcpperf.Result
	err = c.TCPPerf(ctl.TCPPerfRequest{Role: ctl.TCPPerfClient, Addr: addr, Mode: w.mode.String(),
		Size: w.size, DurationMS: int(r.cfg.Duration.Milliseconds())}, &res)
	c.Close()
	srv := <-srvDone
	if err := errors.Join(err, srv.err); err != nil {
		r.failed(what, err)
		return
	}
	after, err := procCPU(r.d1.pid())
	if err != nil {
		r.failed(what, err)
		return
	}
	row := tcpRow(mtu, StackGVisor, w, res)
	if w.mode == tcpperf.Bulk {
		row.RNICCPUPerGB = perGB(after-before, float64(srv.res.Bytes))
	}
	r.res.Rows = append(r.res.Rows, row)
}

// AllOps are the perf suite's tests (Config.Ops).
var AllOps = []string{"write", "read", "send", "write-imm", "atomic"}

var opNames = map[string]string{"write": "RDMA WRITE", "read": "RDMA READ", "send": "SEND",
	"write-imm": TestWriteImm, "atomic": TestAtomic}

// perfCommand is the siwtun perf subcommand and flags of op.
func perfCommand(op string) []string {
	switch op {
	case "write-imm":
		return []string{"write", "--imm"}
	case "atomic":
		return []string{"atomic", "-A", "FETCH_AND_ADD"}
	}
	return []string{op}
}

// perfPair runs `siwtun perf` as server on siwtun1 and client on siwtun0
// with the same test arguments and returns both, exited.
func (r *runner) perfPair(op string, args ...string) (srv, cli *proc, err error) {
	port := r.nextPort()
	common := append(append([]string{"perf"}, perfCommand(op)...), append([]string{"--socket-dir", r.dir, "-p", port, "--json"}, args...)...)
	srv, err = r.start("siwtun perf server", r.nsRNIC, append(common, "--dev", dev1)...)
	if err != nil {
		return nil, nil, err
	}
	cli, err = r.start("siwtun perf client", r.nsRNIC, append(common, "--dev", dev0, rnic1Addr)...)
	if err != nil {
		srv.stop()
		return nil, nil, err
	}
	cerr := cli.wait(r.cfg.Duration + 2*time.Minute)
	serr := srv.wait(30 * time.Second)
	return srv, cli, errors.Join(cerr, serr)
}

// perfOutput is `siwtun perf --json`'s document.
type perfOutput struct {
	Results json.RawMessage `json:"results"`
	// CPU is the process's own CPU time while the runs went on (after
	// its start-up and connection set-up).
	CPU *perftest.CPUUsage `json:"siwtun_cpu"`
}

// appCPU is the CPU time of a perf process's runs as it reported it, or
// else its whole life's.
func appCPU(p *proc) time.Duration {
	var out perfOutput
	if err := decodeJSON(p.stdout.String(), &out); err == nil && out.CPU != nil {
		return time.Duration((out.CPU.User + out.CPU.System) * float64(time.Second))
	}
	return p.cpu()
}

func (r *runner) siwtunBW(mtu int, crc bool, op string, size int) {
	what := fmt.Sprintf("MTU %d siwtun %s bw %s CRC %s", mtu, opNames[op], FormatSize(size), onOff(crc))
	r.logf("%s", what)
	rnic := r.d1
	if op == "read" {
		rnic = r.d0 // Read Responses are placed by the client's RNIC
	}
	before, err := procCPU(rnic.pid())
	if err != nil {
		r.failed(what, err)
		return
	}
	secs := int(r.cfg.Duration / time.Second)
	srv, cli, err := r.perfPair(op, "-s", fmt.Sprint(size), "-D", fmt.Sprint(secs))
	if err != nil {
		r.failed(what, err)
		return
	}
	after, err := procCPU(rnic.pid())
	if err != nil {
		r.failed(what, err)
		return
	}
	// Write and Read: the client's row (the server prints it too); Send:
	// the receiver's own.
	src, recv := cli, srv
	if op == "send" {
		src = srv
	}
	if op == "read" {
		recv = cli
	}
	bw, err := bwFigure(src.stdout.String())
	if err != nil {
		r.failed(what, fmt.Errorf("%s output: %w", src.name, err))
		return
	}
	mbps := bw.Average * (1 << 20) / 1e6
	// A -D run moves data for its whole duration; the report's average
	// is over the middle half, which is the best estimate of the rate.
	bytes := mbps * 1e6 * float64(secs)
	r.res.Rows = append(r.res.Rows, Row{MTU: mtu, Stack: StackSiwtun, Kind: KindBW, Test: opNames[op], Size: size,
		CRC: boolp(crc), Value: mbps, AppCPUPerGB: perGB(appCPU(recv), bytes), RNICCPUPerGB: perGB(after-before, bytes)})
}

// siwtunAtomic measures RFC 7306 Fetch-and-Add between the daemons for
// the run's duration: a KindOps row of operations per second (perftest's
// MsgRate, the client's).
func (r *runner) siwtunAtomic(mtu int, crc bool) {
	what := fmt.Sprintf("MTU %d siwtun %s CRC %s", mtu, TestAtomic, onOff(crc))
	r.logf("%s", what)
	secs := int(r.cfg.Duration / time.Second)
	_, cli, err := r.perfPair("atomic", "-D", fmt.Sprint(secs))
	if err != nil {
		r.failed(what, err)
		return
	}
	bw, err := bwFigure(cli.stdout.String())
	if err != nil {
		r.failed(what, fmt.Errorf("%s output: %w", cli.name, err))
		return
	}
	r.res.Rows = append(r.res.Rows, Row{MTU: mtu, Stack: StackSiwtun, Kind: KindOps, Test: TestAtomic, Size: 8,
		CRC: boolp(crc), Value: bw.MsgRate * 1e6})
}

func (r *runner) siwtunLat(mtu int, crc bool, op string, size int) {
	what := fmt.Sprintf("MTU %d siwtun %s lat %s CRC %s", mtu, opNames[op], FormatSize(size), onOff(crc))
	r.logf("%s", what)
	row, err := r.goLat(mtu, crc, op, size)
	if err != nil {
		r.failed(what, err)
		return
	}
	r.res.Rows = append(r.res.Rows, row)
}

// goLat runs a `siwtun perf --lat` pair and returns its row (stack
// siwtun): the median and mean round trips.
func (r *runner) goLat(mtu int, crc bool, op string, size int, extra ...string) (Row, error) {
	_, cli, err := r.perfPair(op, append([]string{"--lat", "-s", fmt.Sprint(size), "-n", fmt.Sprint(r.cfg.LatIters(size))}, extra...)...)
	if err != nil {
		return Row{}, err
	}
	var out perfOutput
	if err := decodeJSON(cli.stdout.String(), &out); err != nil {
		return Row{}, fmt.Errorf("client output: %w", err)
	}
	var rows []perftest.LatResult
	if err := json.Unmarshal(out.Results, &rows); err != nil || len(rows) != 1 {
		return Row{}, fmt.Errorf("client output: want one latency row: %v\n%s", err, out.Results)
	}
	return latRow(mtu, StackSiwtun, crc, op, size, rows[0].Typical, rows[0].Avg), nil
}

// latRow is a latency row from perftest's figures, which are half the
// round trip for Write and Send ping-pongs and the whole one for Read.
func latRow(mtu int, stack string, crc bool, op string, size int, typical, avg float64) Row {
	if op != "read" {
		typical, avg = 2*typical, 2*avg
	}
	return Row{MTU: mtu, Stack: stack, Kind: KindLat, Test: opNames[op], Size: size, CRC: boolp(crc), Value: typical, Mean: avg}
}

func bwFigure(stdout string) (perftest.BWResult, error) {
	var out perfOutput
	if err := decodeJSON(stdout, &out); err != nil {
		return perftest.BWResult{}, err
	}
	var rows []perftest.BWResult
	if err := json.Unmarshal(out.Results, &rows); err != nil || len(rows) != 1 {
		return perftest.BWResult{}, fmt.Errorf("want one bandwidth row: %v\n%s", err, out.Results)
	}
	return rows[0], nil
}

// decodeJSON decodes the JSON document in a process's output (anything
// before its first '{' is skipped).
func decodeJSON(s string, v any) error {
	i := strings.IndexByte(s, '{')
	if i < 0 {
		return fmt.Errorf("no JSON document in %q", s)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s[i:])))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w in %q", err, s)
	}
	return nil
}

// sortRows orders the rows by MTU, then kernel, gVisor, siwtun, then
// bandwidth before latency, the operation, the size and CRC on before off;
// the comparison of perftest through libsiwtun after siwtun's, each of
// its figures next to siwtun perf's; kernel TCP's tools after tcpperf.
func (r *runner) sortRows() {
	stack := map[string]int{StackKernel: 0, StackGVisor: 1, StackSiwtun: 2, StackPerfPair: 3, StackPerfSpin: 3, StackCLib: 3,
		StackRouted: 4, StackShared: 5}
	tool := map[string]int{ToolIperf3: 1, ToolQperf: 2}
	pair := map[string]int{StackPerfSpin: 1, StackCLib: 2}
	kind := map[string]int{KindBW: 0, KindOps: 1, KindLat: 2}
	test := map[string]int{TestTCPBulk: 0, TestTCPRR: 1, "RDMA WRITE": 2, TestWriteImm: 3, "RDMA READ": 4, "SEND": 5, TestAtomic: 6}
	crc := func(b *bool) int {
		if b == nil || *b {
			return 0
		}
		return 1
	}
	// The set-up, scale and memory rows follow the MTU's main table:
	// connect times, rates, bandwidth, memory; kernel first; by clients
	// and queue pairs.
	group := func(x Row) int {
		if x.QPs == 0 {
			return 0
		}
		return 1 + map[string]int{KindConnect: 0, KindRate: 1, KindBW: 2, KindMem: 3}[x.Kind]
	}
	slices.SortStableFunc(r.res.Rows, func(a, b Row) int {
		for _, d := range []int{a.MTU - b.MTU, group(a) - group(b), stack[a.Stack] - stack[b.Stack], kind[a.Kind] - kind[b.Kind],
			test[a.Test] - test[b.Test], a.Clients - b.Clients, a.QPs - b.QPs, a.Size - b.Size, crc(a.CRC) - crc(b.CRC),
			pair[a.Stack] - pair[b.Stack], tool[a.Tool] - tool[b.Tool]} {
			if d != 0 {
				return d
			}
		}
		return 0
	})
}
