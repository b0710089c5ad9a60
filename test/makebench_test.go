package test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/bench"
	"github.com/siwtun/siwtun/internal/syncbuf"
)

// benchNamespaces lists the network namespaces `siwtun bench` (pid) made.
func benchNamespaces(t *testing.T, pid int) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var ns []string
	prefix := "siwtun-bench-" + strconv.Itoa(pid)
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			ns = append(ns, f[0])
		}
	}
	return ns
}

// TestMakeBenchTiny runs a tiny `siwtun bench` (MTU 1500, RDMA WRITE only,
// 1 MiB bandwidth and 4 B latency, 1 s runs, CRC on and off, two rounds
// merged into medians): every row
// has positive figures, every target a figure, the JSON parses and
// agrees with the table, kernel TCP is measured by iperf3 and qperf too
// (where installed) and every ratio divides by the best kernel figure,
// and the namespaces are gone afterwards.
func TestMakeBenchTiny(t *testing.T) {
	requireRoot(t)
	bin := siwtunBin(t)
	out := t.TempDir()
	cmd := exec.Command(bin, "bench", "--quick", "--suites", "perf", "--mtu", "1500", "-D", "1", "--rounds", "2", "--out", out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("siwtun bench: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("\n%s", stdout.String())
	if ns := benchNamespaces(t, cmd.Process.Pid); len(ns) > 0 {
		t.Errorf("namespaces left behind: %v", ns)
	}
	files, _ := filepath.Glob(filepath.Join(out, "*.json"))
	if len(files) != 1 {
		t.Fatalf("results: %v, want one JSON file", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var res bench.Results
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("results JSON: %v\n%s", err, b)
	}
	// kernel bulk, rr 64 B; gVisor bulk, rr 64 B; RDMA WRITE bw and lat,
	// each with CRC on and off; iperf3's bulk, qperf's bulk and rr 64 B.
	rows, skipped := 8, 0
	for tool, n := range map[string]int{bench.ToolIperf3: 1, bench.ToolQperf: 2} {
		if _, err := exec.LookPath(tool); err != nil {
			skipped++
			continue
		}
		rows += n
	}
	if len(res.Rows) != rows || len(res.KernelSkipped) != skipped {
		t.Fatalf("%d rows, want %d; kernel tools skipped %v, want %d:\n%s", len(res.Rows), rows, res.KernelSkipped, skipped, stdout.String())
	}
	checkKernelAnchors(t, &res, stdout.String())
	if res.Rounds != 2 || !strings.Contains(stdout.String(), "medians of 2 rounds") {
		t.Errorf("rounds %d, want 2 (and the table saying so)", res.Rounds)
	}
	for _, r := range res.Rows {
		if r.Value <= 0 {
			t.Errorf("row without a figure: %+v", r)
		}
		if len(r.Samples) != 2 || r.Value != (r.Samples[0]+r.Samples[1])/2 {
			t.Errorf("row's value is not the median of its 2 samples: %+v", r)
		}
		if r.Stack != bench.StackKernel && r.VsKernel <= 0 {
			t.Errorf("row without its ratio to kernel TCP: %+v", r)
		}
		if r.Stack == bench.StackSiwtun && r.VsGVisor <= 0 {
			t.Errorf("row without its ratio to raw gVisor TCP: %+v", r)
		}
		if r.Kind == bench.KindBW && r.Stack != bench.StackGVisor && r.Tool != bench.ToolQperf && r.AppCPUPerGB <= 0 {
			t.Errorf("bandwidth row without the receiving application's CPU: %+v", r)
		}
		if r.Kind == bench.KindBW && r.Stack != bench.StackKernel && r.RNICCPUPerGB <= 0 {
			t.Errorf("bandwidth row without the receiving daemon's CPU: %+v", r)
		}
	}
	// Five at MTU 1500: the bandwidth target against raw gVisor is judged
	// at MTU 9000 only; the two against kernel TCP at each MTU.
	if len(res.Targets) != 5 {
		t.Fatalf("targets %+v, want 5", res.Targets)
	}
	for _, tg := range res.Targets {
		if tg.Missing != "" || tg.Figure == 0 {
			t.Errorf("target without a figure: %+v", tg)
		}
		if verdict := map[bool]string{true: "PASS", false: "MISS"}[tg.Pass]; !strings.Contains(stdout.String(), verdict) {
			t.Errorf("table lacks %s for %q", verdict, tg.Name)
		}
	}
	if res.ElapsedS <= 0 || !strings.Contains(stdout.String(), "total elapsed") {
		t.Errorf("no elapsed time: %v", res.ElapsedS)
	}
}

// checkKernelAnchors: the anchors are the best kernel TCP figures of their
// kind, the table names them, and every ratio to kernel TCP divides by
// its anchor.
func checkKernelAnchors(t *testing.T, res *bench.Results, table string) {
	t.Helper()
	anchor := map[string]bench.Anchor{}
	for _, a := range res.Anchors {
		anchor[a.Kind+" "+strconv.Itoa(a.Size)] = a
	}
	tools := 0
	for _, r := range res.Rows {
		if r.Stack != bench.StackKernel {
			continue
		}
		if r.Tool != "" {
			tools++
		}
		key := r.Kind + " " + strconv.Itoa(r.Size)
		a, ok := anchor[key]
		if !ok {
			t.Errorf("no anchor for kernel TCP's %s", key)
			continue
		}
		if (r.Kind == bench.KindBW && r.Value > a.Value) || (r.Kind == bench.KindLat && r.Value < a.Value) {
			t.Errorf("anchor %+v is not the best: %+v", a, r)
		}
	}
	if tools > 0 && !strings.Contains(table, "VS KERNEL divides by the best kernel TCP figure of its kind") {
		t.Errorf("the table does not name the anchors:\n%s", table)
	}
	for _, r := range res.Rows {
		if r.Stack == bench.StackKernel || r.VsKernel == 0 {
			continue
		}
		size := max(r.Size, bench.RRSmall)
		if r.Kind == bench.KindBW {
			size = bench.BulkSize
		}
		a := anchor[r.Kind+" "+strconv.Itoa(size)]
		if want := r.Value / a.Value; r.VsKernel < want*0.999 || r.VsKernel > want*1.001 {
			t.Errorf("%+v: VS KERNEL %v, want %v (anchor %+v)", r, r.VsKernel, want, a)
		}
	}
}

// TestMakeBenchSetupScale runs a tiny `siwtun bench` of the set-up, scale
// and memory suites (MTU 1500, 40 connections by one client and by two,
// RDMA WRITE over 1 and 4 QPs for 1 s, memory with 100 idle QPs): every
// row has a positive figure, the rates and connect times come with kernel
// TCP's, every target of these suites has a figure, and the namespaces
// are gone afterwards. The figures themselves are not judged here.
func TestMakeBenchSetupScale(t *testing.T) {
	requireRoot(t)
	bin := siwtunBin(t)
	out := t.TempDir()
	cmd := exec.Command(bin, "bench", "--suites", "connect,scale,memory", "--mtu", "1500", "-D", "1", "--rounds", "1",
		"--connections", "40", "--clients", "2", "--scale-qps", "1,4", "--idle-qps", "100", "--out", out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("siwtun bench: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("\n%s", stdout.String())
	if ns := benchNamespaces(t, cmd.Process.Pid); len(ns) > 0 {
		t.Errorf("namespaces left behind: %v", ns)
	}
	files, _ := filepath.Glob(filepath.Join(out, "*.json"))
	if len(files) != 1 {
		t.Fatalf("results: %v, want one JSON file", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var res bench.Results
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("results JSON: %v\n%s", err, b)
	}
	// Kernel and siwtun: a connect time and two rates each; RDMA WRITE
	// over 1 and 4 QPs; the two daemons' memory.
	count := map[string]int{}
	for _, r := range res.Rows {
		count[r.Stack+" "+r.Kind]++
		if r.Value <= 0 || r.QPs <= 0 {
			t.Errorf("row without a figure: %+v", r)
		}
		if r.Stack == bench.StackSiwtun && (r.Kind == bench.KindConnect || r.Kind == bench.KindRate) && r.VsKernel <= 0 {
			t.Errorf("set-up row without its ratio to kernel TCP: %+v", r)
		}
		if r.Kind == bench.KindMem && (r.QPs != 100 || r.RSSKiB <= r.RSSBaseKiB) {
			t.Errorf("memory row: %+v", r)
		}
	}
	want := map[string]int{"kernel connect": 1, "kernel rate": 2, "siwtun connect": 1, "siwtun rate": 2, "siwtun bw": 2, "siwtun mem": 2}
	if !reflect.DeepEqual(count, want) {
		t.Fatalf("rows %v, want %v:\n%s", count, want, stdout.String())
	}
	if len(res.Targets) != 5 { // connect time, two rates, 4 QPs / 1 QP, memory
		t.Fatalf("targets %+v, want 5", res.Targets)
	}
	for _, tg := range res.Targets {
		if tg.Missing != "" || tg.Figure == 0 {
			t.Errorf("target without a figure: %+v", tg)
		}
	}
	if !strings.Contains(stdout.String(), "SET-UP AND SCALE") {
		t.Errorf("no set-up and scale table:\n%s", stdout.String())
	}
}

// TestMakeBenchInterrupted: SIGINT in the middle of `siwtun bench` stops
// every process it started and removes its namespaces.
func TestMakeBenchInterrupted(t *testing.T) {
	requireRoot(t)
	bin := siwtunBin(t)
	cmd := exec.Command(bin, "bench", "--quick", "--mtu", "1500", "-D", "3", "--rounds", "1", "--out", "")
	var stdout bytes.Buffer
	stderr := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	eventually(t, time.Minute, "bench reaching siwtun's runs", func() (bool, string) {
		return strings.Contains(stderr.String(), "siwtun RDMA WRITE bw"), stderr.String()
	})
	// The processes in the daemons' namespace: the two daemons and the
	// perf server and client.
	ns := "siwtun-bench-" + strconv.Itoa(cmd.Process.Pid)
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		t.Fatalf("ip netns pids %s: %v", ns, err)
	}
	pids := strings.Fields(string(out))
	if len(pids) < 2 {
		t.Fatalf("processes in %s: %v, want at least the two daemons", ns, pids)
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("interrupted bench exited 0")
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("bench still running a minute after SIGINT\n%s", stderr.String())
	}
	if ns := benchNamespaces(t, cmd.Process.Pid); len(ns) > 0 {
		t.Errorf("namespaces left behind: %v", ns)
	}
	for _, p := range pids {
		pid, _ := strconv.Atoi(p)
		if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
			t.Errorf("process %d of the bench still there after it exited (kill 0: %v)", pid, err)
		}
	}
	if !strings.Contains(stderr.String(), "removed the namespaces") {
		t.Errorf("no cleanup logged:\n%s", stderr.String())
	}
}

// TestMakeBenchRFC7306 runs a tiny `siwtun bench` of the RFC 7306 rows
// (--ops write-imm,atomic: RDMA WRITE with Immediate Data 1 MiB bandwidth
// and 4 B latency, Fetch-and-Add operations per second; 1 s runs, CRC on
// and off): each row has a positive figure, the write --imm rows their
// ratios to the TCP baselines, the atomic rows none (nothing of TCP's
// compares), and the table names them.
func TestMakeBenchRFC7306(t *testing.T) {
	requireRoot(t)
	bin := siwtunBin(t)
	out := t.TempDir()
	cmd := exec.Command(bin, "bench", "--quick", "--suites", "perf", "--ops", "write-imm,atomic", "--mtu", "1500", "-D", "1", "--rounds", "1", "--out", out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("siwtun bench: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("\n%s", stdout.String())
	files, _ := filepath.Glob(filepath.Join(out, "*.json"))
	if len(files) != 1 {
		t.Fatalf("results: %v, want one JSON file", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var res bench.Results
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("results JSON: %v\n%s", err, b)
	}
	count := map[string]int{}
	for _, r := range res.Rows {
		if r.Stack != bench.StackSiwtun {
			continue
		}
		count[r.Test+" "+r.Kind]++
		if r.Value <= 0 {
			t.Errorf("row without a figure: %+v", r)
		}
		switch r.Kind {
		case bench.KindOps:
			if r.Test != bench.TestAtomic || r.Size != 8 || r.VsKernel != 0 || r.VsGVisor != 0 {
				t.Errorf("atomic row %+v", r)
			}
		default:
			if r.Test != bench.TestWriteImm || r.VsKernel <= 0 || r.VsGVisor <= 0 {
				t.Errorf("write --imm row %+v", r)
			}
		}
	}
	want := map[string]int{bench.TestWriteImm + " " + bench.KindBW: 2, bench.TestWriteImm + " " + bench.KindLat: 2, bench.TestAtomic + " " + bench.KindOps: 2}
	for k, n := range want {
		if count[k] != n {
			t.Errorf("%d rows of %s, want %d (CRC on and off): %v", count[k], k, n, count)
		}
	}
	for _, s := range []string{"RDMA WRITE IMM bw", "RDMA WRITE IMM lat", "ATOMIC FETCH_ADD rate", "ops/s"} {
		if !strings.Contains(stdout.String(), s) {
			t.Errorf("the table lacks %q", s)
		}
	}
}

// TestMakeBenchShared runs a tiny `siwtun bench` of the shared suite (MTU
// 1500, 1 s, 40 connections): routed and shared daemons each give an RDMA
// WRITE bandwidth, a 4 B round trip, a connect time and a rate, and each
// of the suite's three targets has a figure. The figures themselves are
// not judged here.
func TestMakeBenchShared(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (tools/setup/debian.sh installs nftables)")
	}
	bin := siwtunBin(t)
	cmd := exec.Command(bin, "bench", "--suites", "shared", "--mtu", "1500", "-D", "1", "--rounds", "1",
		"--connections", "40", "--out", "")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("siwtun bench: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("\n%s", stdout.String())
	if ns := benchNamespaces(t, cmd.Process.Pid); len(ns) > 0 {
		t.Errorf("namespaces left behind: %v", ns)
	}
	for _, stack := range []string{"siwtun (routed)", "siwtun (shared)"} {
		for _, row := range []string{"RDMA WRITE bw", "RDMA WRITE lat", "connect time", "connections/s"} {
			if !regexp.MustCompile(`(?m)^1500\s+` + regexp.QuoteMeta(stack) + `\s+` + row + `\s`).MatchString(stdout.String()) {
				t.Errorf("no %s %s row", stack, row)
			}
		}
	}
	if n := strings.Count(stdout.String(), "shared / routed: "); n != 3 {
		t.Errorf("%d shared / routed targets, want 3", n)
	}
	if strings.Contains(stdout.String(), "MISS (") {
		t.Errorf("a target without a figure:\n%s", stdout.String())
	}
}
