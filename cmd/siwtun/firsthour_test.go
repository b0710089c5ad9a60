package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/rnic/rnictest"
)

// TestCaptureNoDevice: capturing a device that is not there fails and
// leaves no file behind (no empty n.pcapng that looks like a capture).
func TestCaptureNoDevice(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "n.pcapng")
	out, err := runRoot(t, "capture", "--dev", "nosuch", "--socket-dir", dir, "-w", file)
	if err == nil {
		t.Fatalf("capture of a missing device succeeded: %s", out)
	}
	if _, serr := os.Stat(file); !os.IsNotExist(serr) {
		t.Errorf("capture failed (%v) but left %s (stat: %v)", err, file, serr)
	}
}

// TestWatchStartLine: with --duration or -c, trace's first line says how
// long it runs instead of "(Ctrl-C to stop)"; --qp takes 0 for all, as
// ctl qp --qp does, and refuses negative numbers with the reason.
func TestWatchStartLine(t *testing.T) {
	p := newWatchedPair(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "200ms"}, "siwtun trace: watching siwtun0 (for 200ms; Ctrl-C to stop earlier)\n"},
		{[]string{"--duration", "200ms", "--qp", "0"}, "siwtun trace: watching siwtun0 (for 200ms; Ctrl-C to stop earlier)\n"},
		{[]string{"--duration", "200ms", "-c", "5"}, "siwtun trace: watching siwtun0 (for 200ms or 5 segments; Ctrl-C to stop earlier)\n"},
	} {
		out, err := runRoot(t, append([]string{"trace", "--dev", "siwtun0", "--socket-dir", p.dir}, tc.args...)...)
		if err != nil || !strings.HasPrefix(out, tc.want) {
			t.Errorf("trace %v: %v\n%s", tc.args, err, out)
		}
	}
	_, err := runRoot(t, "trace", "--dev", "siwtun0", "--socket-dir", p.dir, "--qp", "-1")
	if err == nil || !strings.Contains(err.Error(), "--qp -1: queue pair numbers start at 1; 0, the default, is every queue pair") {
		t.Errorf("trace --qp -1: %v", err)
	}
}

// TestCtlQPNone: ctl qp on a device without queue pairs says so instead
// of printing nothing, which reads like a hang or a failure.
func TestCtlQPNone(t *testing.T) {
	la, _ := netstack.Pipe(1500, netstack.Impairments{})
	eng := rnictest.New(t, la, cliPrefix, 1500, "siwtun0", nil).Engine
	dir := t.TempDir()
	s, err := ctl.Listen(ctl.SocketPath(dir, "siwtun0"), ctl.NewProvider("", eng, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	if out := mustRun(t, "ctl", "qp", "--dev", "siwtun0", "--socket-dir", dir); out != "siwtun0 has no queue pairs\n" {
		t.Errorf("ctl qp: %q", out)
	}
	if out := mustRun(t, "ctl", "qp", "--dev", "siwtun0", "--socket-dir", dir, "-j"); strings.TrimSpace(out) != "[]" && strings.TrimSpace(out) != "null" {
		t.Errorf("ctl qp -j: %q", out)
	}
}
