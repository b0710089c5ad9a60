// Package capps runs unmodified C verbs programs — Debian's rping, udaddy,
// perftest and ibverbs-utils, and libsiwtun's own C test — on two siwtun
// daemons through libsiwtun (`siwtun exec`), in a network namespace of
// its own with addresses from 198.18.0.0/15. It needs root, gcc and the
// Debian packages libibverbs-dev, librdmacm-dev, rdmacm-utils, perftest and
// ibverbs-utils (.ci/run installs them); without them it skips and says why.
package capps

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ipnetns "github.com/siwtun/siwtun/internal/netns"
)

// env is the test topology: one namespace, siwtun0 at 198.18.1.2 and
// siwtun1 at 198.18.2.2 (hosts .1), both daemons' sockets in one directory.
type env struct {
	t       *testing.T
	ns      string
	bin     string // siwtun
	ctest   string // siwtun-ctest
	sockDir string
	stops   map[string]func() // by device: stop its daemon (SIGINT, by PID) and wait
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// build compiles siwtun, libsiwtun and siwtun-ctest once per run.
func build(t *testing.T) (bin, ctest string) {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "siwtun-capps-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(buildDir, "siwtun"), "../../cmd/siwtun").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		out, err = exec.Command("make", "-s", "-C", "../../libsiwtun", "all", "test-prog", "OUT="+buildDir).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("make -C libsiwtun: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "siwtun"), filepath.Join(buildDir, "siwtun-ctest")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// need skips the test when something it runs is not installed.
func need(t *testing.T) {
	t.Helper()
	if err := ipnetns.CanRun(); err != nil {
		t.Skip(err)
	}
	for _, h := range []struct{ path, pkg string }{
		{"/usr/include/infiniband/verbs.h", "libibverbs-dev"}, {"/usr/include/rdma/rdma_cma.h", "librdmacm-dev"},
	} {
		if _, err := os.Stat(h.path); err != nil {
			t.Skipf("%s missing: install %s (.ci/run does)", h.path, h.pkg)
		}
	}
	for _, p := range []struct{ prog, pkg string }{
		{"gcc", "gcc"}, {"make", "make"}, {"rping", "rdmacm-utils"}, {"ib_write_bw", "perftest"}, {"ibv_devinfo", "ibverbs-utils"},
	} {
		if _, err := exec.LookPath(p.prog); err != nil {
			t.Skipf("%s not installed: install %s (.ci/run does)", p.prog, p.pkg)
		}
	}
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := newNamespace(t, "")
	e.run("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward; echo 1 > /proc/sys/net/ipv6/conf/all/forwarding")
	// Both RNICs have an IPv4 and an IPv6 address (the documentation
	// prefix 2001:db8::/32), so programs reach them by either.
	e.daemon("siwtun0", "198.18.1.2/24,2001:db8:1::2/64", "198.18.1.1/24,2001:db8:1::1/64")
	e.daemon("siwtun1", "198.18.2.2/24,2001:db8:2::2/64", "198.18.2.1/24,2001:db8:2::1/64")
	return e
}

// newNamespace is an env with no daemon yet: a namespace of its own
// (its name ending in suffix) with loopback up.
func newNamespace(t *testing.T, suffix string) *env {
	t.Helper()
	need(t)
	bin, ctest := build(t)
	e := &env{t: t, bin: bin, ctest: ctest, sockDir: t.TempDir(), stops: map[string]func(){},
		ns: fmt.Sprintf("siwtun-capps-%d-%d%s", os.Getpid(), time.Now().UnixNano()%1e6, suffix)}
	if err := ipnetns.IP("netns", "add", e.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ipnetns.IP("netns", "del", e.ns) })
	e.run("ip", "link", "set", "lo", "up")
	return e
}

// asanLib is libsiwtun built with AddressSanitizer and UBSan.
func (e *env) asanLib() string { return filepath.Join(filepath.Dir(e.ctest), "asan", "libsiwtun.so") }

// asanEnv is the environment of libsiwtun's own C tests: the library built
// with the sanitizers (an UndefinedBehaviorSanitizer report ends the
// program with an error, as an AddressSanitizer one does), and the RNICs'
// addresses (an iWARP GID is a MAC, so the tests cannot read them from it).
func (e *env) asanEnv() []string {
	return []string{"ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0", "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1",
		"SIWTUN_LIB=" + e.asanLib(),
		"SIWTUN_TEST_ADDRS=siwtun0=198.18.1.2,siwtun1=198.18.2.2"}
}

func (e *env) command(args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", e.ns}, args...)...)
}

func (e *env) run(args ...string) {
	e.t.Helper()
	if out, err := e.command(args...).CombinedOutput(); err != nil {
		e.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// daemon starts siwtun up (with the extra flags) and waits for its
// sockets; cleanup stops it (SIGINT, by PID) and waits.
func (e *env) daemon(dev, addr, host string, extra ...string) {
	e.t.Helper()
	e.up(dev, append([]string{"--addr", addr, "--host-addr", host}, extra...)...)
}

// up starts siwtun up on dev with the flags and waits for its sockets;
// cleanup stops it (SIGINT, by PID) and waits.
func (e *env) up(dev string, flags ...string) {
	e.t.Helper()
	var log bytes.Buffer
	args := append([]string{e.bin, "up", "--dev", dev, "--socket-dir", e.sockDir, "--log-level", "warn"}, flags...)
	cmd := e.command(args...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cmd.Process.Signal(os.Interrupt)
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				cmd.Process.Kill()
				<-done
			}
		})
	}
	e.stops[dev] = stop
	e.t.Cleanup(func() {
		stop()
		if e.t.Failed() {
			e.t.Logf("%s log:\n%s", dev, log.String())
		}
	})
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, err1 := os.Stat(filepath.Join(e.sockDir, dev+".sock"))
		_, err2 := os.Stat(filepath.Join(e.sockDir, dev+".ctl"))
		if err1 == nil && err2 == nil {
			return
		}
		select {
		case <-done:
			e.t.Fatalf("siwtun up %s exited:\n%s", dev, log.String())
		default:
		}
	}
	e.t.Fatalf("siwtun up %s: no sockets after 20 s", dev)
}

// app is a program started through siwtun exec.
type app struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer // apart: a pipe's stdout is flushed in blocks
	done   chan struct{}
	err    error
}

// start runs PROGRAM ARGS through `siwtun exec --dev dev` (dev "" sees
// every device); cleanup kills it (by PID) if it is still running.
func (e *env) start(dev string, extraEnv []string, args ...string) *app {
	e.t.Helper()
	cmdArgs := []string{e.bin, "exec", "--socket-dir", e.sockDir}
	if dev != "" {
		cmdArgs = append(cmdArgs, "--dev", dev)
	}
	return e.launch(append(append(cmdArgs, "--"), args...), extraEnv)
}

// launch starts the command line in the namespace with the extra
// environment, collecting its output; cleanup kills it (by PID) if it is
// still running.
func (e *env) launch(cmdArgs, extraEnv []string) *app {
	e.t.Helper()
	a := &app{cmd: e.command(cmdArgs...), done: make(chan struct{})}
	a.cmd.Env = append(os.Environ(), extraEnv...)
	a.cmd.Stdout, a.cmd.Stderr = lockedWriter{&a.mu, &a.stdout}, lockedWriter{&a.mu, &a.stderr}
	if err := a.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	e.t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			a.cmd.Process.Kill()
			<-a.done
		}
	})
	return a
}

// stdoutString is what the program has printed so far.
func (a *app) stdoutString() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stdout.String()
}

// wait waits for the program to exit (at most d) and returns its standard
// output, then its standard error.
func (a *app) wait(t *testing.T, d time.Duration) (string, error) {
	t.Helper()
	var err error
	select {
	case <-a.done:
		err = a.err
	case <-time.After(d):
		a.cmd.Process.Kill()
		<-a.done
		err = fmt.Errorf("still running after %v, killed", d)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stdout.String() + a.stderr.String(), err
}

// lockedWriter lets the test read a buffer the child process writes.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (e *env) output(dev string, args ...string) string {
	e.t.Helper()
	out, err := e.start(dev, nil, args...).wait(e.t, time.Minute)
	if err != nil {
		e.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func TestDevices(t *testing.T) {
	e := newEnv(t)
	out := e.output("", "ibv_devices")
	for _, dev := range []string{"siwtun0", "siwtun1"} {
		if !regexp.MustCompile(`(?m)^\s+` + dev + `\s+[0-9a-f]{16}$`).MatchString(out) {
			t.Errorf("ibv_devices does not list %s:\n%s", dev, out)
		}
	}
	out = e.output("siwtun1", "ibv_devinfo", "-v")
	for _, want := range []string{"hca_id:\tsiwtun1", "transport:\t\t\tiWARP (1)", "vendor_id:\t\t\t0x736977",
		"state:\t\t\tPORT_ACTIVE (4)", "link_layer:\t\tEthernet", "gid_tbl_len:\t\t1"} {
		if !strings.Contains(out, want) {
			t.Errorf("ibv_devinfo -v lacks %q:\n%s", want, out)
		}
	}
	// An iWARP GID is the interface's MAC and zeros (siw's form), which
	// ibv_devinfo takes for an unset GID and does not print, as for siw;
	// the node GUID is the MAC's EUI-64 (ff:fe in the middle).
	if strings.Contains(out, "GID[") || !regexp.MustCompile(`node_guid:\s+[0-9a-f]{4}:[0-9a-f]{2}ff:fe[0-9a-f]{2}:[0-9a-f]{4}\n`).MatchString(out) {
		t.Errorf("ibv_devinfo -v shows a GID, or a node GUID not of a MAC:\n%s", out)
	}
	if strings.Contains(out, "siwtun0") {
		t.Errorf("--dev siwtun1 still shows siwtun0:\n%s", out)
	}
	t.Logf("ibv_devices and ibv_devinfo -v show both devices as iWARP RNICs")

	// siwtun exec: the environment it hands over, and a missing library.
	out = e.output("siwtun1", "env")
	if !strings.Contains(out, "LD_PRELOAD="+filepath.Join(filepath.Dir(e.bin), "libsiwtun.so")+"\n") ||
		!strings.Contains(out, "SIWTUN_DEV=siwtun1\n") || !strings.Contains(out, "SIWTUN_SOCKET_DIR="+e.sockDir+"\n") {
		t.Errorf("siwtun exec -- env:\n%s", out)
	}
	miss := e.command(e.bin, "exec", "--", "true")
	miss.Env = append(os.Environ(), "SIWTUN_LIB=/nonexistent/libsiwtun.so")
	if b, err := miss.CombinedOutput(); err == nil || !strings.Contains(string(b), "siwtun: SIWTUN_LIB: stat /nonexistent/libsiwtun.so") {
		t.Errorf("siwtun exec with a missing library: %v\n%s", err, b)
	}

	// No daemon: an empty list and one line saying why.
	empty := t.TempDir()
	cmd := e.command(e.bin, "exec", "--socket-dir", empty, "--", "ibv_devinfo")
	b, _ := cmd.CombinedOutput()
	if n := strings.Count(string(b), "libsiwtun: no siwtun device"); n != 1 || !strings.Contains(string(b), "No IB devices found") {
		t.Errorf("ibv_devinfo with no daemon:\n%s", b)
	}
}

func TestCTest(t *testing.T) {
	e := newEnv(t)
	for i, mode := range [][]string{nil, {"--terminate"}, {"--no-imm"}} {
		if mode != nil && mode[0] == "--no-imm" {
			// siwtun1 again, without RFC 7306: immediate data toward it
			// fails at post time.
			e.stops["siwtun1"]()
			e.daemon("siwtun1", "198.18.2.2/24", "198.18.2.1/24", "--rdmap-ext", "off")
		}
		// The library built with ASan and UBSan, under the ASan-built test.
		args := append(append([]string{e.ctest}, mode...), "siwtun0", "siwtun1", strconv.Itoa(17990+i))
		out, err := e.start("", e.asanEnv(),
			args...).wait(t, 2*time.Minute)
		if err != nil || !strings.Contains(out, "\nPASS\n") {
			t.Fatalf("siwtun-ctest %v: %v\n%s", mode, err, out)
		}
		// Every case of the program's table for this mode reported, in
		// the table's order: a case left out of a run is a check not made.
		list, err := exec.Command(e.ctest, append(mode, "--list")...).Output()
		var names []string // each line: the case's name, a tab, what it checks
		for _, line := range strings.Split(strings.TrimSpace(string(list)), "\n") {
			name, _, _ := strings.Cut(line, "\t")
			names = append(names, name)
		}
		if err != nil || len(names) < 20 {
			t.Fatalf("siwtun-ctest %v --list: %v\n%s", mode, err, list)
		}
		var oks []string
		for _, line := range strings.Split(out, "\n") {
			if name, ok := strings.CutPrefix(line, "ok "); ok {
				oks = append(oks, name)
			}
		}
		if strings.Join(oks, " ") != strings.Join(names, " ") {
			t.Fatalf("siwtun-ctest %v reported\n%v\nwant the cases\n%v", mode, oks, names)
		}
		t.Logf("siwtun-ctest %v (%d cases):\n%s", mode, len(names), out)
	}
}

// TestRemoval stops a daemon under a program holding its device: the
// program gets IBV_EVENT_DEVICE_FATAL, its completion channel wakes,
// RDMA_CM_EVENT_DEVICE_REMOVAL arrives and later calls fail with ENODEV.
func TestRemoval(t *testing.T) {
	e := newEnv(t)
	a := e.start("", e.asanEnv(),
		e.ctest, "--removal", "siwtun0")
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(a.stdoutString(), "ready\n"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			out, err := a.wait(t, time.Second)
			t.Fatalf("siwtun-ctest --removal not ready: %v\n%s", err, out)
		}
	}
	e.stops["siwtun0"]()
	out, err := a.wait(t, time.Minute)
	if err != nil || !strings.Contains(out, "\nPASS\n") {
		t.Fatalf("siwtun-ctest --removal: %v\n%s", err, out)
	}
	t.Logf("siwtun-ctest --removal:\n%s", out)
}

// TestKilledClient kills an rping client (SIGKILL, by PID) in the middle
// of its pings: both daemons release its queue pairs.
func TestKilledClient(t *testing.T) {
	e := newEnv(t)
	srv := e.start("siwtun1", nil, "rping", "-s", "-a", "198.18.2.2", "-p", "7200", "-S", "4096")
	var cli *app
	for try := 0; ; try++ {
		time.Sleep(200 * time.Millisecond)
		cli = e.start("siwtun0", nil, "rping", "-c", "-a", "198.18.2.2", "-p", "7200", "-v", "-C", "0", "-S", "4096")
		deadline := time.Now().Add(20 * time.Second)
		for strings.Count(cli.stdoutString(), "ping data: ") < 20 && time.Now().Before(deadline) {
			select {
			case <-cli.done:
				deadline = time.Now()
			default:
				time.Sleep(20 * time.Millisecond)
			}
		}
		if strings.Count(cli.stdoutString(), "ping data: ") >= 20 {
			break
		}
		out, _ := cli.wait(t, time.Second)
		if try == 10 || !strings.Contains(out, "RDMA_CM_EVENT_REJECTED") {
			t.Fatalf("rping client did not get going:\n%s", lastLines(out, 5))
		}
	}
	cli.cmd.Process.Kill()
	cli.wait(t, 10*time.Second)
	srv.wait(t, 30*time.Second) // rping's server ends with its client
	for _, dev := range []string{"siwtun0", "siwtun1"} {
		var out []byte
		deadline := time.Now().Add(15 * time.Second)
		for {
			var err error
			out, err = e.command(e.bin, "ctl", "qp", "-j", "--dev", dev, "--socket-dir", e.sockDir).Output()
			s := strings.TrimSpace(string(out))
			if err == nil && (s == "[]" || s == "null") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still has queue pairs after the client was killed: %v\n%s", dev, err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("client killed after %d pings; siwtun ctl qp is empty on both daemons", strings.Count(cli.stdoutString(), "ping data: "))
}

// rpingLine is what rping -v prints for ping i of size bytes: its
// "rdma-ping-%d: " then letters from 'A'+i (mod 58) upwards, wrapping after
// 'z', up to size-1 characters.
func rpingLine(i, size int) string {
	b := []byte(fmt.Sprintf("rdma-ping-%d: ", i))
	c := byte(65 + i%58)
	for len(b) < size-1 {
		b = append(b, c)
		c++
		if c > 122 {
			c = 65
		}
	}
	return string(b[:size-1])
}

func TestRping(t *testing.T) {
	e := newEnv(t)
	// -q: QPs the programs create and move through INIT/RTR/RTS themselves.
	// v6: the same between the RNICs' IPv6 addresses (rdma_cm resolves
	// and connects AF_INET6 sockaddrs).
	for i, tc := range []struct {
		size int
		q    bool
		v6   bool
	}{{64, false, false}, {4096, false, false}, {65535, false, false}, {4096, true, false}, {4096, false, true}} {
		size := tc.size
		port := strconv.Itoa(7174 + i)
		var flags []string
		name := strconv.Itoa(size)
		if tc.q {
			flags = []string{"-q"}
			name += "-q"
		}
		server := "198.18.2.2"
		if tc.v6 {
			server = "2001:db8:2::2"
			name += "-ipv6"
		}
		t.Run(name, func(t *testing.T) {
			srv := e.start("siwtun1", nil, append([]string{"rping", "-s", "-a", server, "-p", port, "-v", "-V", "-S", strconv.Itoa(size)}, flags...)...)
			var out string
			var err error
			// The server listens once its daemon session is up; a client
			// that comes first is refused and tries again.
			for try := 0; try < 20; try++ {
				time.Sleep(200 * time.Millisecond)
				out, err = e.start("siwtun0", nil, append([]string{"rping", "-c", "-a", server, "-p", port, "-v", "-V", "-C", "100",
					"-S", strconv.Itoa(size)}, flags...)...).wait(t, time.Minute)
				if !strings.Contains(out, "RDMA_CM_EVENT_REJECTED") {
					break
				}
			}
			if err != nil {
				t.Fatalf("rping -c: %v\n%s", err, out)
			}
			sout, serr := srv.wait(t, 30*time.Second)
			if serr != nil {
				t.Fatalf("rping -s: %v\n%s", serr, sout)
			}
			for p := 0; p < 100; p++ {
				want := rpingLine(p, size)
				if !strings.Contains(out, "ping data: "+want+"\n") {
					t.Fatalf("client: ping %d missing or wrong", p)
				}
				if !strings.Contains(sout, "server ping data: "+want+"\n") {
					t.Fatalf("server: ping %d missing or wrong", p)
				}
			}
			if strings.Count(out, "\nping data: ")+boolInt(strings.HasPrefix(out, "ping data: ")) != 100 {
				t.Errorf("client printed %d pings, want 100", strings.Count(out, "ping data: "))
			}
			if !strings.Contains(sout, "server DISCONNECT EVENT") {
				t.Errorf("server saw no DISCONNECT:\n%s", lastLines(sout, 3))
			}
			t.Logf("rping -a %s -S %d -C 100 %v: 100 pings verified on both sides, then DISCONNECT events", server, size, flags)
		})
	}
}

// TestUdaddy runs rdma-core's udaddy, which sends datagrams on UD queue
// pairs found through rdma_cm's RDMA_PS_UDP (or RDMA_PS_IPOIB) port space.
// iWARP has no UD service (RDMAP, RFC 5040, is carried by DDP over MPA over
// TCP: connection-oriented only; Linux's siw creates RC QPs only and
// refuses the rest with EOPNOTSUPP), so both sides must stop at once with
// EOPNOTSUPP and udaddy's own error lines: the server at rdma_listen, the
// client at rdma_create_qp, as on siw. No crash, no hang, nothing left in
// the daemons.
func TestUdaddy(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name, dev string
		args      []string
		want      string
	}{
		{"server", "siwtun1", []string{"udaddy", "-b", "198.18.2.2"}, "udaddy: failure trying to listen: Operation not supported\n"},
		{"client", "siwtun0", []string{"udaddy", "-s", "198.18.2.2"}, "udaddy: unable to create QP: Operation not supported\n"},
		{"client-ipoib", "siwtun0", []string{"udaddy", "-s", "198.18.2.2", "-P", "ipoib"}, "udaddy: unable to create QP: Operation not supported\n"},
	} {
		start := time.Now()
		out, err := e.start(tc.dev, nil, tc.args...).wait(t, 30*time.Second)
		took := time.Since(start)
		ee, ok := err.(*exec.ExitError)
		// udaddy returns its status -1 from main: exit status 255, not a
		// signal.
		if !ok || ee.ExitCode() != 255 || !strings.Contains(out, tc.want) || !strings.Contains(out, "return status -1\n") {
			t.Fatalf("%s %v: %v after %v\n%s", tc.name, tc.args, err, took.Round(time.Millisecond), out)
		}
		if took > 10*time.Second {
			t.Errorf("%s took %v to fail", tc.name, took)
		}
		t.Logf("udaddy %s: %q, exit 255 after %v", tc.name, strings.TrimSpace(tc.want), took.Round(time.Millisecond))
	}
	for _, dev := range []string{"siwtun0", "siwtun1"} {
		out, err := e.command(e.bin, "ctl", "qp", "-j", "--dev", dev, "--socket-dir", e.sockDir).Output()
		if s := strings.TrimSpace(string(out)); err != nil || (s != "[]" && s != "null") {
			t.Errorf("%s has queue pairs after udaddy: %v\n%s", dev, err, out)
		}
	}
}

// TestRdmaServerClient runs rdma-core's rdma_server and rdma_client
// examples: librdmacm's synchronous endpoint API (rdma_create_ep,
// rdma_get_request, blocking rdma_connect/rdma_accept) and rdma_verbs.h's
// helpers, one Send each way.
func TestRdmaServerClient(t *testing.T) {
	e := newEnv(t)
	srv := e.start("siwtun1", nil, "rdma_server", "-s", "198.18.2.2", "-p", "7471")
	var out string
	var err error
	for try := 0; try < 20; try++ {
		time.Sleep(200 * time.Millisecond)
		out, err = e.start("siwtun0", nil, "rdma_client", "-s", "198.18.2.2", "-p", "7471").wait(t, time.Minute)
		if err == nil || !strings.Contains(out, "Connection refused") {
			break
		}
	}
	sout, serr := srv.wait(t, 30*time.Second)
	if err != nil || serr != nil || !strings.Contains(out, "rdma_client: end 0") || !strings.Contains(sout, "rdma_server: end 0") {
		t.Fatalf("rdma_client: %v\n%s\nrdma_server: %v\n%s", err, out, serr, sout)
	}
	t.Logf("rdma_client: end 0, rdma_server: end 0")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// perfReport is the result line under perftest's "#bytes" header: bytes,
// iterations, then the figures. Bandwidth: peak, average[MB/sec], message
// rate. Latency with a fixed count: t_min, t_max, t_typical, t_avg[usec],
// t_stdev, percentiles.
var perfReport = regexp.MustCompile(`(?m)^\s*#bytes.*\n\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)(?:\s+([\d.]+))?`)

// perfCase is one perftest test: the program (ib_write_bw ...), siwtun
// perf's verb for it, the message size and whether it measures latency.
type perfCase struct {
	prog, verb, size string
	lat              bool
}

var perfCases = []perfCase{
	{"ib_write_bw", "write", "65536", false}, {"ib_read_bw", "read", "65536", false}, {"ib_send_bw", "send", "65536", false},
	{"ib_write_lat", "write", "2", true}, {"ib_read_lat", "read", "2", true}, {"ib_send_lat", "send", "2", true},
	// RFC 7306 Fetch-and-Add (siwtun perf atomic against ib_atomic_bw).
	{"ib_atomic_bw", "atomic", "8", false},
}

// iters is a fixed count, not a duration: each side would time its own
// seconds, and a server that ends first flushes the client.
func (c perfCase) iters() string {
	if c.lat {
		return "300"
	}
	return "1000"
}

// perfFigures is one side's parsed report row.
type perfFigures struct {
	row, size, iters string
	// Bandwidth: peak, average (MiB/s), message rate (Mpps), 0.
	// Latency: t_min, t_max, t_typical, t_avg (µs).
	v [4]float64
}

func parsePerf(out string) *perfFigures {
	m := perfReport.FindStringSubmatch(out)
	if m == nil {
		return nil
	}
	f := &perfFigures{row: strings.Join(strings.Fields(m[0][strings.LastIndex(m[0], "\n")+1:]), " "), size: m[1], iters: m[2]}
	for i := range f.v {
		f.v[i], _ = strconv.ParseFloat(m[3+i], 64)
	}
	return f
}

// checkPerf checks the reports of a perftest run, cout the client's output
// and sout the server's, and returns the client's figure (bandwidth average
// in MiB/s, or t_avg in µs). Both sides must report the size and count
// asked for, with sane figures: bandwidth average and message rate above
// zero; latency 0 < t_min <= t_typical, t_avg <= t_max, under a second.
// The two reports must agree: bandwidth averages within 20 % (Write and
// Read: the server prints the client's row, which perftest sends it; Send:
// each side measures its own), latency t_avg within a factor of 2 (each
// side times the same ping-pong). Read latency is timed by the client
// alone: perftest's server prints no report.
func checkPerf(t *testing.T, c perfCase, cout, sout string) float64 {
	t.Helper()
	cf, sf := parsePerf(cout), parsePerf(sout)
	serverReports := !(c.lat && c.verb == "read")
	if cf == nil || (sf != nil) != serverReports {
		t.Fatalf("reports: client's %v, server's %v (want one: %v):\nclient:\n%s\nserver:\n%s",
			cf != nil, sf != nil, serverReports, cout, sout)
	}
	check := func(side string, f *perfFigures) float64 {
		if f.size != c.size || f.iters != c.iters() {
			t.Fatalf("%s report %q: want %s bytes, %s iterations", side, f.row, c.size, c.iters())
		}
		if !c.lat {
			peak, avg, rate := f.v[0], f.v[1], f.v[2]
			if avg <= 0 || rate <= 0 || peak < 0 {
				t.Fatalf("%s report %q: bandwidth or message rate not above zero", side, f.row)
			}
			return avg
		}
		tMin, tMax, tTyp, tAvg := f.v[0], f.v[1], f.v[2], f.v[3]
		if !(tMin > 0 && tMin <= tTyp && tTyp <= tMax && tMin <= tAvg && tAvg <= tMax && tMax < 1e6) {
			t.Fatalf("%s report %q: want 0 < t_min <= t_typical, t_avg <= t_max < 1 s", side, f.row)
		}
		return tAvg
	}
	cv := check("client", cf)
	if sf != nil {
		sv := check("server", sf)
		tol := 1.2
		if c.lat {
			tol = 2
		}
		if cv/sv > tol || sv/cv > tol {
			t.Errorf("client and server disagree (more than %gx):\n%s\n%s", tol, cf.row, sf.row)
		}
	}
	return cv
}

func (c perfCase) unit() string {
	if c.lat {
		return "µs t_avg"
	}
	return "MiB/s average"
}

// TestPerftestVsSiwtunPerf runs perftest through libsiwtun against siwtun
// perf (Go, over the verbs socket), each as server and as client: RDMA
// WRITE, RDMA READ and Send bandwidth at 64 KiB and latency at 2 B, and
// Fetch-and-Add (ib_atomic_bw against siwtun perf atomic), both sides'
// reports checked.
func TestPerftestVsSiwtunPerf(t *testing.T) {
	e := newEnv(t)
	port := 18600
	for _, c := range perfCases {
		var goArgs []string
		if c.lat {
			goArgs = []string{"--lat"}
		}
		for _, cServer := range []bool{true, false} {
			port++
			name := c.prog + "/siwtun-perf-client-perftest-server"
			if !cServer {
				name = c.prog + "/perftest-client-siwtun-perf-server"
			}
			t.Run(name, func(t *testing.T) {
				args := []string{"-s", c.size, "-n", c.iters(), "-p", strconv.Itoa(port)}
				goCmd := func(dev string, extra ...string) []string {
					return append(append(append([]string{e.bin, "perf", c.verb, "--dev", dev, "--socket-dir", e.sockDir}, goArgs...), args...), extra...)
				}
				var srv *app
				if cServer {
					srv = e.start("siwtun1", nil, append([]string{c.prog, "-R", "-d", "siwtun1"}, args...)...)
				} else {
					srv = &app{done: make(chan struct{})}
					srv.cmd = e.command(goCmd("siwtun1")...)
					srv.cmd.Stdout, srv.cmd.Stderr = lockedWriter{&srv.mu, &srv.stdout}, lockedWriter{&srv.mu, &srv.stderr}
					if err := srv.cmd.Start(); err != nil {
						t.Fatal(err)
					}
					go func() { srv.err = srv.cmd.Wait(); close(srv.done) }()
					t.Cleanup(func() {
						select {
						case <-srv.done:
						default:
							srv.cmd.Process.Kill()
							<-srv.done
						}
					})
				}
				time.Sleep(time.Second)
				var cout string
				var cerr error
				if cServer {
					c := e.command(goCmd("siwtun0", "198.18.2.2")...)
					b, err := c.CombinedOutput()
					cout, cerr = string(b), err
				} else {
					cout, cerr = e.start("siwtun0", nil, append(append([]string{c.prog, "-R", "-d", "siwtun0"}, args...), "198.18.2.2")...).wait(t, time.Minute)
				}
				sout, serr := srv.wait(t, time.Minute)
				if cerr != nil || serr != nil {
					t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cout, serr, sout)
				}
				v := checkPerf(t, c, cout, sout)
				t.Logf("%s -s %s: %s iterations, client %.2f %s; server %s", name, c.size, c.iters(), v, c.unit(),
					serverRow(sout))
			})
		}
	}
}

// serverRow is the server's report row, or a note that it printed none.
func serverRow(out string) string {
	if f := parsePerf(out); f != nil {
		return f.row
	}
	return "printed no report (read latency: the client alone times it, as in perftest)"
}

func TestPerftest(t *testing.T) {
	e := newEnv(t)
	type dir struct{ srvDev, cliDev, srvAddr string }
	dirs := []dir{{"siwtun1", "siwtun0", "198.18.2.2"}, {"siwtun0", "siwtun1", "198.18.1.2"}}
	port := 18515
	for _, c := range perfCases {
		for _, d := range dirs {
			port++
			name := fmt.Sprintf("%s/%s-to-%s", c.prog, d.cliDev, d.srvDev)
			t.Run(name, func(t *testing.T) {
				args := []string{"-R", "-s", c.size, "-n", c.iters(), "-p", strconv.Itoa(port)}
				srv := e.start(d.srvDev, nil, append([]string{c.prog, "-d", d.srvDev}, args...)...)
				time.Sleep(time.Second) // the server's listener
				cout, cerr := e.start(d.cliDev, nil, append([]string{c.prog, "-d", d.cliDev}, append(args, d.srvAddr)...)...).wait(t, time.Minute)
				sout, serr := srv.wait(t, time.Minute)
				if cerr != nil || serr != nil {
					t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cout, serr, sout)
				}
				v := checkPerf(t, c, cout, sout)
				t.Logf("%s -R -s %s: %s iterations, client %.2f %s; server %s", c.prog, c.size, c.iters(), v, c.unit(), serverRow(sout))
			})
		}
	}
}
