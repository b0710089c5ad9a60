package capps

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
)

// rstreamRow is rstream's and riostream's result line: name, bytes,
// xfers, iters, total, then the time in seconds, Gb/s and µs per transfer.
var rstreamRow = regexp.MustCompile(`(?m)^(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)\s*$`)

// streamFigures is one side's parsed result line.
type streamFigures struct {
	row                       string
	size, xfers, iters, total string
	secs, gbps, usPerXfer     float64
}

func parseStream(out string) *streamFigures {
	m := rstreamRow.FindStringSubmatch(out)
	if m == nil {
		return nil
	}
	f := &streamFigures{row: strings.Join(strings.Fields(m[0]), " "), size: m[2], xfers: m[3], iters: m[4], total: m[5]}
	f.secs, _ = strconv.ParseFloat(m[6], 64)
	f.gbps, _ = strconv.ParseFloat(m[7], 64)
	f.usPerXfer, _ = strconv.ParseFloat(m[8], 64)
	return f
}

// sizeStr is how rstream prints a size: 64, 4k, 64k, 1m.
func sizeStr(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dm", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dk", n>>10)
	}
	return strconv.Itoa(n)
}

// countStr is how rstream prints a count: 100, 1k.
func countStr(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// streamRun is one rstream or riostream pair: the server on siwtun1, the
// client on siwtun0; each side's output.
type streamRun struct {
	prog          string
	size, count   int
	opts          []string // -T options
	rsockets      bool     // siwtun exec --rsockets (a plain-socket program over librspreload)
	plain         bool     // no siwtun at all: the kernel's TCP in the namespace
	srvAddr       string
	cout, sout    string
	client, serve *streamFigures
}

// run starts the server, then the client (again while it is refused:
// the server's listener gives no sign on a pipe) and checks both reports:
// exit 0, the size, count and iterations asked for, a time, a rate and a
// time per transfer above zero (the rate too, but at 64 B, where it
// rounds to 0.00), and the same total on both sides (count transfers each
// way). The two sides' times are not compared: each times its own part
// of the run, on a machine shared with other work.
func (e *env) streamRun(t *testing.T, r *streamRun, port int) {
	t.Helper()
	args := func(side ...string) []string {
		a := append([]string{r.prog}, side...)
		a = append(a, "-p", strconv.Itoa(port), "-S", strconv.Itoa(r.size), "-C", strconv.Itoa(r.count))
		for _, o := range r.opts {
			a = append(a, "-T", o)
		}
		return a
	}
	start := func(dev string, a []string) *app {
		if r.plain {
			x := &app{done: make(chan struct{})}
			x.cmd = e.command(a...)
			x.cmd.Stdout, x.cmd.Stderr = lockedWriter{&x.mu, &x.stdout}, lockedWriter{&x.mu, &x.stderr}
			if err := x.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { x.err = x.cmd.Wait(); close(x.done) }()
			t.Cleanup(func() {
				select {
				case <-x.done:
				default:
					x.cmd.Process.Kill()
					<-x.done
				}
			})
			return x
		}
		if r.rsockets {
			return e.startRsockets(dev, a...)
		}
		return e.start(dev, nil, a...)
	}
	srv := start("siwtun1", args("-b", r.srvAddr))
	var cerr error
	for try := 0; try < 10; try++ {
		time.Sleep(time.Second)
		r.cout, cerr = start("siwtun0", args("-s", r.srvAddr)).wait(t, 2*time.Minute)
		if cerr == nil || !strings.Contains(r.cout, "refused") {
			break
		}
	}
	var serr error
	r.sout, serr = srv.wait(t, time.Minute)
	name := fmt.Sprintf("%s %v -S %d -C %d", r.prog, r.opts, r.size, r.count)
	if cerr != nil || serr != nil {
		t.Fatalf("%s: client: %v\n%s\nserver: %v\n%s", name, cerr, r.cout, serr, r.sout)
	}
	for _, s := range []string{r.cout, r.sout} {
		if strings.Contains(s, "verification failed") {
			t.Fatalf("%s: data verification failed:\nclient:\n%s\nserver:\n%s", name, r.cout, r.sout)
		}
	}
	r.client, r.serve = parseStream(r.cout), parseStream(r.sout)
	if r.client == nil || r.serve == nil {
		t.Fatalf("%s: no report:\nclient:\n%s\nserver:\n%s", name, r.cout, r.sout)
	}
	for side, f := range map[string]*streamFigures{"client": r.client, "server": r.serve} {
		if f.size != sizeStr(r.size) || f.xfers != countStr(r.count) || f.iters != "1" {
			t.Fatalf("%s: %s report %q: want size %s, %s transfers, 1 iteration", name, side, f.row, sizeStr(r.size), countStr(r.count))
		}
		// The time (s) and Gb/s columns have two decimals: a small
		// run (64 B x 100: 6.4 KB in a few ms) prints 0.00 for either;
		// the time per transfer (µs) is never that small.
		small := r.size*r.count < 1<<20
		if f.usPerXfer <= 0 || f.secs < 0 || f.gbps < 0 || (!small && (f.secs <= 0 || f.gbps <= 0)) {
			t.Fatalf("%s: %s report %q: a figure not above zero", name, side, f.row)
		}
	}
	// Agreement without timing (each side times its own part of the run
	// on a shared machine): both moved the same total.
	if r.client.total != r.serve.total {
		t.Errorf("%s: client and server report different totals:\n%s\n%s", name, r.client.row, r.serve.row)
	}
}

// startRsockets runs a program through siwtun exec --rsockets.
func (e *env) startRsockets(dev string, args ...string) *app {
	e.t.Helper()
	return e.launch(append([]string{e.bin, "exec", "--rsockets", "--socket-dir", e.sockDir, "--dev", dev, "--"}, args...), nil)
}

// octetsRx is what a daemon's MPA layer has received (mpaOctetsRx).
func (e *env) octetsRx(t *testing.T, dev string) uint64 {
	t.Helper()
	c, err := ctl.Dial(ctl.SocketPath(e.sockDir, dev))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range s.MPA {
		if x.Name == "mpaOctetsRx" {
			return x.Value
		}
	}
	t.Fatal("no mpaOctetsRx counter")
	return 0
}

// TestRsockets runs librdmacm's rsockets through libsiwtun: libsiwtun's
// own C test of every rsockets call (ASan and UBSan), Debian's rstream and
// riostream (rdmacm-utils) between the two daemons at several sizes with
// their data verified (-T v), and an unmodified TCP socket program,
// rstream in its plain-socket mode (-T s), under librspreload.so (siwtun
// exec --rsockets) next to the same program over the kernel's TCP.
func TestRsockets(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"rstream", "riostream"} {
		if _, err := os.Stat("/usr/bin/" + p); err != nil {
			t.Skipf("%s not installed: install rdmacm-utils", p)
		}
	}
	t.Run("exec", func(t *testing.T) {
		// siwtun exec --rsockets: libsiwtun first, then librspreload;
		// a missing librspreload named.
		out, err := e.startRsockets("siwtun1", "env").wait(t, time.Minute)
		lib := filepath.Join(filepath.Dir(e.bin), "libsiwtun.so")
		if err != nil || !regexp.MustCompile(`(?m)^LD_PRELOAD=`+regexp.QuoteMeta(lib)+`:/\S+/rsocket/librspreload\.so$`).MatchString(out) {
			t.Errorf("siwtun exec --rsockets -- env: %v\n%s", err, out)
		}
		miss := e.command(e.bin, "exec", "--rsockets", "--", "true")
		miss.Env = append(os.Environ(), "SIWTUN_RSPRELOAD=/nonexistent/librspreload.so")
		if b, err := miss.CombinedOutput(); err == nil || !strings.Contains(string(b), "siwtun: SIWTUN_RSPRELOAD: stat /nonexistent/librspreload.so") {
			t.Errorf("siwtun exec --rsockets with a missing librspreload: %v\n%s", err, b)
		}
	})
	t.Run("ctest", func(t *testing.T) {
		out, err := e.start("", e.asanEnv(),
			e.ctest, "--rsockets", "siwtun0", "siwtun1", "17980").wait(t, 2*time.Minute)
		if err != nil || !strings.Contains(out, "\nPASS\n") {
			t.Fatalf("siwtun-ctest --rsockets: %v\n%s", err, out)
		}
		t.Logf("siwtun-ctest --rsockets:\n%s", out)
	})
	port := 7600
	for _, prog := range []string{"rstream", "riostream"} {
		for _, c := range []struct {
			size, count int
			opts        []string
		}{
			{64, 1000, []string{"v"}}, {4096, 500, []string{"v"}}, {65536, 200, []string{"v"}}, {1 << 20, 20, []string{"v"}},
			{65536, 200, []string{"b"}}, {65536, 200, []string{"a"}},
		} {
			if prog == "riostream" && c.size < 4096 {
				c.count = 100 // riostream's receiver spins on its buffer: slow on two cores
			}
			port++
			r := &streamRun{prog: prog, size: c.size, count: c.count, opts: c.opts, srvAddr: "198.18.2.2"}
			t.Run(fmt.Sprintf("%s/%s-%v", prog, sizeStr(c.size), c.opts), func(t *testing.T) {
				e.streamRun(t, r, port)
				t.Logf("%s -T %v -S %d -C %d: client %q, server %q", prog, c.opts, c.size, c.count, r.client.row, r.serve.row)
			})
		}
	}
	// rstream -T s uses ordinary sockets (socket, bind, listen, accept,
	// connect, send, recv, fcntl, setsockopt, poll): under librspreload
	// they become rsockets on the RNICs' addresses; without it, the
	// kernel's TCP between the namespace's two host addresses (a loopback
	// path: the kernel owns both).
	for _, c := range []struct{ size, count int }{{4096, 2000}, {65536, 500}, {1 << 20, 50}} {
		port++
		rs := &streamRun{prog: "rstream", size: c.size, count: c.count, opts: []string{"s"}, rsockets: true, srvAddr: "198.18.2.2"}
		tcp := &streamRun{prog: "rstream", size: c.size, count: c.count, opts: []string{"s"}, plain: true, srvAddr: "198.18.2.1"}
		t.Run(fmt.Sprintf("rspreload/%s", sizeStr(c.size)), func(t *testing.T) {
			before := e.octetsRx(t, "siwtun1")
			e.streamRun(t, rs, port)
			// Over RDMA: siwtun1's RNIC received at least the client's
			// half of the exchange (the server binds the RNIC's address,
			// which the kernel does not have, so no fallback to TCP).
			if got, want := e.octetsRx(t, "siwtun1")-before, uint64(c.size*c.count); got < want {
				t.Fatalf("siwtun1 received %d octets during the run, want at least %d: not over rsockets", got, want)
			}
			e.streamRun(t, tcp, port+100)
			t.Logf("rstream -T s -S %d -C %d: rsockets (siwtun exec --rsockets) %.2f Gb/s, %.2f µs/xfer; kernel TCP %.2f Gb/s, %.2f µs/xfer (client's report; ratio %.2f)",
				c.size, c.count, rs.client.gbps, rs.client.usPerXfer, tcp.client.gbps, tcp.client.usPerXfer, rs.client.gbps/tcp.client.gbps)
		})
	}
}
