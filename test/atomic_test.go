package test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/verbs"
)

// loadWord reads the 8-byte word at the front of b atomically: it is
// memory the daemon shares with this process and operates on with
// sync/atomic.
func loadWord(b []byte) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[0]))) }

// connectShared connects n queue pairs of dev0 (each its own PD and CQs)
// to n queue pairs accepted on dev1 in one protection domain, which is
// returned with them: a region registered there is reachable from all n.
func (r *twoRNICs) connectShared(t *testing.T, n, depth int, port uint16) (clis []*end, srvPD *verbs.PD, srvs []*end) {
	t.Helper()
	first := newEnd(t, r.dev1, depth)
	l, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, port), n)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range n {
		srv := first
		if i > 0 {
			scq, err := r.dev1.CreateCQ(4 * depth)
			if err != nil {
				t.Fatal(err)
			}
			qp, err := first.pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: scq, MaxSendWR: depth, MaxRecvWR: depth})
			if err != nil {
				t.Fatal(err)
			}
			if err := qp.Modify(verbs.QPInit); err != nil {
				t.Fatal(err)
			}
			srv = &end{dev: r.dev1, pd: first.pd, scq: scq, rcq: scq, qp: qp}
		}
		cli := newEnd(t, r.dev0, depth)
		acc := make(chan error, 1)
		go func() {
			req, err := l.Accept(ctx(t))
			if err != nil {
				acc <- err
				return
			}
			acc <- req.Accept(srv.qp, verbs.ConnParam{})
		}()
		if err := cli.qp.Connect(ctx(t), netip.AddrPortFrom(r.a1, port), verbs.ConnParam{}); err != nil {
			t.Fatalf("Connect %d: %v", i, err)
		}
		if err := <-acc; err != nil {
			t.Fatalf("Accept %d: %v", i, err)
		}
		waitState(t, srv.qp, verbs.QPRTS)
		clis, srvs = append(clis, cli), append(srvs, srv)
	}
	return clis, first.pd, srvs
}

// fetchAddMany adds 1 to the word at addr (rkey) n times from e, in
// batches of batch requests with two batches in flight, only each batch's
// last signaled; it checks every completion it gets.
func fetchAddMany(ctx context.Context, e *end, addr uint64, rkey uint32, n, batch int) error {
	buf, err := e.dev.AllocBuffer(8 * 2 * batch)
	if err != nil {
		return err
	}
	res, err := e.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	defer res.Dereg()
	wrs := make([]verbs.SendWR, batch)
	wcs := make([]verbs.WorkCompletion, 2)
	posted, done, inflight := 0, 0, 0
	for done < n {
		for inflight < 2 && posted < n {
			k := min(batch, n-posted)
			half := (posted / batch) % 2
			for j := range k {
				wrs[j] = verbs.SendWR{ID: uint64(posted + j), Opcode: verbs.WRAtomicFetchAdd,
					SGL: []verbs.SGE{res.SGE(8*(half*batch+j), 8)}, RemoteAddr: addr, RKey: rkey, CompareAdd: 1}
			}
			wrs[k-1].Flags = verbs.FlagSignaled
			if _, err := e.qp.PostSend(wrs[:k]); err != nil {
				return fmt.Errorf("post at %d: %w", posted, err)
			}
			posted += k
			inflight++
		}
		m, err := e.scq.Wait(ctx, wcs[:1])
		if err != nil {
			return err
		}
		for _, wc := range wcs[:m] {
			if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCFetchAdd || wc.ByteLen != 8 {
				return fmt.Errorf("completion %+v", wc)
			}
			done = int(wc.ID) + 1
			inflight--
		}
	}
	return nil
}

// TestDaemonsAtomicCounter: two daemons, an application on each verbs
// socket: 8 queue pairs each add 1 to one counter in the responder
// application's memory 100,000 times with RFC 7306 Fetch-and-Add, and the
// counter ends at exactly 800,000; then 8 queue pairs each increment it
// 500 times with Compare-and-Swap loops (compare with the last value seen,
// retry with the value returned on a miss), and it ends 4,000 higher: the
// responder's atomics are atomic with respect to each other across queue
// pairs. The wire carried Atomic Requests and Responses (the daemons'
// counters).
func TestDaemonsAtomicCounter(t *testing.T) {
	const qps, adds = 8, 100_000
	r := newTwoRNICs(t, 1500)
	if a := r.dev1.Query(); a.AtomicCap != verbs.AtomicHCA {
		t.Fatalf("atomic_cap %v, want HCA", a.AtomicCap)
	}
	clis, pd, _ := r.connectShared(t, qps, 64, 7174)
	if ext := clis[0].qp.Info().Params.Ext; ext&mpa.ExtAtomic == 0 {
		t.Fatalf("negotiated extensions %v, want atomics", ext)
	}
	buf, err := r.dev1.AllocBuffer(64)
	if err != nil {
		t.Fatal(err)
	}
	target, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	counter := target.Addr() + 8
	wctx := timeoutCtx(t, 10*time.Minute) // a hang guard, not a time limit
	var wg sync.WaitGroup
	errs := make([]error, qps)
	for i, c := range clis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fetchAddMany(wctx, c, counter, target.RKey(), adds, 16)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("QP %d: %v", i, err)
		}
	}
	if got := loadWord(buf[8:]); got != qps*adds {
		t.Fatalf("counter %d after %d Fetch-and-Adds from %d QPs, want %d", got, qps*adds, qps, qps*adds)
	}
	if loadWord(buf) != 0 || loadWord(buf[16:]) != 0 {
		t.Fatal("the words around the counter were written")
	}
	t.Logf("counter %d after %d QPs x %d Fetch-and-Adds", loadWord(buf[8:]), qps, adds)

	// Compare-and-Swap loops from every QP.
	const incs = 500
	for i, c := range clis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = casIncrement(wctx, c, counter, target.RKey(), incs)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("QP %d: %v", i, err)
		}
	}
	if got := loadWord(buf[8:]); got != qps*adds+qps*incs {
		t.Fatalf("counter %d after the Compare-and-Swap loops, want %d", got, qps*adds+qps*incs)
	}
	c0, c1 := ctlCounters(t, r.d0), ctlCounters(t, r.d1)
	t.Logf("requester OutRdmaAtomics %d rdmaAtomicsCompleted %d; responder InRdmaAtomics %d OutRdmaAtomicResponses %d",
		c0["OutRdmaAtomics"], c0["rdmaAtomicsCompleted"], c1["InRdmaAtomics"], c1["OutRdmaAtomicResponses"])
	if c0["OutRdmaAtomics"] < qps*(adds+incs) || c1["InRdmaAtomics"] != c0["OutRdmaAtomics"] || c1["OutRdmaAtomicResponses"] != c1["InRdmaAtomics"] {
		t.Fatal("the daemons' atomic counters do not add up")
	}
}

// casIncrement increments the word at addr n times from e with
// Compare-and-Swap: compare with the value last seen, swap in one more;
// a miss returns the current value, which is tried next. It also checks
// the semantics: a hit returns the compare value, a miss anything else.
func casIncrement(ctx context.Context, e *end, addr uint64, rkey uint32, n int) error {
	buf, err := e.dev.AllocBuffer(8)
	if err != nil {
		return err
	}
	res, err := e.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	defer res.Dereg()
	wcs := make([]verbs.WorkCompletion, 1)
	seen := uint64(0) // a guess: the first try misses and learns the value
	for done, tries := 0, 0; done < n; tries++ {
		wr := verbs.SendWR{ID: uint64(tries), Opcode: verbs.WRAtomicCmpSwap, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{res.SGE(0, 8)}, RemoteAddr: addr, RKey: rkey, CompareAdd: seen, Swap: seen + 1}
		if _, err := e.qp.PostSend([]verbs.SendWR{wr}); err != nil {
			return err
		}
		if _, err := e.scq.Wait(ctx, wcs); err != nil {
			return err
		}
		if wc := wcs[0]; wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCCompSwap || wc.ID != uint64(tries) {
			return fmt.Errorf("completion %+v", wc)
		}
		old := binary.NativeEndian.Uint64(buf)
		if old == seen {
			done++
			seen++
		} else {
			seen = old
		}
	}
	return nil
}

// TestDaemonsAtomicPeerWithout: toward a daemon started with --rdmap-ext
// off (as toward Linux siw, which announces no RFC 7306) an atomic fails
// at post time with ErrNotSupportedByPeer, from either side; the device
// without extensions reports AtomicNone; no Atomic Request reaches the
// wire (the daemons' counters, and siwtun trace on the requester's
// device decodes no atomic opcode) and the connection goes on.
func TestDaemonsAtomicPeerWithout(t *testing.T) {
	requireRoot(t)
	r := &twoRNICs{ns: newNetns(t), bin: siwtunBin(t), mtu: 1500,
		a0: netip.MustParseAddr("198.18.1.2"), a1: netip.MustParseAddr("198.18.2.2")}
	r.d0 = startDaemon(t, r.ns, r.bin, "siwtun0", "198.18.1.2/24", "198.18.1.1/24", 1500)
	r.d1 = startDaemon(t, r.ns, r.bin, "siwtun1", "198.18.2.2/24", "198.18.2.1/24", 1500, "--rdmap-ext", "off")
	r.dial(t)
	if a0, a1 := r.dev0.Query().AtomicCap, r.dev1.Query().AtomicCap; a0 != verbs.AtomicHCA || a1 != verbs.AtomicNone {
		t.Fatalf("atomic_cap %v and %v, want HCA and NONE", a0, a1)
	}
	trace := startWatcher(t, r.bin, "trace", "--dev", "siwtun0", "--socket-dir", r.d0.socketDir)
	cli, srv := r.connect(t, 7174, 16)
	dmr, dbuf := srv.mr(t, 64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic)
	cmr, _ := cli.mr(t, 64, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	sres, _ := srv.mr(t, 8, verbs.AccessLocalWrite)
	cres, _ := cli.mr(t, 8, verbs.AccessLocalWrite)
	for _, op := range []verbs.WROpcode{verbs.WRAtomicFetchAdd, verbs.WRAtomicCmpSwap} {
		n, err := cli.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: op, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{cres.SGE(0, 8)},
			RemoteAddr: dmr.Addr(), RKey: dmr.RKey(), CompareAdd: 1, Swap: 2}})
		if n != 0 || !errors.Is(err, verbs.ErrNotSupportedByPeer) {
			t.Fatalf("PostSend(%v) toward the peer without atomics = %d, %v; want ErrNotSupportedByPeer", op, n, err)
		}
		t.Log(err)
		n, err = srv.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: op, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sres.SGE(0, 8)},
			RemoteAddr: cmr.Addr(), RKey: cmr.RKey(), CompareAdd: 1, Swap: 2}})
		if n != 0 || !errors.Is(err, verbs.ErrNotSupportedByPeer) {
			t.Fatalf("PostSend(%v) from the daemon without atomics = %d, %v; want ErrNotSupportedByPeer", op, n, err)
		}
	}
	if _, err := cli.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRWrite, Flags: verbs.FlagInline | verbs.FlagSignaled,
		Inline: []byte("plain write"), RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := cli.wait(t, cli.scq); wc.ID != 2 || wc.Status != verbs.WCSuccess {
		t.Fatalf("plain write after the refusals: %+v", wc)
	}
	eventually(t, 10*time.Second, "the plain write placed", func() (bool, string) {
		return string(dbuf[:11]) == "plain write", fmt.Sprintf("%q", dbuf[:11])
	})
	eventually(t, 10*time.Second, "the trace to show the Write", func() (bool, string) {
		return strings.Contains(trace.stdout.String(), "RDMA Write"), trace.stdout.String()
	})
	trace.stop(t)
	if out := trace.stdout.String(); strings.Contains(out, "Atomic") {
		t.Fatalf("the trace shows an atomic opcode on the wire:\n%s", out)
	}
	c0, c1 := ctlCounters(t, r.d0), ctlCounters(t, r.d1)
	if n := c0["OutRdmaAtomics"] + c1["OutRdmaAtomics"] + c0["InRdmaAtomics"] + c1["InRdmaAtomics"] + c0["rdmapTerminateRx"] + c1["rdmapTerminateRx"]; n != 0 {
		t.Fatalf("atomics or Terminates on the wire: %v / %v", c0, c1)
	}
	if st := cli.qp.State(); st != verbs.QPRTS {
		t.Fatalf("state %v, want RTS", st)
	}
}

// TestCaptureAtomics captures siwtun0's traffic with `siwtun capture`
// (CRC and markers on) while an application runs 50 Fetch-and-Adds and 50
// Compare-and-Swaps over the daemons, and has Wireshark's dissectors
// (tshark) read it: 100 Atomic Requests (AOpCode 0 and 2, 50 each) and
// 100 Atomic Responses, every FPDU with a good CRC, nothing malformed.
func TestCaptureAtomics(t *testing.T) {
	requireRoot(t)
	tshark := needTshark(t)
	r := newTwoRNICs(t, 1500, "--crc", "--markers")
	file := filepath.Join(t.TempDir(), "siwtun0.pcapng")
	capt := startWatcher(t, r.bin, "capture", "--dev", "siwtun0", "--socket-dir", r.d0.socketDir, "-w", file)
	cli, srv := r.connect(t, 7174, 16)
	tmr, tbuf := srv.mr(t, 64, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	rmr, rbuf := cli.mr(t, 8, verbs.AccessLocalWrite)
	const n = 50
	for i := range 2 * n {
		wr := verbs.SendWR{ID: uint64(i), Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{rmr.SGE(0, 8)}, RemoteAddr: tmr.Addr() + 16, RKey: tmr.RKey(), CompareAdd: 3}
		if i >= n {
			wr.Opcode, wr.CompareAdd, wr.Swap = verbs.WRAtomicCmpSwap, 3*n+uint64(i-n), 3*n+uint64(i-n)+1
		}
		if _, err := cli.qp.PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		if wc := cli.wait(t, cli.scq); wc.Status != verbs.WCSuccess || wc.Opcode != wr.Opcode.WC() {
			t.Fatalf("atomic %d: %+v", i, wc)
		}
		want := uint64(3 * i)
		if i >= n {
			want = 3*n + uint64(i-n)
		}
		if got := binary.NativeEndian.Uint64(rbuf); got != want {
			t.Fatalf("atomic %d returned %d, want %d", i, got, want)
		}
	}
	if got := loadWord(tbuf[16:]); got != 4*n {
		t.Fatalf("word %d, want %d", got, 4*n)
	}
	time.Sleep(200 * time.Millisecond) // the last segments reach the capture
	capt.stop(t)

	out, err := exec.Command(tshark, append([]string{"-r", file, "-n", "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,",
		"-e", "iwarp_rdma.opcode", "-e", "iwarp_rdma.atomic.opcode"}, capture.TsharkHeuristicsOff...)...).Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	count := map[string]int{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 2 {
			continue
		}
		ops, aops := strings.Split(f[0], ","), strings.Split(f[1], ",")
		for _, op := range ops {
			count["op "+op]++
		}
		for _, a := range aops {
			if a != "" {
				count["aop "+a]++
			}
		}
	}
	t.Logf("tshark: %v", count)
	if count["op 0x0a"] != 2*n || count["op 0x0b"] != 2*n || count["aop 0"] != n || count["aop 2"] != n {
		t.Fatalf("tshark decoded %v, want %d Atomic Requests (%d FetchAdd, %d CmpSwap) and %d Atomic Responses", count, 2*n, n, n, 2*n)
	}
	res := capture.RunTshark(context.Background(), tshark, file)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.FPDUs == 0 || res.GoodCRC != res.FPDUs || res.BadCRC != 0 || res.Malformed != 0 || res.ExpertErrors != 0 {
		t.Errorf("tshark: %+v", res)
	}
}
