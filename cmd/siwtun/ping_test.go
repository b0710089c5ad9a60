package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/daemon/uverbs"
	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/tools/rping"
)

// pingRun is one `siwtun ping` run through the root command.
type pingRun struct {
	stdout, stderr syncbuf.Buffer
	err            error
	done           chan struct{}
}

func startPing(args ...string) *pingRun {
	r := &pingRun{done: make(chan struct{})}
	root := newRootCmd()
	root.SetOut(&r.stdout)
	root.SetErr(&r.stderr)
	root.SetArgs(append([]string{"ping"}, args...))
	go func() {
		r.err = root.Execute()
		close(r.done)
	}()
	return r
}

func (r *pingRun) wait(t *testing.T) *pingRun {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(ctlTestTimeout):
		t.Fatalf("siwtun ping still running after %v\nstdout:\n%s\nstderr:\n%s", ctlTestTimeout, &r.stdout, &r.stderr)
	}
	return r
}

// status is the exit status siwtun would end with.
func (r *pingRun) status() int {
	var st interface{ ExitStatus() int }
	switch {
	case r.err == nil:
		return 0
	case errors.As(r.err, &st):
		return st.ExitStatus()
	}
	return 1
}

// serveSockets runs two in-process RNICs on an in-memory link and serves
// each on a verbs socket in a fresh directory, as two daemons would.
func serveSockets(t *testing.T) string {
	t.Helper()
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	dir := t.TempDir()
	for _, r := range []*testRNIC{newRNIC(t, la, "siwtun0", cliPrefix), newRNIC(t, lb, "siwtun1", srvPrefix)} {
		srv, err := uverbs.NewServer(r.dev, nil)
		if err != nil {
			t.Fatal(err)
		}
		l, err := uverbs.Listen(filepath.Join(dir, r.dev.Name()+".sock"), -1)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	return dir
}

// TestPingCmd runs `siwtun ping -s` on siwtun1 and `siwtun ping -c -V -v`
// on siwtun0, each through its verbs socket: rping's lines and statuses.
func TestPingCmd(t *testing.T) {
	dir := serveSockets(t)
	srv := startPing("-s", "-a", srvPrefix.Addr().String(), "-S", "4096", "-v", "-d", "--dev", "siwtun1", "--socket-dir", dir)
	deadline := time.Now().Add(ctlTestTimeout)
	for !strings.Contains(srv.stdout.String(), "rdma_listen\n") {
		select {
		case <-srv.done:
			t.Fatalf("server ended: %v\n%s%s", srv.err, &srv.stdout, &srv.stderr)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not listening\n%s", &srv.stdout)
		}
	}
	cli := startPing("-c", "-a", srvPrefix.Addr().String(), "-S", "4096", "-C", "5", "-vV", "--dev", "siwtun0", "--socket-dir", dir).wait(t)
	srv.wait(t)
	if cli.status() != 0 || srv.status() != 0 {
		t.Fatalf("exit statuses client %d (%v), server %d (%v)\nclient stderr:\n%s\nserver stderr:\n%s",
			cli.status(), cli.err, srv.status(), srv.err, &cli.stderr, &srv.stderr)
	}
	var want, wantSrv strings.Builder
	b := make([]byte, 4096)
	for i := range 5 {
		rping.Fill(b, i)
		fmt.Fprintf(&want, "ping data: %s\n", b[:4095])
		fmt.Fprintf(&wantSrv, "server ping data: %s\n", b[:4095])
	}
	if got := cli.stdout.String(); got != want.String() {
		t.Fatalf("client stdout:\n%s\nwant:\n%s", got, want.String())
	}
	if got := cli.stderr.String(); got != "client DISCONNECT EVENT...\n" {
		t.Fatalf("client stderr %q", got)
	}
	// The server ran with -d: its ping lines among the debug lines.
	var got strings.Builder
	for _, line := range strings.SplitAfter(srv.stdout.String(), "\n") {
		if strings.HasPrefix(line, "server ping data: ") {
			got.WriteString(line)
		}
	}
	if got.String() != wantSrv.String() {
		t.Fatalf("server ping lines:\n%s\nwant:\n%s", got.String(), wantSrv.String())
	}
	for _, dbg := range []string{"rdma_bind_addr successful\n", "accepting client connection request\n", "server posted rdma read req \n", "rdma write completion\n"} {
		if !strings.Contains(srv.stdout.String(), dbg) {
			t.Errorf("server -d output lacks %q", dbg)
		}
	}
	if got := srv.stderr.String(); got != "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n" {
		t.Fatalf("server stderr %q", got)
	}
}

// TestPingCmdBadFlags: clear errors and rping's EINVAL status, before any
// device is opened.
func TestPingCmdBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "siwtun ping: one of -s (server) or -c (client) is required\nUsage:"},
		{[]string{"-s", "-c"}, "siwtun ping: -s (server) and -c (client) exclude each other\n"},
		{[]string{"-c"}, "siwtun ping: the client needs the server's address (-a addr)\n"},
		{[]string{"-c", "-a", "server.example"}, "siwtun ping: invalid address \"server.example\": an IPv4 or IPv6 address is needed\n"},
		{[]string{"-c", "-a", "0.0.0.0"}, "siwtun ping: invalid address \"0.0.0.0\": the client needs the server's address\n"},
		{[]string{"-c", "-P", "-a", "198.18.0.2"}, "siwtun ping: -P (persistent) is a server flag\n"},
		{[]string{"-s", "-p", "0"}, "siwtun ping: invalid port 0 (valid range is 1 to 65535)\n"},
		{[]string{"-s", "-p", "70000"}, "siwtun ping: invalid port 70000 (valid range is 1 to 65535)\n"},
		{[]string{"-s", "-p", "x"}, "siwtun ping: invalid argument \"x\" for \"-p, --port\" flag"},
		{[]string{"-s", "--dev", "../x"}, "siwtun ping: invalid device name \"../x\"\n"},
		{[]string{"-s", "-q"}, "siwtun ping: unknown shorthand flag: 'q' in -q\n"},
		{[]string{"-s", "extra"}, "siwtun ping: unexpected argument \"extra\"\n"},
		// rping's own lines for these, without the usage.
		{[]string{"-s", "-S", "25"}, "Invalid size 25 (valid range is 26 to 65535)\n"},
		{[]string{"-c", "-a", "198.18.0.2", "-S", "65536"}, "Invalid size 65536 (valid range is 26 to 65535)\n"},
		{[]string{"-c", "-a", "198.18.0.2", "-C", "-1"}, "Invalid count -1\n"},
	}
	for _, tt := range tests {
		r := startPing(append(tt.args, "--socket-dir", t.TempDir())...).wait(t)
		if r.status() != rping.StatusInvalid {
			t.Errorf("siwtun ping %s: status %d (%v), want %d", strings.Join(tt.args, " "), r.status(), r.err, rping.StatusInvalid)
		}
		if got := r.stderr.String(); !strings.HasPrefix(got, tt.want) {
			t.Errorf("siwtun ping %s: stderr\n%q\nwant prefix\n%q", strings.Join(tt.args, " "), got, tt.want)
		}
		if strings.HasPrefix(tt.want, "Invalid") && strings.Contains(r.stderr.String(), "Usage:") {
			t.Errorf("siwtun ping %s: usage printed after rping's line", strings.Join(tt.args, " "))
		}
	}
}

// TestPingCmdNoDaemon: no verbs socket: a clear error and rping's failure
// status.
func TestPingCmdNoDaemon(t *testing.T) {
	r := startPing("-c", "-a", "198.18.0.2", "--socket-dir", t.TempDir()).wait(t)
	if r.status() != rping.StatusFailed {
		t.Fatalf("status %d (%v), want %d", r.status(), r.err, rping.StatusFailed)
	}
	if got := r.stderr.String(); !strings.HasPrefix(got, "siwtun ping: open siwtun0: ") || !strings.Contains(got, "is `siwtun up --dev siwtun0` running?") {
		t.Fatalf("stderr %q", got)
	}
}
