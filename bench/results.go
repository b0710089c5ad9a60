package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Stacks a Row measures.
const (
	// StackKernel is the kernel's TCP over a veth pair.
	StackKernel = "kernel"
	// StackGVisor is raw TCP between the two daemons' own netstacks,
	// through their TUN devices.
	StackGVisor = "gvisor"
	// StackSiwtun is the RNIC: perftest's tests between applications on
	// the two daemons' verbs sockets.
	StackSiwtun = "siwtun"
	// StackCLib is Debian's perftest (C, linked with rdma-core) through
	// libsiwtun on the same two daemons (`siwtun exec`, SuiteCLib).
	StackCLib = "clib"
	// StackPerfPair is siwtun perf run right next to each StackCLib
	// figure with the same arguments: its side of the comparison. Its
	// latency test waits for the peer's Write as siwtun perf does by
	// default, yielding the processor after a short spin.
	StackPerfPair = "siwtun-pair"
	// StackPerfSpin is the StackPerfPair latency run with --spin: waiting
	// for the peer's Write in a pure busy loop, as ib_write_lat does.
	StackPerfSpin = "siwtun-spin"
)

// Kinds of Row.
const (
	// KindBW is a bandwidth figure in MB/s (10^6 bytes per second).
	KindBW = "bw"
	// KindLat is a round-trip time in microseconds (the median).
	KindLat = "lat"
	// KindConnect is a connect time in microseconds (the median): from
	// the call until the connection is established.
	KindConnect = "connect"
	// KindRate is connections per second.
	KindRate = "rate"
	// KindOps is operations per second (the atomics' message rate).
	KindOps = "ops"
	// KindMem is a daemon's memory per idle connected queue pair, in KiB
	// (its resident set with the connections less without, over their
	// number).
	KindMem = "mem"
)

// Tests of the RFC 7306 rows: RDMA Write with Immediate Data (bandwidth
// and latency, as RDMA WRITE's) and Fetch-and-Add (KindOps).
const (
	TestWriteImm = "RDMA WRITE IMM"
	TestAtomic   = "ATOMIC FETCH_ADD"
)

// Tests of the set-up, scale and memory rows.
const (
	// TestConnect names connect time and rate rows.
	TestConnect = "connect"
	// TestIdleInitiator and TestIdleResponder name the memory rows of the
	// daemon whose queue pairs connected and of the one that accepted.
	TestIdleInitiator = "idle QPs, initiator"
	TestIdleResponder = "idle QPs, responder"
)

// Row is one measurement.
type Row struct {
	MTU   int    `json:"mtu"`
	Stack string `json:"stack"`
	// Tool is the program that measured a kernel TCP row other than
	// apps/tcpperf: ToolIperf3 or ToolQperf (empty: tcpperf).
	Tool string `json:"tool,omitempty"`
	Kind string `json:"kind"`
	// Test names the operation: "TCP bulk", "TCP rr", "RDMA WRITE",
	// "RDMA READ", "SEND".
	Test string `json:"test"`
	// Size is the message size in bytes.
	Size int `json:"size"`
	// CRC is whether MPA CRC was on (siwtun rows only).
	CRC *bool `json:"crc,omitempty"`
	// Value is MB/s (KindBW) or the median round trip in µs (KindLat).
	Value float64 `json:"value"`
	// Mean is the mean round trip in µs (perftest's t_avg; latency rows
	// of the RDMA stacks).
	Mean float64 `json:"mean,omitempty"`
	// VsGVisor and VsKernel are Value divided by the same kind of figure
	// of raw gVisor TCP and of kernel TCP at the same MTU (0: no such
	// baseline); kernel TCP's is the best its tools measured (Anchors).
	// Above 1 is better for bandwidth, worse for latency.
	VsGVisor float64 `json:"vs_gvisor,omitempty"`
	VsKernel float64 `json:"vs_kernel,omitempty"`
	// AppCPUPerGB is the receiving application process's user+system CPU
	// seconds (its own rusage) per 10^9 bytes it received (bandwidth rows
	// whose receiver is an application: kernel TCP's socket receiver, over
	// its whole life, and siwtun's perftest receiver, over its runs as it
	// reports them in "siwtun_cpu", without its start-up).
	AppCPUPerGB float64 `json:"app_cpu_s_per_gb,omitempty"`
	// RNICCPUPerGB is the receiving daemon's CPU seconds per 10^9 bytes
	// (/proc/<pid>/stat), for rows whose receiver is a siwtun daemon.
	RNICCPUPerGB float64 `json:"rnic_cpu_s_per_gb,omitempty"`
	// Samples are the Values of each round, in the order measured, when
	// the run had more than one round; Value is their median.
	Samples []float64 `json:"samples,omitempty"`

	// QPs is, for the set-up, scale and memory rows, the connections
	// (queue pairs, or kernel TCP sockets) the figure was taken with: the
	// connections a connect run opened, the queue pairs of a bandwidth
	// run, the idle queue pairs of a memory row. 0 for the other rows.
	QPs int `json:"qps,omitempty"`
	// Clients is how many client processes opened the connections of a
	// set-up row at once.
	Clients int `json:"clients,omitempty"`
	// VsOneQP is a scale row's Value over that of one queue pair.
	VsOneQP float64 `json:"vs_1qp,omitempty"`
	// RSSBaseKiB and RSSKiB are a memory row's daemon resident set (VmRSS)
	// before the connections and with them idle.
	RSSBaseKiB float64 `json:"rss_base_kib,omitempty"`
	RSSKiB     float64 `json:"rss_kib,omitempty"`
}

// Target is one of the performance targets, judged on the figures.
type Target struct {
	Name   string  `json:"name"`
	MTU    int     `json:"mtu"`
	Figure float64 `json:"figure"`
	// Limit is the bound; Max says whether Figure must stay at or below
	// it (otherwise at or above).
	Limit float64 `json:"limit"`
	Max   bool    `json:"max"`
	Unit  string  `json:"unit"`
	Pass  bool    `json:"pass"`
	// Missing says why the figure could not be computed (then Pass is
	// false).
	Missing string `json:"missing,omitempty"`
	// Skipped says why the measurement was not run at all (then Pass is
	// false): what is not installed.
	Skipped string `json:"skipped,omitempty"`
}

// Results is one run of the benchmark.
type Results struct {
	Started time.Time `json:"started"`
	// ElapsedS is the whole run's wall-clock time in seconds.
	ElapsedS float64 `json:"elapsed_s"`
	// CPUs is the number of CPUs of the machine.
	CPUs int `json:"cpus"`
	// DurationS is each bandwidth and request/response run's length.
	DurationS float64 `json:"duration_s"`
	// Rounds is how many times every measurement was taken, the rounds
	// one after the other, so that a noisy moment hits one sample of
	// every figure rather than every sample of one.
	Rounds int `json:"rounds,omitempty"`
	// Suites are the suites measured (SuitePerf, ...); absent: all.
	Suites []string `json:"suites,omitempty"`
	// DaemonNice is the daemons' `siwtun up --nice` (0: as started).
	DaemonNice int `json:"daemon_nice,omitempty"`
	// UpFlags are the daemons' extra `siwtun up` flags (Config.UpFlags).
	UpFlags []string `json:"up_flags,omitempty"`
	Rows    []Row    `json:"rows"`
	Targets []Target `json:"targets"`
	// CLib is set when the run was to compare Debian's perftest through
	// libsiwtun with siwtun perf (SuiteCLib).
	CLib *CLibInfo `json:"clib,omitempty"`
	// Anchors are the kernel TCP figures the VsKernel ratios divide by:
	// of each kind, the best that tcpperf, iperf3 and qperf measured.
	Anchors []Anchor `json:"anchors,omitempty"`
	// KernelSkipped says which kernel TCP tools did not run, and why.
	KernelSkipped []string `json:"kernel_skipped,omitempty"`
	// Profiles lists CPU profiles taken of the daemons, if any.
	Profiles []string `json:"profiles,omitempty"`
	// Note is what a reader of the figures must know about how this
	// document was made, when it was not written by the run itself.
	Note string `json:"note,omitempty"`
}

// Anchor is the kernel TCP figure of one kind the ratios divide by.
type Anchor struct {
	MTU  int    `json:"mtu"`
	Kind string `json:"kind"`
	Size int    `json:"size"`
	// Tool is the tool that measured it ("tcpperf", ToolIperf3,
	// ToolQperf).
	Tool  string  `json:"tool"`
	Value float64 `json:"value"`
}

// CLibInfo is the comparison of perftest through libsiwtun in a run.
type CLibInfo struct {
	// Skipped says why it did not run (perftest or libsiwtun missing).
	Skipped string `json:"skipped,omitempty"`
}

// find returns the row that matches, or nil.
func (r *Results) find(mtu int, stack, kind, test string, size int, crc *bool) *Row {
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.MTU == mtu && x.Stack == stack && x.Tool == "" && x.Kind == kind && x.Test == test && x.Size == size && x.QPs == 0 &&
			(crc == nil || (x.CRC != nil && *x.CRC == *crc)) {
			return x
		}
	}
	return nil
}

// baseline is the kernel or gVisor row a row compares with: the bulk
// figure for bandwidth (any size), the request/response of the same size
// for latency, or of 64 bytes for smaller messages. Of kernel TCP's rows,
// measured by several tools, the best: the highest bandwidth, the
// shortest round trip.
func (r *Results) baseline(row Row, stack string) *Row {
	if row.Kind != KindBW && row.Kind != KindLat {
		return nil // nothing of TCP's compares
	}
	size := max(row.Size, RRSmall)
	var best *Row
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.MTU != row.MTU || x.Stack != stack || x.Kind != row.Kind || x.QPs != 0 || x.Value <= 0 ||
			(row.Kind == KindLat && (x.Test != TestTCPRR || x.Size != size)) || (row.Kind == KindBW && x.Test != TestTCPBulk) {
			continue
		}
		if best == nil || (row.Kind == KindBW && x.Value > best.Value) || (row.Kind == KindLat && x.Value < best.Value) {
			best = x
		}
	}
	return best
}

// anchors lists, per MTU, the kernel TCP figure each kind of ratio
// divides by.
func (r *Results) anchors() []Anchor {
	var out []Anchor
	for _, row := range r.Rows {
		if row.Stack != StackKernel || row.QPs != 0 || (row.Kind != KindBW && row.Kind != KindLat) {
			continue
		}
		b := r.baseline(row, StackKernel)
		if b == nil || slices.ContainsFunc(out, func(a Anchor) bool { return a.MTU == b.MTU && a.Kind == b.Kind && a.Size == b.Size }) {
			continue
		}
		out = append(out, Anchor{MTU: b.MTU, Kind: b.Kind, Size: b.Size, Tool: toolName(b.Tool), Value: b.Value})
	}
	return out
}

// toolName names the tool of a kernel TCP row.
func toolName(tool string) string {
	if tool == "" {
		return "tcpperf"
	}
	return tool
}

// Tests and sizes of the baselines.
const (
	// TestTCPBulk and TestTCPRR are the TCP workloads' names.
	TestTCPBulk = "TCP bulk"
	TestTCPRR   = "TCP rr"
	// RRSmall is the small request/response size (64 bytes, the size
	// the latency targets compare with).
	RRSmall = 64
)

// Analyze fills the ratios and judges the targets.
func (r *Results) Analyze() {
	for i := range r.Rows {
		row := &r.Rows[i]
		row.VsGVisor, row.VsKernel = 0, 0
		if row.QPs > 0 {
			r.analyzeScale(row)
			continue
		}
		if row.Stack != StackGVisor && row.Stack != StackKernel {
			if b := r.baseline(*row, StackGVisor); b != nil && b.Value > 0 {
				row.VsGVisor = row.Value / b.Value
			}
		}
		if row.Stack != StackKernel {
			if b := r.baseline(*row, StackKernel); b != nil && b.Value > 0 {
				row.VsKernel = row.Value / b.Value
			}
		}
	}
	r.Anchors = r.anchors()
	r.Targets = r.targets()
}

func boolp(b bool) *bool { return &b }

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func (r *Results) mtus() []int {
	var out []int
	for _, row := range r.Rows {
		found := false
		for _, m := range out {
			found = found || m == row.MTU
		}
		if !found {
			out = append(out, row.MTU)
		}
	}
	return out
}

// targets judges the performance targets at each MTU measured: the main
// table's four (the raw gVisor bandwidth target at MTU 9000 only), then
// those of set-up, scale and memory (scaleTargets).
func (r *Results) targets() []Target {
	var ts []Target
	on, off := boolp(true), boolp(false)
	for _, mtu := range r.mtus() {
		if !r.ran(SuitePerf) {
			break
		}
		if mtu == 9000 {
			t := Target{Name: "RDMA WRITE 1 MiB (CRC on) / raw gVisor TCP bulk", MTU: mtu, Limit: 1.0, Unit: "x"}
			if w := r.find(mtu, StackSiwtun, KindBW, "RDMA WRITE", 1<<20, on); w != nil && w.VsGVisor > 0 {
				t.Figure = w.VsGVisor
			} else {
				t.Missing = "RDMA WRITE 1 MiB with CRC or raw gVisor bulk not measured"
			}
			ts = append(ts, t)
		}
		t := Target{Name: "RDMA WRITE 4 B round trip (CRC on) / raw gVisor 64 B rr", MTU: mtu, Limit: 1.1, Max: true, Unit: "x"}
		if w := r.find(mtu, StackSiwtun, KindLat, "RDMA WRITE", 4, on); w != nil && w.VsGVisor > 0 {
			t.Figure = w.VsGVisor
		} else {
			t.Missing = "4 B RDMA WRITE latency with CRC or raw gVisor 64 B rr not measured"
		}
		ts = append(ts, t)

		// Against the host's own TCP over a veth pair: an RDMA WRITE
		// stream through the emulated RNIC reaches at least half the
		// kernel's TCP bulk rate, its round trip at most twice kernel TCP's.
		t = Target{Name: "RDMA WRITE 1 MiB (CRC on) / kernel TCP bulk", MTU: mtu, Limit: 0.5, Unit: "x"}
		if w := r.find(mtu, StackSiwtun, KindBW, "RDMA WRITE", 1<<20, on); w != nil && w.VsKernel > 0 {
			t.Figure = w.VsKernel
		} else {
			t.Missing = "RDMA WRITE 1 MiB with CRC or kernel TCP bulk not measured"
		}
		ts = append(ts, t)
		t = Target{Name: "RDMA WRITE 4 B round trip (CRC on) / kernel TCP 64 B rr", MTU: mtu, Limit: 2.0, Max: true, Unit: "x"}
		if w := r.find(mtu, StackSiwtun, KindLat, "RDMA WRITE", 4, on); w != nil && w.VsKernel > 0 {
			t.Figure = w.VsKernel
		} else {
			t.Missing = "4 B RDMA WRITE latency with CRC or kernel TCP 64 B rr not measured"
		}
		ts = append(ts, t)

		t = Target{Name: "receiving app CPU/GB: RDMA WRITE 1 MiB app / kernel TCP socket receiver", MTU: mtu, Limit: 0.05, Max: true, Unit: "x"}
		w := r.find(mtu, StackSiwtun, KindBW, "RDMA WRITE", 1<<20, on)
		k := r.find(mtu, StackKernel, KindBW, TestTCPBulk, BulkSize, nil)
		if w != nil && k != nil && w.AppCPUPerGB > 0 && k.AppCPUPerGB > 0 {
			t.Figure = w.AppCPUPerGB / k.AppCPUPerGB
		} else {
			t.Missing = "receiver CPU of RDMA WRITE 1 MiB or of the kernel TCP receiver not measured"
		}
		ts = append(ts, t)

		t = Target{Name: "CRC cost: 1 - RDMA WRITE 1 MiB CRC on / CRC off", MTU: mtu, Limit: 0.05, Max: true, Unit: "x"}
		won := r.find(mtu, StackSiwtun, KindBW, "RDMA WRITE", 1<<20, on)
		woff := r.find(mtu, StackSiwtun, KindBW, "RDMA WRITE", 1<<20, off)
		if won != nil && woff != nil && woff.Value > 0 {
			t.Figure = 1 - won.Value/woff.Value
		} else {
			t.Missing = "RDMA WRITE 1 MiB not measured with CRC on and off"
		}
		ts = append(ts, t)
	}
	ts = append(ts, r.clibTargets()...)
	ts = append(ts, r.scaleTargets()...)
	ts = append(ts, r.sharedTargets()...)
	for i := range ts {
		t := &ts[i]
		if t.Missing != "" || t.Skipped != "" {
			continue
		}
		if t.Max {
			t.Pass = t.Figure <= t.Limit
		} else {
			t.Pass = t.Figure >= t.Limit
		}
	}
	return ts
}

// clibTargets judges the targets for perftest through libsiwtun at
// each MTU: its 2 B RDMA WRITE round trip (median, as every latency row
// here, and mean) at most 1.2 times siwtun perf's, its 64 KiB RDMA WRITE
// bandwidth at least 0.9 times; each figure the ratio of the medians of
// the rounds, which ran them side by side. The round trip is judged
// twice: against siwtun perf waiting as ib_write_lat waits (--spin, a
// pure busy loop: the same program behaviour, so the ratio is what the
// library costs against the Go client), and against siwtun perf's own
// wait, which yields the processor.
func (r *Results) clibTargets() []Target {
	if r.CLib == nil || !r.ran(SuiteCLib) {
		return nil
	}
	var ts []Target
	on := boolp(true)
	for _, mtu := range r.mtus() {
		var lats []Target
		for _, pair := range []struct{ stack, name string }{{StackPerfSpin, "siwtun perf --spin"}, {StackPerfPair, "siwtun perf"}} {
			lat := fmt.Sprintf("ib_write_lat %s %%s RTT via libsiwtun / %s", FormatSize(CLibLatSize), pair.name)
			med := Target{Name: fmt.Sprintf(lat, "median"), MTU: mtu, Limit: 1.2, Max: true, Unit: "x"}
			mean := Target{Name: fmt.Sprintf(lat, "mean"), MTU: mtu, Limit: 1.2, Max: true, Unit: "x"}
			c, g := r.find(mtu, StackCLib, KindLat, "RDMA WRITE", CLibLatSize, on), r.find(mtu, pair.stack, KindLat, "RDMA WRITE", CLibLatSize, on)
			switch {
			case r.CLib.Skipped != "":
				med.Skipped, mean.Skipped = r.CLib.Skipped, r.CLib.Skipped
			case c != nil && g != nil && g.Value > 0 && g.Mean > 0:
				med.Figure, mean.Figure = c.Value/g.Value, c.Mean/g.Mean
			default:
				med.Missing = "ib_write_lat or the " + pair.name + " run next to it not measured"
				mean.Missing = med.Missing
			}
			lats = append(lats, med, mean)
		}
		bw := Target{Name: fmt.Sprintf("ib_write_bw %s via libsiwtun / siwtun perf", FormatSize(CLibBWSize)), MTU: mtu, Limit: 0.9, Unit: "x"}
		c, g := r.find(mtu, StackCLib, KindBW, "RDMA WRITE", CLibBWSize, on), r.find(mtu, StackPerfPair, KindBW, "RDMA WRITE", CLibBWSize, on)
		switch {
		case r.CLib.Skipped != "":
			bw.Skipped = r.CLib.Skipped
		case c != nil && g != nil && g.Value > 0:
			bw.Figure = c.Value / g.Value
		default:
			bw.Missing = "ib_write_bw or the siwtun perf run next to it not measured"
		}
		ts = append(append(ts, lats...), bw)
	}
	return ts
}

// BulkSize is the write size of the TCP bulk runs.
const BulkSize = 64 << 10

// FormatSize prints a byte count as 4 B, 64 B, 64 KiB, 1 MiB.
func FormatSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func stackName(s, tool string) string {
	switch s {
	case StackKernel:
		if tool != "" {
			return "kernel TCP (" + tool + ")"
		}
		return "kernel TCP"
	case StackGVisor:
		return "raw gVisor TCP"
	case StackCLib:
		return "perftest (C)"
	case StackPerfPair:
		return "siwtun (paired)"
	case StackPerfSpin:
		return "siwtun (--spin)"
	case StackRouted:
		return "siwtun (routed)"
	case StackShared:
		return "siwtun (shared)"
	}
	return "siwtun"
}

func ratio(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v)
}

func cpu(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}

// WriteTable prints the results as one table: every row with its
// absolute figure and ratios, then the targets.
func (r *Results) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if slices.ContainsFunc(r.Rows, func(x Row) bool { return x.QPs == 0 }) {
		fmt.Fprintln(tw, "MTU\tSTACK\tTEST\tSIZE\tCRC\tVALUE\tMEAN\tUNIT\tVS GVISOR\tVS KERNEL\tAPP CPU s/GB\tRNIC CPU s/GB")
	}
	for _, row := range r.Rows {
		if row.QPs > 0 {
			continue // writeScaleTable
		}
		crc := "-"
		if row.CRC != nil {
			crc = onOff(*row.CRC)
		}
		unit, val := "MB/s", fmt.Sprintf("%.1f", row.Value)
		if row.Kind == KindLat {
			unit, val = "us RTT", fmt.Sprintf("%.1f", row.Value)
		}
		if row.Kind == KindOps {
			unit, val = "ops/s", fmt.Sprintf("%.0f", row.Value)
		}
		test := row.Test
		if row.Stack != StackKernel && row.Stack != StackGVisor {
			test += map[string]string{KindBW: " bw", KindLat: " lat", KindOps: " rate"}[row.Kind]
		}
		mean := "-"
		if row.Mean > 0 {
			mean = fmt.Sprintf("%.1f", row.Mean)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.MTU, stackName(row.Stack, row.Tool), test,
			FormatSize(row.Size), crc, val, mean, unit, ratio(row.VsGVisor), ratio(row.VsKernel),
			cpu(row.AppCPUPerGB), cpu(row.RNICCPUPerGB))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	r.writeAnchors(w)
	if err := r.writeScaleTable(w); err != nil {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(r.Targets) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(tw, "TARGET\tMTU\tFIGURE\tLIMIT\tRESULT")
	}
	for _, t := range r.Targets {
		op := ">="
		if t.Max {
			op = "<="
		}
		fig, res := fmt.Sprintf("%.3f", t.Figure), "MISS"
		if t.Pass {
			res = "PASS"
		}
		if t.Missing != "" {
			fig, res = "-", "MISS ("+t.Missing+")"
		}
		if t.Skipped != "" {
			fig, res = "-", "SKIPPED ("+t.Skipped+")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s %.2f\t%s\n", t.Name, t.MTU, fig, op, t.Limit, res)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.CLib != nil && r.CLib.Skipped != "" {
		fmt.Fprintf(w, "\nperftest through libsiwtun: skipped: %s\n", r.CLib.Skipped)
	}
	for _, s := range r.KernelSkipped {
		fmt.Fprintf(w, "\nkernel TCP with %s\n", s)
	}
	if len(r.Profiles) > 0 {
		fmt.Fprintf(w, "\nCPU profiles: %s\n", strings.Join(r.Profiles, ", "))
	}
	rounds := ""
	if r.Rounds > 1 {
		rounds = fmt.Sprintf(", medians of %d rounds", r.Rounds)
	}
	if r.DaemonNice != 0 {
		rounds += fmt.Sprintf(", daemons at nice %d", r.DaemonNice)
	}
	if len(r.UpFlags) > 0 {
		rounds += ", daemons with " + strings.Join(r.UpFlags, " ")
	}
	_, err := fmt.Fprintf(w, "\n%d CPUs, %.0f s per run%s; total elapsed %s\n", r.CPUs, r.DurationS, rounds,
		time.Duration(r.ElapsedS*float64(time.Second)).Round(time.Second))
	return err
}

// writeAnchors says, under the main table, which kernel TCP figure each
// VS KERNEL ratio divides by, when more than one tool measured kernel
// TCP.
func (r *Results) writeAnchors(w io.Writer) {
	if !slices.ContainsFunc(r.Rows, func(x Row) bool { return x.Stack == StackKernel && x.Tool != "" }) {
		return
	}
	fmt.Fprintln(w, "\nVS KERNEL divides by the best kernel TCP figure of its kind:")
	for _, a := range r.Anchors {
		what, val := "bulk", fmt.Sprintf("%.1f MB/s", a.Value)
		if a.Kind == KindLat {
			what, val = "rr "+FormatSize(a.Size), fmt.Sprintf("%.1f us", a.Value)
		}
		fmt.Fprintf(w, "  %d  %-10s %12s  %s\n", a.MTU, what, val, a.Tool)
	}
}

// WriteJSON writes the results as one indented JSON document.
func (r *Results) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// MergeRounds replaces the rows of several rounds (the same measurements
// taken again, rows of one key in round order) by one row per key: Value
// and the CPU figures are the medians of the rounds' (of those measured),
// Samples the rounds' Values. Rows keep the order of their first round.
func (r *Results) MergeRounds() {
	type key struct {
		mtu                     int
		stack, tool, kind, test string
		size                    int
		crc                     string
		qps, clients            int
	}
	keyOf := func(row *Row) key {
		k := key{row.MTU, row.Stack, row.Tool, row.Kind, row.Test, row.Size, "-", row.QPs, row.Clients}
		if row.CRC != nil {
			k.crc = fmt.Sprint(*row.CRC)
		}
		return k
	}
	groups := map[key][]Row{}
	var order []key
	for _, row := range r.Rows {
		k := keyOf(&row)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], row)
	}
	merged := make([]Row, 0, len(order))
	for _, k := range order {
		g := groups[k]
		row := g[0]
		if len(g) > 1 {
			var vals, means, app, rnic, rss, base []float64
			for _, x := range g {
				vals = append(vals, x.Value)
				if x.Mean > 0 {
					means = append(means, x.Mean)
				}
				rss, base = append(rss, x.RSSKiB), append(base, x.RSSBaseKiB)
				if x.AppCPUPerGB > 0 {
					app = append(app, x.AppCPUPerGB)
				}
				if x.RNICCPUPerGB > 0 {
					rnic = append(rnic, x.RNICCPUPerGB)
				}
			}
			row.Samples = vals
			row.Value, row.Mean, row.AppCPUPerGB, row.RNICCPUPerGB = median(vals), median(means), median(app), median(rnic)
			row.RSSKiB, row.RSSBaseKiB = median(rss), median(base)
		}
		merged = append(merged, row)
	}
	r.Rows = merged
}

// median is the middle value of v (the mean of the middle two for an even
// count), 0 for none. v is not changed.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
