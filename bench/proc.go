package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/siwtun/siwtun/internal/syncbuf"
)

// stopWait is how long a process has to exit after SIGINT before SIGKILL.
const stopWait = 15 * time.Second

// proc is a process the run started: `ip netns exec <ns> <bin> <args>`.
// ip execs the command in place, so the PID, the exit status and the
// rusage are the command's own.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdout syncbuf.Buffer
	stderr syncbuf.Buffer
	done   chan struct{} // closed once waited for
	err    error         // the exit status, set before done closes
}

// startProc starts args in namespace ns. The process gets SIGINT when ctx
// ends, and SIGKILL stopWait later.
func startProc(ctx context.Context, name, ns string, args ...string) (*proc, error) {
	return startProcStdin(ctx, name, ns, nil, args...)
}

// startProcStdin is startProc with the process's standard input read from
// stdin (nil: none).
func startProcStdin(ctx context.Context, name, ns string, stdin io.Reader, args ...string) (*proc, error) {
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(os.Interrupt) }
	p.cmd.WaitDelay = stopWait
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = stdin, &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to timeout for the process to exit by itself; then it is
// stopped. The error says how it ended, with its stderr.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.stop()
		return fmt.Errorf("%s (pid %d) still running after %v; stopped it\n%s", p.name, p.pid(), timeout, p.stderr.String())
	}
	if p.err != nil {
		return fmt.Errorf("%s (pid %d): %v\n%s", p.name, p.pid(), p.err, strings.TrimSpace(p.stderr.String()))
	}
	return nil
}

// stop sends SIGINT to the process (by its PID) unless it has exited, and
// SIGKILL if it has not exited stopWait later; it returns once the process
// was reaped.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(stopWait):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// cpu is the user and system CPU time of an exited process (its own
// rusage).
func (p *proc) cpu() time.Duration {
	if p.cmd.ProcessState == nil {
		return 0
	}
	return p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()
}

// clockTick is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on
// every Linux architecture Go runs on).
const clockTick = 10 * time.Millisecond

// procCPU reads a running process's user and system CPU time from
// /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start with the state (field 3).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/pid/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("malformed /proc/pid/stat")
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("malformed /proc/pid/stat: %w", err)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// procRSS reads a running process's resident set (VmRSS) in KiB from
// /proc/<pid>/status.
func procRSS(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				return strconv.ParseFloat(f[0], 64)
			}
		}
	}
	return 0, errors.New("no VmRSS in /proc/pid/status")
}
