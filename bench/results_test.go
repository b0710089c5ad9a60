package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
)

// fixture is a small run at one MTU with made-up figures: every kind of
// row, and targets that pass and miss.
func fixture() *Results {
	on, off := boolp(true), boolp(false)
	return &Results{
		Started: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC), ElapsedS: 301.4, CPUs: 2, DurationS: 3,
		Rows: []Row{
			{MTU: 9000, Stack: StackKernel, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 3000, AppCPUPerGB: 0.25},
			{MTU: 9000, Stack: StackKernel, Kind: KindLat, Test: TestTCPRR, Size: 64, Value: 20},
			{MTU: 9000, Stack: StackKernel, Kind: KindLat, Test: TestTCPRR, Size: 65536, Value: 60},
			{MTU: 9000, Stack: StackGVisor, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 600, RNICCPUPerGB: 1.2},
			{MTU: 9000, Stack: StackGVisor, Kind: KindLat, Test: TestTCPRR, Size: 64, Value: 80},
			{MTU: 9000, Stack: StackGVisor, Kind: KindLat, Test: TestTCPRR, Size: 65536, Value: 300},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: on, Value: 660, AppCPUPerGB: 0.01, RNICCPUPerGB: 1.5},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: off, Value: 700, AppCPUPerGB: 0.01, RNICCPUPerGB: 1.4},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindLat, Test: "RDMA WRITE", Size: 4, CRC: on, Value: 120, Mean: 130},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindLat, Test: "RDMA READ", Size: 65536, CRC: on, Value: 450, Mean: 470},
			// RFC 7306: Write with Immediate Data, and Fetch-and-Add in operations per second.
			{MTU: 9000, Stack: StackSiwtun, Kind: KindBW, Test: TestWriteImm, Size: 1 << 20, CRC: on, Value: 640, AppCPUPerGB: 0.02, RNICCPUPerGB: 1.6},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindLat, Test: TestWriteImm, Size: 4, CRC: on, Value: 125, Mean: 135},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindOps, Test: TestAtomic, Size: 8, CRC: on, Value: 38090},
			// Set-up, scale and memory.
			{MTU: 9000, Stack: StackKernel, Kind: KindConnect, Test: TestConnect, QPs: 1000, Clients: 1, Value: 40},
			{MTU: 9000, Stack: StackKernel, Kind: KindRate, Test: TestConnect, QPs: 1000, Clients: 1, Value: 20000},
			{MTU: 9000, Stack: StackKernel, Kind: KindRate, Test: TestConnect, QPs: 1000, Clients: 4, Value: 40000},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindConnect, Test: TestConnect, QPs: 1000, Clients: 1, Value: 1000},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindRate, Test: TestConnect, QPs: 1000, Clients: 1, Value: 800},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindRate, Test: TestConnect, QPs: 1000, Clients: 4, Value: 400},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: on, QPs: 1, Value: 600},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: on, QPs: 64, Value: 570},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindMem, Test: TestIdleInitiator, QPs: 1000, Value: 35, RSSBaseKiB: 15000, RSSKiB: 50000},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindMem, Test: TestIdleResponder, QPs: 1000, Value: 36, RSSBaseKiB: 15000, RSSKiB: 51000},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindMem, Test: TestIdleInitiator, QPs: 10000, Value: 31, RSSBaseKiB: 15000, RSSKiB: 325000},
			{MTU: 9000, Stack: StackSiwtun, Kind: KindMem, Test: TestIdleResponder, QPs: 10000, Value: 30, RSSBaseKiB: 15000, RSSKiB: 315000},
			// Perftest through libsiwtun next to siwtun perf.
			{MTU: 9000, Stack: StackPerfPair, Kind: KindBW, Test: "RDMA WRITE", Size: CLibBWSize, CRC: on, Value: 400},
			{MTU: 9000, Stack: StackCLib, Kind: KindBW, Test: "RDMA WRITE", Size: CLibBWSize, CRC: on, Value: 380},
			{MTU: 9000, Stack: StackPerfPair, Kind: KindLat, Test: "RDMA WRITE", Size: CLibLatSize, CRC: on, Value: 100, Mean: 110},
			{MTU: 9000, Stack: StackCLib, Kind: KindLat, Test: "RDMA WRITE", Size: CLibLatSize, CRC: on, Value: 110, Mean: 330},
			{MTU: 9000, Stack: StackPerfSpin, Kind: KindLat, Test: "RDMA WRITE", Size: CLibLatSize, CRC: on, Value: 100, Mean: 300},
			// Shared-address mode next to routed mode.
			{MTU: 9000, Stack: StackRouted, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: on, Value: 650},
			{MTU: 9000, Stack: StackShared, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: on, Value: 630},
			{MTU: 9000, Stack: StackRouted, Kind: KindLat, Test: "RDMA WRITE", Size: 4, CRC: on, Value: 120, Mean: 125},
			{MTU: 9000, Stack: StackShared, Kind: KindLat, Test: "RDMA WRITE", Size: 4, CRC: on, Value: 130, Mean: 135},
			{MTU: 9000, Stack: StackRouted, Kind: KindConnect, Test: TestConnect, QPs: 1000, Clients: 1, Value: 1000},
			{MTU: 9000, Stack: StackRouted, Kind: KindRate, Test: TestConnect, QPs: 1000, Clients: 1, Value: 800},
			{MTU: 9000, Stack: StackShared, Kind: KindConnect, Test: TestConnect, QPs: 1000, Clients: 1, Value: 1050},
			{MTU: 9000, Stack: StackShared, Kind: KindRate, Test: TestConnect, QPs: 1000, Clients: 1, Value: 760},
			// Kernel TCP by iperf3 and qperf beside tcpperf: the anchors
			// are iperf3's bulk, tcpperf's 64 B rr and qperf's 64 KiB rr.
			{MTU: 9000, Stack: StackKernel, Tool: ToolIperf3, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 3300, AppCPUPerGB: 0.2},
			{MTU: 9000, Stack: StackKernel, Tool: ToolQperf, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 2800},
			{MTU: 9000, Stack: StackKernel, Tool: ToolQperf, Kind: KindLat, Test: TestTCPRR, Size: 64, Value: 24},
			{MTU: 9000, Stack: StackKernel, Tool: ToolQperf, Kind: KindLat, Test: TestTCPRR, Size: 65536, Value: 50},
		},
		CLib: &CLibInfo{},
	}
}

func TestTableGolden(t *testing.T) {
	r := fixture()
	r.Analyze()
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, filepath.Join("testdata", "table.golden"), b.Bytes())
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, filepath.Join("testdata", "results.json.golden"), b.Bytes())
	var back Results
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Rows) != len(r.Rows) || len(back.Targets) != 19 {
		t.Fatalf("JSON round trip: %d rows, %d targets", len(back.Rows), len(back.Targets))
	}
}

func TestAnalyze(t *testing.T) {
	r := fixture()
	r.Analyze()
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	// Kernel TCP's best: iperf3's bulk (3300 MB/s), tcpperf's 64 B rr (20
	// µs), qperf's 64 KiB rr (50 µs).
	w := r.Rows[6]
	if !near(w.VsGVisor, 1.1) || !near(w.VsKernel, 0.2) {
		t.Errorf("RDMA WRITE bw ratios %v %v, want 1.1 0.2 (of iperf3's bulk)", w.VsGVisor, w.VsKernel)
	}
	if l := r.Rows[8]; !near(l.VsGVisor, 1.5) || !near(l.VsKernel, 6) {
		t.Errorf("4 B latency against the 64 B rr: %v %v, want 1.5 6 (of tcpperf's)", l.VsGVisor, l.VsKernel)
	}
	if l := r.Rows[9]; !near(l.VsGVisor, 1.5) || !near(l.VsKernel, 9) {
		t.Errorf("64 KiB latency against the 64 KiB rr: %v %v, want 1.5 9 (of qperf's)", l.VsGVisor, l.VsKernel)
	}
	if g := r.Rows[3]; g.VsGVisor != 0 || !near(g.VsKernel, 600.0/3300) {
		t.Errorf("gVisor bulk ratios %v %v", g.VsGVisor, g.VsKernel)
	}
	wantAnchors := []Anchor{{9000, KindBW, BulkSize, ToolIperf3, 3300}, {9000, KindLat, 64, "tcpperf", 20}, {9000, KindLat, 65536, ToolQperf, 50}}
	if !reflect.DeepEqual(r.Anchors, wantAnchors) {
		t.Errorf("anchors %+v, want %+v", r.Anchors, wantAnchors)
	}
	for _, k := range r.Rows[len(r.Rows)-4:] {
		if k.VsKernel != 0 || k.VsGVisor != 0 {
			t.Errorf("kernel TCP row with a ratio: %+v", k)
		}
	}
	want := []struct {
		fig  float64
		pass bool
	}{{1.1, true}, {1.5, false}, {0.2, false}, {6, false}, {0.04, true}, {1 - 660.0/700, false},
		{1.1, true}, {1.1, true}, {1.1, true}, {3, false}, {0.95, true},
		{1.0, true}, {800, true}, {400, false}, {0.95, true}, {31, true},
		{630.0 / 650, true}, {130.0 / 120, false}, {0.95, true}}
	if len(r.Targets) != len(want) {
		t.Fatalf("%d targets, want %d: %+v", len(r.Targets), len(want), r.Targets)
	}
	for i, tg := range r.Targets {
		if !near(tg.Figure, want[i].fig) || tg.Pass != want[i].pass || tg.Missing != "" {
			t.Errorf("target %d %q: %+v, want figure %v pass %v", i, tg.Name, tg, want[i].fig, want[i].pass)
		}
	}
	if s := r.Rows[20]; !near(s.VsOneQP, 0.95) || s.VsKernel != 0 {
		t.Errorf("64 QPs: %v of 1 QP, %v of kernel; want 0.95, none", s.VsOneQP, s.VsKernel)
	}
	if c := r.Rows[16]; !near(c.VsKernel, 25) {
		t.Errorf("connect time against kernel TCP's: %v, want 25", c.VsKernel)
	}
	if c := r.Rows[18]; !near(c.VsKernel, 0.01) {
		t.Errorf("4 clients' rate against kernel TCP's: %v, want 0.01", c.VsKernel)
	}
	if a := r.Rows[12]; a.Kind != KindOps || a.VsGVisor != 0 || a.VsKernel != 0 {
		t.Errorf("atomic row %+v: no TCP figure compares with operations per second", a)
	}
	if w := r.Rows[10]; w.Test != TestWriteImm || !near(w.VsGVisor, 640.0/600) {
		t.Errorf("write --imm row %+v: want 1.07x raw gVisor bulk", w)
	}
	// A run of some suites judges their targets only.
	r.Suites = []string{SuiteScale}
	r.Analyze()
	if len(r.Targets) != 1 || r.Targets[0].Figure != want[14].fig {
		t.Errorf("scale suite alone: targets %+v", r.Targets)
	}
	r.Suites = nil
	// Without the CRC-off row the CRC target is missing, not passed.
	r.Rows = append(r.Rows[:7], r.Rows[8:]...)
	r.Analyze()
	if tg := r.Targets[5]; tg.Pass || tg.Missing == "" {
		t.Errorf("CRC target without CRC off: %+v", tg)
	}
	// Without perftest the comparison's targets are skipped, not missed;
	// with its suite left out of the run they are not there at all.
	r.CLib = &CLibInfo{Skipped: "ib_write_lat not installed"}
	r.Analyze()
	for _, tg := range r.Targets[6:11] {
		if tg.Pass || tg.Skipped == "" || tg.Missing != "" || !strings.Contains(tg.Name, "libsiwtun") {
			t.Errorf("target of a skipped comparison: %+v", tg)
		}
	}
	r.CLib = &CLibInfo{}
	r.Suites = []string{SuitePerf, SuiteScale}
	if r.Analyze(); len(r.Targets) != 6+1 {
		t.Errorf("without the comparison: %d targets", len(r.Targets))
	}
	r.Suites = []string{SuiteCLib}
	if r.Analyze(); len(r.Targets) != 5 || !r.Targets[0].Pass {
		t.Errorf("the comparison alone: %+v", r.Targets)
	}
}

// TestPerftestReport parses the report rows of Debian's perftest 4.5.
func TestPerftestReport(t *testing.T) {
	lat := " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n" +
		" 2       2000          34.32          20809.61      82.29    \t       253.64      \t806.90 \t\t2688.40 \t\t18486.84\n" +
		"---------------------------------------------------------------------------------------\n"
	f, err := perftestReport("banner\n"+lat, 2, 2, 3)
	if err != nil || len(f) != 7 || f[2] != 82.29 || f[3] != 253.64 {
		t.Fatalf("latency row: %v %v", f, err)
	}
	bw := " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n" +
		" 65536      9904             0.00               308.68 \t\t   0.004939\n"
	if f, err := perftestReport(bw, 65536, 1); err != nil || f[1] != 308.68 {
		t.Fatalf("bandwidth row: %v %v", f, err)
	}
	// perftest prints -nan for the standard deviation now and then.
	if f, err := perftestReport(strings.Replace(lat, "806.90", "-nan", 1), 2, 2, 3); err != nil || f[3] != 253.64 {
		t.Fatalf("latency row with -nan: %v %v", f, err)
	}
	for name, c := range map[string]struct {
		out  string
		size int
		want []int
	}{
		"timed run's peak": {bw, 65536, []int{0}},
		"other size":       {bw, 4096, []int{1}},
		"no row":           {"Couldn't connect to 198.18.2.2:18516\n", 2, nil},
		"inf":              {strings.Replace(lat, "82.29", "inf", 1), 2, []int{2}},
		"too few figures":  {bw, 65536, []int{5}},
	} {
		if f, err := perftestReport(c.out, c.size, c.want...); err == nil {
			t.Errorf("%s: %v, want an error", name, f)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int]string{4: "4 B", 64: "64 B", 65536: "64 KiB", 1 << 20: "1 MiB", 1500: "1500 B"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestProcCPU(t *testing.T) {
	d, err := procCPU(os.Getpid())
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if d < 0 {
		t.Fatalf("procCPU = %v", d)
	}
}

// TestMergeRounds: rows of the same key from several rounds become one row
// with the median value and CPU figures and the samples in round order;
// rows keep the order of the first round.
func TestMergeRounds(t *testing.T) {
	on, off := true, false
	r := &Results{Rows: []Row{
		{MTU: 1500, Stack: StackGVisor, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 100, RNICCPUPerGB: 4},
		{MTU: 1500, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: &on, Value: 90, AppCPUPerGB: 0.01, RNICCPUPerGB: 5},
		{MTU: 1500, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: &off, Value: 95},
		{MTU: 1500, Stack: StackGVisor, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 140, RNICCPUPerGB: 3},
		{MTU: 1500, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: &on, Value: 70, AppCPUPerGB: 0.03, RNICCPUPerGB: 6},
		{MTU: 1500, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: &off, Value: 99},
		{MTU: 1500, Stack: StackGVisor, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 120, RNICCPUPerGB: 9},
		{MTU: 1500, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: &on, Value: 80, AppCPUPerGB: 0.02},
		{MTU: 1500, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: &off, Value: 97},
	}}
	r.MergeRounds()
	want := []Row{
		{MTU: 1500, Stack: StackGVisor, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 120, RNICCPUPerGB: 4, Samples: []float64{100, 140, 120}},
		{MTU: 1500, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: &on, Value: 80, AppCPUPerGB: 0.02, RNICCPUPerGB: 5.5, Samples: []float64{90, 70, 80}},
		{MTU: 1500, Stack: StackSiwtun, Kind: KindBW, Test: "RDMA WRITE", Size: 1 << 20, CRC: &off, Value: 97, Samples: []float64{95, 99, 97}},
	}
	if !reflect.DeepEqual(r.Rows, want) {
		t.Fatalf("merged rows\n%+v\nwant\n%+v", r.Rows, want)
	}
	one := &Results{Rows: []Row{{MTU: 9000, Stack: StackKernel, Kind: KindLat, Test: TestTCPRR, Size: RRSmall, Value: 17}}}
	one.MergeRounds()
	if len(one.Rows) != 1 || one.Rows[0].Samples != nil || one.Rows[0].Value != 17 {
		t.Fatalf("a single round changed: %+v", one.Rows)
	}
}
