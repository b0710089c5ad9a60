package capps

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPerftestAtomic runs Debian's ib_atomic_bw -R (perftest's rdma_cm)
// through libsiwtun between two daemons, Fetch-and-Add and
// Compare-and-Swap: both report 8-byte messages at the count asked for
// with a message rate above zero, and the responder's daemon performed
// every atomic (its counters). perftest gives every request of a queue
// pair the same wr_id and signals one in 100, which libsiwtun's send
// shadow ring must follow.
func TestPerftestAtomic(t *testing.T) {
	e := newEnv(t)
	port := 18700
	for _, op := range []string{"FETCH_AND_ADD", "CMP_AND_SWAP"} {
		port++
		t.Run(op, func(t *testing.T) {
			before := atomicsPerformed(t, e)
			c := perfCase{prog: "ib_atomic_bw", verb: "atomic", size: "8"}
			args := []string{"-R", "-A", op, "-n", c.iters(), "-p", strconv.Itoa(port)}
			srv := e.start("siwtun1", nil, append([]string{c.prog, "-d", "siwtun1"}, args...)...)
			time.Sleep(time.Second) // the server's listener
			cout, cerr := e.start("siwtun0", nil, append([]string{c.prog, "-d", "siwtun0"}, append(args, "198.18.2.2")...)...).wait(t, time.Minute)
			sout, serr := srv.wait(t, time.Minute)
			if cerr != nil || serr != nil {
				t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cout, serr, sout)
			}
			if !strings.Contains(cout, "Atomic "+op+" BW Test") || !strings.Contains(cout, "Transport type : IW") {
				t.Fatalf("client's banner:\n%s", cout)
			}
			checkPerf(t, c, cout, sout)
			f := parsePerf(cout)
			t.Logf("ib_atomic_bw -R -A %s: %s; %.0f operations/s", op, f.row, f.v[2]*1e6)
			if got := atomicsPerformed(t, e) - before; got < 1000 {
				t.Fatalf("the responder performed %d atomics, want at least %s", got, c.iters())
			}
		})
	}
}

// atomicsPerformed is siwtun1's InRdmaAtomics counter.
func atomicsPerformed(t *testing.T, e *env) int {
	t.Helper()
	b, err := e.command(e.bin, "ctl", "stats", "--socket-dir", e.sockDir, "--dev", "siwtun1").CombinedOutput()
	if err != nil {
		t.Fatalf("siwtun ctl stats: %v\n%s", err, b)
	}
	out := string(b)
	for _, f := range strings.Split(out, "\n") {
		fs := strings.Fields(f)
		for i := 0; i+1 < len(fs); i++ {
			if fs[i] == "InRdmaAtomics" {
				n, err := strconv.Atoi(fs[i+1])
				if err != nil {
					t.Fatalf("InRdmaAtomics %q", fs[i+1])
				}
				return n
			}
		}
	}
	t.Fatalf("no InRdmaAtomics in ctl stats:\n%s", out)
	return 0
}
