package interop

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/syncbuf"
)

// proc is a process this test started in the peer's namespace (ip netns
// exec execs the command in place, so the PID is the command's own).
type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr *syncbuf.Buffer
	exited         chan struct{}
	err            error
}

// startProc starts args in namespace netns; at cleanup a process still
// running gets SIGINT, then SIGKILL after 10 s.
func startProc(t *testing.T, netns, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command("ip", append([]string{"netns", "exec", netns}, args...)...),
		stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

// stop ends the process by its PID: SIGINT, then SIGKILL after 10 s.
func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	syscall.Kill(p.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// wait waits up to d for the process to exit and returns its exit status
// (-1 if it had to be killed).
func (p *proc) wait(d time.Duration) int {
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		p.stop()
		return -1
	}
}

// waitFor waits up to d until the process printed s on stdout or stderr.
func (p *proc) waitFor(s string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for !strings.Contains(p.stdout.String(), s) && !strings.Contains(p.stderr.String(), s) {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited (%v) before printing %q\n%s%s", p.name, p.err, s, p.stdout, p.stderr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not print %q within %v\n%s%s", p.name, s, d, p.stdout, p.stderr)
		}
	}
	return nil
}

// daemon is a siwtun up process with its sockets in dir.
type daemon struct {
	*proc
	dir  string
	args []string
	addr string // where peers reach the RNIC: rnicIP, or the shared address
}

// startDaemon runs siwtun up on siwtun0 in the peer's namespace with the
// extra flags of a scenario and waits for its control socket.
func startDaemon(t *testing.T, netns, bin string, flags ...string) *daemon {
	t.Helper()
	return startDaemonAt(t, netns, bin, rnicIP, append([]string{"--addr", rnicPrefix, "--host-addr", hostPrefix, "--mtu", fmt.Sprint(tunMTU)}, flags...)...)
}

// startDaemonAt runs siwtun up on siwtun0 in the peer's namespace with
// flags that give the RNIC its address, addr (where peers reach it).
func startDaemonAt(t *testing.T, netns, bin, addr string, flags ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{bin, "up", "--dev", tunDev, "--socket-dir", dir, "--log-level", "debug"}, flags...)
	d := &daemon{proc: startProc(t, netns, "siwtun up", args...), dir: dir, args: flags, addr: addr}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("siwtun up %s log:\n%s", strings.Join(flags, " "), tail(d.stderr.String(), 60))
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, e1 := os.Stat(filepath.Join(dir, tunDev+".sock"))
		_, e2 := os.Stat(ctl.SocketPath(dir, tunDev))
		if e1 == nil && e2 == nil {
			return d
		}
		select {
		case <-d.exited:
			t.Fatalf("siwtun up exited: %v\n%s", d.err, d.stderr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("siwtun up: sockets not ready after 20 s\n%s", d.stderr)
		}
	}
}

// qps lists the daemon's queue pairs through ctl.
func (d *daemon) qps() ([]ctl.QP, error) {
	c, err := ctl.Dial(ctl.SocketPath(d.dir, tunDev))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.QPs(0)
}

// counters returns every counter of the daemon's stats by name.
func (d *daemon) counters() (map[string]uint64, error) {
	c, err := ctl.Dial(ctl.SocketPath(d.dir, tunDev))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	s, err := c.Stats()
	if err != nil {
		return nil, err
	}
	m := map[string]uint64{}
	for _, layer := range [][]ctl.Counter{s.TCP, s.MPA, s.DDP, s.RDMAP, s.Verbs} {
		for _, c := range layer {
			m[c.Name] = c.Value
		}
	}
	return m, nil
}

// noQPsLeft waits up to 10 s until the daemon has no queue pair.
func (d *daemon) noQPsLeft() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		qps, err := d.qps()
		if err == nil && len(qps) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queue pairs left on the daemon: %+v (%v)", qps, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopDaemon stops the daemon and checks it exited cleanly.
func (d *daemon) stopDaemon() error {
	d.stop()
	if d.err != nil {
		return fmt.Errorf("siwtun up exited with %v", d.err)
	}
	return nil
}

// tcpdumpCapture is a tcpdump on siwtun0 writing file.
type tcpdumpCapture struct {
	*proc
	file string
}

// captureSnaplen is tcpdump's snapshot length: whole packets of the TUN
// device, which with segmentation offload (siwtun up's default) carries
// TCP super-segments of up to 64 KiB both ways: ours before the kernel
// cuts them, and the VM's, which the kernel hands the offloading TUN
// uncut. siwtun check counts a super-segment of whole FPDUs as aligned.
// (With -s 0 the ring's slots are 256 KiB each and a 64 MiB buffer holds
// only 256 packets: bandwidth tests overran it; captureBufferKiB keeps
// 16384 slots of 64 KiB: with 4096, siw's 64,000 segments of an
// ib_send_bw run on a quiet host overran it.)
const (
	captureSnaplen   = 65535
	captureBufferKiB = 1048576
)

// errCaptureDropped: the kernel dropped packets of a capture.
var errCaptureDropped = errors.New("packets dropped by the kernel")

// startCapture starts tcpdump on the daemon's TUN device (the segments
// siwtun sends and receives) and waits until it listens. --immediate-mode:
// otherwise the packets of the last second sit in a ring block tcpdump
// has not been handed when SIGINT stops it, and are lost.
func startCapture(t *testing.T, netns, file string) *tcpdumpCapture {
	t.Helper()
	return startCaptureOn(t, netns, tunDev, file)
}

// startCaptureOn is startCapture on interface dev.
func startCaptureOn(t *testing.T, netns, dev, file string) *tcpdumpCapture {
	t.Helper()
	c := &tcpdumpCapture{proc: startProc(t, netns, "tcpdump", "tcpdump", "-i", dev, "-n", "-s", fmt.Sprint(captureSnaplen), "-B", fmt.Sprint(captureBufferKiB), "--immediate-mode", "-U", "-Z", "root", "-w", file), file: file}
	if err := c.waitFor("listening on", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// finish stops tcpdump and returns how many packets it wrote, and an
// error when the kernel dropped some (the capture is then incomplete and
// its dissection cannot be trusted).
func (c *tcpdumpCapture) finish() (string, error) {
	time.Sleep(300 * time.Millisecond) // the last segments' way through the TUN device
	c.stop()
	var captured string
	var dropped int
	for _, line := range strings.Split(c.stderr.String(), "\n") {
		switch {
		case strings.Contains(line, "packets captured"):
			captured = strings.TrimSpace(line)
		case strings.Contains(line, "packets dropped by kernel"):
			fmt.Sscanf(strings.TrimSpace(line), "%d", &dropped)
		}
	}
	if captured == "" {
		return "", fmt.Errorf("tcpdump said nothing about what it captured: %s", strings.TrimSpace(c.stderr.String()))
	}
	if dropped > 0 {
		return captured, fmt.Errorf("tcpdump: %d %w, the capture %s is incomplete", dropped, errCaptureDropped, filepath.Base(c.file))
	}
	return captured, nil
}
