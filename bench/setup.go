package bench

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/siwtun/siwtun/apps/connperf"
)

// suites are the suites the run measures, in their order.
func (r *runner) suites() []string {
	if len(r.cfg.Suites) == 0 {
		return AllSuites
	}
	return slices.DeleteFunc(slices.Clone(AllSuites), func(s string) bool { return !slices.Contains(r.cfg.Suites, s) })
}

// on reports whether the run measures suite.
func (r *runner) on(suite string) bool { return slices.Contains(r.suites(), suite) }

// clientCounts are the client processes of the connect runs: one, then
// Config.Clients at once.
func (r *runner) clientCounts() []int {
	if r.cfg.Clients > 1 {
		return []int{1, r.cfg.Clients}
	}
	return []int{1}
}

// measureSetupScale takes the connect and scale measurements at mtu:
// kernel TCP's connects over the veth pair, then, with the daemons up (CRC
// on, room for every connection), siwtun's connects and the RDMA WRITE
// bandwidth with each number of queue pairs.
func (r *runner) measureSetupScale(mtu int) error {
	conn, scale := r.on(SuiteConnect), r.on(SuiteScale)
	if !conn && !scale {
		return nil
	}
	if conn {
		for _, c := range r.clientCounts() {
			if err := r.ctx.Err(); err != nil {
				return err
			}
			r.connRun(mtu, StackKernel, c)
		}
	}
	if err := r.startDaemons(mtu, true, qpRoom(r.cfg.Connections)...); err != nil {
		return err
	}
	if conn {
		for _, c := range r.clientCounts() {
			if err := r.ctx.Err(); err != nil {
				return err
			}
			r.connRun(mtu, StackSiwtun, c)
		}
	}
	if scale {
		for _, q := range r.cfg.ScaleQPs {
			if err := r.ctx.Err(); err != nil {
				return err
			}
			r.scaleBW(mtu, q)
		}
	}
	return r.stopDaemons()
}

// qpRoom are the flags of `siwtun up` that let one client hold n queue
// pairs (the device's and a client's limits).
func qpRoom(n int) []string {
	room := fmt.Sprint(max(4096, n+64))
	return []string{"--max-qp", room, "--max-client-qps", room}
}

// connArgs are the `siwtun bench conn` arguments of a stack's server (at
// addr) or client, and the namespaces they run in.
func (r *runner) connArgs(stack string) (srvNS, cliNS, addr string, srv, cli []string) {
	port := r.nextPort()
	if stack == StackKernel {
		addr = veth1Addr + ":" + port
		return r.nsK1, r.nsK0, addr, []string{"bench", "conn", "--tcp", "--listen", addr}, []string{"bench", "conn", "--tcp", addr}
	}
	addr = rnic1Addr + ":" + port
	return r.nsRNIC, r.nsRNIC, addr, []string{"bench", "conn", "--socket-dir", r.dir, "--dev", dev1, "--listen", addr},
		[]string{"bench", "conn", "--socket-dir", r.dir, "--dev", dev0, addr}
}

// startConnServer starts a connect server for n connections and waits
// until it listens.
func (r *runner) startConnServer(ns string, args []string, n int) (*proc, error) {
	srv, err := r.start("siwtun bench conn server", ns, append(args, "-n", fmt.Sprint(n))...)
	if err != nil {
		return nil, err
	}
	if err := waitOutput(r, srv, "listening", 30*time.Second); err != nil {
		srv.stop()
		return nil, err
	}
	return srv, nil
}

// waitOutput waits until p's standard output contains s.
func waitOutput(r *runner, p *proc, s string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.stdout.String(), s) {
		if p.exited() {
			return fmt.Errorf("%s exited before printing %q: %v\n%s", p.name, s, p.err, p.stderr.String())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s printed no %q in %v\n%s", p.name, s, timeout, p.stderr.String())
		}
		select {
		case <-r.ctx.Done():
			return r.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// connTimeout bounds a connect run of n connections: it is no performance
// bound, only a guard against a hang.
func connTimeout(n int) time.Duration { return time.Minute + time.Duration(n)*20*time.Millisecond }

// connRun opens Config.Connections connections from clients processes at
// once (each its share, one after the other) to a server that accepts
// them all: kernel TCP over the veth pair, or siwtun from siwtun0 to
// siwtun1. One client gives a connect time row and a rate row, several a
// rate row (their connections over their common span).
func (r *runner) connRun(mtu int, stack string, clients int) {
	per := max(r.cfg.Connections/clients, 1)
	total := per * clients
	what := fmt.Sprintf("MTU %d %s %d connections, %s", mtu, stackName(stack, ""), total, clientsName(clients))
	r.logf("%s", what)
	srvNS, cliNS, _, srvArgs, cliArgs := r.connArgs(stack)
	srv, err := r.startConnServer(srvNS, srvArgs, total)
	if err != nil {
		r.failed(what, err)
		return
	}
	var clis []*proc
	for i := range clients {
		c, err := r.start(fmt.Sprintf("siwtun bench conn client %d", i+1), cliNS, append(cliArgs, "-n", fmt.Sprint(per))...)
		if err != nil {
			srv.stop()
			r.failed(what, err)
			return
		}
		clis = append(clis, c)
	}
	var errs []error
	for _, c := range clis {
		errs = append(errs, c.wait(connTimeout(total)))
	}
	errs = append(errs, srv.wait(time.Minute))
	if err := errors.Join(errs...); err != nil {
		r.failed(what, err)
		return
	}
	var rs []connperf.Result
	for _, c := range clis {
		var res connperf.Result
		if err := decodeJSON(c.stdout.String(), &res); err != nil {
			r.failed(what, fmt.Errorf("%s output: %w", c.name, err))
			return
		}
		rs = append(rs, res)
	}
	n, rate := connperf.Span(rs)
	if clients == 1 {
		r.res.Rows = append(r.res.Rows, Row{MTU: mtu, Stack: stack, Kind: KindConnect, Test: TestConnect, QPs: n, Clients: 1, Value: rs[0].MedianUS})
	}
	r.res.Rows = append(r.res.Rows, Row{MTU: mtu, Stack: stack, Kind: KindRate, Test: TestConnect, QPs: n, Clients: clients, Value: rate})
}

// scaleBW is perftest's RDMA WRITE bandwidth at 1 MiB over qps queue
// pairs at once (CRC on), their aggregate.
func (r *runner) scaleBW(mtu, qps int) {
	what := fmt.Sprintf("MTU %d siwtun RDMA WRITE bw 1 MiB over %d QPs", mtu, qps)
	r.logf("%s", what)
	secs := int(r.cfg.Duration / time.Second)
	_, cli, err := r.perfPair("write", "-s", fmt.Sprint(1<<20), "-D", fmt.Sprint(secs), "-q", fmt.Sprint(qps))
	if err != nil {
		r.failed(what, err)
		return
	}
	bw, err := bwFigure(cli.stdout.String())
	if err != nil {
		r.failed(what, fmt.Errorf("%s output: %w", cli.name, err))
		return
	}
	r.res.Rows = append(r.res.Rows, Row{MTU: mtu, Stack: StackSiwtun, Kind: KindBW, Test: opNames["write"], Size: 1 << 20,
		CRC: boolp(true), QPs: qps, Value: bw.Average * (1 << 20) / 1e6})
}

// settle is how long the daemons rest before their memory is read: the
// connections' set-up is over.
const settle = 2 * time.Second

// idleMemory reads both daemons' resident sets, started afresh, then with
// n connected idle queue pairs (a client holds them open), and records the
// difference per queue pair: siwtun0's queue pairs connected, siwtun1's
// accepted.
func (r *runner) idleMemory(mtu, n int) error {
	what := fmt.Sprintf("MTU %d siwtun memory with %d idle connected QPs", mtu, n)
	r.logf("%s", what)
	if err := r.startDaemons(mtu, true, qpRoom(n)...); err != nil {
		return err
	}
	if err := r.measureIdle(mtu, n); err != nil {
		r.failed(what, err)
	}
	return r.stopDaemons()
}

// sleep waits d, or less if the run is interrupted.
func (r *runner) sleep(d time.Duration) {
	select {
	case <-r.ctx.Done():
	case <-time.After(d):
	}
}

func (r *runner) measureIdle(mtu, n int) error {
	r.sleep(settle)
	base0, err0 := procRSS(r.d0.pid())
	base1, err1 := procRSS(r.d1.pid())
	if err := errors.Join(err0, err1); err != nil {
		return err
	}
	srvNS, cliNS, _, srvArgs, cliArgs := r.connArgs(StackSiwtun)
	srv, err := r.startConnServer(srvNS, srvArgs, n)
	if err != nil {
		return err
	}
	hold, release := io.Pipe()
	cli, err := startProcStdin(r.ctx, "siwtun bench conn client (holding)", cliNS, hold,
		append([]string{r.cfg.Bin}, append(cliArgs, "-n", fmt.Sprint(n), "--hold")...)...)
	if err != nil {
		srv.stop()
		return err
	}
	r.procs = append(r.procs, cli)
	defer release.Close()
	if err := waitOutput(r, cli, "per_second", connTimeout(n)); err != nil {
		return err
	}
	r.sleep(settle)
	rss0, err0 := procRSS(r.d0.pid())
	rss1, err1 := procRSS(r.d1.pid())
	release.Close()
	if err := errors.Join(err0, err1, cli.wait(connTimeout(n)), srv.wait(connTimeout(n))); err != nil {
		return err
	}
	for _, d := range []struct {
		test      string
		base, rss float64
	}{{TestIdleInitiator, base0, rss0}, {TestIdleResponder, base1, rss1}} {
		r.res.Rows = append(r.res.Rows, Row{MTU: mtu, Stack: StackSiwtun, Kind: KindMem, Test: d.test, QPs: n,
			Value: (d.rss - d.base) / float64(n), RSSBaseKiB: d.base, RSSKiB: d.rss})
	}
	return nil
}
