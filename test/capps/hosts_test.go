package capps

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ipnetns "github.com/siwtun/siwtun/internal/netns"
)

// hosts are two namespaces standing for two hosts on a LAN (a veth pair,
// lan0 on each), each with a daemon in shared-address mode (siwtun up
// --shared) on its LAN address, as doc/two-machines.md sets them up: no
// other address and no route is added. Programs run on a host through
// siwtun exec, their TCP side channels to the same address as their RDMA.
type hosts struct {
	a, b *env
	dir  string // the programs' working directory (libfabric writes a backtrace file there when a program crashes)
	// sanitized, when set, is the environment that runs the programs on
	// libsiwtun built with AddressSanitizer and UBSan (libasan preloaded
	// for programs built without it).
	sanitized []string
}

// The hosts' LAN addresses, each its RNIC's too.
const (
	hostA = "198.18.40.1"
	hostB = "198.18.40.2"
)

func newHosts(t *testing.T) *hosts {
	t.Helper()
	h := &hosts{a: newNamespace(t, "-a"), b: newNamespace(t, "-b"), dir: t.TempDir()}
	if err := ipnetns.IP("link", "add", "lan0", "netns", h.a.ns, "type", "veth", "peer", "name", "lan0", "netns", h.b.ns); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		e    *env
		addr string
	}{{h.a, hostA}, {h.b, hostB}} {
		x.e.run("ip", "addr", "add", x.addr+"/24", "dev", "lan0")
		x.e.run("ip", "link", "set", "lan0", "up")
		x.e.up("siwtun0", "--shared", x.addr)
	}
	return h
}

// cmd is the program through siwtun exec on host e's siwtun0.
func (h *hosts) cmd(e *env, args ...string) *exec.Cmd {
	c := e.command(append([]string{e.bin, "exec", "--socket-dir", e.sockDir, "--dev", "siwtun0", "--"}, args...)...)
	c.Dir = h.dir
	if h.sanitized != nil {
		c.Env = append(os.Environ(), h.sanitized...)
	}
	return c
}

// sanitize makes the programs run on the sanitizer-built libsiwtun.
func (h *hosts) sanitize(t *testing.T) {
	t.Helper()
	asan, err := exec.Command("gcc", "-print-file-name=libasan.so").Output()
	if err != nil {
		t.Fatalf("gcc -print-file-name=libasan.so: %v", err)
	}
	h.sanitized = []string{"LD_PRELOAD=" + strings.TrimSpace(string(asan)), "SIWTUN_LIB=" + h.a.asanLib(),
		"ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0", "UBSAN_OPTIONS=print_stacktrace=1"}
	// A program gets both: the library and the sanitizers' runtime.
	maps, err := h.run(t, time.Minute, h.a, "cat", "/proc/self/maps")
	if err != nil || !strings.Contains(maps, h.a.asanLib()) || !strings.Contains(maps, "libasan") {
		t.Fatalf("a program under the sanitized environment does not map %s and libasan (%v):\n%s", h.a.asanLib(), err, maps)
	}
}

// sanitizerSaid fails the test if a sanitizer reported anything in out.
func sanitizerSaid(t *testing.T, what, out string) {
	t.Helper()
	if strings.Contains(out, "AddressSanitizer") || strings.Contains(out, "runtime error:") {
		t.Errorf("%s: the sanitizers reported:\n%s", what, out)
	}
}

// run runs the program to its end (at most d) and returns its output.
func (h *hosts) run(t *testing.T, d time.Duration, e *env, args ...string) (string, error) {
	t.Helper()
	c := h.cmd(e, args...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(d, func() { c.Process.Kill() })
	err := c.Wait()
	timer.Stop()
	return out.String(), err
}

// server is a program started on a host; the test's cleanup kills it by
// PID if it still runs.
type server struct {
	out  lockedBuf
	done chan struct{}
	err  error
}

func (h *hosts) start(t *testing.T, e *env, args ...string) *server {
	t.Helper()
	return startServer(t, h.cmd(e, args...))
}

func startServer(t *testing.T, c *exec.Cmd) *server {
	t.Helper()
	s := &server{done: make(chan struct{})}
	c.Stdout, c.Stderr = &s.out, &s.out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.err = c.Wait(); close(s.done) }()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			c.Process.Kill()
			<-s.done
		}
	})
	return s
}

// wait waits for the server to exit (at most d) and returns its output.
func (s *server) wait(d time.Duration) (string, error) {
	select {
	case <-s.done:
		return s.out.String(), s.err
	case <-time.After(d):
		return s.out.String(), fmt.Errorf("still running after %v", d)
	}
}

// exited tells whether the server has exited.
func (s *server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// waitListening waits until host e's RNIC listens on port of the shared
// address (siwtun ctl link lists the RNIC's listener ports as published).
func waitListening(t *testing.T, e *env, port int, s *server) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out, err := e.command(e.bin, "ctl", "link", "-j", "--dev", "siwtun0", "--socket-dir", e.sockDir).Output()
		var links []struct {
			Shared struct {
				Published []int `json:"published"`
			} `json:"shared"`
		}
		if err == nil && json.Unmarshal(out, &links) == nil && len(links) == 1 {
			for _, p := range links[0].Shared.Published {
				if p == port {
					return
				}
			}
		}
		if s.exited() {
			out, err := s.wait(0)
			t.Fatalf("the server exited (%v) before listening on port %d:\n%s", err, port, out)
		}
	}
	t.Fatalf("the RNIC does not listen on port %d after 30 s:\n%s", port, s.out.String())
}

// waitKernelListening waits until a kernel socket of host e listens on
// port (a program's TCP side channel).
func waitKernelListening(t *testing.T, e *env, port int, s *server) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out, _ := e.command("ss", "-Htln", fmt.Sprintf("sport = :%d", port)).Output()
		if strings.Contains(string(out), "LISTEN") {
			return
		}
		if s.exited() {
			out, err := s.wait(0)
			t.Fatalf("the server exited (%v) before listening on port %d:\n%s", err, port, out)
		}
	}
	t.Fatalf("no kernel socket listens on port %d after 30 s:\n%s", port, s.out.String())
}

// qps is what siwtun ctl qp prints for host e's siwtun0.
func (h *hosts) qps(t *testing.T, e *env) string {
	t.Helper()
	out, err := e.command(e.bin, "ctl", "qp", "--dev", "siwtun0", "--socket-dir", e.sockDir).CombinedOutput()
	if err != nil {
		t.Fatalf("siwtun ctl qp: %v\n%s", err, out)
	}
	return string(out)
}

// lockedBuf is an output buffer a running process writes while the test
// reads it.
type lockedBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestLibfabric: libfabric's verbs provider lists each host's siwtun0 at
// the host's address (it maps interface addresses to devices with
// rdma_bind_addr), and fi_pingpong runs between the hosts over verbs (MSG
// endpoints) and over verbs;ofi_rxm (RDM). Its server is given no
// address: libfabric then binds the loopback address and listens on the
// device's own addresses, as on any RNIC.
func TestLibfabric(t *testing.T) {
	for _, p := range []string{"fi_info", "fi_pingpong"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed: install libfabric-bin (.ci/run does)", p)
		}
	}
	h := newHosts(t)
	for _, x := range []struct {
		e    *env
		addr string
	}{{h.a, hostA}, {h.b, hostB}} {
		out, err := h.run(t, time.Minute, x.e, "fi_info", "-p", "verbs")
		for _, want := range []string{"provider: verbs\n", "fabric: Ethernet-iWARP", "domain: siwtun0", "protocol: FI_PROTO_IWARP",
			"provider: verbs;ofi_rxm", "type: FI_EP_RDM"} {
			if err != nil || !strings.Contains(out, want) {
				t.Fatalf("fi_info -p verbs on %s (%v) lacks %q:\n%s", x.addr, err, want, out)
			}
		}
		// The MSG endpoint's source address is the host's.
		out, err = h.run(t, time.Minute, x.e, "fi_info", "-p", "verbs", "-t", "FI_EP_MSG", "-v")
		if want := "src_addr: fi_sockaddr_in://" + x.addr + ":0"; err != nil || !strings.Contains(out, want) {
			t.Fatalf("fi_info -p verbs -t FI_EP_MSG -v on %s (%v) lacks %q:\n%s", x.addr, err, want, out)
		}
	}
	row := regexp.MustCompile(`(?m)^(\S+)\s+(\d+)\s+=(\d+)\s+\S+\s+\S+\s+([\d.]+)\s+([\d.]+)`)
	for _, c := range []struct{ prov, ep string }{{"verbs", "msg"}, {"verbs;ofi_rxm", "rdm"}} {
		srv := h.start(t, h.b, "fi_pingpong", "-p", c.prov, "-e", c.ep)
		// fi_pingpong's default port, where it takes its side channel
		// (kernel TCP) before it makes its endpoint.
		waitKernelListening(t, h.b, 47592, srv)
		cout, cerr := h.run(t, 2*time.Minute, h.a, "fi_pingpong", "-p", c.prov, "-e", c.ep, hostB)
		sout, serr := srv.wait(time.Minute)
		if cerr != nil || serr != nil {
			t.Fatalf("fi_pingpong -p %s -e %s: client %v:\n%s\nserver %v:\n%s", c.prov, c.ep, cerr, cout, serr, sout)
		}
		// Both sides print a row per size, 64 B to 1 MiB, each of its 10
		// transfers answered.
		for side, out := range map[string]string{"client": cout, "server": sout} {
			rows := row.FindAllStringSubmatch(out, -1)
			var sizes []string
			for _, r := range rows {
				if r[2] != "10" || r[3] != "10" {
					t.Errorf("fi_pingpong -p %s -e %s %s: row %q", c.prov, c.ep, side, r[0])
				}
				sizes = append(sizes, r[1])
			}
			if got := strings.Join(sizes, " "); got != "64 256 1k 4k 64k 1m" {
				t.Errorf("fi_pingpong -p %s -e %s %s: sizes %q, want 64 256 1k 4k 64k 1m:\n%s", c.prov, c.ep, side, got, out)
			}
			if side == "client" && len(rows) > 0 {
				last := rows[len(rows)-1]
				t.Logf("fi_pingpong -p %s -e %s, 1 MiB: %s MB/s, %s µs per transfer", c.prov, c.ep, last[4], last[5])
			}
		}
	}
}

// TestHostsRdmacm: rdma-core's cmtime and rdma_xserver/rdma_xclient
// (rdmacm-utils) between the hosts, on libsiwtun built with the
// sanitizers.
func TestHostsRdmacm(t *testing.T) {
	for _, p := range []string{"cmtime", "rdma_xserver", "rdma_xclient"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed: install rdmacm-utils (.ci/run does)", p)
		}
	}
	h := newHosts(t)
	h.sanitize(t)

	// cmtime: 1000 connections set up and torn down at once. Its server
	// (rdma-core 44) never returns: it handles events until one fails. So
	// the check is that every one of its connections was disconnected and
	// its QP destroyed (the device has no QP left), and that it still runs.
	srv := h.start(t, h.b, "cmtime", "-b", hostB, "-c", "1000")
	waitListening(t, h.b, 7471, srv)
	out, err := h.run(t, 3*time.Minute, h.a, "cmtime", "-s", hostB, "-c", "1000")
	if err != nil || !regexp.MustCompile(`(?m)^connect\s*:\s+[\d.]+`).MatchString(out) || strings.Contains(out, "event:") {
		t.Fatalf("cmtime -c 1000: %v\n%s\nserver:\n%s", err, out, srv.out.String())
	}
	sanitizerSaid(t, "cmtime's client", out)
	t.Logf("cmtime -c 1000:\n%s", out)
	var left string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if left = h.qps(t, h.b); strings.Contains(left, "has no queue pairs") {
			break
		}
	}
	if !strings.Contains(left, "has no queue pairs") {
		t.Errorf("cmtime's server still has queue pairs a minute after its client ended:\n%s", left)
	}
	if srv.exited() {
		out, err := srv.wait(0)
		t.Fatalf("cmtime's server exited: %v\n%s", err, out)
	}
	sanitizerSaid(t, "cmtime's server", srv.out.String())

	// rdma_xserver/rdma_xclient: one message over RC, with the default
	// and the named connection type.
	port := 7480
	for _, mode := range [][]string{nil, {"-c", "r"}} {
		port++
		p := strconv.Itoa(port)
		srv := h.start(t, h.b, append([]string{"rdma_xserver", "-p", p}, mode...)...)
		waitListening(t, h.b, port, srv)
		cout, cerr := h.run(t, time.Minute, h.a, append([]string{"rdma_xclient", "-s", hostB, "-p", p}, mode...)...)
		sout, serr := srv.wait(time.Minute)
		if cerr != nil || serr != nil || !strings.Contains(cout, "rdma_xclient: end 0") || !strings.Contains(sout, "rdma_xserver: end 0") {
			t.Fatalf("rdma_xclient %v: %v\n%s\nrdma_xserver: %v\n%s", mode, cerr, cout, serr, sout)
		}
		sanitizerSaid(t, "rdma_xclient", cout)
		sanitizerSaid(t, "rdma_xserver", sout)
	}
	// XRC is InfiniBand's: both sides say so at rdma_create_ep, as on any
	// iWARP device, and neither crashes.
	for _, c := range []struct {
		e    *env
		args []string
	}{{h.b, []string{"rdma_xserver", "-c", "x", "-p", "7490"}}, {h.a, []string{"rdma_xclient", "-c", "x", "-s", hostB, "-p", "7490"}}} {
		out, err := h.run(t, time.Minute, c.e, c.args...)
		ee, ok := err.(*exec.ExitError)
		if !ok || !ee.Exited() || !strings.Contains(out, "rdma_create_ep: Operation not supported") {
			t.Errorf("%s: %v, want an exit status and EOPNOTSUPP:\n%s", strings.Join(c.args, " "), err, out)
		}
		sanitizerSaid(t, c.args[0], out)
	}
}

// TestHostsCMTools: more of rdma-core's tools between the hosts:
// ucmatose (10 connections, 100 messages each), ib_write_bw -R (perftest
// over rdma_cm) and rstream (rsockets).
func TestHostsCMTools(t *testing.T) {
	for _, p := range []string{"ucmatose", "rstream"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed: install rdmacm-utils (.ci/run does)", p)
		}
	}
	h := newHosts(t)
	for _, c := range []struct {
		name     string
		port     int
		srv, cli []string
		want     string // in the client's output
		srvAlso  bool   // and in the server's
	}{
		{"ucmatose", 7471, []string{"ucmatose", "-c", "10", "-C", "100"}, []string{"ucmatose", "-s", hostB, "-c", "10", "-C", "100"},
			"test complete\n", true},
		{"ib_write_bw", 18515, []string{"ib_write_bw", "-R", "-d", "siwtun0", "-s", "65536", "-n", "1000"},
			[]string{"ib_write_bw", "-R", "-d", "siwtun0", "-s", "65536", "-n", "1000", hostB}, " 65536      1000 ", true},
		{"rstream", 7471, []string{"rstream", "-b", hostB, "-S", "65536", "-C", "100"},
			[]string{"rstream", "-s", hostB, "-S", "65536", "-C", "100"}, "64k", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := h.start(t, h.b, c.srv...)
			waitListening(t, h.b, c.port, srv)
			cout, cerr := h.run(t, 2*time.Minute, h.a, c.cli...)
			sout, serr := srv.wait(time.Minute)
			if cerr != nil || serr != nil || !strings.Contains(cout, c.want) || (c.srvAlso && !strings.Contains(sout, c.want)) {
				t.Fatalf("%s: client %v:\n%s\nserver %v:\n%s", c.name, cerr, cout, serr, sout)
			}
			t.Logf("%s client:\n%s", c.name, cout)
		})
	}
}

// TestQperf: qperf's RC tests between the two hosts, its control
// connection to the address of the RNIC it then connects to; then qperf
// rc_bw (64 KiB) and rc_lat taking turns with siwtun perf write in the same
// run, their ratios logged (speed itself is the benchmarks' to judge).
func TestQperf(t *testing.T) {
	if _, err := exec.LookPath("qperf"); err != nil {
		t.Skip("qperf not installed: install qperf (.ci/run does)")
	}
	h := newHosts(t)
	srv := h.start(t, h.b, "qperf")
	waitKernelListening(t, h.b, 19765, srv) // qperf's control port (kernel TCP)
	out, err := h.run(t, 3*time.Minute, h.a, "qperf", hostB, "-cm1", "-t", "2",
		"rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_read_bw", "rc_rdma_write_lat")
	if err != nil {
		t.Fatalf("qperf: %v\n%s\nserver:\n%s", err, out, srv.out.String())
	}
	figure := regexp.MustCompile(`(?m)^(rc_\w+):\n\s+(bw|latency)\s+=\s+([\d.]+) (\S+)`)
	got := figure.FindAllStringSubmatch(out, -1)
	if len(got) != 5 {
		t.Fatalf("qperf printed %d figures, want 5:\n%s", len(got), out)
	}
	for _, m := range got {
		if v, _ := strconv.ParseFloat(m[3], 64); v <= 0 {
			t.Errorf("%s: %s %s %s", m[1], m[2], m[3], m[4])
		}
		t.Logf("%s: %s %s %s", m[1], m[2], m[3], m[4])
	}
	for round := 1; round <= 2; round++ {
		qbw, qlat, qlatPoll := h.qperf(t, "-m", "64k", "rc_bw"), h.qperf(t, "rc_lat"), h.qperf(t, "-cp1", "rc_lat")
		pbw := h.perfWrite(t, "-s", "65536", "-n", "3000") * 1.048576 // MiB/s to qperf's MB/s
		plat := h.perfWrite(t, "--lat", "-s", "2", "-n", "2000")
		t.Logf("round %d: rc_bw 64 KiB %.0f MB/s, siwtun perf write %.0f MB/s: %.2fx; rc_lat %.1f µs (waiting on completion events), "+
			"%.1f µs (polling, -cp1), siwtun perf write --lat %.1f µs: %.2fx, %.2fx", round, qbw, pbw, qbw/pbw, qlat, qlatPoll, plat,
			qlat/plat, qlatPoll/plat)
	}
}

// qperf runs one qperf test from host a against the qperf server of host
// b and returns its figure: MB/s or one-way µs.
func (h *hosts) qperf(t *testing.T, args ...string) float64 {
	t.Helper()
	out, err := h.run(t, time.Minute, h.a, append([]string{"qperf", hostB, "-cm1", "-t", "3"}, args...)...)
	m := regexp.MustCompile(`(?m)^\s+(bw|latency)\s+=\s+([\d.]+) (\S+)`).FindStringSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("qperf %v: %v\n%s", args, err, out)
	}
	v, _ := strconv.ParseFloat(m[2], 64)
	switch m[3] {
	case "MB/sec", "us":
	case "GB/sec":
		v *= 1000
	case "ms":
		v *= 1000
	default:
		t.Fatalf("qperf %v: unit %q:\n%s", args, m[3], out)
	}
	return v
}

// perfWrite runs siwtun perf write between the hosts (server on b) and
// returns the client's figure: bandwidth average in MiB/s, or with --lat
// t_avg in µs (qperf's latency is an average too).
func (h *hosts) perfWrite(t *testing.T, args ...string) float64 {
	t.Helper()
	srv := startServer(t, h.b.command(append([]string{h.b.bin, "perf", "write", "--socket-dir", h.b.sockDir, "-p", "18700"}, args...)...))
	waitListening(t, h.b, 18700, srv)
	out, err := h.a.command(append([]string{h.a.bin, "perf", "write", "--socket-dir", h.a.sockDir, "-p", "18700"},
		append(args, hostB)...)...).CombinedOutput()
	sout, serr := srv.wait(time.Minute)
	f := parsePerf(string(out))
	if err != nil || serr != nil || f == nil {
		t.Fatalf("siwtun perf write %v: %v\n%s\nserver: %v\n%s", args, err, out, serr, sout)
	}
	if strings.Contains(strings.Join(args, " "), "--lat") {
		return f.v[3]
	}
	return f.v[1]
}
