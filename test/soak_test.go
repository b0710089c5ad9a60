package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/apps/connperf"
	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/verbs"
)

// The soak tests (make soak) run for minutes; they skip unless envSoak is
// set. envSoakTime is the traffic run's length (a Go duration, default
// 10m), envSoakQPs the idle QPs of TestSoakManyQPs (10000), envSoakKills
// the clients TestSoakClientKilled kills (100).
const (
	envSoak      = "SIWTUN_SOAK"
	envSoakTime  = "SOAK_TIME"
	envSoakQPs   = "SOAK_QPS"
	envSoakKills = "SOAK_KILLS"
	// envSoakImpair replaces TestSoakImpaired's impairments (siwtun up
	// --impair syntax), for runs that look for a rare failure faster.
	envSoakImpair = "SOAK_IMPAIR"
)

// requireSoak skips a soak test unless SIWTUN_SOAK=1 (make soak sets it).
func requireSoak(t *testing.T) {
	t.Helper()
	if os.Getenv(envSoak) == "" {
		t.Skip("soak test (minutes long): run make soak, or set SIWTUN_SOAK=1")
	}
	requireRoot(t)
}

// soakInt is an integer setting from the environment, def if unset.
func soakInt(t *testing.T, env string, def int) int {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", env, v)
	}
	return n
}

// soakQP is one of TestSoakImpaired's connections: a worker's QPs on each
// side, remade after every connection the corruption ends.
type soakQP struct {
	r          *twoRNICs
	port       uint16
	cpd, spd   *verbs.PD
	ccq, scq   *verbs.CQ
	cqp, sqp   *verbs.QP
	smr, kmr   *verbs.MR // client: source of Writes and Sends, sink of Reads
	dmr, rmr   *verbs.MR // server: Write target and Read source, Send sink
	sbuf, kbuf []byte
	dbuf, rbuf []byte
	nmr        *verbs.MR // server: the notices after each Write
	msg        int
}

func (q *soakQP) mr(t *testing.T, dev *verbs.Device, pd *verbs.PD, n int, acc verbs.Access) (*verbs.MR, []byte) {
	buf, err := dev.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(buf[:n], acc)
	if err != nil {
		t.Fatal(err)
	}
	return mr, buf[:n]
}

// connect makes fresh CQs and QPs on both sides and connects them; a
// corrupted MPA Request or Reply makes it fail, and the caller tries again.
func (q *soakQP) connect(t *testing.T) error {
	mk := func(dev *verbs.Device, pd *verbs.PD) (*verbs.CQ, *verbs.QP, error) {
		cq, err := dev.CreateCQ(64)
		if err != nil {
			return nil, nil, err
		}
		qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8})
		if err != nil {
			cq.Destroy()
			return nil, nil, err
		}
		return cq, qp, qp.Modify(verbs.QPInit)
	}
	var err error
	if q.ccq, q.cqp, err = mk(q.r.dev0, q.cpd); err != nil {
		t.Fatal(err)
	}
	if q.scq, q.sqp, err = mk(q.r.dev1, q.spd); err != nil {
		t.Fatal(err)
	}
	l, err := q.r.dev1.Listen(netip.AddrPortFrom(q.r.a1, q.port), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acc := make(chan error, 1)
	go func() {
		req, err := l.Accept(c)
		if err == nil {
			err = req.Accept(q.sqp, verbs.ConnParam{})
		}
		acc <- err
	}()
	cerr := q.cqp.Connect(c, l.Addr(), verbs.ConnParam{})
	if cerr != nil {
		cancel()
	}
	aerr := <-acc
	if err := errors.Join(cerr, aerr); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for q.sqp.State() != verbs.QPRTS {
		if q.sqp.State() == verbs.QPErr || time.Now().After(deadline) {
			return fmt.Errorf("server QP %v after Accept", q.sqp.State())
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// teardown destroys the QPs and CQs of the current connection.
func (q *soakQP) teardown(t *testing.T) {
	for _, qp := range []*verbs.QP{q.cqp, q.sqp} {
		if qp != nil {
			if err := qp.Destroy(); err != nil {
				t.Errorf("destroy QP: %v", err)
			}
		}
	}
	for _, cq := range []*verbs.CQ{q.ccq, q.scq} {
		if cq != nil {
			if err := cq.Destroy(); err != nil {
				t.Errorf("destroy CQ: %v", err)
			}
		}
	}
	q.cqp, q.sqp, q.ccq, q.scq = nil, nil, nil, nil
}

// errConnEnded is a round that ended with an error completion: the
// connection is gone (the corruption's Terminate), not the data.
var errConnEnded = errors.New("connection ended")

// soakHang is how long a completion may take before the wait is a hang;
// soakSlow is when a wait still open is reported (stuckReport), so that a
// hang explains itself.
const (
	soakHang = 2 * time.Minute
	soakSlow = 20 * time.Second
)

// waitN waits for n completions on cq; any error status is errConnEnded.
// A wait past soakSlow logs the connection's state on both daemons once.
func (q *soakQP) waitN(t *testing.T, cq *verbs.CQ, n int) ([]verbs.WorkCompletion, error) {
	c, cancel := context.WithTimeout(context.Background(), soakHang)
	defer cancel()
	slow := time.AfterFunc(soakSlow, func() { q.stuckReport(t, cq, n) })
	defer slow.Stop()
	var out []verbs.WorkCompletion
	wcs := make([]verbs.WorkCompletion, 8)
	var bad error
	for len(out) < n {
		k, err := cq.Wait(c, wcs)
		if err != nil {
			return out, fmt.Errorf("waiting for %d completions (have %d): %w", n, len(out), err)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != verbs.WCSuccess && bad == nil {
				bad = fmt.Errorf("%w: %v (opcode %v)", errConnEnded, wc.Status, wc.Opcode)
			}
		}
		out = append(out, wcs[:k]...)
	}
	return out, bad
}

// stuckReport logs what each daemon says about q's connection: its QP's
// state, queues, the octets each side has sent and received (the
// receiver's mpaOctetsRx short of the sender's mpaOctetsTx: TCP has not
// delivered them; equal while the receiver awaits octets: a damaged FPDU
// length), what the FPDU being received still lacks and how long its
// receive side has been quiet, and the QP's counters.
func (q *soakQP) stuckReport(t *testing.T, cq *verbs.CQ, n int) {
	side := "client"
	if cq == q.scq {
		side = "server"
	}
	t.Logf("port %d: the %s's wait for %d completions has taken %v; the connection's state:", q.port, side, n, soakSlow)
	for _, x := range []struct {
		d   *daemon
		num uint32
	}{{q.r.d0, q.cqp.Num()}, {q.r.d1, q.sqp.Num()}} {
		cc, err := ctl.Dial(ctl.SocketPath(x.d.socketDir, x.d.dev))
		if err != nil {
			t.Logf("  ctl %s: %v", x.d.dev, err)
			continue
		}
		qps, err := cc.QPs(0)
		cc.Close()
		if err != nil {
			t.Logf("  ctl qp %s: %v", x.d.dev, err)
			continue
		}
		found := false
		for _, qp := range qps {
			if qp.LQPN != x.num {
				continue
			}
			found = true
			var cs []string
			for _, c := range qp.Counters {
				if c.Value != 0 {
					cs = append(cs, fmt.Sprintf("%s %d", c.Name, c.Value))
				}
			}
			t.Logf("  %s QP %d %s %s->%s: SQ %d/%d RQ %d/%d, octets tx %d rx %d, FPDUs tx %d rx %d, receiving an FPDU that lacks %d octets, receive quiet %d ms; TCP send: %s; %s",
				x.d.dev, qp.LQPN, qp.State, qp.Src, qp.Dst, qp.SQUsed, qp.SQDepth, qp.RQUsed, qp.RQDepth,
				qp.BytesTx, qp.BytesRx, qp.FPDUsTx, qp.FPDUsRx, qp.RxAwaiting, qp.RxQuietMs, qp.TCPSend, strings.Join(cs, ", "))
		}
		if !found {
			t.Logf("  %s: no QP %d", x.d.dev, x.num)
		}
	}
}

// round does one RDMA Write (and a Send saying it is there), one RDMA Read
// and one Send, each of msg bytes of a fresh pattern, and checks every
// byte where it lands. A mismatch after a successful completion is a
// corrupted delivery: it fails the test at once.
func (q *soakQP) round(t *testing.T, seed byte) (int64, error) {
	post := func(qp *verbs.QP, wrs []verbs.SendWR) error {
		if _, err := qp.PostSend(wrs); err != nil {
			return fmt.Errorf("%w: post: %v", errConnEnded, err)
		}
		return nil
	}
	recv := func(mr *verbs.MR, n int) error {
		if _, err := q.sqp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{mr.SGE(0, n)}}}); err != nil {
			return fmt.Errorf("%w: post receive: %v", errConnEnded, err)
		}
		return nil
	}
	n := q.msg
	fillPattern(q.sbuf, seed)
	if err := recv(q.nmr, 16); err != nil {
		return 0, err
	}
	if err := post(q.cqp, []verbs.SendWR{
		{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{q.smr.SGE(0, n)}, RemoteAddr: q.dmr.Addr(), RKey: q.dmr.RKey()},
		{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("written")},
	}); err != nil {
		return 0, err
	}
	_, e1 := q.waitN(t, q.ccq, 2)
	_, e2 := q.waitN(t, q.scq, 1)
	if err := errors.Join(e1, e2); err != nil {
		return 0, err
	}
	if !bytes.Equal(q.dbuf, q.sbuf) {
		t.Fatalf("port %d: RDMA Write completed and its notice arrived, but the target holds other bytes (%d differ)", q.port, differ(q.dbuf, q.sbuf))
	}
	fillPattern(q.dbuf, seed+101)
	if err := post(q.cqp, []verbs.SendWR{{ID: 3, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{q.kmr.SGE(0, n)}, RemoteAddr: q.dmr.Addr(), RKey: q.dmr.RKey()}}); err != nil {
		return 0, err
	}
	if _, err := q.waitN(t, q.ccq, 1); err != nil {
		return 0, err
	}
	if !bytes.Equal(q.kbuf, q.dbuf) {
		t.Fatalf("port %d: RDMA Read completed with other bytes (%d differ)", q.port, differ(q.kbuf, q.dbuf))
	}
	fillPattern(q.sbuf, seed+53)
	if err := recv(q.rmr, n); err != nil {
		return 0, err
	}
	if err := post(q.cqp, []verbs.SendWR{{ID: 4, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{q.smr.SGE(0, n)}}}); err != nil {
		return 0, err
	}
	_, e1 = q.waitN(t, q.ccq, 1)
	wcs, e2 := q.waitN(t, q.scq, 1)
	if err := errors.Join(e1, e2); err != nil {
		return 0, err
	}
	if int(wcs[0].ByteLen) != n || !bytes.Equal(q.rbuf, q.sbuf) {
		t.Fatalf("port %d: Send received (%d bytes) with other bytes (%d differ)", q.port, wcs[0].ByteLen, differ(q.rbuf, q.sbuf))
	}
	return 3 * int64(n), nil
}

// fillPattern fills b with a pattern of seed (pattern() without the
// allocation).
func fillPattern(b []byte, seed byte) {
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
}

func differ(a, b []byte) int {
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n + max(len(a), len(b)) - min(len(a), len(b))
}

// printProcs logs both daemons' footprints.
func printProcs(t *testing.T, what string, r *twoRNICs, gc bool) (p0, p1 ctl.Proc) {
	p0, p1 = ctlProc(t, r.d0, gc), ctlProc(t, r.d1, gc)
	t.Logf("%s: siwtun0 %s", what, procString(p0))
	t.Logf("%s: siwtun1 %s", what, procString(p1))
	return p0, p1
}

// warmUp connects, uses and destroys one QP pair between the daemons, so
// that what a daemon makes at its first client or QP and keeps (the ring
// sleepers' thread and descriptors) is in the baseline taken after it.
func warmUp(t *testing.T, r *twoRNICs, port uint16) {
	t.Helper()
	l, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, port), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	newGoodClients(t, r, l).round(t, 0)
}

// soakBack waits until d's goroutines and descriptors are back at base
// and its heap within 8 MiB and a quarter of it (the connections it
// closed first linger in TIME_WAIT for a minute), and returns what it saw.
func soakBack(t *testing.T, d *daemon, base ctl.Proc) ctl.Proc {
	t.Helper()
	var now ctl.Proc
	eventually(t, 100*time.Second, d.dev+" back at its baseline", func() (bool, string) {
		now = ctlProc(t, d, true)
		ok := now.Goroutines <= base.Goroutines+2 && now.FDs <= base.FDs &&
			now.HeapBytes <= base.HeapBytes+base.HeapBytes/4+8<<20
		return ok, fmt.Sprintf("now %s; baseline %s", procString(now), procString(base))
	})
	return now
}

// TestSoakImpaired (make soak): SOAK_TIME (10 minutes) of RDMA Writes,
// Reads and Sends of 256 KiB on 16 QPs at once between the two daemons,
// both of whose links lose 1 %, reorder 2 %, duplicate 0.5 % and corrupt
// 0.01 % of the packets (the TCP checksum fixed: only MPA's CRC can catch
// it). Every byte is checked where it lands; a corrupted byte delivered
// with a successful completion fails the test. A corruption ends its
// connection with the MPA CRC Terminate (or, when it hit a header whose
// FPDU's CRC had not yet arrived, with the error the header shows:
// doc/terminate-codes.md); the worker then makes fresh QPs, reconnects
// and goes on. At the end: every ended connection is matched by a CRC
// error, an FPDU timeout or an error sent before its FPDU's CRC, no DDP
// or RDMAP error happened in an FPDU whose CRC was checked, and both
// daemons' goroutines, descriptors and heap are back at their baseline.
func TestSoakImpaired(t *testing.T) {
	requireSoak(t)
	dur := 10 * time.Minute
	if v := os.Getenv(envSoakTime); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a duration", envSoakTime, v)
		}
		dur = d
	}
	imp := "loss=1%,reorder=2%,dup=0.5%,corrupt=0.01%,seed=15"
	if v := os.Getenv(envSoakImpair); v != "" {
		imp = v
	}
	const nQP, msg = 16, 256 << 10
	r := newTwoRNICs(t, 1500, "--impair", imp)
	warmUp(t, r, 7699)
	b0, b1 := printProcs(t, "before", r, true)
	qs := make([]*soakQP, nQP)
	for i := range qs {
		q := &soakQP{r: r, port: uint16(7700 + i), msg: msg}
		var err error
		if q.cpd, err = r.dev0.AllocPD(); err != nil {
			t.Fatal(err)
		}
		if q.spd, err = r.dev1.AllocPD(); err != nil {
			t.Fatal(err)
		}
		q.smr, q.sbuf = q.mr(t, r.dev0, q.cpd, msg, verbs.AccessLocalWrite)
		q.kmr, q.kbuf = q.mr(t, r.dev0, q.cpd, msg, verbs.AccessLocalWrite)
		q.dmr, q.dbuf = q.mr(t, r.dev1, q.spd, msg, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		q.rmr, q.rbuf = q.mr(t, r.dev1, q.spd, msg, verbs.AccessLocalWrite)
		q.nmr, _ = q.mr(t, r.dev1, q.spd, 16, verbs.AccessLocalWrite)
		qs[i] = q
	}
	var verified, rounds, ended, connFails atomic.Int64
	var firstEnd sync.Map
	start := time.Now()
	end := start.Add(dur)
	var wg sync.WaitGroup
	for i, q := range qs {
		wg.Go(func() {
			seed := byte(i * 16)
			for time.Now().Before(end) && !t.Failed() {
				if err := q.connect(t); err != nil {
					connFails.Add(1)
					q.teardown(t)
					if connFails.Load() > 1000 {
						t.Errorf("port %d: connect: %v (over 1000 failed connects)", q.port, err)
						return
					}
					continue
				}
				for time.Now().Before(end) && !t.Failed() {
					seed++
					n, err := q.round(t, seed)
					if err != nil {
						if !errors.Is(err, errConnEnded) {
							t.Errorf("port %d: %v (a hang, not an ended connection); the daemons' goroutines follow in their logs (SIGQUIT)", q.port, err)
							for _, d := range []*daemon{r.d0, r.d1} {
								d.cmd.Process.Signal(syscall.SIGQUIT) // by its PID
							}
							return
						}
						ended.Add(1)
						firstEnd.LoadOrStore(err.Error(), q.port)
						break
					}
					verified.Add(n)
					rounds.Add(1)
				}
				q.teardown(t)
			}
		})
	}
	// Progress once a minute.
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Minute):
				t.Logf("%v: %d MiB verified, %d rounds, %d connections ended, %d connects failed",
					time.Since(start).Round(time.Second), verified.Load()>>20, rounds.Load(), ended.Load(), connFails.Load())
			}
		}
	}()
	wg.Wait()
	close(done)
	el := time.Since(start)
	s0, s1 := ctlStats(t, r.d0), ctlStats(t, r.d1)
	sum := func(k string) uint64 { return s0[k] + s1[k] }
	t.Logf("SOAK impaired: %v under %s, 16 QPs: %d MiB verified (%.1f MB/s), %d rounds of Write+Read+Send of 256 KiB, 0 corrupted bytes delivered",
		el.Round(time.Second), imp, verified.Load()>>20, float64(verified.Load())/el.Seconds()/1e6, rounds.Load())
	t.Logf("SOAK impaired: connections ended by an error completion %d, connects that failed %d; mpaCrcErrors %d, mpaFpduTimeouts %d, mpaErrorsBeforeCrc %d, rdmapTerminateTx %d, rdmapTerminateRx %d, ddpErrors %d, rdmapErrors %d, mpaErrors %d, tcpRetransSegs %d, tcpTailRescues %d",
		ended.Load(), connFails.Load(), sum("mpaCrcErrors"), sum("mpaFpduTimeouts"), sum("mpaErrorsBeforeCrc"), sum("rdmapTerminateTx"), sum("rdmapTerminateRx"), sum("ddpErrors"), sum("rdmapErrors"), sum("mpaErrors"), sum("tcpRetransSegs"), sum("tcpTailRescues"))
	firstEnd.Range(func(k, v any) bool { t.Logf("ended connection (first on port %v): %v", v, k); return true })
	if rounds.Load() == 0 {
		t.Fatal("no round completed")
	}
	if sum("mpaCrcErrors") == 0 {
		t.Error("no CRC error in the whole run: the corruption was not applied")
	}
	// Each ended connection was ended by a CRC error (the one that found
	// it sends the Terminate), by an FPDU whose length the corruption
	// raised, its rest never coming (the FPDU timeout's LLP/MPA 0x01), or
	// by a header or Marker the corruption hit in an FPDU whose CRC had
	// not arrived yet (mpaErrorsBeforeCrc: cut-through, the error goes out
	// as the header shows it); a corrupted MPA Request or Reply is a CRC
	// error of no connection (the connect fails and is retried).
	early := sum("mpaErrorsBeforeCrc")
	crcEnds := sum("mpaCrcErrors") + sum("mpaFpduTimeouts") + early
	if uint64(ended.Load()) > crcEnds {
		t.Errorf("%d connections ended but only %d CRC errors, FPDU timeouts and errors before a CRC: some ended for another reason", ended.Load(), crcEnds)
	}
	if crcEnds > 0 && sum("rdmapTerminateTx") < crcEnds-uint64(connFails.Load()) {
		t.Errorf("%d CRC errors, FPDU timeouts and errors before a CRC but %d Terminates sent", crcEnds, sum("rdmapTerminateTx"))
	}
	// A header damaged on the wire whose FPDU's CRC came with it is a CRC
	// error too: DDP and RDMAP errors only where the CRC had not arrived.
	if sum("ddpErrors")+sum("rdmapErrors") > early {
		t.Errorf("DDP errors %d, RDMAP errors %d, only %d sent before their FPDU's CRC: something other than the corruption ended a connection", sum("ddpErrors"), sum("rdmapErrors"), early)
	}
	for _, q := range qs {
		for _, mr := range []*verbs.MR{q.smr, q.kmr, q.dmr, q.rmr, q.nmr} {
			mr.Dereg()
		}
		q.cpd.Dealloc()
		q.spd.Dealloc()
	}
	a0 := soakBack(t, r.d0, b0)
	a1 := soakBack(t, r.d1, b1)
	t.Logf("SOAK impaired after: siwtun0 %s", procString(a0))
	t.Logf("SOAK impaired after: siwtun1 %s", procString(a1))
	for _, d := range []*daemon{r.d0, r.d1} {
		if qps := ctlQPs(t, d); len(qps) != 0 {
			t.Errorf("%s lists %d QPs after the run", d.dev, len(qps))
		}
	}
}

// TestSoakManyQPs (make soak): SOAK_QPS (10,000) connections between the
// two daemons, each on its own QP on both sides, held, then torn down: this
// process dials them from siwtun0 (apps/connperf, as siwtun bench conn
// does) to a `siwtun bench conn --listen` process on siwtun1 that accepts
// each with a new QP (one process holding both sides would need twice
// the descriptors). It prints the connect time and rate and each daemon's
// memory per QP; afterwards no QP is left in siwtun ctl qp and each
// daemon's goroutines and descriptors are back at their baseline. Twice:
// the second cycle leaves no more mappings than the first, and the heap
// after each is printed.
func TestSoakManyQPs(t *testing.T) {
	requireSoak(t)
	n := soakInt(t, envSoakQPs, 10000)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < uint64(n+1024) {
		t.Fatalf("RLIMIT_NOFILE %d: this process needs a descriptor or so per QP (%d)", lim.Cur, n)
	}
	flags := []string{"--max-qp", strconv.Itoa(2 * n), "--max-client-qps", "0", "--max-client-wrs", "0", "--max-client-cqes", "0"}
	r := newTwoRNICs(t, 1500, flags...)
	warmUp(t, r, 7799)
	b0, b1 := printProcs(t, "before", r, true)
	// Twice: the first cycle brings the daemons' Go runtime, maps and
	// pools to their size for n QPs (which a Go process keeps); after the
	// second the heap must be back where the first left it, and the
	// goroutines and descriptors where they were before either.
	var warm0, warm1 ctl.Proc
	for cycle := 1; cycle <= 2; cycle++ {
		a0, a1 := manyQPsCycle(t, r, n, uint16(7800+cycle), b0, b1)
		if cycle == 1 {
			warm0, warm1 = a0, a1
			continue
		}
		for _, x := range []struct {
			dev             string
			base, warm, now ctl.Proc
		}{{"siwtun0", b0, warm0, a0}, {"siwtun1", b1, warm1, a1}} {
			// Reported, not asserted: in the runs made, one daemon's heap
			// 75 s after a cycle was sometimes 30-40 MiB above the other
			// cycle's, on either side and not on both, so not a steady
			// per-QP leak; what holds it is not known yet.
			t.Logf("SOAK many QPs: %s: heap %d KiB after the second cycle, %d KiB after the first (%+.1f KiB per QP)",
				x.dev, x.now.HeapBytes>>10, x.warm.HeapBytes>>10, (float64(x.now.HeapBytes)-float64(x.warm.HeapBytes))/1024/float64(n))
			if x.now.Mappings > x.warm.Mappings+8 {
				t.Errorf("%s: %d mappings after the second cycle, %d after the first", x.dev, x.now.Mappings, x.warm.Mappings)
			}
		}
	}
}

// manyQPsCycle is one cycle of TestSoakManyQPs on port: n QPs connected,
// held, torn down. It returns each daemon's footprint afterwards, its
// goroutines and descriptors back at b0 and b1.
func manyQPsCycle(t *testing.T, r *twoRNICs, n int, port uint16, b0, b1 ctl.Proc) (a0, a1 ctl.Proc) {
	p0, p1 := printProcs(t, "before the cycle", r, true)
	addr := netip.AddrPortFrom(r.a1, port)
	srvOut := &syncbuf.Buffer{}
	srv := r.ns.command(r.bin, "bench", "conn", "--socket-dir", r.d1.socketDir, "--dev", "siwtun1",
		"--listen", addr.String(), "-n", strconv.Itoa(n), "--timeout", "30m")
	srv.Stdout, srv.Stderr = srvOut, srvOut
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	defer srv.Process.Kill() // by its PID; no-op once reaped
	eventually(t, 30*time.Second, "the server listens", func() (bool, string) {
		return strings.Contains(srvOut.String(), "listening"), srvOut.String()
	})
	c := timeoutCtx(t, 20*time.Minute)
	cli, res, err := connperf.DialVerbs(c, r.dev0, addr, n)
	if err != nil {
		t.Fatalf("%v\nserver: %s", err, srvOut)
	}
	t.Logf("SOAK many QPs: %d connections in %.1f s (%.0f/s), connect median %.0f us, max %.0f us",
		res.Connections, res.Seconds, res.PerSecond, res.MedianUS, res.MaxUS)
	eventually(t, time.Minute, "the server accepted them all", func() (bool, string) {
		return strings.Contains(srvOut.String(), fmt.Sprintf("accepted %d connections", n)), srvOut.String()
	})
	for _, d := range []*daemon{r.d0, r.d1} {
		if st := statesOf(ctlQPs(t, d)); st["RTS"] != n {
			t.Fatalf("%s: QP states %v, want %d in RTS", d.dev, st, n)
		}
	}
	time.Sleep(2 * time.Second)
	h0, h1 := printProcs(t, fmt.Sprintf("holding %d QPs", n), r, true)
	for _, x := range []struct {
		dev       string
		base, now ctl.Proc
	}{{"siwtun0", p0, h0}, {"siwtun1", p1, h1}} {
		t.Logf("SOAK many QPs: %s: %.1f KiB RSS and %.1f KiB heap per QP, %.2f goroutines and %.2f descriptors per QP",
			x.dev, float64(x.now.RSSKiB-x.base.RSSKiB)/float64(n), float64(x.now.HeapBytes-x.base.HeapBytes)/1024/float64(n),
			float64(x.now.Goroutines-x.base.Goroutines)/float64(n), float64(x.now.FDs-x.base.FDs)/float64(n))
	}
	start := time.Now()
	if err := cli.Close(); err != nil {
		t.Errorf("client teardown: %v", err)
	}
	select {
	case err := <-srvDone:
		if err != nil {
			t.Errorf("server: %v\n%s", err, srvOut)
		}
	case <-time.After(5 * time.Minute):
		t.Fatalf("the server has not seen its %d connections end 5 minutes after the client closed them\n%s", n, srvOut)
	}
	for _, d := range []*daemon{r.d0, r.d1} {
		eventually(t, 2*time.Minute, d.dev+": no QP left", func() (bool, string) {
			qps, c := ctlQPs(t, d), ctlVerbsCounters(t, d)
			return len(qps) == 0 && c["qpActive"] == 0, fmt.Sprintf("%d QPs listed, qpActive %d", len(qps), c["qpActive"])
		})
	}
	tornDown := time.Now()
	t.Logf("SOAK many QPs: torn down (both sides' QPs destroyed, the server gone) in %v", tornDown.Sub(start).Round(time.Millisecond))
	for _, x := range []struct {
		d    *daemon
		base ctl.Proc
		out  *ctl.Proc
	}{{r.d0, b0, &a0}, {r.d1, b1, &a1}} {
		eventually(t, 100*time.Second, x.d.dev+": goroutines and descriptors back at the baseline", func() (bool, string) {
			*x.out = ctlProc(t, x.d, true)
			return x.out.Goroutines <= x.base.Goroutines+2 && x.out.FDs <= x.base.FDs, procString(*x.out)
		})
	}
	// The side that closed first (siwtun0's, its client destroyed its QPs
	// first) keeps each connection in TIME_WAIT for a minute: the heap
	// says what stays once they have gone.
	time.Sleep(time.Until(tornDown.Add(75 * time.Second)))
	a0, a1 = ctlProc(t, r.d0, true), ctlProc(t, r.d1, true)
	t.Logf("SOAK many QPs after, TIME_WAIT gone: siwtun0 %s", procString(a0))
	t.Logf("SOAK many QPs after, TIME_WAIT gone: siwtun1 %s", procString(a1))
	return a0, a1
}

// TestSoakClientKilled (make soak): SOAK_KILLS (100) times, a client
// process (TestHelperClient) on siwtun0 registers a region, connects to a
// server QP of this process on siwtun1 and streams RDMA Writes into it,
// and is SIGKILLed at a random moment from 0 to 1 s after it started
// (starting, setting up, connecting or transferring). Every time: siwtun0
// releases everything it had (no QP listed, qpActive and mrActive,
// descriptors and mappings back at their baseline), and if the server QP
// was connected it sees the connection end (ERR, its receive flushed),
// never a hang.
func TestSoakClientKilled(t *testing.T) {
	requireSoak(t)
	kills := soakInt(t, envSoakKills, 100)
	const size, port = 256 << 10, 7900
	r := newTwoRNICs(t, 9000)
	// What siwtun0 makes at its first QP and keeps (the doorbell
	// sleepers: an epoll instance, an eventfd and a thread) exists before
	// the baseline, whatever moment the first client is killed at.
	warm := newEnd(t, r.dev0, 4)
	for _, err := range []error{warm.qp.Destroy(), warm.scq.Destroy(), warm.rcq.Destroy(), warm.pd.Dealloc()} {
		if err != nil {
			t.Fatal(err)
		}
	}
	base := ctlVerbsCounters(t, r.d0)
	baseProc := ctlProc(t, r.d0, false)
	spd, err := r.dev1.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := r.dev1.AllocBuffer(size)
	if err != nil {
		t.Fatal(err)
	}
	dmr, err := spd.RegMR(buf[:size], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	rbuf, _ := r.dev1.AllocBuffer(64)
	rmr, err := spd.RegMR(rbuf[:64], verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	l, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, port), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rng := rand.New(rand.NewPCG(15, uint64(time.Now().UnixNano())))
	var baseSnap procSnap
	var last, prev ctl.Proc // siwtun0 once clean after this kill and the one before
	var connected, transferring int
	var worstClean, worstPeer time.Duration
	for i := range kills {
		cq, err := r.dev1.CreateCQ(16)
		if err != nil {
			t.Fatal(err)
		}
		sqp, err := spd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
		if err != nil {
			t.Fatal(err)
		}
		if err := sqp.Modify(verbs.QPInit); err != nil {
			t.Fatal(err)
		}
		if _, err := sqp.PostRecv([]verbs.RecvWR{{ID: 77, SGL: []verbs.SGE{rmr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithCancel(context.Background())
		accepted := make(chan error, 1)
		go func() {
			req, err := l.Accept(actx)
			if err == nil {
				err = req.Accept(sqp, verbs.ConnParam{})
			}
			accepted <- err
		}()
		child := exec.Command(os.Args[0], "-test.run=^TestHelperClient$", "-test.count=1")
		child.Env = append(os.Environ(),
			envHelperRole+"=writer",
			envHelperSock+"="+r.d0.socketDir+"/siwtun0.sock",
			envHelperDst+"="+netip.AddrPortFrom(r.a1, port).String(),
			envHelperRAddr+"="+strconv.FormatUint(dmr.Addr(), 10),
			envHelperRKey+"="+strconv.FormatUint(uint64(dmr.RKey()), 10),
			envHelperSize+"="+strconv.Itoa(size),
		)
		out := &syncbuf.Buffer{}
		child.Stdout, child.Stderr = out, out
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(rng.Int64N(int64(time.Second)))
		time.Sleep(delay)
		child.Process.Signal(syscall.SIGKILL) // by its PID; it may have ended on its own
		waited := make(chan error, 1)
		go func() { waited <- child.Wait() }()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			t.Fatalf("kill %d: client still running 10 s after SIGKILL", i)
		}
		killed := time.Now()
		if strings.Contains(out.String(), helperStarted) {
			transferring++
		}
		eventually(t, 30*time.Second, fmt.Sprintf("kill %d (%v after start): siwtun0 releases the client's objects", i, delay.Round(time.Millisecond)), func() (bool, string) {
			// The footprint first: the control connections of the
			// calls before it would still be open in the daemon (it
			// closes each once it reads the client's end), one
			// descriptor more or less by chance.
			p := ctlProc(t, r.d0, false)
			qps, c := ctlQPs(t, r.d0), ctlVerbsCounters(t, r.d0)
			if i == 0 {
				// What the daemon keeps from its first client on (the
				// ring sleepers' thread and descriptors) is in the
				// baseline: it is taken after the first kill.
				baseProc = p
				baseSnap = readProcSnap(p.PID)
			}
			// The client's memory and rings are the daemon's memfd
			// mappings; its anonymous ones are the Go heap's and each OS
			// thread's (a pthread stack and guard, glibc's arena for the
			// thread), which a Go process keeps once made: a thread made
			// while the client died (more goroutines at once in a system
			// call, a ring's poll(2)) is not the client's.
			snap := readProcSnap(p.PID)
			last = p
			ok := len(qps) == 0 && c["qpActive"] == base["qpActive"] && c["mrActive"] == base["mrActive"] &&
				p.FDs <= baseProc.FDs && snap.memfdMaps() <= baseSnap.memfdMaps()
			saw := fmt.Sprintf("QPs %d, qpActive %d mrActive %d (baseline %d %d), %d fds, %d memfd mappings of %d, %d threads (baseline %d, %d of %d, %d)",
				len(qps), c["qpActive"], c["mrActive"], base["qpActive"], base["mrActive"], p.FDs, snap.memfdMaps(), p.Mappings, p.Threads,
				baseProc.FDs, baseSnap.memfdMaps(), baseProc.Mappings, baseProc.Threads)
			if !ok && i > 0 {
				// Say what is held: the descriptors and mappings not in
				// the baseline.
				saw += "\n" + snap.diff(baseSnap)
			}
			return ok, saw
		})
		worstClean = max(worstClean, time.Since(killed))
		if i > 0 && (last.Threads != prev.Threads || last.Mappings > prev.Mappings+4) {
			// The daemon's anonymous mappings follow its OS threads (a
			// thread's stack and glibc arena), not its clients.
			t.Logf("kill %d: siwtun0 clean; its threads %d -> %d, mappings %d -> %d", i, prev.Threads, last.Threads, prev.Mappings, last.Mappings)
		}
		prev = last
		var aerr error
		select {
		case aerr = <-accepted:
		case <-time.After(3 * time.Second):
			acancel()
			aerr = <-accepted
		}
		acancel()
		if aerr == nil {
			connected++
			// The server QP sees its connection end: ERR, the receive
			// flushed.
			wcs := make([]verbs.WorkCompletion, 4)
			c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			n, err := cq.Wait(c, wcs)
			cancel()
			if err != nil || n < 1 || wcs[0].ID != 77 || wcs[0].Status != verbs.WCFlushErr {
				t.Fatalf("kill %d (%v after start): server's posted receive: %v %+v, want its flush (client output:\n%s)", i, delay, err, wcs[:n], out)
			}
			worstPeer = max(worstPeer, time.Since(killed))
			if st := sqp.State(); st != verbs.QPErr {
				t.Fatalf("kill %d: server QP %v after its receive was flushed", i, st)
			}
		}
		if err := sqp.Destroy(); err != nil {
			t.Fatal(err)
		}
		if err := cq.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("SOAK client killed: %d clients SIGKILLed at random moments (0-1 s after start): %d had connected, %d were transferring; siwtun0 clean every time, at worst %v after the kill; every connected server QP saw the end (ERR, receive flushed), at worst %v after the kill",
		kills, connected, transferring, worstClean.Round(time.Millisecond), worstPeer.Round(time.Millisecond))
	end, endSnap := ctlProc(t, r.d0, false), readProcSnap(baseProc.PID)
	t.Logf("SOAK client killed: siwtun0 after the kills: %d fds, %d memfd mappings, %d threads, %d mappings in all (after the first kill: %d, %d, %d, %d)",
		end.FDs, endSnap.memfdMaps(), end.Threads, end.Mappings, baseProc.FDs, baseSnap.memfdMaps(), baseProc.Threads, baseProc.Mappings)
	if transferring == 0 {
		t.Error("no client was killed while transferring")
	}
	// The daemon still serves a new client.
	d, err := verbs.DialPath(r.d0.socketDir + "/siwtun0.sock")
	if err != nil {
		t.Fatalf("siwtun0 after the kills: %v", err)
	}
	d.Close()
}

// TestSoakDaemonStopped (make soak): 8 connections between the two
// daemons, each with a worker of this process on siwtun1 streaming RDMA
// Writes of 256 KiB into siwtun0, 8 outstanding; then siwtun1's daemon is
// stopped (SIGINT, or SIGKILL every other time), 10 times on fresh
// daemons. Every worker's next call or wait must fail with
// ErrDeviceRemoved (after the flushed completions) within 20 s: none hangs.
func TestSoakDaemonStopped(t *testing.T) {
	requireSoak(t)
	const nQP, size = 8, 256 << 10
	var worst time.Duration
	for i := range 10 {
		r := newTwoRNICs(t, 1500)
		type pair struct{ cli, srv *end }
		ps := make([]pair, nQP)
		for j := range ps {
			cli, srv := r.connect(t, uint16(7950+j), 16)
			ps[j] = pair{cli, srv}
		}
		var started sync.WaitGroup
		results := make(chan error, nQP)
		for _, p := range ps {
			dmr, _ := p.cli.mr(t, size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			smr, _ := p.srv.mr(t, size, verbs.AccessLocalWrite)
			started.Add(1)
			go func() {
				wr := verbs.SendWR{Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, size)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}
				wcs := make([]verbs.WorkCompletion, 8)
				out, done := 0, 0
				c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				for {
					for out < 8 {
						if _, err := p.srv.qp.PostSend([]verbs.SendWR{wr}); err != nil {
							results <- fmt.Errorf("post: %w", err)
							return
						}
						out++
					}
					n, err := p.srv.scq.Wait(c, wcs)
					if err != nil {
						results <- fmt.Errorf("wait: %w", err)
						return
					}
					for _, wc := range wcs[:n] {
						out--
						if wc.Status == verbs.WCSuccess {
							if done++; done == 8 {
								started.Done()
							}
						}
					}
				}
			}()
		}
		started.Wait()
		kill := i%2 == 1
		stopped := time.Now()
		if kill {
			r.d1.kill(t)
		} else {
			r.d1.stop()
		}
		for range nQP {
			select {
			case err := <-results:
				if !errors.Is(err, verbs.ErrDeviceRemoved) {
					t.Fatalf("round %d (kill %v): a worker ended with %v, want ErrDeviceRemoved", i, kill, err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("round %d (kill %v): a worker still blocked 20 s after its daemon stopped", i, kill)
			}
		}
		took := time.Since(stopped)
		worst = max(worst, took)
		t.Logf("round %d: siwtun1 %s under load: all %d workers got ErrDeviceRemoved within %v", i, map[bool]string{false: "stopped (SIGINT)", true: "killed (SIGKILL)"}[kill], nQP, took.Round(time.Millisecond))
	}
	t.Logf("SOAK daemon stopped: 10 rounds of 8 loaded QPs, daemon stopped or killed: every worker got ErrDeviceRemoved, at worst %v after the stop", worst.Round(time.Millisecond))
}

// procSnap is a process's descriptors (by number, what each refers to)
// and mappings (the lines of /proc/<pid>/maps), for saying what a leak
// check found held.
type procSnap struct {
	fds  map[string]string
	maps map[string]bool
}

// readProcSnap reads pid's procSnap (as root: the daemon's /proc files);
// what it cannot read stays empty.
func readProcSnap(pid int) procSnap {
	s := procSnap{fds: make(map[string]string), maps: make(map[string]bool)}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err == nil {
			s.fds[e.Name()] = target
		}
	}
	maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	for _, l := range strings.Split(string(maps), "\n") {
		if l != "" {
			s.maps[l] = true
		}
	}
	return s
}

// memfdMaps counts the mappings of memfds: in the daemon, client regions
// and the rings it shares with clients.
func (s procSnap) memfdMaps() int {
	n := 0
	for l := range s.maps {
		if strings.Contains(l, "/memfd:") {
			n++
		}
	}
	return n
}

// diff lists what s holds that base did not: descriptors whose target
// changed or is new, and mappings not in base (anonymous ones of the Go
// heap move on their own; memfd ones name their object).
func (s procSnap) diff(base procSnap) string {
	var b strings.Builder
	for fd, target := range s.fds {
		if base.fds[fd] != target {
			fmt.Fprintf(&b, "fd %s -> %s (baseline: %q)\n", fd, target, base.fds[fd])
		}
	}
	for fd, target := range base.fds {
		if _, ok := s.fds[fd]; !ok {
			fmt.Fprintf(&b, "fd %s gone (baseline: %q)\n", fd, target)
		}
	}
	for l := range s.maps {
		if !base.maps[l] {
			fmt.Fprintf(&b, "new mapping: %s\n", l)
		}
	}
	for l := range base.maps {
		if !s.maps[l] {
			fmt.Fprintf(&b, "gone mapping: %s\n", l)
		}
	}
	return b.String()
}
