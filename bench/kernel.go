package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/siwtun/siwtun/apps/tcpperf"
)

// Kernel TCP is measured with apps/tcpperf and, beside it in the same
// namespaces, with Debian's iperf3 (bulk) and qperf (tcp_bw, tcp_lat):
// every ratio to kernel TCP divides by the best of their figures, so that
// no target passes because one tool's baseline was slow.

// Kernel TCP tools besides apps/tcpperf (Row.Tool; tcpperf's rows have
// none).
const (
	ToolIperf3 = "iperf3"
	ToolQperf  = "qperf"
)

// AllKernelTools are the tools measured beside tcpperf by default.
var AllKernelTools = []string{ToolIperf3, ToolQperf}

// toolWait bounds a tool's start (its server listening) and, beyond the
// run's duration, its run.
const toolWait = 30 * time.Second

// kernelTools finds the tools of the configuration that are installed and
// notes those that are not (Results.KernelSkipped).
func (r *runner) kernelTools() {
	r.tools = map[string]string{}
	for _, t := range r.cfg.KernelTools {
		p, err := exec.LookPath(t)
		if err != nil {
			r.res.KernelSkipped = append(r.res.KernelSkipped, fmt.Sprintf("%s: not installed (Debian package %s)", t, t))
			r.logf("kernel TCP with %s: skipped: not installed", t)
			continue
		}
		r.tools[t] = p
	}
}

// kernelToolRuns measures kernel TCP with the other tools at mtu: iperf3
// bulk; qperf tcp_bw and tcp_lat at each request/response size.
func (r *runner) kernelToolRuns(mtu int) {
	for _, w := range r.tcpWorkloads() {
		if r.ctx.Err() != nil {
			return
		}
		if _, ok := r.tools[ToolIperf3]; ok && w.mode == tcpperf.Bulk {
			r.iperf3(mtu)
		}
		if _, ok := r.tools[ToolQperf]; ok {
			r.qperf(mtu, w)
		}
	}
}

// startTool starts an installed tool in namespace ns.
func (r *runner) startTool(name, ns, tool string, args ...string) (*proc, error) {
	p, err := startProc(r.ctx, name, ns, append([]string{r.tools[tool]}, args...)...)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, p)
	return p, nil
}

// waitListening waits until a TCP socket listens on port in namespace ns
// (or the process p, which is to listen there, exited).
func (r *runner) waitListening(ns, port string, p *proc) error {
	deadline := time.Now().Add(toolWait)
	for {
		out, err := exec.CommandContext(r.ctx, "ip", "netns", "exec", ns, "ss", "-Hltn", "sport = :"+port).Output()
		if err == nil && len(strings.TrimSpace(string(out))) > 0 {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited before listening: %v\n%s", p.name, p.err, p.stderr.String())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening on port %s after %v", p.name, port, toolWait)
		}
		select {
		case <-r.ctx.Done():
			return r.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// iperf3Result is what the run needs of iperf3's JSON report.
type iperf3Result struct {
	End struct {
		SumReceived struct {
			Bytes         float64 `json:"bytes"`
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

// iperf3 measures bulk throughput with iperf3, 64 KiB writes (-l), the
// receiver's figure; the receiving server's CPU per GB as tcpperf's.
func (r *runner) iperf3(mtu int) {
	what := fmt.Sprintf("MTU %d kernel TCP bulk %s with iperf3", mtu, FormatSize(BulkSize))
	r.logf("%s", what)
	port := r.nextPort()
	srv, err := r.startTool("iperf3 server", r.nsK1, ToolIperf3, "-s", "-1", "-p", port, "-J")
	if err != nil {
		r.failed(what, err)
		return
	}
	if err := r.waitListening(r.nsK1, port, srv); err != nil {
		srv.stop()
		r.failed(what, err)
		return
	}
	cli, err := r.startTool("iperf3 client", r.nsK0, ToolIperf3, "-c", veth1Addr, "-p", port,
		"-t", fmt.Sprint(int(r.cfg.Duration.Seconds())), "-l", fmt.Sprint(BulkSize), "-J")
	if err != nil {
		srv.stop()
		r.failed(what, err)
		return
	}
	cerr := cli.wait(r.cfg.Duration + toolWait)
	serr := srv.wait(toolWait)
	var res iperf3Result
	if err := json.Unmarshal([]byte(cli.stdout.String()), &res); err != nil {
		r.failed(what, errors.Join(cerr, serr, fmt.Errorf("client output: %w\n%s", err, cli.stdout.String())))
		return
	}
	if res.Error != "" || res.End.SumReceived.BitsPerSecond <= 0 {
		r.failed(what, errors.Join(cerr, serr, fmt.Errorf("iperf3: %q, %v bit/s received", res.Error, res.End.SumReceived.BitsPerSecond)))
		return
	}
	if err := errors.Join(cerr, serr); err != nil {
		r.failed(what, err)
		return
	}
	r.res.Rows = append(r.res.Rows, Row{MTU: mtu, Stack: StackKernel, Tool: ToolIperf3, Kind: KindBW, Test: TestTCPBulk,
		Size: BulkSize, Value: res.End.SumReceived.BitsPerSecond / 8 / 1e6, AppCPUPerGB: perGB(srv.cpu(), res.End.SumReceived.Bytes)})
}

// qperf measures with qperf: tcp_bw for bulk (64 KiB messages), tcp_lat
// for request/response, whose one-way latency (half the round trip, as
// qperf reports it) the row doubles into a round trip.
func (r *runner) qperf(mtu int, w tcpWorkload) {
	test, name := "tcp_bw", "bulk"
	if w.mode == tcpperf.RR {
		test, name = "tcp_lat", "rr"
	}
	what := fmt.Sprintf("MTU %d kernel TCP %s %s with qperf %s", mtu, name, FormatSize(w.size), test)
	r.logf("%s", what)
	port, dataPort := r.nextPort(), r.nextPort()
	// The server serves until it is stopped.
	srv, err := r.startTool("qperf server", r.nsK1, ToolQperf, "-lp", port)
	if err != nil {
		r.failed(what, err)
		return
	}
	defer srv.stop()
	if err := r.waitListening(r.nsK1, port, srv); err != nil {
		r.failed(what, err)
		return
	}
	cli, err := r.startTool("qperf client", r.nsK0, ToolQperf, "-lp", port, "-ip", dataPort,
		"-t", fmt.Sprint(int(r.cfg.Duration.Seconds())), "-m", fmt.Sprint(w.size), veth1Addr, test)
	if err != nil {
		r.failed(what, err)
		return
	}
	if err := cli.wait(r.cfg.Duration + toolWait); err != nil {
		r.failed(what, fmt.Errorf("%w\n%s%s", err, cli.stdout.String(), cli.stderr.String()))
		return
	}
	v, err := parseQperf(cli.stdout.String(), test)
	if err != nil {
		r.failed(what, err)
		return
	}
	row := Row{MTU: mtu, Stack: StackKernel, Tool: ToolQperf, Kind: KindBW, Test: TestTCPBulk, Size: w.size, Value: v}
	if w.mode == tcpperf.RR {
		row.Kind, row.Test = KindLat, TestTCPRR
	}
	r.res.Rows = append(r.res.Rows, row)
}

// qperfFigure is a line of qperf's report: "bw  =  2.57 GB/sec",
// "latency  =  19.2 us".
var qperfFigure = regexp.MustCompile(`(?m)^\s*(bw|latency)\s*=\s*([0-9.,]+)\s*(\S+)`)

// parseQperf returns the figure of a qperf test's report: tcp_bw's
// bandwidth in MB/s (10^6 bytes per second), tcp_lat's round trip in µs
// (twice the one-way latency qperf reports).
func parseQperf(out, test string) (float64, error) {
	m := qperfFigure.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("qperf %s: no figure in its report:\n%s", test, out)
	}
	v, err := strconv.ParseFloat(strings.ReplaceAll(m[2], ",", ""), 64)
	if err != nil {
		return 0, fmt.Errorf("qperf %s: %q: %w", test, m[2], err)
	}
	scale, ok := map[string]float64{
		"GB/sec": 1e3, "MB/sec": 1, "KB/sec": 1e-3, "bytes/sec": 1e-6,
		"sec": 2e6, "ms": 2e3, "us": 2, "ns": 2e-3,
	}[m[3]]
	if !ok || (m[1] == "bw") != strings.HasSuffix(m[3], "/sec") || (m[1] == "bw") != (test == "tcp_bw") {
		return 0, fmt.Errorf("qperf %s: unexpected figure %q", test, m[0])
	}
	return v * scale, nil
}
