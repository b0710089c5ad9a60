package bench

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The comparison of Debian's perftest through libsiwtun with siwtun perf
// (GroupCLib): the sizes of its latency and bandwidth targets.
const (
	// CLibLatSize is ib_write_lat's message size.
	CLibLatSize = 2
	// CLibBWSize is ib_write_bw's message size.
	CLibBWSize = 64 << 10
)

// Perftest programs the comparison runs (Debian's perftest package).
var CLibPrograms = []string{"ib_write_lat", "ib_write_bw"}

// clibCompare runs Debian's ib_write_lat and ib_write_bw with -R between
// the two daemons, through libsiwtun (`siwtun exec`), each right next to
// siwtun perf with the same arguments: back to back, which goes first
// turning from round to round, so that the machine's moods fall on all
// alike. ib_write_lat runs next to two siwtun perf runs: one waiting for
// the peer's Write as ib_write_lat does (--spin), one with siwtun perf's
// own yielding wait. Both use no inline data, as perftest on any device
// it does not know (siwtun's, Linux siw's) never does (ctx_set_max_inline
// sets 0; its report says "Max inline data : 0[B]").
func (r *runner) clibCompare(mtu int, crc bool) error {
	type job func()
	lat := []job{func() { r.pairGoLat(mtu, crc, true) }, func() { r.pairGoLat(mtu, crc, false) }, func() { r.cLat(mtu, crc) }}
	bw := []job{func() { r.pairGoBW(mtu, crc) }, func() { r.cBW(mtu, crc) }}
	k := r.round % len(lat)
	lat = append(lat[k:], lat[:k]...)
	if r.round%2 == 1 {
		bw[0], bw[1] = bw[1], bw[0]
	}
	for _, j := range append(lat, bw...) {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		j()
	}
	return nil
}

// pairGoLat runs siwtun perf write --lat next to ib_write_lat, with its
// inline size (none) and, with spin, its busy wait.
func (r *runner) pairGoLat(mtu int, crc, spin bool) {
	args, stack, how := []string{"-I", "0"}, StackPerfPair, ""
	if spin {
		args, stack, how = append(args, "--spin"), StackPerfSpin, " --spin"
	}
	what := fmt.Sprintf("MTU %d siwtun perf write --lat%s %s (next to ib_write_lat)", mtu, how, FormatSize(CLibLatSize))
	r.logf("%s", what)
	row, err := r.goLat(mtu, crc, "write", CLibLatSize, args...)
	if err != nil {
		r.failed(what, err)
		return
	}
	row.Stack = stack
	r.res.Rows = append(r.res.Rows, row)
}

func (r *runner) pairGoBW(mtu int, crc bool) {
	what := fmt.Sprintf("MTU %d siwtun perf write %s (next to ib_write_bw)", mtu, FormatSize(CLibBWSize))
	r.logf("%s", what)
	_, cli, err := r.perfPair("write", "-s", fmt.Sprint(CLibBWSize), "-D", fmt.Sprint(int(r.cfg.Duration/time.Second)))
	if err != nil {
		r.failed(what, err)
		return
	}
	bw, err := bwFigure(cli.stdout.String())
	if err != nil {
		r.failed(what, fmt.Errorf("client output: %w", err))
		return
	}
	r.res.Rows = append(r.res.Rows, Row{MTU: mtu, Stack: StackPerfPair, Kind: KindBW, Test: opNames["write"],
		Size: CLibBWSize, CRC: boolp(crc), Value: bw.Average * (1 << 20) / 1e6})
}

func (r *runner) cLat(mtu int, crc bool) {
	what := fmt.Sprintf("MTU %d ib_write_lat -R %s through libsiwtun", mtu, FormatSize(CLibLatSize))
	r.logf("%s", what)
	iters := r.cfg.LatIters(CLibLatSize)
	// t_min, t_max, t_typical, t_avg: half the round trip.
	f, err := r.perftestRun("ib_write_lat", 2*time.Minute+time.Duration(iters)*5*time.Millisecond, CLibLatSize, []int{2, 3},
		"-s", fmt.Sprint(CLibLatSize), "-n", fmt.Sprint(iters))
	if err != nil {
		r.failed(what, err)
		return
	}
	r.res.Rows = append(r.res.Rows, latRow(mtu, StackCLib, crc, "write", CLibLatSize, f[2], f[3]))
}

func (r *runner) cBW(mtu int, crc bool) {
	what := fmt.Sprintf("MTU %d ib_write_bw -R %s through libsiwtun", mtu, FormatSize(CLibBWSize))
	r.logf("%s", what)
	// BW peak, BW average (MiB/s: perftest's MB is 2^20 bytes).
	f, err := r.perftestRun("ib_write_bw", r.cfg.Duration+2*time.Minute, CLibBWSize, []int{1},
		"-s", fmt.Sprint(CLibBWSize), "-D", fmt.Sprint(int(r.cfg.Duration/time.Second)))
	if err != nil {
		r.failed(what, err)
		return
	}
	r.res.Rows = append(r.res.Rows, Row{MTU: mtu, Stack: StackCLib, Kind: KindBW, Test: opNames["write"],
		Size: CLibBWSize, CRC: boolp(crc), Value: f[1] * (1 << 20) / 1e6})
}

// perftestRun runs a perftest pair (perftestPair) and returns the
// figures of the client's report (perftestReport). A report without the
// figures wanted is taken again, once: under load perftest 4.5 now and
// then measures its CPU clock as 0 and reports every time as inf.
func (r *runner) perftestRun(prog string, timeout time.Duration, size int, want []int, args ...string) ([]float64, error) {
	for attempt := 0; ; attempt++ {
		_, cli, err := r.perftestPair(prog, timeout, args...)
		if err != nil {
			return nil, err
		}
		f, err := perftestReport(cli.stdout.String(), size, want...)
		if err == nil {
			return f, nil
		}
		if attempt == 1 {
			return nil, fmt.Errorf("client output: %w", err)
		}
		r.logf("%s: %v: again", prog, err)
	}
}

// perftestPair runs a perftest program with -R through libsiwtun (`siwtun
// exec`) as server on siwtun1 and client on siwtun0, with the same
// arguments, and returns both, exited. The client starts a second after
// the server, whose listener must be up by then (its output, a pipe, is
// not seen before it exits). A client that fails within seconds (its
// connection refused: the server not listening yet on a loaded machine)
// is tried again with a new server: the old one may hold half of the
// failed connection.
func (r *runner) perftestPair(prog string, timeout time.Duration, args ...string) (srv, cli *proc, err error) {
	for attempt := 0; ; attempt++ {
		port := r.nextPort()
		cmd := func(dev string, extra ...string) []string {
			c := append([]string{"exec", "--socket-dir", r.dir, "--dev", dev, "--", prog, "-d", dev, "-R", "-p", port}, args...)
			return append(c, extra...)
		}
		if srv, err = r.start(prog+" server", r.nsRNIC, cmd(dev1)...); err != nil {
			return nil, nil, err
		}
		select {
		case <-r.ctx.Done():
			srv.stop()
			return nil, nil, r.ctx.Err()
		case <-time.After(time.Second):
		}
		started := time.Now()
		if cli, err = r.start(prog+" client", r.nsRNIC, cmd(dev0, rnic1Addr)...); err != nil {
			srv.stop()
			return nil, nil, err
		}
		cerr := cli.wait(timeout)
		if cerr != nil && attempt < 2 && time.Since(started) < 5*time.Second && !srv.exited() {
			srv.stop()
			first, _, _ := strings.Cut(cerr.Error(), "\n")
			r.logf("%s client failed at once (%s): again, with a new server", prog, first)
			continue
		}
		serr := srv.wait(30 * time.Second)
		return srv, cli, errors.Join(cerr, serr)
	}
}

// perftestRow is the figures row under perftest's "#bytes" header: bytes,
// iterations, then the figures.
var perftestRow = regexp.MustCompile(`(?m)^[ \t]*#bytes.*\n[ \t]*(\d+)[ \t]+(\d+)((?:[ \t]+\S+)+)`)

// perftestReport returns the figures after the iterations of perftest's
// report in out, which must be of size bytes, checking that those at the
// indexes want are positive and finite (a timed run's peak is 0).
func perftestReport(out string, size int, want ...int) ([]float64, error) {
	m := perftestRow.FindStringSubmatch(out)
	if m == nil {
		return nil, fmt.Errorf("no report row in %q", out)
	}
	if m[1] != strconv.Itoa(size) {
		return nil, fmt.Errorf("report of %s bytes, want %d: %q", m[1], size, m[0])
	}
	fields := strings.Fields(m[3])
	figs := make([]float64, len(fields))
	for i, f := range fields {
		// A figure not wanted may be anything ("-nan" for the standard
		// deviation of a run with an overflowing sample).
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			v = math.NaN()
		}
		figs[i] = v
	}
	for _, i := range want {
		if i >= len(figs) || math.IsInf(figs[i], 0) || math.IsNaN(figs[i]) || figs[i] <= 0 {
			return nil, fmt.Errorf("report row without figure %d: %q", i+1, m[0])
		}
	}
	return figs, nil
}
