package capps

import (
	"bytes"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ipnetns "github.com/siwtun/siwtun/internal/netns"
)

// hosts are two namespaces standing for two hosts of a shared-address
// set-up, joined by a veth pair as their LAN: hostA's interface siwtun0 has
// siwtun0's RNIC address, hostB's siwtun1 siwtun1's. Programs run there,
// with a kernel TCP path to each other's address (their side channel),
// while their RDMA runs through the daemons of e's namespace, which
// libsiwtun reaches over its Unix sockets.
type hosts struct {
	e    *env
	a, b string
	dir  string // the programs' working directory (libfabric writes a backtrace file there when a program crashes)
}

func newHosts(t *testing.T, e *env) *hosts {
	t.Helper()
	h := &hosts{e: e, a: e.ns + "-a", b: e.ns + "-b", dir: t.TempDir()}
	for _, ns := range []string{h.a, h.b} {
		if err := ipnetns.IP("netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		ns := ns
		t.Cleanup(func() { ipnetns.IP("netns", "del", ns) })
	}
	for _, c := range [][]string{
		{"-n", h.a, "link", "set", "lo", "up"}, {"-n", h.b, "link", "set", "lo", "up"},
		{"-n", h.a, "link", "add", "siwtun0", "type", "veth", "peer", "name", "siwtun1", "netns", h.b},
		{"-n", h.a, "addr", "add", "198.18.1.2/24", "dev", "siwtun0"}, {"-n", h.b, "addr", "add", "198.18.2.2/24", "dev", "siwtun1"},
		{"-n", h.a, "link", "set", "siwtun0", "up"}, {"-n", h.b, "link", "set", "siwtun1", "up"},
		{"-n", h.a, "route", "add", "198.18.2.0/24", "dev", "siwtun0"}, {"-n", h.b, "route", "add", "198.18.1.0/24", "dev", "siwtun1"},
	} {
		if err := ipnetns.IP(c...); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// cmd is the program through siwtun exec on dev, in namespace ns.
func (h *hosts) cmd(ns, dev string, args ...string) *exec.Cmd {
	c := exec.Command("ip", append([]string{"netns", "exec", ns, h.e.bin, "exec", "--socket-dir", h.e.sockDir, "--dev", dev, "--"},
		args...)...)
	c.Dir = h.dir
	return c
}

// run runs the program to its end (at most d) and returns its output.
func (h *hosts) run(t *testing.T, d time.Duration, ns, dev string, args ...string) (string, error) {
	t.Helper()
	c := h.cmd(ns, dev, args...)
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

// start starts a server; the test's cleanup kills it by PID if it still
// runs.
func (h *hosts) start(t *testing.T, ns, dev string, args ...string) (*exec.Cmd, *lockedBuf) {
	t.Helper()
	c := h.cmd(ns, dev, args...)
	b := &lockedBuf{}
	c.Stdout, c.Stderr = b, b
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			c.Process.Kill()
			<-done
		}
	})
	return c, b
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

// TestLibfabric: libfabric's verbs provider lists siwtun0 (it maps
// interface addresses to devices with rdma_bind_addr), and fi_pingpong runs
// over verbs (MSG endpoints) and over verbs;ofi_rxm (RDM), its client and
// server on siwtun0, their control connection over kernel TCP.
func TestLibfabric(t *testing.T) {
	for _, p := range []string{"fi_info", "fi_pingpong"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed: install libfabric-bin (.ci/run does)", p)
		}
	}
	e := newEnv(t)
	h := newHosts(t, e)
	out, err := h.run(t, time.Minute, h.a, "siwtun0", "fi_info", "-p", "verbs")
	for _, want := range []string{"provider: verbs\n", "fabric: Ethernet-iWARP", "domain: siwtun0", "protocol: FI_PROTO_IWARP",
		"provider: verbs;ofi_rxm", "type: FI_EP_RDM"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("fi_info -p verbs (%v) lacks %q:\n%s", err, want, out)
		}
	}
	row := regexp.MustCompile(`(?m)^64k\s+100\s+=100\s+\S+\s+\S+\s+([\d.]+)\s+([\d.]+)`)
	for i, c := range []struct{ prov, ep string }{{"verbs", "msg"}, {"verbs;ofi_rxm", "rdm"}} {
		port := strconv.Itoa(47600 + i)
		args := []string{"fi_pingpong", "-p", c.prov, "-e", c.ep, "-I", "100", "-S", "65536", "-B", port}
		_, srv := h.start(t, h.a, "siwtun0", args...)
		time.Sleep(time.Second)
		cout, err := h.run(t, 2*time.Minute, h.a, "siwtun0", "fi_pingpong", "-p", c.prov, "-e", c.ep, "-I", "100", "-S", "65536",
			"-P", port, "198.18.1.2")
		m := row.FindStringSubmatch(cout)
		if err != nil || m == nil {
			t.Fatalf("fi_pingpong -p %s -e %s: %v\nclient:\n%s\nserver:\n%s", c.prov, c.ep, err, cout, srv.String())
		}
		t.Logf("fi_pingpong -p %s -e %s, 64 KiB: %s MB/s, %s µs per transfer", c.prov, c.ep, m[1], m[2])
	}
}

// TestQperf: qperf's RC tests between the two hosts, its control
// connection to the address of the RNIC it then connects to (hostB's
// siwtun1 is siwtun1's RNIC address).
func TestQperf(t *testing.T) {
	if _, err := exec.LookPath("qperf"); err != nil {
		t.Skip("qperf not installed: install qperf (.ci/run does)")
	}
	e := newEnv(t)
	h := newHosts(t, e)
	_, srv := h.start(t, h.b, "siwtun1", "qperf")
	time.Sleep(time.Second)
	out, err := h.run(t, 3*time.Minute, h.a, "siwtun0", "qperf", "198.18.2.2", "-cm1", "-t", "2",
		"rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_read_bw", "rc_rdma_write_lat")
	if err != nil {
		t.Fatalf("qperf: %v\n%s\nserver:\n%s", err, out, srv.String())
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
}
