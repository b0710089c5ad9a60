package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
)

// sharedIP is the peer namespace's own address on the VM's LAN (the tap's,
// the VM's on-link neighbour): the address the shared scenario gives the
// RNIC.
var sharedIP = peerEnv("SIWPEER_HOST_IP", "198.18.0.1")

// isSiwtun reports whether addr (an address, or address:port) is siwtun's
// end of a captured connection: the routed RNIC's address or the shared one.
func isSiwtun(addr string) bool {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		addr = ap.Addr().String()
	}
	return addr == rnicIP || addr == sharedIP
}

// sharedTCPTime is how long the kernel TCP transfer on the shared address
// runs while the RNIC's pings cross the same address.
const sharedTCPTime = 10 * time.Second

// runShared: siwtun up --shared on the namespace's address on the VM's LAN,
// as on a host with one LAN address. Linux siw in the VM reaches the RNIC
// at the address it reaches the host at, on-link (the VM's route to it
// names no gateway: nothing routed, nothing configured for siwtun), while
// the host's kernel keeps serving a TCP transfer to a port of its own on
// the same address. Pings both ways at each size, checked as the modes
// are (rping's data, the MPA negotiation, tshark and siwtun check on the
// capture), captured on the tap: what crosses the VM's wire, after the
// RNIC's address translation.
func (e *env) runShared(t *testing.T) {
	e.vm.setSiw(t, nil)
	tap := peerEnv("SIWPEER_TAP", "siwtap0")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, st := e.vm.exec(ctx, "ip -o route get "+sharedIP); st != 0 || strings.Contains(out, " via ") {
		t.Fatalf("the VM's route to %s (status %d): %q, want on-link", sharedIP, st, out)
	}
	d := startDaemonAt(t, e.netns, e.bin, sharedIP, "--shared", sharedIP, "--shared-dev", tap)

	// Kernel TCP on the same address while the RNIC works there.
	static := filepath.Join(e.out, "bin", "siwtun-static")
	if _, err := os.Stat(static); err != nil {
		goBuild(t, static, "../../cmd/siwtun", true)
	}
	vmBin := e.vm.put(t, static, "siwtun")
	tcpPort := e.nextPort()
	tcpSrv := startProc(t, e.netns, "siwtun bench tcp --listen (kernel)", e.bin, "bench", "tcp", "--listen", fmt.Sprintf("%s:%d", sharedIP, tcpPort))
	if err := e.waitListen(tcpPort, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	type tcpResult struct {
		out string
		st  int
	}
	tcpDone := make(chan tcpResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), sharedTCPTime+time.Minute)
		defer cancel()
		out, st := e.vm.exec(ctx, fmt.Sprintf("%s bench tcp --json --time %s %s:%d", vmBin, sharedTCPTime, sharedIP, tcpPort))
		tcpDone <- tcpResult{out, st}
	}()

	m := mode{name: "shared", capDev: tap, want: [2]expect{{rev: 2, crc: true, rtr: mpa.RTRWrite}, {rev: 2, crc: true}}}
	scenario := fmt.Sprintf("shared (siwtun up --shared %s --shared-dev %s: the host's LAN address)", sharedIP, tap)
	for dir, name := range []string{toSiw, fromSiw} {
		pcap := filepath.Join(e.out, fmt.Sprintf("shared-%s.pcap", map[int]string{dirToSiw: "to-siw", dirFrom: "from-siw"}[dir]))
		okText, fig, errs, _ := e.modeDirection(t, d, m, dir, pcap)
		for _, msg := range errs {
			t.Errorf("shared %s: %s", name, msg)
		}
		var err error
		if len(errs) > 0 {
			err = fmt.Errorf("%s", strings.Join(errs, "; "))
		}
		e.addResult(scenario, name, okText, fig, err)
	}

	r := <-tcpDone
	tcpSrv.wait(30 * time.Second)
	var res struct {
		MBps float64 `json:"mb_per_s"`
	}
	var err error
	line := r.out
	if i := strings.LastIndex(line, "\n{"); i >= 0 {
		line = line[i+1:] // the JSON line, after anything ssh printed
	}
	if jerr := json.Unmarshal([]byte(strings.TrimSpace(line)), &res); r.st != 0 || jerr != nil || res.MBps <= 0 {
		err = fmt.Errorf("kernel TCP client in the VM: status %d, %q: %v", r.st, tail(r.out, 3), jerr)
		t.Error(err)
	}
	e.addResult(scenario, "VM -> host kernel TCP, same address", "ok",
		fmt.Sprintf("%.1f MB/s over %v while the pings ran", res.MBps, sharedTCPTime), err)
	if err := d.stopDaemon(); err != nil {
		t.Error(err)
	}
}
