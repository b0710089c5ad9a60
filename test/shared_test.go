package test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
	ipnetns "github.com/siwtun/siwtun/internal/netns"
	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/verbs"
)

// Shared-address mode (siwtun up --shared): namespaces stand for hosts on
// a LAN, each RNIC answers on its host's LAN address, and nobody adds a
// route. Unlike newNetns, the hosts keep IPv4 forwarding off, as a host
// has it, so the daemon's turning it on (and back off) is tested too.

// newHost creates a namespace with loopback up and nothing else.
func newHost(t testing.TB, tag string) *netns {
	t.Helper()
	name := fmt.Sprintf("siwtun-shared-%s-%d-%d", tag, os.Getpid(), time.Now().UnixNano()%1e6)
	if err := ipnetns.IP("netns", "add", name); err != nil {
		t.Fatal(err)
	}
	n := &netns{t: t, name: name}
	t.Cleanup(func() { ipnetns.IP("netns", "del", name) })
	n.run("ip", "link", "set", "lo", "up")
	return n
}

// lanLink joins hosts a and b with a veth pair named lan0 in both, with
// addresses addrA and addrB.
func lanLink(t testing.TB, a, b *netns, addrA, addrB string) {
	t.Helper()
	if err := ipnetns.IP("link", "add", "lan0", "netns", a.name, "type", "veth", "peer", "name", "lan0", "netns", b.name); err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		n    *netns
		addr string
	}{{a, addrA}, {b, addrB}} {
		h.n.run("ip", "addr", "add", h.addr, "dev", "lan0")
		h.n.run("ip", "link", "set", "lan0", "up")
	}
}

// bridgeLAN puts every host on a bridge (in a namespace of its own, the
// switch) through a veth pair, lan0 on the host, with the host's address.
func bridgeLAN(t testing.TB, hosts []*netns, addrs []string) *netns {
	t.Helper()
	sw := newHost(t, "sw")
	sw.run("ip", "link", "add", "br0", "type", "bridge")
	sw.run("ip", "link", "set", "br0", "up")
	for i, h := range hosts {
		port := fmt.Sprintf("port%d", i)
		if err := ipnetns.IP("link", "add", port, "netns", sw.name, "type", "veth", "peer", "name", "lan0", "netns", h.name); err != nil {
			t.Fatal(err)
		}
		sw.run("ip", "link", "set", port, "master", "br0")
		sw.run("ip", "link", "set", port, "up")
		h.run("ip", "addr", "add", addrs[i], "dev", "lan0")
		h.run("ip", "link", "set", "lan0", "up")
	}
	return sw
}

// toolIn runs `siwtun args...` in n on the daemon d's sockets.
func toolIn(t testing.TB, n *netns, d *daemon, bin string, args ...string) *pingProc {
	t.Helper()
	return procIn(t, n, append([]string{"env", "SIWTUN_SOCKET_DIR=" + d.socketDir, bin}, args...)...)
}

// procIn runs a command line in n, killed at cleanup if still running.
func procIn(t testing.TB, n *netns, args ...string) *pingProc {
	t.Helper()
	p := &pingProc{cmd: n.command(args...), stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// mustExit waits for p and fails the test unless it exits with status 0.
func (p *pingProc) mustExit(t testing.TB, what string) string {
	t.Helper()
	if code := p.wait(t, what); code != 0 {
		t.Fatalf("%s: exit status %d\nstdout:\n%s\nstderr:\n%s", what, code, p.stdout, p.stderr)
	}
	return p.stdout.String()
}

// pingAcross runs siwtun ping's server on srv (daemon ds) at addr and its
// client on cli (daemon dc), count pings checked with -V.
func pingAcross(t testing.TB, bin string, srv *netns, ds *daemon, cli *netns, dc *daemon, addr string, count int) {
	t.Helper()
	s := toolIn(t, srv, ds, bin, "ping", "--dev", ds.dev, "-s", "-a", addr, "-d")
	s.waitListening(t)
	c := toolIn(t, cli, dc, bin, "ping", "--dev", dc.dev, "-c", "-a", addr, "-C", fmt.Sprint(count), "-V", "-v")
	out := c.mustExit(t, "siwtun ping -c -a "+addr)
	if got, want := linesWith(out, "ping data: "), expectedPings("ping data: ", 64, count); got != want {
		t.Errorf("ping -c -a %s printed:\n%s\nwant:\n%s", addr, got, want)
	}
	s.mustExit(t, "siwtun ping -s -a "+addr)
}

// linkOf is `siwtun ctl link -j` of daemon d in n.
func linkOf(t testing.TB, n *netns, d *daemon, bin string) map[string]any {
	t.Helper()
	out := n.run(bin, "ctl", "link", "-j", "--dev", d.dev, "--socket-dir", d.socketDir)
	var links []map[string]any
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("ctl link -j: %v\n%s", err, out)
	}
	return links[0]
}

// nftTable reports whether n has nftables table ip name.
func nftTable(n *netns, name string) bool {
	return n.command("nft", "list", "table", "ip", name).Run() == nil
}

// sysctlIn reads a sysctl in n.
func sysctlIn(t testing.TB, n *netns, key string) string {
	t.Helper()
	return strings.TrimSpace(n.run("sysctl", "-n", key))
}

func requireNft(t testing.TB) {
	t.Helper()
	requireRoot(t)
	for _, p := range []string{"nft", "iperf3", "python3"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed (tools/setup/debian.sh installs it)", p)
		}
	}
}

// TestSharedTwoHosts: two hosts on a veth LAN, each RNIC on its host's LAN
// address, no route added by anyone: siwtun ping both ways, siwtun perf
// write, the addresses every report shows (ctl link, the QPs' local and
// remote addresses: the shared ones, ports the same on both ends), and
// the host's forwarding and table gone again after the daemons stop.
func TestSharedTwoHosts(t *testing.T) {
	requireNft(t)
	bin := siwtunBin(t)
	a, b := newHost(t, "a"), newHost(t, "b")
	// Strict reverse-path filtering everywhere, as hardened hosts have it.
	for _, h := range []*netns{a, b} {
		h.run("sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.default.rp_filter=1")
	}
	lanLink(t, a, b, "198.18.20.1/24", "198.18.20.2/24")
	da := startUp(t, a, bin, "siwtun0", "--shared", "198.18.20.1", "--mtu", "1500")
	// b's RNIC gets its private address from --addr (a's has the default,
	// which would be the same in both namespaces).
	db := startUp(t, b, bin, "siwtun0", "--shared", "198.18.20.2", "--mtu", "1500", "--addr", "169.254.77.7/32")

	la := linkOf(t, a, da, bin)
	if fmt.Sprint(la["addrs"]) != "[198.18.20.1/24]" || la["netdev"] != "lan0" {
		t.Errorf("ctl link on a: addrs %v netdev %v, want [198.18.20.1/24] lan0", la["addrs"], la["netdev"])
	}
	for _, h := range []*netns{a, b} {
		if got := sysctlIn(t, h, "net.ipv4.conf.lan0.forwarding"); got != "1" {
			t.Errorf("lan0 forwarding %s while the RNIC runs, want 1", got)
		}
	}

	// Each RNIC's node GUID (and with it its GID) is its LAN interface's
	// MAC's, as an iWARP card's is its port's: two hosts' siwtun0 differ.
	guids := map[string]bool{}
	for _, h := range []struct {
		n *netns
		d *daemon
	}{{a, da}, {b, db}} {
		mac, err := net.ParseMAC(strings.TrimSpace(h.n.run("cat", "/sys/class/net/lan0/address")))
		if err != nil {
			t.Fatal(err)
		}
		want := ctl.FormatGUID(verbs.GUIDOfMAC([6]byte(mac)))
		out := h.n.run(bin, "ctl", "devinfo", "-j", "--dev", h.d.dev, "--socket-dir", h.d.socketDir)
		var dev map[string]any
		if err := json.Unmarshal([]byte(out), &dev); err != nil {
			t.Fatalf("ctl devinfo -j: %v\n%s", err, out)
		}
		if got := dev["node_guid"]; got != want {
			t.Errorf("node_guid %v, want %s (lan0's MAC %s)", got, want, mac)
		}
		guids[want] = true
	}
	if len(guids) != 2 {
		t.Errorf("both hosts' RNICs have node GUID %v", guids)
	}

	pingAcross(t, bin, b, db, a, da, "198.18.20.2", 5)
	pingAcross(t, bin, a, da, b, db, "198.18.20.1", 5)

	// b's lan0 forwarded nothing before its RNIC came; now it forwards the
	// RNIC's NATed traffic and nothing else: a connection from a straight
	// to b's RNIC's private address, through b as a router, gets no
	// answer, though the RNIC listens on that port.
	l := toolIn(t, b, db, bin, "ping", "-s", "-a", "198.18.20.2", "-p", "7600", "-d")
	l.waitListening(t)
	private := linkOf(t, b, db, bin)["shared"].(map[string]any)["private"].(string)
	if private != "169.254.77.7" {
		t.Errorf("b's private address %s, want --addr's 169.254.77.7", private)
	}
	a.run("ip", "route", "add", private+"/32", "via", "198.18.20.2")
	probe := fmt.Sprintf("import socket; s=socket.create_connection(('%s', 7600), timeout=2)", private)
	if out, err := a.command("python3", "-c", probe).CombinedOutput(); err == nil {
		t.Errorf("a reached b's RNIC at its private address %s through b's forwarding: the host forwards what it did not before\n%s", private, out)
	}
	l.cmd.Process.Kill()

	// A connection held open: perf write for 3 s, its QPs looked at.
	srv := toolIn(t, b, db, bin, "perf", "write", "-D", "3")
	time.Sleep(500 * time.Millisecond)
	cli := toolIn(t, a, da, bin, "perf", "write", "-D", "3", "198.18.20.2")
	var qa, qb []map[string]any
	deadline := time.Now().Add(20 * time.Second)
	for len(qa) == 0 || len(qb) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no connected QP on both sides; a: %v b: %v\nclient:\n%s%s", qa, qb, cli.stdout, cli.stderr)
		}
		time.Sleep(100 * time.Millisecond)
		qa, qb = connectedQPs(t, a, da, bin), connectedQPs(t, b, db, bin)
	}
	srcA, dstA, srcB, dstB := qa[0]["src"].(string), qa[0]["dst"].(string), qb[0]["src"].(string), qb[0]["dst"].(string)
	if !strings.HasPrefix(srcA, "198.18.20.1:") || srcA != dstB || dstA != srcB || !strings.HasPrefix(srcB, "198.18.20.2:") {
		t.Errorf("QP addresses: a %s -> %s, b %s -> %s; want the shared addresses, each end's local the other's remote", srcA, dstA, srcB, dstB)
	}
	out := cli.mustExit(t, "siwtun perf write (client)")
	srv.mustExit(t, "siwtun perf write (server)")
	if !strings.Contains(out, "BW average") && !strings.Contains(out, "#bytes") {
		t.Errorf("perf write printed no report:\n%s", out)
	}
	t.Logf("siwtun perf write across the LAN (shared addresses):\n%s", out)

	da.stop()
	db.stop()
	for _, h := range []*netns{a, b} {
		if nftTable(h, "siwtun-siwtun0") {
			t.Errorf("table ip siwtun-siwtun0 left after the daemon stopped")
		}
		if got := sysctlIn(t, h, "net.ipv4.conf.lan0.forwarding"); got != "0" {
			t.Errorf("lan0 forwarding %s after the daemon stopped, want 0 again", got)
		}
	}
}

// connectedQPs are the QPs of d that have a remote address.
func connectedQPs(t testing.TB, n *netns, d *daemon, bin string) []map[string]any {
	t.Helper()
	out, err := n.command(bin, "ctl", "qp", "-j", "--dev", d.dev, "--socket-dir", d.socketDir).Output()
	if err != nil {
		return nil
	}
	var qps, with []map[string]any
	json.Unmarshal(out, &qps)
	for _, q := range qps {
		if s, _ := q["dst"].(string); s != "" {
			with = append(with, q)
		}
	}
	return with
}

// TestSharedThreeHostsBridge: three hosts on a bridge, each RNIC on its
// host's address with its LAN interface's MTU (no --mtu); each pings the
// next.
func TestSharedThreeHostsBridge(t *testing.T) {
	requireNft(t)
	bin := siwtunBin(t)
	hosts := []*netns{newHost(t, "a"), newHost(t, "b"), newHost(t, "c")}
	addrs := []string{"198.18.21.1", "198.18.21.2", "198.18.21.3"}
	bridgeLAN(t, hosts, []string{addrs[0] + "/24", addrs[1] + "/24", addrs[2] + "/24"})
	ds := make([]*daemon, len(hosts))
	for i, h := range hosts {
		ds[i] = startUp(t, h, bin, "siwtun0", "--shared", addrs[i]) // the MTU: lan0's
		if !ds[i].grepLog(" mtu=1500 ") {
			t.Errorf("without --mtu the RNIC does not take lan0's MTU (1500):\n%s", ds[i].log)
		}
	}
	for i := range hosts {
		j := (i + 1) % len(hosts)
		pingAcross(t, bin, hosts[j], ds[j], hosts[i], ds[i], addrs[j], 3)
	}
}

// TestSharedRping: Debian's rping, unmodified, through siwtun exec from
// one host to the other's LAN address; its listener on a port a kernel
// socket holds fails with EADDRINUSE.
func TestSharedRping(t *testing.T) {
	requireNft(t)
	if _, err := exec.LookPath("rping"); err != nil {
		t.Skip("rping not installed (rdmacm-utils; .ci/run installs it)")
	}
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"} {
		if _, err := os.Stat(h); err != nil {
			t.Skipf("%s missing: libsiwtun needs libibverbs-dev and librdmacm-dev (.ci/run installs them)", h)
		}
	}
	bin := siwtunBin(t)
	if out, err := exec.Command("make", "-s", "-C", "../libsiwtun", "all", "OUT="+filepath.Dir(bin)).CombinedOutput(); err != nil {
		t.Fatalf("make -C libsiwtun: %v\n%s", err, out)
	}
	a, b := newHost(t, "a"), newHost(t, "b")
	lanLink(t, a, b, "198.18.22.1/24", "198.18.22.2/24")
	da := startUp(t, a, bin, "siwtun0", "--shared", "198.18.22.1", "--mtu", "1500")
	db := startUp(t, b, bin, "siwtun0", "--shared", "198.18.22.2", "--mtu", "1500")
	s := procIn(t, b, bin, "exec", "--socket-dir", db.socketDir, "--", "rping", "-s", "-a", "198.18.22.2", "-v")
	waitPublished(t, b, db, bin, 7174) // rping's stdout is a pipe: its lines come at exit
	c := procIn(t, a, bin, "exec", "--socket-dir", da.socketDir, "--", "rping", "-c", "-a", "198.18.22.2", "-v", "-V", "-C", "10")
	out := c.mustExit(t, "rping -c")
	if got := strings.Count(out, "ping data: rdma-ping-"); got != 10 {
		t.Errorf("rping -c printed %d pings, want 10:\n%s", got, out)
	}
	s.mustExit(t, "rping -s")

	// A kernel socket holds port 7300 of b's address: rping's listener
	// there fails with EADDRINUSE (at rdma_listen, or at rdma_bind_addr
	// where the bind takes the port).
	procIn(t, b, "python3", "-c", `import socket, time
s = socket.socket(); s.bind(("198.18.22.2", 7300)); s.listen(); time.sleep(60)`)
	waitPort(t, b, "198.18.22.2:7300")
	busy := procIn(t, b, bin, "exec", "--socket-dir", db.socketDir, "--", "rping", "-s", "-a", "198.18.22.2", "-p", "7300")
	if code := busy.wait(t, "rping -s on a port a kernel socket holds"); code == 0 || !strings.Contains(busy.stdout.String()+busy.stderr.String(), "Address already in use") {
		t.Errorf("rping -s on a port a kernel socket holds: exit %d\n%s%s", code, busy.stdout, busy.stderr)
	}
}

// TestSharedKernelSockets: the host's own sockets on the shared address
// are left alone. A kernel TCP transfer on the address runs while the
// host's daemon starts, serves a ping, stops on SIGTERM, starts again, is
// killed with SIGKILL (its table stays, no port stays reserved) and
// starts once more (the table of the killed run removed); the transfer
// ends unharmed. An RNIC listener on a port a kernel socket holds fails
// with EADDRINUSE, and a second daemon on the same address cannot take a
// port the first one has.
func TestSharedKernelSockets(t *testing.T) {
	requireNft(t)
	bin := siwtunBin(t)
	a, b := newHost(t, "a"), newHost(t, "b")
	lanLink(t, a, b, "198.18.23.1/24", "198.18.23.2/24")
	da := startUp(t, a, bin, "siwtun0", "--shared", "198.18.23.1", "--mtu", "1500")

	// The kernel transfer: iperf3 on b's shared address, its client on a
	// (whose address a's RNIC shares too), throttled so it lasts.
	iperfS := procIn(t, b, "iperf3", "-s", "-1", "-B", "198.18.23.2", "-p", "5201")
	waitPort(t, b, "198.18.23.2:5201")
	iperfC := procIn(t, a, "iperf3", "-c", "198.18.23.2", "-p", "5201", "-t", "14", "-b", "200M", "-J")

	up := func() *daemon {
		d := startUp(t, b, bin, "siwtun0", "--shared", "198.18.23.2", "--mtu", "1500")
		pingAcross(t, bin, b, d, a, da, "198.18.23.2", 2)
		return d
	}
	d := up()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	if d.err != nil {
		t.Errorf("siwtun up after SIGTERM: %v\n%s", d.err, d.log)
	}
	if nftTable(b, "siwtun-siwtun0") {
		t.Error("table left after SIGTERM")
	}
	d = up()
	// A listener up when the daemon dies: its port was reserved.
	toolIn(t, b, d, bin, "ping", "-s", "-a", "198.18.23.2", "-p", "7500", "-d").waitListening(t)
	held := linkOf(t, b, d, bin)["shared"].(map[string]any)["reserved"]
	d.kill(t)
	if !nftTable(b, "siwtun-siwtun0") {
		t.Error("after SIGKILL: no table left behind (the next up is to remove it)")
	}
	// Every port the killed daemon held is free: a kernel socket binds it.
	ports, _ := held.([]any)
	if len(ports) == 0 {
		t.Errorf("the daemon reported no reserved port (it had a listener): %v", held)
	}
	for _, p := range ports {
		bind := fmt.Sprintf("import socket; s=socket.socket(); s.bind(('198.18.23.2', %v))", p)
		if out, err := b.command("python3", "-c", bind).CombinedOutput(); err != nil {
			t.Errorf("after SIGKILL port %v of the shared address is still held: %v\n%s", p, err, out)
		}
	}
	d = up()
	if !d.grepLog("removed the nftables table an earlier run of the device left behind") {
		t.Error("the next up did not say it removed the killed run's table")
	}

	// A kernel listener holds port 7300: the RNIC cannot listen there.
	procIn(t, b, "iperf3", "-s", "-1", "-B", "198.18.23.2", "-p", "7300")
	waitPort(t, b, "198.18.23.2:7300")
	p := toolIn(t, b, d, bin, "ping", "-s", "-a", "198.18.23.2", "-p", "7300")
	if code := p.wait(t, "ping -s -p 7300"); code == 0 || !strings.Contains(p.stdout.String()+p.stderr.String(), "address already in use") {
		t.Errorf("RNIC listener on a port a kernel socket holds: exit %d\n%s%s", code, p.stdout, p.stderr)
	}

	// A second daemon on the same shared address: the port of the first
	// one's listener is taken, another is free.
	d2 := startUp(t, b, bin, "siwtun1", "--shared", "198.18.23.2", "--mtu", "1500")
	first := toolIn(t, b, d, bin, "ping", "-s", "-a", "198.18.23.2", "-p", "7400", "-d")
	first.waitListening(t)
	second := toolIn(t, b, d2, bin, "ping", "--dev", d2.dev, "-s", "-a", "198.18.23.2", "-p", "7400")
	if code := second.wait(t, "second daemon's ping -s -p 7400"); code == 0 || !strings.Contains(second.stdout.String()+second.stderr.String(), "address already in use") {
		t.Errorf("second daemon listening on the first one's port: exit %d\n%s%s", code, second.stdout, second.stderr)
	}
	first.cmd.Process.Kill()
	pingAcross(t, bin, b, d2, a, da, "198.18.23.2", 2)
	d2.stop()
	d.stop()

	out := iperfC.mustExit(t, "iperf3 -c (the kernel transfer)")
	iperfS.wait(t, "iperf3 -s")
	var rep struct {
		End struct {
			SumReceived struct {
				Bytes   float64 `json:"bytes"`
				Seconds float64 `json:"seconds"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.End.SumReceived.Seconds < 13 || rep.End.SumReceived.Bytes < 13*200e6/8*0.9 {
		t.Errorf("the kernel transfer: %v, received %.0f bytes in %.1f s, want 14 s at 200 Mbit/s", err, rep.End.SumReceived.Bytes, rep.End.SumReceived.Seconds)
	}
	t.Logf("kernel transfer through the daemons' start, SIGTERM, SIGKILL and restart: %.0f bytes in %.1f s",
		rep.End.SumReceived.Bytes, rep.End.SumReceived.Seconds)
	if nftTable(b, "siwtun-siwtun0") || nftTable(b, "siwtun-siwtun1") {
		t.Error("a table left after the daemons stopped")
	}
	if got := sysctlIn(t, b, "net.ipv4.conf.lan0.forwarding"); got != "0" {
		t.Errorf("lan0 forwarding %s after the daemons stopped, want 0 again", got)
	}
}

// waitPublished waits until d's RNIC listens on port of its shared
// address.
func waitPublished(t testing.TB, n *netns, d *daemon, bin string, port int) {
	t.Helper()
	for range 400 {
		sh, _ := linkOf(t, n, d, bin)["shared"].(map[string]any)
		ps, _ := sh["published"].([]any)
		for _, p := range ps {
			if p == float64(port) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: port %d not published after 20 s", d.dev, port)
}

// waitPort waits until a TCP socket listens on addr (host:port) in n.
func waitPort(t testing.TB, n *netns, addr string) {
	t.Helper()
	for range 200 {
		if strings.Contains(n.run("ss", "-Htln"), addr) {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %s", addr)
}

// TestSharedSingleHost: the address put on the RNIC's own device
// (--shared-dev siwtun0), the way a single machine uses siwtun: a second
// RNIC (siwtun1, its own address on its own device) pings it, the RNIC
// pings itself, a kernel TCP server on the same address answers a kernel
// client of the same host, and a kernel socket that the RNIC connects to
// sees the RNIC's shared address.
func TestSharedSingleHost(t *testing.T) {
	requireNft(t)
	bin := siwtunBin(t)
	h := newHost(t, "one")
	d0 := startUp(t, h, bin, "siwtun0", "--shared", "198.18.24.2/24", "--shared-dev", "siwtun0", "--mtu", "9000")
	d1 := startUp(t, h, bin, "siwtun1", "--shared", "198.18.25.2/24", "--shared-dev", "siwtun1", "--mtu", "9000")
	if out := h.run("ip", "-4", "addr", "show", "dev", "siwtun0"); !strings.Contains(out, "198.18.24.2/24") {
		t.Errorf("siwtun0 lacks the shared address:\n%s", out)
	}
	pingAcross(t, bin, h, d0, h, d1, "198.18.24.2", 3)
	pingAcross(t, bin, h, d1, h, d0, "198.18.25.2", 3)
	pingAcross(t, bin, h, d0, h, d0, "198.18.24.2", 3)

	iperfS := procIn(t, h, "iperf3", "-s", "-1", "-B", "198.18.24.2", "-p", "5201")
	waitPort(t, h, "198.18.24.2:5201")
	procIn(t, h, "iperf3", "-c", "198.18.24.2", "-p", "5201", "-t", "1").mustExit(t, "iperf3 -c on the RNIC's address")
	iperfS.mustExit(t, "iperf3 -s")

	// The RNIC connecting to a kernel socket of its own host: the socket
	// sees the shared address, not the RNIC's private one.
	srv := procIn(t, h, "python3", "-c", `import socket
s = socket.socket(); s.bind(("198.18.24.2", 7700)); s.listen()
c, peer = s.accept(); print(peer[0], flush=True)`)
	waitPort(t, h, "198.18.24.2:7700")
	toolIn(t, h, d1, bin, "ping", "--dev", d1.dev, "-c", "-a", "198.18.24.2", "-p", "7700", "-C", "1").wait(t, "ping -c to a kernel socket")
	if out := strings.TrimSpace(srv.mustExit(t, "python3 server")); out != "198.18.25.2" {
		t.Errorf("a kernel socket sees the RNIC's connection from %q, want its shared address 198.18.25.2", out)
	}
}

// TestSharedBadInput: an address no interface has is refused with the
// command that adds it; so is one the named interface lacks.
func TestSharedBadInput(t *testing.T) {
	requireNft(t)
	bin := siwtunBin(t)
	a, b := newHost(t, "a"), newHost(t, "b")
	lanLink(t, a, b, "198.18.26.1/24", "198.18.26.2/24")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--shared", "198.18.26.7"}, "ip addr add 198.18.26.7/24 dev lan0"},
		{[]string{"--shared", "198.18.26.1", "--shared-dev", "lo"}, "ip addr add 198.18.26.1/32 dev lo"},
		{[]string{"--shared", "2001:db8::1"}, "IPv4 only"},
		{[]string{"--shared-dev", "lan0", "--addr", "198.18.27.2/24"}, "--shared-dev needs --shared"},
	} {
		out, err := a.command(append([]string{bin, "up", "--socket-dir", t.TempDir()}, tc.args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("siwtun up %s: %v\n%s\nwant a message with %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
	if nftTable(a, "siwtun-siwtun0") {
		t.Error("a refused up left a table")
	}
}

// TestSharedContainers: the RNIC in a container, set up the way a
// container runtime sets one up (docker run --cap-add NET_ADMIN --device
// /dev/net/tun): each container a network namespace with a veth (eth0) to
// a bridge in the host's namespace and a default route through it, and a
// daemon that has CAP_NET_ADMIN and no other capability, with /proc/sys
// read-only as a runtime mounts it. Each RNIC shares its container's
// address: siwtun ping between them, while a kernel TCP server in the
// second container keeps serving on the same address.
func TestSharedContainers(t *testing.T) {
	requireNft(t)
	for _, p := range []string{"setpriv", "mount"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed (util-linux)", p)
		}
	}
	bin := siwtunBin(t)
	host := newHost(t, "dockerhost")
	host.run("ip", "link", "add", "br0", "type", "bridge")
	host.run("ip", "addr", "add", "198.18.28.1/24", "dev", "br0")
	host.run("ip", "link", "set", "br0", "up")
	host.run("sysctl", "-qw", "net.ipv4.ip_forward=1") // as Docker sets it
	cs := []*netns{newHost(t, "c1"), newHost(t, "c2")}
	addrs := []string{"198.18.28.2", "198.18.28.3"}
	ds := make([]*daemon, len(cs))
	// What a runtime gives the container's process: CAP_NET_ADMIN only,
	// /proc/sys read-only.
	wrapper := []string{"sh", "-c", `mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec setpriv --bounding-set=-all,+net_admin --inh-caps=-all "$@"`, "container"}
	for i, c := range cs {
		veth := fmt.Sprintf("veth%d", i)
		if err := ipnetns.IP("link", "add", veth, "netns", host.name, "type", "veth", "peer", "name", "eth0", "netns", c.name); err != nil {
			t.Fatal(err)
		}
		host.run("ip", "link", "set", veth, "master", "br0")
		host.run("ip", "link", "set", veth, "up")
		c.run("ip", "addr", "add", addrs[i]+"/24", "dev", "eth0")
		c.run("ip", "link", "set", "eth0", "up")
		c.run("ip", "route", "add", "default", "via", "198.18.28.1")
		ds[i] = startUpWith(t, c, wrapper, bin, "siwtun0", "--shared", addrs[i], "--mtu", "1500")
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ds[i].pid()))
		if err != nil || !strings.Contains(string(status), "CapEff:\t0000000000001000") {
			t.Errorf("daemon in container %d: want CAP_NET_ADMIN alone (CapEff 0000000000001000): %v\n%s", i+1, err, status)
		}
		if mi, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", ds[i].pid())); !readOnlyMount(string(mi), "/proc/sys") {
			t.Errorf("daemon in container %d: /proc/sys is not read-only for it:\n%s", i+1, mi)
		}
	}
	iperfS := procIn(t, cs[1], "iperf3", "-s", "-1", "-B", addrs[1], "-p", "5201")
	waitPort(t, cs[1], addrs[1]+":5201")
	iperfC := procIn(t, cs[0], "iperf3", "-c", addrs[1], "-p", "5201", "-t", "4", "-b", "100M")
	pingAcross(t, bin, cs[1], ds[1], cs[0], ds[0], addrs[1], 5)
	pingAcross(t, bin, cs[0], ds[0], cs[1], ds[1], addrs[0], 5)
	iperfC.mustExit(t, "iperf3 -c between the containers")
	iperfS.mustExit(t, "iperf3 -s")
	for i, d := range ds {
		d.stop()
		if d.err != nil {
			t.Errorf("container %d's daemon: %v", i+1, d.err)
		}
		if nftTable(cs[i], "siwtun-siwtun0") {
			t.Errorf("container %d: table left after the daemon stopped", i+1)
		}
		if got := sysctlIn(t, cs[i], "net.ipv4.conf.eth0.forwarding"); got != "0" {
			t.Errorf("container %d: eth0 forwarding %s after the daemon stopped, want 0 again", i+1, got)
		}
	}
}

// readOnlyMount reports whether mountinfo has mount point at, read-only.
func readOnlyMount(mountinfo, at string) bool {
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == at && strings.HasPrefix(f[5], "ro") {
			return true
		}
	}
	return false
}

// TestSharedStaleSegment: a segment of one of the RNIC's connections that
// conntrack finds out of its window (as a stale retransmission looks) is
// INVALID, so no NAT translates it; without the table's "invalid" chain
// the host took it for its own and answered with a reset in the peer's
// window, which ended the connection ("Work Request Flushed Error"). Here
// the segment is sent during an RDMA WRITE run, below the sending host's
// netfilter (testdata/stale_segment.py, on its Ethernet interface), with
// the ACK the peer last sent and a sequence number half the sequence
// space away: the run ends well and the host sends no reset.
func TestSharedStaleSegment(t *testing.T) {
	requireNft(t)
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Skip("tcpdump not installed (tools/setup/debian.sh installs it)")
	}
	bin := siwtunBin(t)
	a, b := newHost(t, "a"), newHost(t, "b")
	lanLink(t, a, b, "198.18.29.1/24", "198.18.29.2/24")
	da := startUp(t, a, bin, "siwtun0", "--shared", "198.18.29.1")
	db := startUp(t, b, bin, "siwtun0", "--shared", "198.18.29.2")
	srv := toolIn(t, b, db, bin, "perf", "write", "-D", "5", "-p", "18600")
	waitPublished(t, b, db, bin, 18600)
	cli := toolIn(t, a, da, bin, "perf", "write", "-D", "5", "-p", "18600", "198.18.29.2")

	// One of a's data segments, as b's LAN interface sees it.
	seen, err := b.command("timeout", "20", "tcpdump", "-ni", "lan0", "-S", "-c", "1",
		"tcp and src host 198.18.29.1 and dst port 18600 and tcp[tcpflags] & tcp-ack != 0 and greater 200").Output()
	if err != nil {
		t.Fatalf("tcpdump: %v\n%s", err, seen)
	}
	m := regexp.MustCompile(`IP 198\.18\.29\.1\.(\d+) > .* seq (\d+)[:,].* ack (\d+),`).FindStringSubmatch(string(seen))
	if m == nil {
		t.Fatalf("no data segment of a's in %q", seen)
	}
	seq, _ := strconv.ParseUint(m[2], 10, 32)
	resets := procIn(t, b, "timeout", "4", "tcpdump", "-ni", "lan0", "-l", "tcp[tcpflags] & tcp-rst != 0 and src host 198.18.29.2")
	time.Sleep(500 * time.Millisecond) // tcpdump listening
	mac := strings.Fields(b.run("ip", "-br", "link", "show", "lan0"))[2]
	a.run("python3", "testdata/stale_segment.py", "lan0", mac, "198.18.29.1", m[1], "198.18.29.2", "18600",
		fmt.Sprint((seq+1<<31)%(1<<32)), m[3])
	resets.wait(t, "tcpdump of resets")
	if out := strings.TrimSpace(resets.stdout.String()); out != "" {
		t.Errorf("b sent resets after the stale segment:\n%s", out)
	}
	cli.mustExit(t, "siwtun perf write (client)")
	srv.mustExit(t, "siwtun perf write (server)")
}
