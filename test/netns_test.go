// Package test holds siwtun's integration tests: real TUN devices, daemons
// as separate processes and clients in other processes, inside network
// namespaces the tests create and remove. They need root and /dev/net/tun
// and skip with the reason otherwise.
package test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	// Renamed: this package's type netns is a namespace a test created.
	ipnetns "github.com/siwtun/siwtun/internal/netns"
	"github.com/siwtun/siwtun/internal/syncbuf"
)

// requireRoot skips a test that needs root, /dev/net/tun and ip(8),
// saying which is missing.
func requireRoot(t testing.TB) {
	t.Helper()
	if err := ipnetns.CanRun(); err != nil {
		t.Skip(err)
	}
}

// siwtunBin builds the siwtun binary once per test run.
func siwtunBin(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SIWTUN_TEST_BIN_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	bin := filepath.Join(dir, "siwtun")
	if _, err := os.Stat(bin); err == nil && os.Getenv("SIWTUN_TEST_BIN_DIR") != "" {
		return bin
	}
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/siwtun")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// netns is a network namespace this test created.
type netns struct {
	t    testing.TB
	name string
}

// newNetns creates a namespace with loopback up and forwarding on; it is
// removed (with every process the test started in it) at cleanup.
func newNetns(t testing.TB) *netns {
	t.Helper()
	name := fmt.Sprintf("siwtun-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if err := ipnetns.IP("netns", "add", name); err != nil {
		t.Fatal(err)
	}
	n := &netns{t: t, name: name}
	t.Cleanup(func() { ipnetns.IP("netns", "del", name) })
	n.run("ip", "link", "set", "lo", "up")
	// The namespace's kernel routes between the RNICs' TUN devices.
	n.run("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward; echo 1 > /proc/sys/net/ipv6/conf/all/forwarding")
	return n
}

// run runs a command in the namespace and fails the test if it fails.
func (n *netns) run(args ...string) string {
	n.t.Helper()
	out, err := n.command(args...).CombinedOutput()
	if err != nil {
		n.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (n *netns) command(args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.name}, args...)...)
}

// daemon is a siwtun up process in a namespace.
type daemon struct {
	dev       string
	cmd       *exec.Cmd
	log       *syncbuf.Buffer
	socketDir string
	exited    chan struct{} // closed when the process has been waited for
	err       error         // its exit status, set before exited closes
}

// startDaemon runs siwtun up in n and waits until its control socket answers.
func startDaemon(t testing.TB, n *netns, bin, dev, addr, hostAddr string, mtu int, extra ...string) *daemon {
	t.Helper()
	return startUp(t, n, bin, dev, append([]string{"--addr", addr, "--host-addr", hostAddr, "--mtu", fmt.Sprint(mtu)}, extra...)...)
}

// startUp runs `siwtun up --dev dev flags...` (with a socket directory of
// its own and debug logs) in n and waits until its sockets answer.
func startUp(t testing.TB, n *netns, bin, dev string, flags ...string) *daemon {
	t.Helper()
	return startUpWith(t, n, nil, bin, dev, flags...)
}

// startUpWith is startUp with the command line of `siwtun up` put after
// wrapper (a program that runs it: setpriv, unshare, ...).
func startUpWith(t testing.TB, n *netns, wrapper []string, bin, dev string, flags ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	for i, a := range flags {
		if a == "--socket-dir" && i+1 < len(flags) {
			dir = flags[i+1] // daemons sharing one directory (the last flag wins)
		}
	}
	args := append(append([]string{}, wrapper...), bin, "up", "--dev", dev, "--socket-dir", dir, "--log-level", "debug")
	for _, a := range flags {
		// {dev} names this daemon's device, so one flag list can give each
		// daemon a file of its own (SIWTUN_UP_FLAGS=--cpuprofile=/tmp/{dev}.pprof).
		args = append(args, strings.ReplaceAll(a, "{dev}", dev))
	}
	d := &daemon{dev: dev, cmd: n.command(args...), log: &syncbuf.Buffer{}, socketDir: dir, exited: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("siwtun up: %v", err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("%s log:\n%s", dev, d.log)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(filepath.Join(dir, dev+".sock")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, dev+".ctl")); err == nil {
				return d
			}
		}
		select {
		case <-d.exited:
			t.Fatalf("siwtun up %s exited: %v\n%s", dev, d.err, d.log)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("siwtun up %s: sockets not ready after 20 s\n%s", dev, d.log)
	return nil
}

// stop sends SIGINT (unless the daemon has exited) and waits for it to exit.
func (d *daemon) stop() error {
	select {
	case <-d.exited:
		return d.err
	default:
	}
	d.cmd.Process.Signal(os.Interrupt)
	select {
	case <-d.exited:
		return d.err
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		return fmt.Errorf("%s did not stop within 20 s", d.dev)
	}
}

// pid is the daemon's process id: ip netns exec execs siwtun in place, so
// it is the siwtun process itself.
func (d *daemon) pid() int { return d.cmd.Process.Pid }

// kill sends SIGKILL to the daemon (by its PID) and waits until it has
// been reaped.
func (d *daemon) kill(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(d.pid(), syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s (pid %d): %v", d.dev, d.pid(), err)
	}
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s (pid %d) still running 10 s after SIGKILL", d.dev, d.pid())
	}
}

// grepLog reports whether the daemon logged a line containing s.
func (d *daemon) grepLog(s string) bool {
	sc := bufio.NewScanner(bytes.NewReader(d.log.Bytes()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			return true
		}
	}
	return false
}

// ctx is a test-bounded context.
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}
