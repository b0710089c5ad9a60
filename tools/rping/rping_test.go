package rping_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/rnic/rnictest"
	"github.com/siwtun/siwtun/tools/rping"
	"github.com/siwtun/siwtun/verbs"
)

// testTimeout guards against hangs; it is not a performance bound.
const testTimeout = 60 * time.Second

var (
	cliPrefix = netip.MustParsePrefix("198.18.0.1/24")
	srvPrefix = netip.MustParsePrefix("198.18.0.2/24")
	srvAddr   = netip.AddrPortFrom(srvPrefix.Addr(), rping.DefaultPort)
)

// pair is two in-process RNICs joined by an in-memory link.
type pair struct {
	cli, srv *verbs.Device
}

func newPair(t testing.TB, mtu int) *pair {
	t.Helper()
	la, lb := netstack.Pipe(mtu, netstack.Impairments{})
	return &pair{cli: newDevice(t, la, cliPrefix, mtu, "siwtun0"), srv: newDevice(t, lb, srvPrefix, mtu, "siwtun1")}
}

func newDevice(t testing.TB, link *netstack.Link, addr netip.Prefix, mtu int, name string) *verbs.Device {
	t.Helper()
	return rnictest.New(t, link, addr, mtu, name, nil).Device
}

// run is one side's result and output.
type run struct {
	err error
	// The connection's event watcher and its main loop write at once.
	stdout, stderr *syncbuf.Buffer
}

func opts(o rping.Options) (rping.Options, *run) {
	r := &run{stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}}
	o.Stdout, o.Stderr = r.stdout, r.stderr
	return o, r
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// startServer listens on the pair's server and serves in the background;
// wait returns its result.
func startServer(t testing.TB, ctx context.Context, dev *verbs.Device, o rping.Options) (r *run, wait func() *run) {
	t.Helper()
	o, r = opts(o)
	srv, err := rping.Listen(dev, srvAddr, o)
	if err != nil {
		t.Fatalf("Listen: %v\n%s", err, r.stderr)
	}
	done := make(chan struct{})
	go func() {
		r.err = srv.Serve(ctx)
		close(done)
	}()
	return r, func() *run {
		t.Helper()
		select {
		case <-done:
		case <-time.After(testTimeout):
			t.Fatalf("server still serving after %v\nstdout:\n%s\nstderr:\n%s", testTimeout, r.stdout, r.stderr)
		}
		return r
	}
}

func ping(ctx context.Context, dev *verbs.Device, o rping.Options) *run {
	o, r := opts(o)
	r.err = rping.Ping(ctx, dev, srvAddr, o)
	return r
}

// pingLines is what -v prints for count pings of size bytes.
func pingLines(prefix string, size, count int) string {
	var sb strings.Builder
	b := make([]byte, size)
	for i := range count {
		rping.Fill(b, i)
		fmt.Fprintf(&sb, "%s%s\n", prefix, b[:size-1])
	}
	return sb.String()
}

func wantExit(t testing.TB, what string, err error, status int) {
	t.Helper()
	var ee *rping.ExitError
	if status == 0 {
		if err != nil {
			t.Fatalf("%s: %v, want success", what, err)
		}
		return
	}
	if !errors.As(err, &ee) || ee.ExitStatus() != status {
		t.Fatalf("%s: %v, want exit status %d", what, err, status)
	}
}

func wantOutput(t testing.TB, what, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s:\n got: %q\nwant: %q", what, got, want)
	}
}

// TestPingSizes pings with -v -V at rping's smallest size, its default,
// 4 KiB and its largest (64 KiB - 1), at MTU 1500 and 9000: every byte
// comes back, and both sides print rping's lines.
func TestPingSizes(t *testing.T) {
	for _, mtu := range []int{1500, 9000} {
		for _, size := range []int{rping.MinSize, 64, 4096, rping.MaxSize} {
			t.Run(fmt.Sprintf("mtu%d/%dB", mtu, size), func(t *testing.T) {
				const count = 10
				p := newPair(t, mtu)
				ctx := testCtx(t)
				_, wait := startServer(t, ctx, p.srv, rping.Options{Size: size, Verbose: true, Validate: true})
				c := ping(ctx, p.cli, rping.Options{Size: size, Count: count, Verbose: true, Validate: true})
				s := wait()
				wantExit(t, "client", c.err, 0)
				wantExit(t, "server", s.err, 0)
				wantOutput(t, "client stdout", c.stdout.String(), pingLines("ping data: ", size, count))
				wantOutput(t, "server stdout", s.stdout.String(), pingLines("server ping data: ", size, count))
				wantOutput(t, "client stderr", c.stderr.String(), "client DISCONNECT EVENT...\n")
				wantOutput(t, "server stderr", s.stderr.String(), "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n")
			})
		}
	}
}

// TestGoldenOutput: rping -s -v and rping -c -v -C 3 print exactly these
// lines (testdata/*.golden), on the streams rping uses.
func TestGoldenOutput(t *testing.T) {
	p := newPair(t, 1500)
	ctx := testCtx(t)
	_, wait := startServer(t, ctx, p.srv, rping.Options{Verbose: true})
	c := ping(ctx, p.cli, rping.Options{Count: 3, Verbose: true, Validate: true})
	s := wait()
	wantExit(t, "client", c.err, 0)
	wantExit(t, "server", s.err, 0)
	for _, g := range []struct{ file, got string }{
		{"client.stdout.golden", c.stdout.String()},
		{"client.stderr.golden", c.stderr.String()},
		{"server.stdout.golden", s.stdout.String()},
		{"server.stderr.golden", s.stderr.String()},
	} {
		want, err := os.ReadFile("testdata/" + g.file)
		if err != nil {
			t.Fatal(err)
		}
		wantOutput(t, g.file, g.got, string(want))
	}
}

// TestCountZeroUntilServerGoes: without -C the client pings until the
// server disconnects, and exits 0 then, as rping does.
func TestCountZeroUntilServerGoes(t *testing.T) {
	p := newPair(t, 1500)
	ctx := testCtx(t)
	sctx, stop := context.WithCancel(ctx)
	_, wait := startServer(t, sctx, p.srv, rping.Options{Verbose: true})
	o, c := opts(rping.Options{Verbose: true, Validate: true})
	done := make(chan struct{})
	go func() {
		c.err = rping.Ping(ctx, p.cli, srvAddr, o)
		close(done)
	}()
	deadline := time.Now().Add(testTimeout)
	for strings.Count(c.stdout.String(), "\n") < 20 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := wait().err; !errors.Is(err, context.Canceled) {
		t.Fatalf("server stopped: %v, want context.Canceled", err)
	}
	<-done
	wantExit(t, "client", c.err, 0)
	if n := strings.Count(c.stdout.String(), "ping data: "); n < 20 {
		t.Fatalf("client printed %d pings, want at least 20", n)
	}
	if !strings.HasPrefix(c.stderr.String(), "client DISCONNECT EVENT...\nwait for RDMA_") {
		t.Fatalf("client stderr %q, want the DISCONNECT EVENT and the state it waited in", c.stderr)
	}
}

// TestPersistentServer: -P serves two clients one after the other, then
// two at once, and keeps listening until stopped.
func TestPersistentServer(t *testing.T) {
	p := newPair(t, 1500)
	ctx := testCtx(t)
	sctx, stop := context.WithCancel(ctx)
	s, wait := startServer(t, sctx, p.srv, rping.Options{Size: 4096, Persistent: true, Validate: true, Verbose: true})
	for i := range 2 {
		c := ping(ctx, p.cli, rping.Options{Size: 4096, Count: 5, Validate: true, Verbose: true})
		wantExit(t, fmt.Sprintf("client %d", i), c.err, 0)
		wantOutput(t, "client stdout", c.stdout.String(), pingLines("ping data: ", 4096, 5))
	}
	var wg sync.WaitGroup
	runs := make([]*run, 2)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i] = ping(ctx, p.cli, rping.Options{Size: 4096, Count: 5, Validate: true})
		}()
	}
	wg.Wait()
	for i, c := range runs {
		wantExit(t, fmt.Sprintf("concurrent client %d", i), c.err, 0)
	}
	// The last connections' DISCONNECT lines may still be on their way.
	deadline := time.Now().Add(testTimeout)
	for strings.Count(s.stderr.String(), "server DISCONNECT EVENT...") < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := wait().err; !errors.Is(err, context.Canceled) {
		t.Fatalf("persistent server stopped: %v, want context.Canceled", err)
	}
	if n := strings.Count(s.stdout.String(), "server ping data: rdma-ping-4: "); n != 4 {
		t.Fatalf("server served ping 4 %d times, want 4 (one per client)\n%s", n, s.stdout)
	}
	// Each connection's two lines come from two goroutines (rping's CM
	// thread and the connection's), so the two concurrent connections'
	// lines may interleave; the sequential ones' may not.
	pair := "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n"
	got := s.stderr.String()
	if !strings.HasPrefix(got, strings.Repeat(pair, 2)) {
		t.Fatalf("server stderr %q, want it to start with the sequential clients' %q twice", got, pair)
	}
	gotLines, wantLines := strings.SplitAfter(got, "\n"), strings.SplitAfter(strings.Repeat(pair, 4), "\n")
	slices.Sort(gotLines)
	slices.Sort(wantLines)
	wantOutput(t, "server stderr, lines sorted", strings.Join(gotLines, ""), strings.Join(wantLines, ""))
}

// TestServeOnlyOneClient: without -P the server serves one client and
// returns; the listener is gone, so the next client is refused and says
// so like rping on siw.
func TestServeOnlyOneClient(t *testing.T) {
	p := newPair(t, 1500)
	ctx := testCtx(t)
	_, wait := startServer(t, ctx, p.srv, rping.Options{})
	wantExit(t, "first client", ping(ctx, p.cli, rping.Options{Count: 2}).err, 0)
	wantExit(t, "server", wait().err, 0)
	c := ping(ctx, p.cli, rping.Options{Count: 2})
	wantExit(t, "second client", c.err, rping.StatusFailed)
	if !strings.HasPrefix(c.stderr.String(), "rdma_connect: Connection refused\nconnect error -1\nsiwtun ping: ") {
		t.Fatalf("refused client stderr %q", c.stderr)
	}
}

// TestRejected: a listener that rejects the MPA Request: the client prints
// the REJECTED event with siw's -ECONNRESET and fails.
func TestRejected(t *testing.T) {
	p := newPair(t, 1500)
	ctx := testCtx(t)
	l, err := p.srv.Listen(srvAddr, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if req, err := l.Accept(ctx); err == nil {
			req.Reject([]byte("busy"))
		}
	}()
	c := ping(ctx, p.cli, rping.Options{Count: 1})
	wantExit(t, "client", c.err, rping.StatusFailed)
	if !strings.HasPrefix(c.stderr.String(), "cma event RDMA_CM_EVENT_REJECTED, error -104\nsiwtun ping: ") {
		t.Fatalf("rejected client stderr %q", c.stderr)
	}
}

// TestServerBufferTooSmall: a client pinging with more bytes than the
// server's -S: the server fails and says why; the client sees the
// disconnect before its first ping is done and, unlike rping's (which
// exits 0, which a script cannot tell from success), says what probably
// happened and exits 255.
func TestServerBufferTooSmall(t *testing.T) {
	p := newPair(t, 1500)
	ctx := testCtx(t)
	_, wait := startServer(t, ctx, p.srv, rping.Options{Size: 64})
	c := ping(ctx, p.cli, rping.Options{Size: 4096, Count: 3, Verbose: true, Validate: true})
	s := wait()
	wantExit(t, "server", s.err, rping.StatusFailed)
	if !strings.Contains(s.stderr.String(), "siwtun ping: the client's buffer is 4096 bytes, more than this server's 64 (-S)") ||
		!strings.HasSuffix(s.stderr.String(), "rping server failed: -1\n") {
		t.Fatalf("server stderr %q", s.stderr)
	}
	wantExit(t, "client", c.err, rping.StatusFailed)
	wantOutput(t, "client stdout", c.stdout.String(), "")
	wantOutput(t, "client stderr", c.stderr.String(), "client DISCONNECT EVENT...\nwait for RDMA_WRITE_ADV state 10\n"+
		"siwtun ping: the server disconnected before the first ping completed: is its -S smaller than this client's -S 4096? (it reads the whole buffer the client advertises)\nrping client failed: -1\n")
}

// TestBadOptions: rping's checks, lines and exit status 22.
func TestBadOptions(t *testing.T) {
	p := newPair(t, 1500)
	ctx := testCtx(t)
	tests := []struct {
		o    rping.Options
		line string
	}{
		{rping.Options{Size: 25}, "Invalid size 25 (valid range is 26 to 65535)\n"},
		{rping.Options{Size: 65536}, "Invalid size 65536 (valid range is 26 to 65535)\n"},
		{rping.Options{Count: -1}, "Invalid count -1\n"},
	}
	for _, tt := range tests {
		o, r := opts(tt.o)
		_, err := rping.Listen(p.srv, srvAddr, o)
		wantExit(t, "Listen", err, rping.StatusInvalid)
		wantOutput(t, "server stderr", r.stderr.String(), tt.line)
		c := ping(ctx, p.cli, tt.o)
		wantExit(t, "Ping", c.err, rping.StatusInvalid)
		wantOutput(t, "client stderr", c.stderr.String(), tt.line)
	}
}

// TestListenInUse: a second server on the same port fails like rping's
// rdma_bind_addr.
func TestListenInUse(t *testing.T) {
	p := newPair(t, 1500)
	o, _ := opts(rping.Options{})
	srv, err := rping.Listen(p.srv, srvAddr, o)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	o2, r := opts(rping.Options{})
	_, err = rping.Listen(p.srv, srvAddr, o2)
	wantExit(t, "second Listen", err, rping.StatusFailed)
	if !strings.HasPrefix(r.stderr.String(), "rdma_bind_addr: Address already in use\n") {
		t.Fatalf("stderr %q", r.stderr)
	}
}
