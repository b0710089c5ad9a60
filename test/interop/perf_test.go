package interop

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// perfTest is one perftest test over rdma_cm: its siwtun perf arguments,
// perftest's tool in the VM, and how many iterations.
type perfTest struct {
	name  string   // ib_write_bw, ...
	args  []string // siwtun perf write, --lat, ...
	iters int
	lat   bool
}

// perfTests are the perftest tests run against siw: bandwidth and latency
// of RDMA Write, Read and Send, as RDMA users measure. The VM has perftest
// 4.5+0.17 (Debian 12), which reports version 6.06.
var perfTests = []perfTest{
	{name: "ib_write_bw", args: []string{"write"}, iters: 200},
	{name: "ib_read_bw", args: []string{"read"}, iters: 200},
	// Send bandwidth is measured by each side on its own (the sender from
	// its completions, which come when TCP takes the data): with 200 × 64
	// KiB most of the run fits in the TCP send buffers and the sender's
	// figure ran up to 1.5× the receiver's. 1000 iterations keep the
	// buffered share small.
	{name: "ib_send_bw", args: []string{"send"}, iters: 1000},
	{name: "ib_write_lat", args: []string{"write", "--lat"}, iters: 1000, lat: true},
}

// runPerftest runs each perftest test both ways: perftest's client in the
// VM against `siwtun perf` as server, and `siwtun perf` as client against
// perftest's server in the VM; both must finish and print figures that
// agree (bandwidth within 25 %, typical latency within a factor of 2: the
// VM is emulated, its timing noisy). Each run is captured and checked with
// tshark like the rping runs. perftest 4.5 names its columns MB/sec; the
// figures are MiB/s, as siwtun perf's.
func (e *env) runPerftest(t *testing.T) {
	d := startDaemon(t, e.netns, e.bin)
	for _, pt := range perfTests {
		for dir, name := range []string{toSiw, fromSiw} {
			pcap := filepath.Join(e.out, fmt.Sprintf("%s-%s.pcap", pt.name, map[int]string{dirToSiw: "to-siw", dirFrom: "from-siw"}[dir]))
			c := startCapture(t, e.netns, pcap)
			fig, err := e.perfRun(t, d, pt, dir)
			if errors.Is(err, errDisagree) {
				// The emulated VM's clock is calibrated at start-up and
				// starved by a loaded host: once a server reported 0.00
				// MiB/s for a run the other side measured at 12.53. Both
				// runs' figures go into the table.
				t.Logf("%s %s: %v; running it again", pt.name, name, err)
				var again string
				again, err = e.perfRun(t, d, pt, dir)
				fig = again + " (the first run disagreed: " + fig + ")"
			}
			captured, cerr := c.finish()
			var figs string
			var terr error
			if errors.Is(cerr, errCaptureDropped) {
				// The run's own checks (both reports) stand; only its
				// capture is incomplete and goes unchecked, as the
				// table says.
				t.Logf("%s %s: %v: capture not checked", pt.name, name, cerr)
				figs, cerr = "capture not checked: "+cerr.Error(), nil
			} else {
				_, figs, terr = e.checkCapture(pcap, true) // siwtun asks for CRC
			}
			err = joinErrs(nonNil(err, cerr, terr))
			fig += "\n" + figs + " (" + captured + ")"
			if err != nil {
				t.Errorf("%s %s: %v", pt.name, name, err)
			}
			e.addResult(fmt.Sprintf("perftest %s -R (siwtun perf %s)", pt.name, strings.Join(pt.args, " ")), name, "ok", fig, err)
		}
	}
	if err := d.stopDaemon(); err != nil {
		t.Error(err)
	}
}

// perfRun runs one test one way and compares the two reports.
func (e *env) perfRun(t *testing.T, d *daemon, pt perfTest, dir int) (string, error) {
	port := e.nextPort()
	perftest := fmt.Sprintf("%s -R -F -n %d -p %d", pt.name, pt.iters, port)
	siwtun := append([]string{e.bin, "perf"}, pt.args...)
	siwtun = append(siwtun, "-n", fmt.Sprint(pt.iters), "-p", fmt.Sprint(port), "--dev", tunDev, "--socket-dir", d.dir)
	var vmOut, vmErr, ourOut, ourErr string
	var vmSt, ourSt int
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if dir == dirFrom {
		// perftest's client in the VM, siwtun perf serving.
		srv := startProc(t, e.netns, "siwtun perf", siwtun...)
		if err := srv.waitFor("Waiting for client to connect", 30*time.Second); err != nil {
			return "", err
		}
		time.Sleep(200 * time.Millisecond) // the listen follows the banner
		vmOut, vmErr, vmSt = e.vm.client(ctx, "timeout 100 "+perftest+" "+rnicIP)
		ourSt = srv.wait(30 * time.Second)
		ourOut, ourErr = srv.stdout.String(), srv.stderr.String()
	} else {
		// perftest's server in the VM, siwtun perf connecting.
		srv := e.vm.startServer(t, fmt.Sprintf("perf-%d", port), perftest, port)
		cli := startProc(t, e.netns, "siwtun perf", append(siwtun, vmIP)...)
		ourSt = cli.wait(2 * time.Minute)
		ourOut, ourErr = cli.stdout.String(), cli.stderr.String()
		vmOut, vmErr, vmSt = srv.wait(t, 30*time.Second)
	}
	var errs []error
	if ourSt != 0 {
		errs = append(errs, fmt.Errorf("siwtun perf exit status %d: stderr %q, stdout ends %q", ourSt, tail(ourErr, 5), tail(ourOut, 2)))
	}
	if vmSt != 0 {
		errs = append(errs, fmt.Errorf("%s exit status %d: stderr %q, stdout ends %q", pt.name, vmSt, tail(vmErr, 5), tail(vmOut, 2)))
	}
	if len(errs) > 0 {
		return "", joinErrs(errs)
	}
	ours, err1 := perfFigure(ourOut, pt.lat)
	theirs, err2 := perfFigure(vmOut, pt.lat)
	if err := joinErrs(nonNil(err1, err2)); err != nil {
		return "", err
	}
	unit, what := "MiB/s average", "bandwidth"
	if pt.lat {
		unit, what = "µs typical", "latency"
	}
	fig := fmt.Sprintf("siwtun perf %.2f %s, %s %.2f %s (%d iterations)", ours, unit, pt.name, theirs, unit, pt.iters)
	if !agree(ours, theirs, pt.lat) {
		return fig, fmt.Errorf("%w on the %s: siwtun perf %.2f, %s %.2f", errDisagree, what, ours, pt.name, theirs)
	}
	if err := d.noQPsLeft(); err != nil {
		return fig, err
	}
	return fig, nil
}

// errDisagree: both sides of a perftest run finished, but their figures
// do not agree.
var errDisagree = errors.New("the two reports disagree")

// agree reports whether two figures agree within the noise of the
// emulated VM.
func agree(a, b float64, lat bool) bool {
	if a <= 0 || b <= 0 {
		return false
	}
	r := math.Max(a, b) / math.Min(a, b)
	if lat {
		return r <= 2
	}
	return r <= 1.25
}

// perfFigure finds the figure of a perftest report (siwtun perf's or
// perftest's own): the row under the "#bytes" header, BW average (column
// 4) or t_typical (column 5).
func perfFigure(out string, lat bool) (float64, error) {
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		if !strings.Contains(line, "#bytes") || i+1 >= len(lines) {
			continue
		}
		f := strings.Fields(lines[i+1])
		col := 3
		if lat {
			col = 4
		}
		if len(f) <= col {
			break
		}
		v, err := strconv.ParseFloat(f[col], 64)
		if err != nil {
			return 0, fmt.Errorf("report row %q: %w", lines[i+1], err)
		}
		return v, nil
	}
	return 0, fmt.Errorf("no report table in:\n%s", tail(out, 10))
}
