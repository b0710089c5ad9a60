package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// gapIters is the number of 64 KiB RDMA WRITEs of each ib_write_bw run of
// the gap group: 32 MiB, a few seconds on the emulated VM.
const gapIters = 500

// gapTime is how long each kernel TCP bulk run lasts.
const gapTime = 4 * time.Second

// runGap measures the interop gap (how far siwtun's RDMA with kernel siw
// falls short of kernel TCP on the same path) on the one link the VM has,
// the tap between the host's namespace and the VM, and puts the figures in
// the table (speed is reported here, never judged: the VM is emulated and
// the host shared):
//   - kernel TCP bulk each way (`siwtun bench tcp`, 64 KiB writes; a static
//     build runs in the VM), the ceiling of the path, and from the VM once
//     more with one segment per packet (gso_max_size 1500), as siw sends;
//   - `ib_write_bw -R -s 65536` between `siwtun perf` and the VM's
//     perftest on siw, each way, with the daemon asking for MPA CRC (its
//     default) and with CRC off, each also as a fraction of kernel TCP the
//     same way;
//   - siw to itself inside the VM (its own loopback), CRC off (siw's
//     default) and required, which is what siw's side costs without
//     siwtun or the link.
//
// What it checks: every run finishes with figures, and perftest's two
// reports agree (as in the perftest group).
func (e *env) runGap(t *testing.T) {
	static := filepath.Join(e.out, "bin", "siwtun-static")
	goBuild(t, static, "../../cmd/siwtun", true)
	vmBin := e.vm.put(t, static, "siwtun")
	const mib = 1 << 20

	tcp := map[int]float64{}
	for _, dir := range []int{dirToSiw, dirFrom} {
		mbps, err := e.gapTCP(t, vmBin, dir)
		name := map[int]string{dirToSiw: "host -> VM", dirFrom: "VM -> host"}[dir]
		if err != nil {
			t.Errorf("kernel TCP %s: %v", name, err)
		}
		tcp[dir] = mbps
		e.addResult("gap: kernel TCP bulk, 64 KiB writes (the link's ceiling)", name, "ok",
			fmt.Sprintf("%.1f MB/s (%v)", mbps, gapTime), err)
	}

	// siw sends every FPDU as its own segment (no GSO; try_gso off), and
	// the emulated VM pays per packet: the same kernel TCP limited to one
	// segment per packet (gso_max_size 1500 on the VM's eth0) is the
	// ceiling for siw's sends on this link.
	e.vm.mustExec(t, "ip link set dev eth0 gso_max_size 1500")
	perSeg, err := e.gapTCP(t, vmBin, dirFrom)
	e.vm.mustExec(t, "ip link set dev eth0 gso_max_size 65536")
	if err != nil {
		t.Errorf("kernel TCP VM -> host, one segment per packet: %v", err)
	}
	e.addResult("gap: kernel TCP bulk, the VM sending one segment per packet (as siw does)", "VM -> host", "ok",
		fmt.Sprintf("%.1f MB/s (%v)", perSeg, gapTime), err)

	pt := perfTest{name: "ib_write_bw", args: []string{"write"}, iters: gapIters}
	for _, crc := range []bool{true, false} {
		d := startDaemon(t, e.netns, e.bin, fmt.Sprintf("--crc=%v", crc))
		for dir, name := range []string{toSiw, fromSiw} {
			fig, err := e.perfRun(t, d, pt, dir)
			var v float64
			if _, serr := fmt.Sscanf(fig, "siwtun perf %f", &v); err == nil && serr == nil && tcp[dir] > 0 {
				fig += fmt.Sprintf("; %.2f× kernel TCP the same way", v*mib/1e6/tcp[dir])
				if dir == dirFrom && perSeg > 0 {
					fig += fmt.Sprintf(", %.2f× with one segment per packet", v*mib/1e6/perSeg)
				}
			}
			if err != nil {
				t.Errorf("ib_write_bw crc=%v %s: %v", crc, name, err)
			}
			e.addResult(fmt.Sprintf("gap: ib_write_bw -R 64 KiB, siwtun CRC %s", onOff(crc)), name, "ok", fig, err)
		}
		if err := d.stopDaemon(); err != nil {
			t.Error(err)
		}
	}

	for _, crc := range []bool{false, true} {
		if crc {
			e.vm.setSiw(t, map[string]string{"mpa_crc_required": "Y"})
		}
		v, err := e.gapLoopback(t)
		if crc {
			e.vm.setSiw(t, nil)
		}
		if err != nil {
			t.Errorf("siw loopback crc=%v: %v", crc, err)
		}
		e.addResult(fmt.Sprintf("gap: ib_write_bw -R 64 KiB, siw to itself in the VM, CRC %s", onOff(crc)), "in the VM", "ok",
			fmt.Sprintf("%.2f MiB/s average (%d iterations)", v, gapIters), err)
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// gapTCP runs one kernel TCP bulk transfer over the tap link and returns
// the receiver's throughput in MB/s: host -> VM (dirToSiw) or VM -> host.
func (e *env) gapTCP(t *testing.T, vmBin string, dir int) (float64, error) {
	port := e.nextPort()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out string
	if dir == dirToSiw {
		srv := e.vm.startServer(t, fmt.Sprintf("tcp-%d", port), fmt.Sprintf("%s bench tcp --listen %s:%d", vmBin, vmIP, port), port)
		cli := startProc(t, e.netns, "siwtun bench tcp", e.bin, "bench", "tcp", "--json", "--time", gapTime.String(), fmt.Sprintf("%s:%d", vmIP, port))
		if st := cli.wait(time.Minute); st != 0 {
			return 0, fmt.Errorf("client exit status %d: %s", st, tail(cli.stderr.String(), 5))
		}
		if _, serr, st := srv.wait(t, 30*time.Second); st != 0 {
			return 0, fmt.Errorf("server in the VM: exit status %d: %s", st, tail(serr, 5))
		}
		out = cli.stdout.String()
	} else {
		hostAddr := peerEnv("SIWPEER_HOST_IP", "198.18.0.1")
		srv := startProc(t, e.netns, "siwtun bench tcp --listen", e.bin, "bench", "tcp", "--listen", fmt.Sprintf("%s:%d", hostAddr, port))
		if err := e.waitListen(port, 10*time.Second); err != nil {
			srv.stop()
			return 0, err
		}
		var serr string
		var st int
		out, serr, st = e.vm.client(ctx, fmt.Sprintf("%s bench tcp --json --time %s %s:%d", vmBin, gapTime, hostAddr, port))
		if st != 0 {
			return 0, fmt.Errorf("client in the VM: exit status %d: %s", st, tail(serr, 5))
		}
		srv.wait(30 * time.Second)
	}
	var res struct {
		MBps float64 `json:"mb_per_s"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil || res.MBps <= 0 {
		return 0, fmt.Errorf("no figure in %q: %v", tail(out, 3), err)
	}
	return res.MBps, nil
}

// gapLoopback runs ib_write_bw -R between two processes in the VM over siw
// and returns the client's average bandwidth in MiB/s, after checking that
// the server's report agrees.
func (e *env) gapLoopback(t *testing.T) (float64, error) {
	port := e.nextPort()
	cmd := fmt.Sprintf("ib_write_bw -R -F -s 65536 -n %d -p %d", gapIters, port)
	srv := e.vm.startServer(t, fmt.Sprintf("lo-%d", port), "timeout 100 "+cmd, port)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, cerr, st := e.vm.client(ctx, "timeout 100 "+cmd+" "+vmIP)
	sout, serr, sst := srv.wait(t, 30*time.Second)
	if st != 0 || sst != 0 {
		return 0, fmt.Errorf("client exit status %d (%s), server %d (%s)", st, tail(cerr, 3), sst, tail(serr, 3))
	}
	a, err1 := perfFigure(out, false)
	b, err2 := perfFigure(sout, false)
	if err := joinErrs(nonNil(err1, err2)); err != nil {
		return 0, err
	}
	if !agree(a, b, false) {
		return a, fmt.Errorf("%w: client %.2f, server %.2f MiB/s", errDisagree, a, b)
	}
	return a, nil
}

// waitListen waits until a TCP socket listens on port in the test's
// namespace.
func (e *env) waitListen(port int, d time.Duration) error {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out, err := exec.Command("ip", "netns", "exec", e.netns, "ss", "-ltnH", fmt.Sprintf("sport = :%d", port)).Output()
		if err == nil && len(strings.TrimSpace(string(out))) > 0 {
			return nil
		}
	}
	return fmt.Errorf("nothing listens on port %d after %v", port, d)
}
