package uverbs

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"

	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/verbs"
)

// rawClient speaks the protocol by hand.
type rawClient struct {
	t   *testing.T
	c   *uabi.Conn
	seq uint32
}

func (r *rig) raw(t *testing.T) *rawClient {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: r.path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, c: uabi.NewConn(c)}
}

// send sends raw bytes with fds and returns the reply's status and message.
func (rc *rawClient) sendRaw(b []byte, fds ...int) (uint32, string, []byte) {
	rc.t.Helper()
	if err := rc.c.Send(b, fds...); err != nil {
		rc.t.Fatal(err)
	}
	rc.c.C.SetReadDeadline(time.Now().Add(testTimeout))
	for {
		h, body, rfds, err := rc.c.Recv()
		uabi.CloseFDs(rfds)
		if err != nil {
			rc.t.Fatalf("reading the reply: %v", err)
		}
		if h.Op == uabi.OpEvent {
			continue
		}
		var st uabi.Status
		d := &uabi.Dec{B: body}
		if err := st.Decode(d); err != nil {
			rc.t.Fatalf("the reply's status: %v", err)
		}
		return st.Code, st.Msg, d.B
	}
}

// req sends request m (nil: empty) of op, which need not be op's type.
func (rc *rawClient) req(op uint16, m uabi.Msg, fds ...int) (uint32, string, []byte) {
	rc.t.Helper()
	rc.seq++
	var e uabi.Enc
	return rc.sendRaw(e.Message(op, rc.seq, m, len(fds)), fds...)
}

func TestHostileMessages(t *testing.T) {
	r := newRig(t)
	a, b := r.raw(t), r.raw(t)
	st, _, body := b.req(uabi.OpAllocPD, nil)
	if st != uabi.StOK {
		t.Fatalf("AllocPD: status %d", st)
	}
	foreign := binary.LittleEndian.Uint32(body)
	efd, err := uabi.NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	defer uabi.Close(efd)

	hdr := func(length uint32, op uint16, nfds uint16) []byte {
		m := make([]byte, uabi.MsgHeaderLen)
		binary.LittleEndian.PutUint32(m, length)
		binary.LittleEndian.PutUint16(m[4:], op)
		binary.LittleEndian.PutUint16(m[6:], nfds)
		binary.LittleEndian.PutUint32(m[8:], 77)
		return m
	}
	tests := []struct {
		name string
		send func() (uint32, string, []byte)
		want uint32
	}{
		{"shorter than a header", func() (uint32, string, []byte) { return a.sendRaw([]byte{1, 2, 3}) }, uabi.StBadMessage},
		{"truncated", func() (uint32, string, []byte) {
			return a.sendRaw(append(hdr(100, uabi.OpDeallocPD, 0), 1, 2))
		}, uabi.StBadMessage},
		{"oversized", func() (uint32, string, []byte) {
			m := append(hdr(uabi.MaxMsg*2, uabi.OpDeallocPD, 0), make([]byte, uabi.MaxMsg*2-uabi.MsgHeaderLen)...)
			return a.sendRaw(m)
		}, uabi.StBadMessage},
		{"unknown op", func() (uint32, string, []byte) { return a.req(999, nil) }, uabi.StUnknownOp},
		{"short body", func() (uint32, string, []byte) { return a.req(uabi.OpDeallocPD, nil) }, uabi.StBadMessage},
		{"trailing bytes", func() (uint32, string, []byte) {
			return a.req(uabi.OpAllocPD, &uabi.Ref{Handle: 1})
		}, uabi.StBadMessage},
		{"unknown handle", func() (uint32, string, []byte) {
			return a.req(uabi.OpDeallocPD, &uabi.Ref{Handle: 123456})
		}, uabi.StBadHandle},
		{"another client's PD", func() (uint32, string, []byte) {
			return a.req(uabi.OpDeallocPD, &uabi.Ref{Handle: foreign})
		}, uabi.StForeign},
		{"another client's PD in create QP", func() (uint32, string, []byte) {
			return a.req(uabi.OpCreateQP, &uabi.CreateQP{PD: foreign, SendCQ: 1, RecvCQ: 1, MaxSendWR: 4, MaxRecvWR: 4})
		}, uabi.StForeign},
		{"descriptor where none is wanted", func() (uint32, string, []byte) {
			return a.req(uabi.OpAllocPD, nil, efd)
		}, uabi.StBadMessage},
		{"descriptors not announced", func() (uint32, string, []byte) {
			var e uabi.Enc
			e.Begin(uabi.OpAllocPD, 5)
			return a.sendRaw(e.Finish(0), efd)
		}, uabi.StBadMessage},
		{"region of an eventfd", func() (uint32, string, []byte) {
			_, _, pb := a.req(uabi.OpAllocPD, nil)
			pd := binary.LittleEndian.Uint32(pb)
			return a.req(uabi.OpRegMR, &uabi.RegMR{PD: pd, Length: 4096, Access: 1}, efd)
		}, uabi.StError},
		{"huge CQ", func() (uint32, string, []byte) {
			return a.req(uabi.OpCreateCQ, &uabi.CreateCQ{Depth: 1 << 30})
		}, uabi.StError},
		{"bad address family", func() (uint32, string, []byte) {
			var e uabi.Enc
			e.Begin(uabi.OpListen, 6)
			e.U8(9) // neither 0, 4 nor 6
			e.B = append(e.B, make([]byte, 18)...)
			e.U32(1)
			return a.sendRaw(e.Finish(0))
		}, uabi.StBadMessage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a.t = t
			st, msg, _ := tt.send()
			if st != tt.want {
				t.Fatalf("status %d (%s), want %d", st, msg, tt.want)
			}
			t.Logf("status %d: %s", st, msg)
			// The daemon keeps serving both clients.
			if st, msg, _ := a.req(uabi.OpHello, &uabi.Hello{Version: uabi.Version}); st != uabi.StOK {
				t.Fatalf("hello after: %d %s", st, msg)
			}
		})
	}
	b.t = t
	if st, _, _ := b.req(uabi.OpDeallocPD, &uabi.Ref{Handle: foreign}); st != uabi.StOK {
		t.Fatalf("owner's DeallocPD: %d", st)
	}
	// A verbs client still works.
	d := r.dial()
	if _, err := d.AllocPD(); err != nil {
		t.Fatal(err)
	}
}

// TestSIGKILLChild is the child of TestClientKilled: it connects through
// the socket and writes to the peer until it is killed.
func TestSIGKILLChild(t *testing.T) {
	path := os.Getenv("UVERBS_TEST_SOCKET")
	if path == "" {
		t.Skip("child of TestClientKilled only")
	}
	addr, _ := strconv.ParseUint(os.Getenv("UVERBS_TEST_ADDR"), 0, 64)
	rkey, _ := strconv.ParseUint(os.Getenv("UVERBS_TEST_RKEY"), 0, 32)
	dev, err := verbs.DialPath(path)
	if err != nil {
		t.Fatal(err)
	}
	cli := newEnd(t, dev, 64)
	ctx := context.Background()
	if err := cli.qp.Connect(ctx, netip.AddrPortFrom(peerAddr.Addr(), peerPort), verbs.ConnParam{}); err != nil {
		t.Fatal(err)
	}
	src := cli.region(t, 1<<20, verbs.AccessLocalWrite)
	wcs := make([]verbs.WorkCompletion, 8)
	for i := 0; ; i++ {
		if _, err := cli.qp.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{src.SGE(0, 1<<20)}, RemoteAddr: addr, RKey: uint32(rkey)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.scq.Wait(ctx, wcs[:1]); err != nil {
			t.Fatal(err)
		}
	}
}

func TestClientKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	r := newRig(t)
	srv := newEnd(t, r.peer, 64)
	dst := srv.region(t, 1<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	l, err := r.peer.Listen(netip.AddrPortFrom(peerAddr.Addr(), peerPort), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSIGKILLChild$", "-test.v")
	cmd.Env = append(os.Environ(), "UVERBS_TEST_SOCKET="+r.path,
		fmt.Sprintf("UVERBS_TEST_ADDR=%d", dst.Addr()), fmt.Sprintf("UVERBS_TEST_RKEY=%d", dst.RKey()))
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	req, err := l.Accept(ctx)
	if err != nil {
		t.Fatalf("no connection from the child: %v\n%s", err, out)
	}
	if err := req.Accept(srv.qp, verbs.ConnParam{}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, srv.qp, verbs.EventEstablished)
	testkit.Eventually(t, testTimeout, "data from the child", func() bool { return r.peerEng.Stats().PlacedBytes.Load() > 8<<20 })
	if n := len(r.daemon.QPs()); n != 1 {
		t.Fatalf("%d daemon QPs", n)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	waitEvent(t, srv.qp, verbs.EventDisconnected)
	testkit.Eventually(t, testTimeout, "daemon cleanup", func() bool {
		return len(r.daemon.QPs()) == 0 && r.daemon.Regions().Len() == 0 && r.srv.Sessions() == 0
	})
	// The daemon serves the next client.
	if _, err := r.dial().AllocPD(); err != nil {
		t.Fatal(err)
	}
}
