package test

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/verbs"
)

// The helper client process (TestHelperClient) is configured by these.
const (
	envHelperRole  = "SIWTUN_TEST_HELPER"       // "writer"
	envHelperSock  = "SIWTUN_TEST_HELPER_SOCK"  // verbs socket to open
	envHelperDst   = "SIWTUN_TEST_HELPER_DST"   // address:port to connect to
	envHelperRAddr = "SIWTUN_TEST_HELPER_RADDR" // target region address
	envHelperRKey  = "SIWTUN_TEST_HELPER_RKEY"  // and its rkey
	envHelperSize  = "SIWTUN_TEST_HELPER_SIZE"  // bytes per RDMA Write
)

// helperStarted is what the helper prints once its Writes complete.
const helperStarted = "transferring"

// TestHelperClient is not a test: it is the body of the client process
// TestClientKilled starts (the test binary re-executed). It opens the verbs
// socket, connects, and RDMA Writes until it is killed.
func TestHelperClient(t *testing.T) {
	if os.Getenv(envHelperRole) != "writer" {
		t.Skip("helper process for TestClientKilled")
	}
	fail := func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "helper: "+f+"\n", a...)
		os.Exit(2)
	}
	size, _ := strconv.Atoi(os.Getenv(envHelperSize))
	raddr, _ := strconv.ParseUint(os.Getenv(envHelperRAddr), 0, 64)
	rkey, _ := strconv.ParseUint(os.Getenv(envHelperRKey), 0, 32)
	dst, err := netip.ParseAddrPort(os.Getenv(envHelperDst))
	if err != nil || size <= 0 {
		fail("bad environment: %v, size %d", err, size)
	}
	dev, err := verbs.DialPath(os.Getenv(envHelperSock))
	if err != nil {
		fail("%v", err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		fail("%v", err)
	}
	cq, err := dev.CreateCQ(256)
	if err != nil {
		fail("%v", err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, MaxRecvWR: 4})
	if err != nil {
		fail("%v", err)
	}
	if err := qp.Modify(verbs.QPInit); err != nil {
		fail("%v", err)
	}
	buf, err := dev.AllocBuffer(size)
	if err != nil {
		fail("%v", err)
	}
	copy(buf, pattern(size, 9))
	mr, err := pd.RegMR(buf[:size], verbs.AccessLocalWrite)
	if err != nil {
		fail("%v", err)
	}
	c := timeoutCtx(t, 2*time.Minute) // never outlive a lost parent for long
	if err := qp.Connect(c, dst, verbs.ConnParam{}); err != nil {
		fail("connect: %v", err)
	}
	wr := verbs.SendWR{Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{mr.SGE(0, size)}, RemoteAddr: raddr, RKey: uint32(rkey)}
	wcs := make([]verbs.WorkCompletion, 16)
	outstanding, done := 0, 0
	for id := uint64(0); ; id++ {
		for outstanding >= 8 {
			n, err := cq.Wait(c, wcs)
			if err != nil {
				fail("wait: %v", err)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != verbs.WCSuccess {
					fail("completion %+v", wc)
				}
				outstanding--
				if done++; done == 16 {
					fmt.Println(helperStarted)
				}
			}
		}
		wr.ID = id
		if _, err := qp.PostSend([]verbs.SendWR{wr}); err != nil {
			fail("post: %v", err)
		}
		outstanding++
	}
}

// TestClientKilled: a client in another process (this binary re-executed
// as TestHelperClient) connects a QP on siwtun0 to a server QP this
// process holds on siwtun1 and streams 1 MiB RDMA Writes into it. The
// client is SIGKILLed mid-transfer. The server QP must see the connection
// end promptly (Disconnected event, ERR state, its posted receive flushed),
// and siwtun0's daemon must release everything the dead client had: no QP
// listed, qpActive and mrActive back to where they were before it came.
func TestClientKilled(t *testing.T) {
	const size, port = 1 << 20, 7310
	r := newTwoRNICs(t, 9000)
	base := ctlVerbsCounters(t, r.d0)

	srv := newEnd(t, r.dev1, 16)
	dmr, dbuf := srv.mr(t, size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	rmr, _ := srv.mr(t, 64, verbs.AccessLocalWrite)
	if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: 77, SGL: []verbs.SGE{rmr.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	l, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, port), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx(t))
		if err == nil {
			err = req.Accept(srv.qp, verbs.ConnParam{})
		}
		acc <- err
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
	stderr := &syncbuf.Buffer{}
	child.Stderr = stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	started := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ok := false
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == helperStarted && !ok {
				ok = true
				started <- true
			}
		}
		if !ok {
			started <- false
		}
		exited <- child.Wait()
	}()
	t.Cleanup(func() {
		child.Process.Kill() // by its PID; no-op once reaped
		<-exited
	})
	if err := <-acc; err != nil {
		t.Fatalf("accept: %v\nhelper: %s", err, stderr)
	}
	select {
	case ok := <-started:
		if !ok {
			t.Fatalf("helper ended before transferring: %v\n%s", <-exited, stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("helper not transferring after 60 s\n%s", stderr)
	}
	// Mid-transfer: the client's QP is in RTS with bytes flowing.
	qps := ctlQPs(t, r.d0)
	if len(qps) != 1 || qps[0].State != "RTS" || qps[0].BytesTx < 16*size {
		t.Fatalf("siwtun0 before the kill: %+v", qps)
	}
	if dbuf[size-1] != pattern(size, 9)[size-1] {
		t.Fatal("the helper's Writes have not reached the server's region")
	}

	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("helper exit: %v\n%s", err, stderr)
		}
		exited <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("helper still running 10 s after SIGKILL")
	}

	// The server side sees the connection end promptly.
	const bound = 20 * time.Second
	ev := within(t, bound, "server QP event after the client was killed", func() verbs.Event {
		for e := range srv.qp.Events() {
			if e.Type == verbs.EventDisconnected {
				return e
			}
		}
		return verbs.Event{}
	})
	t.Logf("server QP: %v %v after the kill (%v)", ev.Type, time.Since(killed).Round(time.Millisecond), ev.Err)
	waitState(t, srv.qp, verbs.QPErr)
	wcs := make([]verbs.WorkCompletion, 4)
	n, err := srv.rcq.Wait(timeoutCtx(t, bound), wcs)
	if err != nil || n != 1 || wcs[0].ID != 77 || wcs[0].Status != verbs.WCFlushErr {
		t.Fatalf("server's posted receive after the kill: %v %+v, want a flush error for ID 77", err, wcs[:n])
	}

	// siwtun0 released everything of the dead client.
	eventually(t, bound, "siwtun0 releases the killed client's objects", func() (bool, string) {
		qps, c := ctlQPs(t, r.d0), ctlVerbsCounters(t, r.d0)
		return len(qps) == 0 && c["qpActive"] == base["qpActive"] && c["mrActive"] == base["mrActive"],
			fmt.Sprintf("QPs %+v, qpActive %d mrActive %d (baseline %d %d)", qps, c["qpActive"], c["mrActive"], base["qpActive"], base["mrActive"])
	})
	t.Logf("siwtun0 clean %v after the kill", time.Since(killed).Round(time.Millisecond))
	// The daemon is still serving: a new client works.
	d, err := verbs.DialPath(r.d0.socketDir + "/siwtun0.sock")
	if err != nil {
		t.Fatalf("siwtun0 after the killed client: %v", err)
	}
	d.Close()
}

// TestDaemonKilled: this process has a connection through both daemons
// with work outstanding (receives posted on both sides, a Wait blocked on
// siwtun1's CQ). siwtun1's daemon is SIGKILLed (by its PID). Then, each
// within a bound: the blocked Wait returns with the receives completed
// with flush errors, the QP gets a Disconnected event carrying
// ErrDeviceRemoved and reads as ERR, later calls on the device fail with
// ErrDeviceRemoved, and the peer QP on siwtun0 sees its connection end.
func TestDaemonKilled(t *testing.T) {
	// A short peer timeout: the surviving RNIC must notice the silent peer.
	r := newTwoRNICs(t, 1500, "--peer-timeout", "3s")
	cli, srv := r.connect(t, 7320, 16)
	rmr, _ := srv.mr(t, 4096, verbs.AccessLocalWrite)
	for id := uint64(1); id <= 3; id++ {
		if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: id, SGL: []verbs.SGE{rmr.SGE(0, 4096)}}}); err != nil {
			t.Fatal(err)
		}
	}
	cmr, _ := cli.mr(t, 4096, verbs.AccessLocalWrite)
	if _, err := cli.qp.PostRecv([]verbs.RecvWR{{ID: 10, SGL: []verbs.SGE{cmr.SGE(0, 4096)}}}); err != nil {
		t.Fatal(err)
	}
	type waited struct {
		n   int
		err error
		wcs []verbs.WorkCompletion
	}
	blocked := make(chan waited, 1)
	go func() {
		wcs := make([]verbs.WorkCompletion, 8)
		n, err := srv.rcq.Wait(ctx(t), wcs)
		blocked <- waited{n, err, wcs[:n]}
	}()
	time.Sleep(200 * time.Millisecond) // let the Wait block
	select {
	case w := <-blocked:
		t.Fatalf("Wait returned before the kill: %+v", w)
	default:
	}

	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", r.d1.pid())); err != nil || strings.TrimSpace(string(b)) != "siwtun" {
		t.Fatalf("pid %d is %q (%v), not the siwtun daemon", r.d1.pid(), b, err)
	}
	r.d1.kill(t)
	killed := time.Now()
	const bound = 10 * time.Second

	// The blocked Wait returns with the receives flushed.
	var w waited
	select {
	case w = <-blocked:
	case <-time.After(bound):
		t.Fatalf("Wait on siwtun1's CQ still blocked %v after the daemon was killed", bound)
	}
	t.Logf("blocked Wait returned %v after the kill: %d %v", time.Since(killed).Round(time.Millisecond), w.n, w.err)
	if w.err != nil {
		t.Fatalf("blocked Wait: %v, want the flushed receives", w.err)
	}
	flushed := w.wcs
	for len(flushed) < 3 {
		p := within(t, bound, "Poll after the daemon was killed", func() waited {
			wcs := make([]verbs.WorkCompletion, 8)
			n, err := srv.rcq.Poll(wcs)
			return waited{n, err, wcs[:n]}
		})
		if p.n == 0 {
			t.Fatalf("receives flushed: %+v, then Poll: %v", flushed, p.err)
		}
		flushed = append(flushed, p.wcs...)
	}
	for i, wc := range flushed {
		if wc.ID != uint64(i+1) || wc.Status != verbs.WCFlushErr || wc.Opcode != verbs.WCRecv || wc.QPNum != srv.qp.Num() {
			t.Fatalf("flushed receive %d: %+v, want ID %d WCFlushErr", i, wc, i+1)
		}
	}
	if n, err := srv.rcq.Poll(make([]verbs.WorkCompletion, 8)); n != 0 || !errors.Is(err, verbs.ErrDeviceRemoved) {
		t.Fatalf("Poll once flushed: %d %v, want ErrDeviceRemoved", n, err)
	}
	if p := within(t, bound, "Wait after the flush", func() waited {
		n, err := srv.rcq.Wait(ctx(t), make([]verbs.WorkCompletion, 8))
		return waited{n: n, err: err}
	}); p.n != 0 || !errors.Is(p.err, verbs.ErrDeviceRemoved) {
		t.Fatalf("Wait once flushed: %d %v, want ErrDeviceRemoved", p.n, p.err)
	}

	// The QP hears of it; calls fail promptly with ErrDeviceRemoved.
	ev := within(t, bound, "Disconnected event on siwtun1's QP", func() verbs.Event {
		for e := range srv.qp.Events() {
			if e.Type == verbs.EventDisconnected {
				return e
			}
		}
		return verbs.Event{}
	})
	if !errors.Is(ev.Err, verbs.ErrDeviceRemoved) {
		t.Errorf("Disconnected event: %v, want ErrDeviceRemoved", ev.Err)
	}
	if st := within(t, bound, "QP.State", srv.qp.State); st != verbs.QPErr {
		t.Errorf("siwtun1 QP state %v, want ERR", st)
	}
	calls := []struct {
		name string
		f    func() error
	}{
		{"PostSend", func() error {
			_, err := srv.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("x")}})
			return err
		}},
		{"PostRecv", func() error {
			_, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: 4, SGL: []verbs.SGE{rmr.SGE(0, 16)}}})
			return err
		}},
		{"AllocPD", func() error { _, err := r.dev1.AllocPD(); return err }},
		{"CreateCQ", func() error { _, err := r.dev1.CreateCQ(4); return err }},
		{"RegMR", func() error {
			buf, err := r.dev1.AllocBuffer(4096)
			if err != nil {
				return err
			}
			_, err = srv.pd.RegMR(buf, verbs.AccessLocalWrite)
			return err
		}},
		{"Listen", func() error { _, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, 7321), 1); return err }},
		{"Modify", func() error { return srv.qp.Modify(verbs.QPReset) }},
	}
	for _, c := range calls {
		if err := within(t, bound, c.name+" on the removed device", c.f); !errors.Is(err, verbs.ErrDeviceRemoved) {
			t.Errorf("%s after the daemon was killed: %v, want ErrDeviceRemoved", c.name, err)
		}
	}
	if err := within(t, bound, "Destroy on the removed device", srv.qp.Destroy); err != nil {
		t.Errorf("QP.Destroy after the daemon was killed: %v, want nil", err)
	}
	if err := within(t, bound, "Close of the removed device", r.dev1.Close); err != nil {
		t.Errorf("Device.Close after the daemon was killed: %v", err)
	}

	// The peer on siwtun0: nothing answers for 198.18.2.2 any more (the
	// kernel has no route once siwtun1 is gone and answers with ICMP
	// unreachable, a soft error to TCP). A Send from it should end its
	// connection (ERR, its receive flushed) in bounded time instead of
	// retransmitting into the void. Known issue: the RNIC's TCP has no user
	// timeout or keepalive, so this takes gVisor's full retransmission
	// limit (15 retries, RTO up to 120 s: many minutes).
	t.Run("PeerSeesEnd", func(t *testing.T) {
		if _, err := cli.qp.PostSend([]verbs.SendWR{{ID: 20, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("anyone?")}}); err != nil {
			t.Fatalf("siwtun0 PostSend: %v", err)
		}
		// --peer-timeout 3s: the unacknowledged Send ends it within seconds.
		eventually(t, 30*time.Second, "siwtun0's QP sees its connection end", func() (bool, string) {
			qps := ctlQPs(t, r.d0)
			if len(qps) != 1 {
				return false, describe(qps)
			}
			return qps[0].State == "ERR", fmt.Sprintf("%s, %d bytes sent", qps[0].State, qps[0].BytesTx)
		})
		t.Logf("siwtun0's QP in ERR %v after the kill", time.Since(killed).Round(time.Millisecond))
		if wc := collect(t, cli.rcq, 1)[10]; wc.Status != verbs.WCFlushErr {
			t.Fatalf("siwtun0's posted receive: %+v, want a flush error", wc)
		}
	})
	// Whatever the peer's connection does, its daemon is unharmed.
	if qps := ctlQPs(t, r.d0); len(qps) != 1 {
		t.Fatalf("siwtun0 after siwtun1 was killed: %+v", qps)
	}
}
