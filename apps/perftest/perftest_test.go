package perftest

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/verbs"
)

// mode is one test configuration run in-process between two RNICs.
type mode struct {
	name string
	cfg  Config
}

// modes: every test (write, read, send; bandwidth and latency), the
// bidirectional and two-QP bandwidth tests, all sizes, timed runs.
var modes = []mode{
	{"write-bw", Config{Verb: Write, Iters: 200, Size: 65536, Inline: -1}},
	{"read-bw", Config{Verb: Read, Iters: 200, Size: 65536, Inline: -1}},
	{"send-bw", Config{Verb: Send, Iters: 2000, Size: 4096, Inline: -1}},
	{"write-lat", Config{Verb: Write, Latency: true, Iters: 200, Inline: -1}},
	{"read-lat", Config{Verb: Read, Latency: true, Iters: 200, Inline: -1}},
	{"send-lat", Config{Verb: Send, Latency: true, Iters: 200, Inline: -1}},
	{"write-bw-b", Config{Verb: Write, Iters: 200, Size: 65536, Inline: -1, Bidirectional: true}},
	{"read-bw-b", Config{Verb: Read, Iters: 200, Size: 65536, Inline: -1, Bidirectional: true}},
	{"send-bw-b", Config{Verb: Send, Iters: 2000, Size: 4096, Inline: -1, Bidirectional: true}},
	{"write-bw-q2", Config{Verb: Write, Iters: 200, Size: 65536, Inline: -1, QPs: 2}},
	{"read-bw-q2", Config{Verb: Read, Iters: 200, Size: 65536, Inline: -1, QPs: 2}},
	{"send-bw-q2", Config{Verb: Send, Iters: 2000, Size: 4096, Inline: -1, QPs: 2}},
	// -a up to 2^23 moves 160 MB per latency run: these stop at 64 KiB.
	{"write-bw-a", Config{Verb: Write, Iters: 5, All: true, Inline: -1, allUpTo: 1 << 16}},
	{"send-bw-a", Config{Verb: Send, Iters: 5, All: true, Inline: -1, allUpTo: 1 << 16}},
	{"write-lat-a", Config{Verb: Write, Latency: true, Iters: 5, All: true, Inline: -1, allUpTo: 1 << 16}},
	{"write-bw-gbits", Config{Verb: Write, Iters: 200, Size: 1024, Inline: -1, Gbits: true}},
	{"write-bw-D1", Config{Verb: Write, Duration: time.Second, Size: 4096, Inline: -1}},
	{"send-bw-D1", Config{Verb: Send, Duration: time.Second, Size: 4096, Inline: -1}},
	{"send-lat-D1", Config{Verb: Send, Latency: true, Duration: time.Second, Inline: -1}},
	// RDMA Write with Immediate Data (--imm): receives and credits as in Send.
	{"write-imm-bw", Config{Verb: Write, Imm: true, Iters: 2000, Size: 4096, Inline: -1}},
	{"write-imm-lat", Config{Verb: Write, Imm: true, Latency: true, Iters: 200, Inline: -1}},
	{"write-imm-bw-b", Config{Verb: Write, Imm: true, Iters: 2000, Size: 4096, Inline: -1, Bidirectional: true}},
	{"write-imm-bw-q2", Config{Verb: Write, Imm: true, Iters: 2000, Size: 4096, Inline: -1, QPs: 2}},
	{"write-imm-bw-a", Config{Verb: Write, Imm: true, Iters: 5, All: true, Inline: -1, allUpTo: 1 << 16}},
	// RFC 7306 atomics (ib_atomic_bw): 8-byte Fetch-and-Add and Compare-and-Swap.
	{"atomic-bw", Config{Verb: Atomic, Iters: 2000, Inline: -1}},
	{"atomic-cas-bw", Config{Verb: Atomic, AtomicType: CmpAndSwap, Iters: 2000, Inline: -1}},
	{"atomic-bw-q2", Config{Verb: Atomic, Iters: 2000, Inline: -1, QPs: 2}},
	{"atomic-bw-b", Config{Verb: Atomic, Iters: 2000, Inline: -1, Bidirectional: true}},
}

// traceLog records the control messages of one side.
type traceLog struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *traceLog) add(sent bool, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sent {
		fmt.Fprintf(&l.buf, "> %d\n", n)
	} else {
		fmt.Fprintf(&l.buf, "< %d\n", n)
	}
}

// TestModes runs every mode between two in-process RNICs and checks the
// text report of both sides, the client's JSON keys and control messages
// against golden files (figures masked), that the two sides agree, and
// that no Send ever met an empty receive queue.
func TestModes(t *testing.T) {
	for i, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			if testing.Short() && m.cfg.Duration > 0 {
				t.Skip("-short: a timed (-D) run takes seconds; make test runs it")
			}
			cdev, sdev := devicePair(t, 1500)
			var ctrace, strace traceLog
			cli, srv := runOn(t, cdev, sdev, m.cfg, uint16(18515+i), func(client bool, c *Config) {
				if client {
					c.trace = ctrace.add
				} else {
					c.trace = strace.add
				}
			})
			if cli.err != nil || srv.err != nil {
				t.Fatalf("client: %v\nserver: %v\n--- client\n%s\n--- server\n%s", cli.err, srv.err, cli.out.String(), srv.out.String())
			}
			testkit.Golden(t, filepath.Join("testdata", m.name+".client.golden"), []byte(masked(cli.out.String(), m.cfg.Duration > 0)))
			testkit.Golden(t, filepath.Join("testdata", m.name+".server.golden"), []byte(masked(srv.out.String(), m.cfg.Duration > 0)))
			testkit.Golden(t, filepath.Join("testdata", m.name+".control.golden"), []byte("client\n"+ctrace.buf.String()+"server\n"+strace.buf.String()))
			js, err := json.MarshalIndent(cli.report, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			testkit.Golden(t, filepath.Join("testdata", m.name+".json.golden"), []byte(maskJSON(string(js))))
			checkAgreement(t, m, cli.report, srv.report)
			for _, d := range []*verbs.Device{cdev, sdev} {
				st := rnic.Engine(d).Stats()
				if n := st.RecvNoBuffer.Load(); n != 0 {
					t.Errorf("%s: %d Sends met an empty receive queue", d.Name(), n)
				}
				if n := st.TerminatesTx.Load(); n != 0 {
					t.Errorf("%s: %d Terminates sent", d.Name(), n)
				}
			}
		})
	}
}

// sizesOf is the sizes a (not normalized) configuration runs.
func sizesOf(c Config) []int {
	n, err := c.Normalize(NominalDeviceAttr())
	if err != nil {
		panic(err)
	}
	return n.sizes()
}

var jsonNumber = regexp.MustCompile(`": -?\d+(\.\d+)?(e[-+]?\d+)?`)

// maskJSON keeps the keys and the structure of a report and masks the
// figures.
func maskJSON(s string) string { return jsonNumber.ReplaceAllString(s, `": #`) }

// checkAgreement: the sides report the same sizes; where perftest moves a
// report from one side to the other (write/read without -b, every -b
// test but timed send) the rows are equal.
func checkAgreement(t *testing.T, m mode, cli, srv *Report) {
	t.Helper()
	c := m.cfg
	switch {
	case c.Latency && c.Verb == Read:
		if len(cli.Lat) != len(sizesOf(c)) || len(srv.Lat) != 0 {
			t.Fatalf("read latency: client %d rows, server %d", len(cli.Lat), len(srv.Lat))
		}
	case c.Latency:
		if len(cli.Lat) != len(sizesOf(c)) || len(srv.Lat) != len(cli.Lat) {
			t.Fatalf("latency rows: client %d, server %d", len(cli.Lat), len(srv.Lat))
		}
		for i := range cli.Lat {
			if cli.Lat[i].Size != srv.Lat[i].Size || (c.Duration == 0 && cli.Lat[i].Iters != uint64(c.Iters)) {
				t.Fatalf("row %d: client %+v server %+v", i, cli.Lat[i], srv.Lat[i])
			}
		}
	case !c.recvs() && !c.Bidirectional:
		if len(srv.BW) != 1 || srv.BW[0] != cli.BW[len(cli.BW)-1] {
			t.Fatalf("server row %+v, want the client's last %+v", srv.BW, cli.BW[len(cli.BW)-1])
		}
	default:
		if len(cli.BW) != len(srv.BW) || len(cli.BW) != len(sizesOf(c)) {
			t.Fatalf("rows: client %d, server %d", len(cli.BW), len(srv.BW))
		}
		for i := range cli.BW {
			a, b := cli.BW[i], srv.BW[i]
			if a.Size != b.Size {
				t.Fatalf("row %d sizes %d/%d", i, a.Size, b.Size)
			}
			if c.Duration == 0 && (a.Iters != uint64(c.Iters*max(c.QPs, 1)) || b.Iters != a.Iters) {
				t.Fatalf("row %d iterations %d/%d, want %d", i, a.Iters, b.Iters, c.Iters*max(c.QPs, 1))
			}
			if c.Bidirectional && c.Duration == 0 && !near(a.Average, b.Average) {
				t.Fatalf("bidirectional sums differ: %+v / %+v", a, b)
			}
			if c.Duration == 0 && a.Average <= 0 {
				t.Fatalf("row %d: no bandwidth %+v", i, a)
			}
		}
	}
}
