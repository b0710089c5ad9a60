package test

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// twoRNICs is the topology of the integration tests: one namespace, two
// daemons (siwtun0 at 198.18.1.2 behind host 198.18.1.1, siwtun1 at
// 198.18.2.2 behind 198.18.2.1), routed by the namespace's kernel.
type twoRNICs struct {
	ns     *netns
	bin    string
	d0, d1 *daemon
	a0, a1 netip.Addr
	dev0   *verbs.Device
	dev1   *verbs.Device
	mtu    int
}

func newTwoRNICs(t testing.TB, mtu int, extra ...string) *twoRNICs {
	t.Helper()
	requireRoot(t)
	r := &twoRNICs{ns: newNetns(t), bin: siwtunBin(t), mtu: mtu,
		a0: netip.MustParseAddr("198.18.1.2"), a1: netip.MustParseAddr("198.18.2.2")}
	r.d0 = startDaemon(t, r.ns, r.bin, "siwtun0", "198.18.1.2/24", "198.18.1.1/24", mtu, extra...)
	r.d1 = startDaemon(t, r.ns, r.bin, "siwtun1", "198.18.2.2/24", "198.18.2.1/24", mtu, extra...)
	r.dial(t)
	return r
}

// dial opens dev0 and dev1 through the daemons' verbs sockets; they are
// closed when the test ends.
func (r *twoRNICs) dial(t testing.TB) {
	t.Helper()
	r.dev0 = dialVerbs(t, filepath.Join(r.d0.socketDir, "siwtun0.sock"))
	t.Cleanup(func() { r.dev0.Close() })
	r.dev1 = dialVerbs(t, filepath.Join(r.d1.socketDir, "siwtun1.sock"))
	t.Cleanup(func() { r.dev1.Close() })
}

// dialVerbs opens a daemon's verbs socket. The socket's file exists from
// bind(2) on, a moment before listen(2) (net.ListenUnix makes both calls),
// and a connection in between is refused: on a loaded machine a test can
// find the file in that moment, so a refusal is tried again for a while.
func dialVerbs(t testing.TB, path string) *verbs.Device {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := verbs.DialPath(path)
		if err == nil {
			return d
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// end is one side of a connection made through a daemon's verbs socket.
type end struct {
	dev      *verbs.Device
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	qp       *verbs.QP
}

func newEnd(t testing.TB, dev *verbs.Device, depth int) *end {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, err := dev.CreateCQ(4 * depth)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := dev.CreateCQ(4 * depth)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, MaxSendWR: depth, MaxRecvWR: depth})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	return &end{dev, pd, scq, rcq, qp}
}

func (e *end) mr(t testing.TB, n int, access verbs.Access) (*verbs.MR, []byte) {
	t.Helper()
	buf, err := e.dev.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := e.pd.RegMR(buf[:n], access)
	if err != nil {
		t.Fatal(err)
	}
	return mr, buf[:n]
}

func (e *end) wait(t testing.TB, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	wcs := make([]verbs.WorkCompletion, 1)
	if _, err := cq.Wait(ctx(t), wcs); err != nil {
		t.Fatalf("waiting for a completion: %v", err)
	}
	return wcs[0]
}

// connect connects a QP on dev0 to one accepted on dev1 at port.
func (r *twoRNICs) connect(t testing.TB, port uint16, depth int) (cli, srv *end) {
	t.Helper()
	cli, srv = newEnd(t, r.dev0, depth), newEnd(t, r.dev1, depth)
	l, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, port), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
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
		t.Fatalf("Connect: %v", err)
	}
	if err := <-acc; err != nil {
		t.Fatalf("Accept: %v", err)
	}
	waitState(t, srv.qp, verbs.QPRTS)
	return cli, srv
}

func waitState(t testing.TB, qp *verbs.QP, want verbs.QPState) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for qp.State() != want {
		if time.Now().After(deadline) {
			t.Fatalf("QP %d in %v, want %v", qp.Num(), qp.State(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// TestDaemonsOperations: two daemons, an application on each verbs socket:
// Send, RDMA Write and RDMA Read across the namespace's routing, every byte
// verified, at MTU 1500 and 9000.
func TestDaemonsOperations(t *testing.T) {
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprintf("mtu%d", mtu), func(t *testing.T) {
			r := newTwoRNICs(t, mtu)
			cli, srv := r.connect(t, 7174, 16)
			const n = 1 << 20
			smr, sbuf := cli.mr(t, n, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
			copy(sbuf, pattern(n, 1))
			dmr, dbuf := srv.mr(t, n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			rmr, rbuf := srv.mr(t, n, verbs.AccessLocalWrite)

			// Send.
			if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{rmr.SGE(0, n)}}}); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, n)}}}); err != nil {
				t.Fatal(err)
			}
			if wc := cli.wait(t, cli.scq); wc.Status != verbs.WCSuccess {
				t.Fatalf("send: %v", wc.Status)
			}
			if wc := srv.wait(t, srv.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != n {
				t.Fatalf("receive: %v len %d", wc.Status, wc.ByteLen)
			}
			if !bytes.Equal(rbuf, sbuf) {
				t.Fatal("Send: received bytes differ")
			}
			// RDMA Write, then a Send behind it.
			copy(sbuf, pattern(n, 2))
			srv.qp.PostRecv([]verbs.RecvWR{{ID: 3, SGL: []verbs.SGE{rmr.SGE(0, 16)}}})
			if _, err := cli.qp.PostSend([]verbs.SendWR{
				{ID: 4, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, n)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()},
				{ID: 5, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("written")},
			}); err != nil {
				t.Fatal(err)
			}
			if wc := cli.wait(t, cli.scq); wc.Status != verbs.WCSuccess || wc.ID != 4 {
				t.Fatalf("write: %+v", wc)
			}
			srv.wait(t, srv.rcq)
			if !bytes.Equal(dbuf, sbuf) {
				t.Fatal("RDMA Write: target bytes differ")
			}
			// RDMA Read back into a fresh buffer.
			copy(dbuf, pattern(n, 3))
			kmr, kbuf := cli.mr(t, n, verbs.AccessLocalWrite)
			if _, err := cli.qp.PostSend([]verbs.SendWR{{ID: 6, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{kmr.SGE(0, n)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}}); err != nil {
				t.Fatal(err)
			}
			if wc := cli.wait(t, cli.scq); wc.Status != verbs.WCSuccess || wc.ID != 6 {
				t.Fatalf("read: %+v", wc)
			}
			if !bytes.Equal(kbuf, dbuf) {
				t.Fatal("RDMA Read: bytes differ")
			}
			out, err := exec.Command(r.bin, "ctl", "qp", "--dev", "siwtun0", "--socket-dir", r.d0.socketDir).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "state RTS") {
				t.Fatalf("siwtun ctl qp: %v\n%s", err, out)
			}
		})
	}
}

// TestSecondDaemonRefused: a second siwtun up on the same device name fails
// with a clear message and leaves the first one running.
func TestSecondDaemonRefused(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	bin := siwtunBin(t)
	d := startDaemon(t, ns, bin, "siwtun0", "198.18.1.2/24", "198.18.1.1/24", 1500)
	out, err := ns.command(bin, "up", "--dev", "siwtun0", "--addr", "198.18.3.2/24", "--socket-dir", d.socketDir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "already up") {
		t.Fatalf("second siwtun up: %v\n%s", err, out)
	}
	if _, err := exec.Command(bin, "ctl", "devinfo", "--dev", "siwtun0", "--socket-dir", d.socketDir).CombinedOutput(); err != nil {
		t.Fatalf("first daemon gone after the refused second one: %v", err)
	}
}
