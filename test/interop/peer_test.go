package interop

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
)

// Topology (../shared/peer/README.md): the VM is 198.18.0.2 behind tap
// 198.18.0.1 in namespace siwpeer and routes 198.18.0.0/15 there; the
// daemon's TUN device goes in the same namespace with the host side at
// 198.19.0.1 and the RNIC at 198.19.0.2.
const (
	vmIP       = "198.18.0.2"
	rnicIP     = "198.19.0.2"
	rnicPrefix = "198.19.0.2/24"
	hostPrefix = "198.19.0.1/24"
	tunDev     = "siwtun0"
	tunMTU     = 1500
)

// siwDefaults are siw's knobs as the peer build exposes them (module
// parameters with upstream's compile-time defaults); each scenario sets
// the ones it changes and the rest go back to these.
var siwDefaults = map[string]string{
	"mpa_crc_required": "N",
	"mpa_crc_strict":   "N",
	"peer_to_peer":     "N",
	"mpa_version":      "2",
}

// peerVM drives the scripts of ../shared/peer.
type peerVM struct {
	scripts string // directory of build-peer.sh, start-peer.sh, ...
	netns   string // SIWPEER_NETNS
	share   string // $SIWPEER_DIR/share, /mnt/share in the VM
	started bool   // this test booted the VM (and so stops it)
	log     *bytes.Buffer
}

// peerScripts finds the peer scripts: SIWPEER_SCRIPTS, else
// ../shared/peer beside the checkout (testkit.SharedDir).
func peerScripts() (string, error) {
	dir := os.Getenv("SIWPEER_SCRIPTS")
	if dir == "" {
		d, ok := testkit.SharedDir("peer")
		if !ok {
			return "", fmt.Errorf("peer VM scripts not found in ../shared/peer beside the checkout (set SIWPEER_SCRIPTS)")
		}
		dir = d
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(abs, "start-peer.sh")); err != nil {
		return "", fmt.Errorf("peer VM scripts not found in %s (set SIWPEER_SCRIPTS): %w", abs, err)
	}
	return abs, nil
}

// peerEnv returns the value of a setting of the peer scripts (common.sh
// defaults unless the environment overrides them).
func peerEnv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// newPeerVM builds the VM image (build-peer.sh, skipping the test when it
// cannot be built) and refuses to touch a VM someone else started.
func newPeerVM(t *testing.T) *peerVM {
	t.Helper()
	dir, err := peerScripts()
	if err != nil {
		t.Skip(err)
	}
	p := &peerVM{scripts: dir, netns: peerEnv("SIWPEER_NETNS", "siwpeer"),
		share: filepath.Join(peerEnv("SIWPEER_DIR", "/var/tmp/siwpeer"), "share"), log: &bytes.Buffer{}}
	if pid := p.runningPID(); pid != 0 {
		t.Fatalf("a peer VM is already running (qemu pid %d) that this test did not start; stop it with %s/stop-peer.sh, or give this run its own SIWPEER_DIR and SIWPEER_NETNS", pid, dir)
	}
	if out, err := exec.Command("ip", "netns", "pids", p.netns).Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("network namespace %s exists with processes in it (%s); this test creates and removes it, so it stops here", p.netns, strings.Fields(string(out)))
	}
	t0 := time.Now()
	out, err := p.script(context.Background(), "build-peer.sh")
	if err != nil {
		t.Skipf("the peer VM cannot be built here (%v); build-peer.sh said:\n%s", err, tail(out, 30))
	}
	t.Logf("build-peer.sh: %v", time.Since(t0).Round(100*time.Millisecond))
	return p
}

// runningPID is the PID of a running peer qemu, 0 if none.
func (p *peerVM) runningPID() int {
	b, err := os.ReadFile(filepath.Join(peerEnv("SIWPEER_DIR", "/var/tmp/siwpeer"), "run", "qemu.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || syscall.Kill(pid, 0) != nil {
		return 0
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !bytes.Contains(cmdline, []byte("siwpeer-vm")) {
		return 0
	}
	return pid
}

func (p *peerVM) script(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(p.scripts, name), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	p.log.Write(out.Bytes())
	return out.String(), err
}

// start boots the VM and registers its stop (stop-peer.sh) for the end of
// the test, whatever happens.
func (p *peerVM) start(t *testing.T) {
	t.Helper()
	t0 := time.Now()
	p.started = true
	t.Cleanup(func() { p.stop(t) })
	out, err := p.script(context.Background(), "start-peer.sh")
	if err != nil {
		t.Fatalf("start-peer.sh: %v\n%s", err, tail(out, 40))
	}
	t.Logf("start-peer.sh: %v", time.Since(t0).Round(100*time.Millisecond))
}

// stop stops the VM this test started and removes its namespace.
func (p *peerVM) stop(t *testing.T) {
	if !p.started {
		return
	}
	p.started = false
	out, err := p.script(context.Background(), "stop-peer.sh")
	if err != nil {
		t.Errorf("stop-peer.sh: %v\n%s", err, out)
	}
	if pid := p.runningPID(); pid != 0 {
		t.Errorf("the peer VM (qemu pid %d) is still running after stop-peer.sh", pid)
	}
}

// client runs a client command line in the VM and returns its standard
// output and error apart, and its exit status (-1: ssh failed).
func (p *peerVM) client(ctx context.Context, cmdline string) (stdout, stderr string, status int) {
	out, st := p.exec(ctx, cmdline+" 2>/tmp/client.err; st=$?; echo; echo STDERR; cat /tmp/client.err; exit $st")
	stdout, stderr, ok := strings.Cut(out, "\nSTDERR\n")
	if !ok {
		return out, "", -1
	}
	return stdout, stderr, st
}

// exec runs a shell command line in the VM and returns its output and
// exit status (-1 when ssh itself failed or the context ended).
func (p *peerVM) exec(ctx context.Context, cmdline string) (string, int) {
	cmd := exec.CommandContext(ctx, filepath.Join(p.scripts, "peer-exec.sh"), cmdline)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok && ctx.Err() == nil {
			return out.String(), ee.ExitCode()
		}
		return out.String() + "\n" + err.Error(), -1
	}
	return out.String(), 0
}

// mustExec runs cmdline in the VM and fails the test unless it exits 0.
func (p *peerVM) mustExec(t *testing.T, cmdline string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, st := p.exec(ctx, cmdline)
	if st != 0 {
		t.Fatalf("in the VM: %s: exit status %d\n%s", cmdline, st, out)
	}
	return out
}

// setSiw sets siw's knobs (for connections set up afterwards): the
// defaults, then params on top. It fails the test when a knob is missing
// (a peer built with SIWPEER_SIW_PARAMS=0).
func (p *peerVM) setSiw(t *testing.T, params map[string]string) {
	t.Helper()
	var sb strings.Builder
	for k, def := range siwDefaults {
		v := def
		if pv, ok := params[k]; ok {
			v = pv
		}
		fmt.Fprintf(&sb, "echo %s > /sys/module/siw/parameters/%s && ", v, k)
	}
	for k := range params {
		if _, ok := siwDefaults[k]; !ok {
			t.Fatalf("siw knob %s is not one the tests reset", k)
		}
	}
	sb.WriteString("true")
	p.mustExec(t, sb.String())
}

// put copies a host file into the VM's share (/mnt/share/name).
func (p *peerVM) put(t *testing.T, local, name string) string {
	t.Helper()
	b, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(p.share, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.share, name), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return "/mnt/share/" + name
}

// vmServer is a command running in the background in the VM (rping -s),
// with its output and exit status in files there.
type vmServer struct {
	vm   *peerVM
	name string // log /tmp/<name>.log, status /tmp/<name>.st
}

// startServer starts cmdline in the background in the VM and waits until
// something listens on port there (siw: wait before connecting, never
// probe a siw port with a bare connect).
func (p *peerVM) startServer(t *testing.T, name, cmdline string, port int) *vmServer {
	t.Helper()
	script := fmt.Sprintf(`rm -f /tmp/%[1]s.st /tmp/%[1]s.pid; nohup sh -c '%[2]s >/tmp/%[1]s.log 2>/tmp/%[1]s.err & echo $! >/tmp/%[1]s.pid; wait $!; echo $? >/tmp/%[1]s.st' </dev/null >/dev/null 2>&1 &
for i in $(seq 100); do ss -ltnH 'sport = :%[3]d' | grep -q . && exit 0; sleep 0.1; done; echo "not listening on %[3]d"; cat /tmp/%[1]s.log; exit 1`, name, cmdline, port)
	p.mustExec(t, script)
	return &vmServer{vm: p, name: name}
}

// wait waits up to d for the server to exit; it returns its standard
// output and error (kept apart: a redirected stdout is block-buffered and
// would cut stderr's lines into its own) and its exit status, or -1 if it
// was still running (it is then killed).
func (s *vmServer) wait(t *testing.T, d time.Duration) (stdout, stderr string, status int) {
	t.Helper()
	script := fmt.Sprintf(`for i in $(seq %d); do [ -f /tmp/%[2]s.st ] && break; sleep 0.1; done
if [ ! -f /tmp/%[2]s.st ]; then kill -9 "$(cat /tmp/%[2]s.pid)"; echo "STILL RUNNING" >>/tmp/%[2]s.err; fi
echo "STATUS $(cat /tmp/%[2]s.st 2>/dev/null)"; cat /tmp/%[2]s.err; echo "STDOUT"; cat /tmp/%[2]s.log`, int(d/(100*time.Millisecond)), s.name)
	out := s.vm.mustExec(t, script)
	head, stdout, _ := strings.Cut(out, "STDOUT\n")
	first, stderr, _ := strings.Cut(head, "\n")
	st, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(first, "STATUS ")))
	if err != nil || strings.Contains(stderr, "STILL RUNNING") {
		return stdout, stderr, -1
	}
	return stdout, stderr, st
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
