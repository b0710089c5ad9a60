package test

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/tools/rping"
)

// pingProc is a `siwtun ping` (or other subcommand's) process in the
// test's namespace.
type pingProc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncbuf.Buffer
	exited         chan struct{}
	err            error
}

// startPingProc runs `siwtun ping args...` in the test's namespace.
func startPingProc(t testing.TB, r *twoRNICs, args ...string) *pingProc {
	t.Helper()
	return startToolProc(t, r, append([]string{"ping"}, args...)...)
}

// startToolProc runs `siwtun args...` in the test's namespace: any
// subcommand, killed when the test ends if it is still running.
func startToolProc(t testing.TB, r *twoRNICs, args ...string) *pingProc {
	t.Helper()
	p := &pingProc{cmd: r.ns.command(append([]string{r.bin}, args...)...),
		stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("siwtun %s: %v", args[0], err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL) // ip netns exec execs siwtun in place
			<-p.exited
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit status.
func (p *pingProc) wait(t testing.TB, what string) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s still running after 2 minutes\nstdout:\n%.2000s\nstderr:\n%s", what, p.stdout, p.stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

// waitListening waits for a server started with -d to print rping's
// "rdma_listen".
func (p *pingProc) waitListening(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.stdout.String(), "rdma_listen\n") {
		select {
		case <-p.exited:
			t.Fatalf("siwtun ping -s exited (%v)\nstdout:\n%s\nstderr:\n%s", p.err, p.stdout, p.stderr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("siwtun ping -s not listening after 30 s\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
	}
}

// expectedPings is what -v prints for count pings of size bytes.
func expectedPings(prefix string, size, count int) string {
	var sb strings.Builder
	b := make([]byte, size)
	for i := range count {
		rping.Fill(b, i)
		fmt.Fprintf(&sb, "%s%s\n", prefix, b[:size-1])
	}
	return sb.String()
}

// linesWith keeps the lines of s that start with prefix.
func linesWith(s, prefix string) string {
	var sb strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if strings.HasPrefix(line, prefix) {
			sb.WriteString(line)
		}
	}
	return sb.String()
}

// TestPingBetweenDaemons: `siwtun ping -s` on siwtun1 and `siwtun ping -c
// -V` on siwtun0, each its own process on its daemon's verbs socket, 100
// pings at 64 B, 4 KiB and 64 KiB - 1 (rping's largest), at MTU 1500 and
// 9000: every byte verified by the client (-V), the data the server read
// checked against rping's pattern (-V), rping's lines and exit status 0 on
// both sides, and no queue pair left on either daemon.
func TestPingBetweenDaemons(t *testing.T) {
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprintf("mtu%d", mtu), func(t *testing.T) {
			r := newTwoRNICs(t, mtu)
			for i, size := range []int{64, 4096, rping.MaxSize} {
				t.Run(fmt.Sprintf("%dB", size), func(t *testing.T) {
					const count = 100
					port := fmt.Sprint(7174 + i)
					srv := startPingProc(t, r, "-s", "-a", r.a1.String(), "-p", port, "-S", fmt.Sprint(size), "-v", "-V", "-d",
						"--dev", "siwtun1", "--socket-dir", r.d1.socketDir)
					srv.waitListening(t)
					cli := startPingProc(t, r, "-c", "-a", r.a1.String(), "-p", port, "-S", fmt.Sprint(size), "-C", fmt.Sprint(count), "-v", "-V",
						"--dev", "siwtun0", "--socket-dir", r.d0.socketDir)
					cst := cli.wait(t, "siwtun ping -c")
					sst := srv.wait(t, "siwtun ping -s")
					if cst != 0 || sst != 0 {
						t.Fatalf("exit statuses: client %d, server %d\nclient stderr:\n%s\nserver stderr:\n%s", cst, sst, cli.stderr, srv.stderr)
					}
					if got, want := cli.stdout.String(), expectedPings("ping data: ", size, count); got != want {
						t.Fatalf("client printed %d lines, not the %d pings expected\n%.2000s", strings.Count(got, "\n"), count, got)
					}
					if got, want := linesWith(srv.stdout.String(), "server ping data: "), expectedPings("server ping data: ", size, count); got != want {
						t.Fatalf("server printed %d ping lines, not the %d expected", strings.Count(got, "\n"), count)
					}
					if got := cli.stderr.String(); got != "client DISCONNECT EVENT...\n" {
						t.Fatalf("client stderr %q", got)
					}
					if got := srv.stderr.String(); got != "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n" {
						t.Fatalf("server stderr %q", got)
					}
					for _, d := range []*daemon{r.d0, r.d1} {
						eventually(t, 10*time.Second, d.dev+" QPs gone", func() (bool, string) {
							qps := ctlQPs(t, d)
							return len(qps) == 0, describe(qps)
						})
					}
				})
			}
		})
	}
}

// TestPingPersistentBetweenDaemons: `siwtun ping -s -P` serves two
// clients in a row and keeps listening; SIGINT ends it.
func TestPingPersistentBetweenDaemons(t *testing.T) {
	r := newTwoRNICs(t, 9000)
	srv := startPingProc(t, r, "-s", "-P", "-a", r.a1.String(), "-S", "4096", "-V", "-d", "--dev", "siwtun1", "--socket-dir", r.d1.socketDir)
	srv.waitListening(t)
	for i := range 2 {
		cli := startPingProc(t, r, "-c", "-a", r.a1.String(), "-S", "4096", "-C", "20", "-V", "-v", "--dev", "siwtun0", "--socket-dir", r.d0.socketDir)
		if st := cli.wait(t, "siwtun ping -c"); st != 0 {
			t.Fatalf("client %d: exit status %d\n%s", i, st, cli.stderr)
		}
		if got := strings.Count(cli.stdout.String(), "ping data: "); got != 20 {
			t.Fatalf("client %d: %d pings, want 20", i, got)
		}
	}
	eventually(t, 10*time.Second, "two DISCONNECT EVENTs", func() (bool, string) {
		s := srv.stderr.String()
		return strings.Count(s, "server DISCONNECT EVENT...\n") == 2, s
	})
	select {
	case <-srv.exited:
		t.Fatalf("persistent server exited after its clients: %v\n%s", srv.err, srv.stderr)
	default:
	}
	srv.cmd.Process.Signal(syscall.SIGINT)
	if st := srv.wait(t, "siwtun ping -s -P"); st != 130 {
		t.Fatalf("persistent server after SIGINT: exit status %d, want 130\n%s", st, srv.stderr)
	}
	eventually(t, 10*time.Second, "siwtun1 QPs gone", func() (bool, string) {
		qps := ctlQPs(t, r.d1)
		return len(qps) == 0, describe(qps)
	})
}
