package test

import (
	"strings"
	"testing"
	"time"
)

// waitFor waits until the process has printed s on stdout or stderr.
func (p *pingProc) waitFor(t testing.TB, what, s string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.stdout.String(), s) && !strings.Contains(p.stderr.String(), s) {
		select {
		case <-p.exited:
			t.Fatalf("%s exited before printing %q (%v)\nstdout:\n%.3000s\nstderr:\n%s", what, s, p.err, p.stdout, p.stderr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %q after 30 s\nstdout:\n%.3000s\nstderr:\n%s", what, s, p.stdout, p.stderr)
		}
	}
}

// TestToolsWhenDaemonStops: siwtun ping and siwtun perf on siwtun1, as
// servers waiting for a client and as clients in the middle of a run,
// when siwtun1's daemon stops: each says "device siwtun1 removed (daemon
// stopped)" and exits non-zero, not "context canceled", not blaming the
// peer, and never 0 as if the run had succeeded.
func TestToolsWhenDaemonStops(t *testing.T) {
	r := newTwoRNICs(t, 1500)
	a0, a1 := r.a0.String(), r.a1.String()
	dev1 := []string{"--dev", "siwtun1", "--socket-dir", r.d1.socketDir}
	dev0 := []string{"--dev", "siwtun0", "--socket-dir", r.d0.socketDir}

	pingSrv := startToolProc(t, r, append([]string{"ping", "-s", "-a", a1, "-d"}, dev1...)...)
	pingSrv.waitListening(t)
	peerSrv := startToolProc(t, r, append([]string{"ping", "-s", "-P", "-a", a0, "-d"}, dev0...)...)
	peerSrv.waitListening(t)
	pingCli := startToolProc(t, r, append([]string{"ping", "-c", "-a", a0, "-C", "0", "-v"}, dev1...)...)
	pingCli.waitFor(t, "ping client", "ping data: ")

	perfSrv := startToolProc(t, r, append([]string{"perf", "write", "-p", "18515"}, dev1...)...)
	perfSrv.waitFor(t, "perf server", "Waiting for client")
	peerPerf := startToolProc(t, r, append([]string{"perf", "write", "-p", "18516", "-D", "60"}, dev0...)...)
	peerPerf.waitFor(t, "perf server on siwtun0", "Waiting for client")
	perfCli := startToolProc(t, r, append([]string{"perf", "write", "-p", "18516", "-D", "60"}, append(dev1, a0)...)...)
	perfCli.waitFor(t, "perf client", "#bytes")

	r.d1.stop()

	for _, tc := range []struct {
		name string
		p    *pingProc
		want int
	}{
		{"ping server", pingSrv, 255},
		{"ping client", pingCli, 255},
		{"perf server", perfSrv, 1},
		{"perf client", perfCli, 1},
	} {
		st := tc.p.wait(t, tc.name)
		if st != tc.want || !strings.Contains(tc.p.stderr.String(), "device siwtun1 removed (daemon stopped)") {
			t.Errorf("%s: exit status %d (want %d)\nstdout:\n%.2000s\nstderr:\n%s", tc.name, st, tc.want, tc.p.stdout, tc.p.stderr)
		}
	}
}
