package test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// envOpsClient makes the test binary act as the client process of
// TestClientProcesses: its value is the verbs socket path, envOpsDst the
// server's address.
const (
	envOpsClient = "SIWTUN_TEST_OPS_CLIENT"
	envOpsDst    = "SIWTUN_TEST_OPS_DST"
)

// TestOpsClientProcess is the client process of TestClientProcesses (it
// skips when run directly): on siwtun0 it connects to the server, learns the
// server buffer from a Send, RDMA Writes a pattern there, Sends "written",
// then RDMA Reads the server's second pattern back and verifies it.
func TestOpsClientProcess(t *testing.T) {
	sock := os.Getenv(envOpsClient)
	if sock == "" {
		t.Skip("client process of TestClientProcesses")
	}
	fail := func(f string, a ...any) { fmt.Fprintf(os.Stderr, "client: "+f+"\n", a...); os.Exit(2) }
	dst, err := netip.ParseAddrPort(os.Getenv(envOpsDst))
	if err != nil {
		fail("%v", err)
	}
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dev, err := verbs.DialPath(sock)
	if err != nil {
		fail("%v", err)
	}
	e := newEndOrExit(dev, fail)
	const n = 1 << 20
	buf, _ := dev.AllocBuffer(n)
	mr, err := e.pd.RegMR(buf[:n], verbs.AccessLocalWrite)
	if err != nil {
		fail("%v", err)
	}
	msg, _ := dev.AllocBuffer(16)
	mmr, _ := e.pd.RegMR(msg[:16], verbs.AccessLocalWrite)
	e.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{mmr.SGE(0, 16)}}})
	if err := e.qp.Connect(c, dst, verbs.ConnParam{}); err != nil {
		fail("connect: %v", err)
	}
	wcs := make([]verbs.WorkCompletion, 1)
	wait := func(cq *verbs.CQ, what string) {
		if _, err := cq.Wait(c, wcs); err != nil || wcs[0].Status != verbs.WCSuccess {
			fail("%s: %v %+v", what, err, wcs[0])
		}
	}
	wait(e.rcq, "server's advert")
	raddr, rkey := binary.BigEndian.Uint64(msg), binary.BigEndian.Uint32(msg[8:])
	copy(buf, pattern(n, 21))
	e.qp.PostSend([]verbs.SendWR{
		{ID: 2, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{mr.SGE(0, n)}, RemoteAddr: raddr, RKey: rkey},
		{ID: 3, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("written")},
	})
	wait(e.scq, "write")
	wait(e.scq, "send")
	e.qp.PostRecv([]verbs.RecvWR{{ID: 4, SGL: []verbs.SGE{mmr.SGE(0, 16)}}})
	wait(e.rcq, "server's go-ahead")
	e.qp.PostSend([]verbs.SendWR{{ID: 5, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{mr.SGE(0, n)}, RemoteAddr: raddr, RKey: rkey}})
	wait(e.scq, "read")
	if !bytes.Equal(buf[:n], pattern(n, 22)) {
		fail("RDMA Read: bytes differ")
	}
	e.qp.Disconnect()
	os.Exit(0)
}

func newEndOrExit(dev *verbs.Device, fail func(string, ...any)) *end {
	pd, err := dev.AllocPD()
	if err != nil {
		fail("%v", err)
	}
	scq, _ := dev.CreateCQ(16)
	rcq, _ := dev.CreateCQ(16)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, MaxSendWR: 8, MaxRecvWR: 8})
	if err != nil {
		fail("%v", err)
	}
	qp.Modify(verbs.QPInit)
	return &end{dev: dev, pd: pd, scq: scq, rcq: rcq, qp: qp}
}

// TestClientProcesses: the two daemons, a server application (this
// process) on siwtun1 and a client application in another process on
// siwtun0: Send, RDMA Write and RDMA Read, every byte verified on the side
// that receives it.
func TestClientProcesses(t *testing.T) {
	r := newTwoRNICs(t, 9000)
	srv := newEnd(t, r.dev1, 8)
	const n = 1 << 20
	dmr, dbuf := srv.mr(t, n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	msg, _ := r.dev1.AllocBuffer(16)
	mmr, err := srv.pd.RegMR(msg[:16], verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	l, err := r.dev1.Listen(netip.AddrPortFrom(r.a1, 7400), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	child := exec.Command(os.Args[0], "-test.run", "^TestOpsClientProcess$", "-test.v")
	child.Env = append(os.Environ(), envOpsClient+"="+filepath.Join(r.d0.socketDir, "siwtun0.sock"),
		envOpsDst+"="+netip.AddrPortFrom(r.a1, 7400).String())
	var out bytes.Buffer
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	req, err := l.Accept(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	srv.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{mmr.SGE(0, 16)}}})
	if err := req.Accept(srv.qp, verbs.ConnParam{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, srv.qp, verbs.QPRTS)
	advert := make([]byte, 16)
	binary.BigEndian.PutUint64(advert, dmr.Addr())
	binary.BigEndian.PutUint32(advert[8:], dmr.RKey())
	binary.BigEndian.PutUint32(advert[12:], n)
	srv.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: advert}})
	if wc := srv.wait(t, srv.scq); wc.Status != verbs.WCSuccess {
		t.Fatalf("advert: %+v", wc)
	}
	if wc := srv.wait(t, srv.rcq); wc.Status != verbs.WCSuccess || string(msg[:wc.ByteLen]) != "written" {
		t.Fatalf("client's Send: %+v %q", wc, msg[:wc.ByteLen])
	}
	if !bytes.Equal(dbuf, pattern(n, 21)) {
		t.Fatal("the client's RDMA Write: bytes differ")
	}
	copy(dbuf, pattern(n, 22))
	srv.qp.PostRecv([]verbs.RecvWR{{ID: 3, SGL: []verbs.SGE{mmr.SGE(0, 16)}}})
	srv.qp.PostSend([]verbs.SendWR{{ID: 4, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("go")}})
	srv.wait(t, srv.scq)
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("client process: %v\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("client process did not finish\n%s", out.String())
	}
}
