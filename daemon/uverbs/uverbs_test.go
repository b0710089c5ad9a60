package uverbs

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"

	"github.com/siwtun/siwtun/verbs"
)

func TestSocketDataPath(t *testing.T) {
	r := newRig(t)
	cli := newEnd(t, r.dial(), 64)
	srv := newEnd(t, r.peer, 64)
	if !cli.dev.Remote() || cli.dev.Name() != "siwtun0" || cli.dev.Query().MaxSGE != verbs.MaxSGE {
		t.Fatalf("remote device: %v %q %+v", cli.dev.Remote(), cli.dev.Name(), cli.dev.Query())
	}
	connect(t, cli, srv)

	const n = 100000
	src := cli.region(t, n, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i * 7)
	}
	dst := srv.region(t, n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	sink := cli.region(t, n, verbs.AccessLocalWrite)

	// RDMA Write from the client's shared buffer into the peer.
	post(t, cli.qp, verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{src.SGE(0, n)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	if wc := poll(t, cli.scq, 1)[0]; wc.ID != 1 || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCWrite {
		t.Fatalf("write completion %+v", wc)
	}
	// A Send behind the Write: when it is received, the Write is placed.
	recvBuf := srv.region(t, 256, verbs.AccessLocalWrite)
	if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: 5, SGL: []verbs.SGE{recvBuf.SGE(0, 256)}}}); err != nil {
		t.Fatal(err)
	}
	post(t, cli.qp, verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSignaled, Inline: []byte("over the socket")})
	if wc := poll(t, srv.rcq, 1)[0]; wc.ID != 5 || wc.ByteLen != 15 || string(recvBuf.Bytes()[:15]) != "over the socket" {
		t.Fatalf("recv %+v %q", wc, recvBuf.Bytes()[:15])
	}
	poll(t, cli.scq, 1)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("written bytes differ")
	}

	// RDMA Read back into the client's sink.
	post(t, cli.qp, verbs.SendWR{ID: 3, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{sink.SGE(0, n)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	if wc := poll(t, cli.scq, 1)[0]; wc.ID != 3 || wc.Status != verbs.WCSuccess || wc.ByteLen != n {
		t.Fatalf("read completion %+v", wc)
	}
	if !bytes.Equal(sink.Bytes(), src.Bytes()) {
		t.Fatal("read bytes differ")
	}

	// The peer Sends into the client's receive (placed in the shared buffer).
	rb := cli.region(t, 64, verbs.AccessLocalWrite)
	if _, err := cli.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{rb.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSolicited, Inline: []byte("hello client")}}); err != nil {
		t.Fatal(err)
	}
	if wc := poll(t, cli.rcq, 1)[0]; wc.ID != 9 || wc.ByteLen != 12 || string(rb.Bytes()[:12]) != "hello client" {
		t.Fatalf("client recv %+v", wc)
	}
	if st := cli.qp.State(); st != verbs.QPRTS {
		t.Fatalf("state %v", st)
	}
	// Memory not from AllocBuffer is refused.
	if _, err := cli.pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrNotShared) {
		t.Fatalf("RegMR of Go memory: %v", err)
	}
	// Invalid requests fail at post time, like in-process.
	if _, err := cli.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WRRead, SGL: make([]verbs.SGE, 2)}}); err == nil {
		t.Fatal("two-SGE Read posted")
	}
}

func post(t testing.TB, qp *verbs.QP, wrs ...verbs.SendWR) {
	t.Helper()
	if n, err := qp.PostSend(wrs); err != nil || n != len(wrs) {
		t.Fatalf("PostSend: %d, %v", n, err)
	}
}

func TestSocketCloseDestroysObjects(t *testing.T) {
	r := newRig(t)
	dev := r.dial()
	cli := newEnd(t, dev, 16)
	srv := newEnd(t, r.peer, 16)
	connect(t, cli, srv)
	cli.region(t, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if n := len(r.daemon.QPs()); n != 1 {
		t.Fatalf("%d engine QPs", n)
	}
	// Closing the socket without destroying anything: the daemon does it.
	dev.Close()
	waitEvent(t, srv.qp, verbs.EventDisconnected)
	testkit.Eventually(t, testTimeout, "daemon cleanup", func() bool {
		return len(r.daemon.QPs()) == 0 && r.daemon.Regions().Len() == 0 && r.srv.Sessions() == 0
	})
	if _, err := dev.AllocPD(); err == nil {
		t.Fatal("AllocPD on a closed device")
	}
}

func TestSocketDaemonShutdown(t *testing.T) {
	r := newRig(t)
	cli := newEnd(t, r.dial(), 16)
	srv := newEnd(t, r.peer, 16)
	connect(t, cli, srv)
	rb := cli.region(t, 64, verbs.AccessLocalWrite)
	if _, err := cli.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{rb.SGE(0, 64)}}, {ID: 2, SGL: []verbs.SGE{rb.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		// Blocks until the daemon goes: then the receives flush.
		_, err := cli.rcq.Wait(context.Background(), make([]verbs.WorkCompletion, 1))
		done <- err
	}()
	r.srv.Close()
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	// The engine's own Disconnected (its QP destroyed by the daemon) may
	// come first; then the device's removal.
	for {
		ev := waitEvent(t, cli.qp, verbs.EventDisconnected)
		if errors.Is(ev.Err, verbs.ErrDeviceRemoved) {
			break
		}
	}
	wcs := poll(t, cli.rcq, 1)
	if wcs[0].Status != verbs.WCFlushErr {
		t.Fatalf("completion %+v", wcs[0])
	}
	if _, err := cli.rcq.Wait(context.Background(), make([]verbs.WorkCompletion, 1)); !errors.Is(err, verbs.ErrDeviceRemoved) {
		t.Fatalf("Wait after the flush: %v", err)
	}
	if _, err := cli.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, Flags: verbs.FlagInline}}); !errors.Is(err, verbs.ErrDeviceRemoved) {
		t.Fatalf("PostSend: %v", err)
	}
	if _, err := cli.dev.AllocPD(); !errors.Is(err, verbs.ErrDeviceRemoved) {
		t.Fatalf("AllocPD: %v", err)
	}
	waitEvent(t, srv.qp, verbs.EventDisconnected)
	if n := len(r.daemon.QPs()); n != 0 {
		t.Fatalf("%d engine QPs left", n)
	}
}

// TestSocketConnectRefused: a Connect refused by the peer's TCP fails over
// the verbs socket with an error that still matches ECONNREFUSED, as it
// does in-process (tools report it like rdma_connect's errno).
func TestSocketConnectRefused(t *testing.T) {
	r := newRig(t)
	e := newEnd(t, r.dial(), 4)
	if err := e.qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	err := e.qp.Connect(ctx, netip.AddrPortFrom(peerAddr.Addr(), 7999), verbs.ConnParam{})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Connect to a closed port = %v, want an error matching ECONNREFUSED", err)
	}
	var re *verbs.RemoteError
	if !errors.As(err, &re) || re.Errno != syscall.ECONNREFUSED {
		t.Fatalf("Connect error %#v, want a *verbs.RemoteError with Errno ECONNREFUSED", err)
	}
}
