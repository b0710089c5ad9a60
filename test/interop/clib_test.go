package interop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/offload/mpa"
)

// runCLib runs the host's unmodified Debian rping and ib_write_bw -R
// through libsiwtun (`siwtun exec`) against the VM's rping and perftest
// on Linux siw, both ways: the host's program as client and as server.
// rping's pings are checked byte for byte on both sides (-v -V, 100 of
// them at each size); both ib_write_bw reports must be there and agree
// within 25 %. Each direction is captured and checked like the others.
func (e *env) runCLib(t *testing.T) {
	for _, p := range []struct{ prog, pkg string }{{"rping", "rdmacm-utils"}, {"ib_write_bw", "perftest"}, {"make", "make"}, {"gcc", "gcc"}} {
		if _, err := exec.LookPath(p.prog); err != nil {
			t.Skipf("%s not installed on the host: install %s", p.prog, p.pkg)
		}
	}
	lib := filepath.Join(filepath.Dir(e.bin), "libsiwtun.so")
	if out, err := exec.Command("make", "-s", "-C", "../../libsiwtun", "all", "OUT="+filepath.Dir(e.bin)).CombinedOutput(); err != nil {
		t.Fatalf("make -C libsiwtun: %v\n%s", err, out)
	}
	if _, err := os.Stat(lib); err != nil {
		t.Skipf("libsiwtun not built (install libibverbs-dev and librdmacm-dev): %v", err)
	}
	e.vm.setSiw(t, nil)
	d := startDaemon(t, e.netns, e.bin)
	// siwtun asks for CRC and offers peer-to-peer mode by default; siw
	// initiates without it.
	wants := [2]expect{{rev: 2, crc: true, rtr: mpa.RTRWrite}, {rev: 2, crc: true}}
	for dir, name := range []string{toSiw, fromSiw} {
		want := wants[dir]
		scenario := "libsiwtun: host rping -s (siwtun exec), VM rping -c"
		if dir == dirToSiw {
			scenario = "libsiwtun: host rping -c (siwtun exec), VM rping -s"
		}
		pcap := filepath.Join(e.out, fmt.Sprintf("clib-rping-%s.pcap", map[int]string{dirToSiw: "to-siw", dirFrom: "from-siw"}[dir]))
		c := startCapture(t, e.netns, pcap)
		var figs, errs []string
		for _, size := range pingSizes {
			t0 := time.Now()
			var err error
			if dir == dirToSiw {
				err = e.clibPingSiw(t, d, size)
			} else {
				err = e.clibPingedBySiw(t, d, size)
			}
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", sizeName(size), err))
				t.Errorf("%s %s: %v", scenario, sizeName(size), err)
				continue
			}
			figs = append(figs, fmt.Sprintf("%s %.2fs", sizeName(size), time.Since(t0).Seconds()))
		}
		captured, cerr := c.finish()
		if cerr != nil {
			errs = append(errs, cerr.Error())
		}
		verdict, verr := e.verify(pcap, want, len(pingSizes))
		if verr != nil {
			errs = append(errs, verr.Error())
			t.Errorf("%s: %v", scenario, verr)
		}
		fig := fmt.Sprintf("%d pings each, -v -V, checked on both sides: %s\n%s (%s)", pingCount, strings.Join(figs, ", "), verdict, captured)
		var err error
		if len(errs) > 0 {
			err = errors.New(strings.Join(errs, "; "))
		}
		e.addResult(scenario, name, "ok", fig, err)
	}
	for dir, name := range []string{toSiw, fromSiw} {
		scenario := "libsiwtun: host ib_write_bw -R server (siwtun exec), VM client"
		if dir == dirToSiw {
			scenario = "libsiwtun: host ib_write_bw -R client (siwtun exec), VM server"
		}
		pcap := filepath.Join(e.out, fmt.Sprintf("clib-ib_write_bw-%s.pcap", map[int]string{dirToSiw: "to-siw", dirFrom: "from-siw"}[dir]))
		c := startCapture(t, e.netns, pcap)
		fig, err := e.clibWriteBW(t, d, dir)
		// Linux siw fails a Send it has already transmitted when the
		// peer's FIN arrives before its send call returned (it checks
		// tx_suspend before the message's last flag): perftest's closing
		// exchange then ends in "Bad wc status 2" after its report. The
		// daemon holds its FIN to such a peer for --fin-delay (20 ms); with
		// that, 10 of 10 runs of this group passed at the first attempt
		// (2 of 6 had failed one without it). A VM slower than that may still
		// meet it: such a run is run once more, checked whole, and its
		// figure says so.
		for retry := 0; retry < 1 && (errors.Is(err, errDisagree) || (err != nil && strings.Contains(err.Error(), "Bad wc status"))); retry++ {
			t.Logf("%s: %v; running it again", scenario, err)
			first := err
			var again string
			again, err = e.clibWriteBW(t, d, dir)
			fig = again + fmt.Sprintf(" (attempt %d; the one before failed: %v)", retry+2, first)
		}
		captured, cerr := c.finish()
		var figs string
		var terr error
		if errors.Is(cerr, errCaptureDropped) {
			t.Logf("%s: %v: capture not checked", scenario, cerr)
			figs, cerr = "capture not checked: "+cerr.Error(), nil
		} else {
			var v tsharkVerdict
			v, figs, terr = e.checkCapture(pcap, true)
			if terr == nil && v.FPDUs == 0 {
				terr = fmt.Errorf("tshark decoded no FPDU in %s", filepath.Base(pcap))
			}
		}
		err = joinErrs(nonNil(err, cerr, terr))
		if err != nil {
			t.Errorf("%s: %v", scenario, err)
		}
		e.addResult(scenario, name, "ok", fig+"\n"+figs+" ("+captured+")", err)
	}
	if err := d.stopDaemon(); err != nil {
		t.Error(err)
	}
}

// execArgs is PROGRAM ARGS run through libsiwtun on siwtun0.
func (e *env) execArgs(d *daemon, args ...string) []string {
	return append([]string{e.bin, "exec", "--dev", tunDev, "--socket-dir", d.dir, "--"}, args...)
}

// refused reports whether a client's output says its server was not
// listening yet (the host's server gives no sign that it listens: its
// listener is in siwtun's own TCP/IP stack, and rping and perftest print
// to a block-buffered pipe).
func refused(out string) bool {
	for _, s := range []string{"REJECTED", "UNREACHABLE", "Connection refused", "connect error", "Unable to perform rdma_client function"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}

// clibPingSiw: rping -s in the VM, the host's rping -c through libsiwtun.
func (e *env) clibPingSiw(t *testing.T, d *daemon, size int) error {
	port := e.nextPort()
	srv := e.vm.startServer(t, fmt.Sprintf("rping-s-%d", port),
		fmt.Sprintf("rping -s -a %s -p %d -S %d -v -V", vmIP, port, size), port)
	cli := startProc(t, e.netns, "rping -c (siwtun exec)", e.execArgs(d, "rping", "-c", "-a", vmIP, "-p", fmt.Sprint(port),
		"-S", fmt.Sprint(size), "-C", fmt.Sprint(pingCount), "-v", "-V")...)
	st := cli.wait(2 * time.Minute)
	out, serr, sst := srv.wait(t, 30*time.Second)
	var errs []error
	if st != 0 {
		errs = append(errs, fmt.Errorf("host rping -c exit status %d: %s", st, tail(cli.stderr.String()+cli.stdout.String(), 5)))
	} else if err := samePings("host rping -c", cli.stdout.String(), expectedPings("ping data: ", size, pingCount)); err != nil {
		errs = append(errs, err)
	}
	if sst != 0 {
		errs = append(errs, fmt.Errorf("VM rping -s exit status %d: %s", sst, tail(serr, 5)))
	} else if err := samePings("VM rping -s", linesWith(out, "server ping data: "), expectedPings("server ping data: ", size, pingCount)); err != nil {
		errs = append(errs, err)
	}
	if err := d.noQPsLeft(); err != nil {
		errs = append(errs, err)
	}
	return joinErrs(errs)
}

// clibPingedBySiw: the host's rping -s through libsiwtun, rping -c in the
// VM (tried again while the server is not listening yet).
func (e *env) clibPingedBySiw(t *testing.T, d *daemon, size int) error {
	port := e.nextPort()
	srv := startProc(t, e.netns, "rping -s (siwtun exec)", e.execArgs(d, "rping", "-s", "-a", rnicIP, "-p", fmt.Sprint(port),
		"-S", fmt.Sprint(size), "-v", "-V")...)
	var out, cerr string
	var st int
	for try := 0; try < 10; try++ {
		time.Sleep(500 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, cerr, st = e.vm.client(ctx, fmt.Sprintf("rping -c -a %s -p %d -S %d -C %d -v -V", rnicIP, port, size, pingCount))
		cancel()
		if st == 0 || !refused(out+cerr) {
			break
		}
	}
	sst := srv.wait(30 * time.Second)
	var errs []error
	if st != 0 {
		errs = append(errs, fmt.Errorf("VM rping -c exit status %d: %s", st, tail(cerr+out, 5)))
	} else if err := samePings("VM rping -c", out, expectedPings("ping data: ", size, pingCount)); err != nil {
		errs = append(errs, err)
	}
	if sst != 0 {
		errs = append(errs, fmt.Errorf("host rping -s exit status %d: %s", sst, tail(srv.stderr.String()+srv.stdout.String(), 5)))
	} else if err := samePings("host rping -s", linesWith(srv.stdout.String(), "server ping data: "), expectedPings("server ping data: ", size, pingCount)); err != nil {
		errs = append(errs, err)
	}
	if err := d.noQPsLeft(); err != nil {
		errs = append(errs, err)
	}
	return joinErrs(errs)
}

// clibWriteBW runs ib_write_bw -R at 64 KiB, 200 iterations: the host's
// through libsiwtun, the VM's on siw; one of them serves. Both reports
// (for Write both print the client's row) must agree within 25 %.
func (e *env) clibWriteBW(t *testing.T, d *daemon, dir int) (string, error) {
	port := e.nextPort()
	const iters = 200
	args := []string{"ib_write_bw", "-R", "-F", "-s", "65536", "-n", fmt.Sprint(iters), "-p", fmt.Sprint(port)}
	perftest := strings.Join(args, " ")
	var vmOut, vmErr, hostOut, hostErr string
	var vmSt, hostSt int
	if dir == dirFrom {
		// The VM's client, the host's server.
		srv := startProc(t, e.netns, "ib_write_bw server (siwtun exec)", e.execArgs(d, append(args, "-d", tunDev)...)...)
		for try := 0; try < 10; try++ {
			time.Sleep(time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			vmOut, vmErr, vmSt = e.vm.client(ctx, "timeout 100 "+perftest+" "+rnicIP)
			cancel()
			if vmSt == 0 || !refused(vmOut+vmErr) {
				break
			}
		}
		hostSt = srv.wait(30 * time.Second)
		hostOut, hostErr = srv.stdout.String(), srv.stderr.String()
	} else {
		srv := e.vm.startServer(t, fmt.Sprintf("perf-%d", port), perftest, port)
		cli := startProc(t, e.netns, "ib_write_bw client (siwtun exec)", e.execArgs(d, append(args, "-d", tunDev, vmIP)...)...)
		hostSt = cli.wait(2 * time.Minute)
		hostOut, hostErr = cli.stdout.String(), cli.stderr.String()
		vmOut, vmErr, vmSt = srv.wait(t, 30*time.Second)
	}
	var errs []error
	if hostSt != 0 {
		errs = append(errs, fmt.Errorf("host ib_write_bw exit status %d: stderr %q, stdout ends %q", hostSt, tail(hostErr, 5), tail(hostOut, 2)))
	}
	if vmSt != 0 {
		errs = append(errs, fmt.Errorf("VM ib_write_bw exit status %d: stderr %q, stdout ends %q", vmSt, tail(vmErr, 5), tail(vmOut, 2)))
	}
	if len(errs) > 0 {
		return "", joinErrs(errs)
	}
	host, err1 := perfFigure(hostOut, false)
	vm, err2 := perfFigure(vmOut, false)
	if err := joinErrs(nonNil(err1, err2)); err != nil {
		return "", err
	}
	fig := fmt.Sprintf("host ib_write_bw %.2f MiB/s average, VM ib_write_bw %.2f MiB/s average (64 KiB × %d)", host, vm, iters)
	if !agree(host, vm, false) {
		return fig, fmt.Errorf("%w on the bandwidth: host %.2f, VM %.2f", errDisagree, host, vm)
	}
	if err := d.noQPsLeft(); err != nil {
		return fig, err
	}
	return fig, nil
}
