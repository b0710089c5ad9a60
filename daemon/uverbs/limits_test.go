package uverbs

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/verbs"
)

// wantLimit checks that err is the per-client limit error naming flag.
func wantLimit(t *testing.T, err error, flag string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error past the limit of --max-client-%s", flag)
	}
	if !errors.Is(err, verbs.ErrLimit) || !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("%v: not verbs.ErrLimit and ENOMEM", err)
	}
	if !strings.Contains(err.Error(), "--max-client-"+flag) {
		t.Fatalf("%v: does not name --max-client-%s", err, flag)
	}
	t.Logf("past the limit: %v", err)
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// TestClientLimits hits each per-client limit: the call fails with
// ErrLimit (ENOMEM), the session goes on (once an object is destroyed the
// same call succeeds), and another client is not affected.
func TestClientLimits(t *testing.T) {
	r := newRig(t)
	r.srv.SetLimits(Limits{QPs: 2, CQs: 4, MRs: 4, PDs: 2, Listeners: 1, MRBytes: 64 << 10, WRs: 64, CQEs: 128})

	// other is a client at each limit's edge too, all the time.
	other := r.dial()

	t.Run("attributes", func(t *testing.T) {
		a := r.dial().Query()
		if a.MaxQP != 2 || a.MaxCQ != 4 || a.MaxMR != 4 || a.MaxPD != 2 || a.MaxCQE != 128 {
			t.Fatalf("device attributes not capped by the limits: %+v", a)
		}
	})
	t.Run("pds", func(t *testing.T) {
		d := r.dial()
		pd := must[*verbs.PD](t)(d.AllocPD())
		must[*verbs.PD](t)(d.AllocPD())
		_, err := d.AllocPD()
		wantLimit(t, err, "pds")
		must[*verbs.PD](t)(other.AllocPD()) // another client is not limited by this one
		if err := pd.Dealloc(); err != nil {
			t.Fatal(err)
		}
		must[*verbs.PD](t)(d.AllocPD())
	})
	t.Run("cqs", func(t *testing.T) {
		d := r.dial()
		cqs := make([]*verbs.CQ, 4)
		for i := range cqs {
			cqs[i] = must[*verbs.CQ](t)(d.CreateCQ(4))
		}
		_, err := d.CreateCQ(4)
		wantLimit(t, err, "cqs")
		must[*verbs.CQ](t)(other.CreateCQ(4)).Destroy()
		if err := cqs[1].Destroy(); err != nil {
			t.Fatal(err)
		}
		must[*verbs.CQ](t)(d.CreateCQ(4))
	})
	t.Run("cqes", func(t *testing.T) {
		d := r.dial()
		must[*verbs.CQ](t)(d.CreateCQ(64))
		cq := must[*verbs.CQ](t)(d.CreateCQ(33)) // 64 entries
		_, err := d.CreateCQ(1)
		wantLimit(t, err, "cqes")
		must[*verbs.CQ](t)(other.CreateCQ(128)).Destroy()
		if err := cq.Destroy(); err != nil {
			t.Fatal(err)
		}
		must[*verbs.CQ](t)(d.CreateCQ(64))
	})
	t.Run("qps", func(t *testing.T) {
		d := r.dial()
		pd := must[*verbs.PD](t)(d.AllocPD())
		cq := must[*verbs.CQ](t)(d.CreateCQ(16))
		attr := verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4}
		qp := must[*verbs.QP](t)(pd.CreateQP(attr))
		must[*verbs.QP](t)(pd.CreateQP(attr))
		_, err := pd.CreateQP(attr)
		wantLimit(t, err, "qps")
		if err := qp.Destroy(); err != nil {
			t.Fatal(err)
		}
		qp = must[*verbs.QP](t)(pd.CreateQP(attr))
		// The session works on: a QP connects and moves data.
		srv := newEnd(t, r.peer, 8)
		cli := &side{dev: d, pd: pd, scq: cq, rcq: cq, qp: qp}
		connect(t, cli, srv)
		src := cli.region(t, 4096, verbs.AccessLocalWrite)
		dst := srv.region(t, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		copy(src.Bytes(), "after the limit")
		if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{dst.SGE(1024, 16)}}}); err != nil {
			t.Fatal(err)
		}
		// The Send completes at the peer after the Write is placed.
		if _, err := qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{src.SGE(0, 15)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()},
			{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		if wc := poll(t, cq, 1)[0]; wc.Status != verbs.WCSuccess {
			t.Fatalf("write: %v", wc.Status)
		}
		if wc := poll(t, srv.rcq, 1)[0]; wc.Status != verbs.WCSuccess {
			t.Fatalf("peer's receive: %v", wc.Status)
		}
		if got := string(dst.Bytes()[:15]); got != "after the limit" {
			t.Fatalf("peer got %q", got)
		}
	})
	t.Run("wrs", func(t *testing.T) {
		d := r.dial()
		pd := must[*verbs.PD](t)(d.AllocPD())
		cq := must[*verbs.CQ](t)(d.CreateCQ(64))
		qp := must[*verbs.QP](t)(pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16}))
		// 17 rounds up to 32: 32 + 32 + 16 > 64.
		_, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 17, MaxRecvWR: 16})
		wantLimit(t, err, "wrs")
		must[*verbs.QP](t)(pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16}))
		_, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
		if !errors.Is(err, verbs.ErrLimit) {
			t.Fatalf("a third QP: %v, want ErrLimit", err)
		}
		if err := qp.Destroy(); err != nil {
			t.Fatal(err)
		}
		must[*verbs.QP](t)(pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16}))
	})
	t.Run("mrs", func(t *testing.T) {
		d := r.dial()
		pd := must[*verbs.PD](t)(d.AllocPD())
		buf := must[[]byte](t)(d.AllocBuffer(4 * 4096))
		mrs := make([]*verbs.MR, 4)
		for i := range mrs {
			mrs[i] = must[*verbs.MR](t)(pd.RegMR(buf[i*4096:(i+1)*4096], verbs.AccessLocalWrite))
		}
		_, err := pd.RegMR(buf[:1], verbs.AccessLocalWrite)
		wantLimit(t, err, "mrs")
		if err := mrs[2].Dereg(); err != nil {
			t.Fatal(err)
		}
		must[*verbs.MR](t)(pd.RegMR(buf[:1], verbs.AccessLocalWrite))
	})
	t.Run("mr-bytes", func(t *testing.T) {
		d := r.dial()
		pd := must[*verbs.PD](t)(d.AllocPD())
		buf := must[[]byte](t)(d.AllocBuffer(128 << 10))
		mr := must[*verbs.MR](t)(pd.RegMR(buf[:48<<10], verbs.AccessLocalWrite))
		must[*verbs.MR](t)(pd.RegMR(buf[:16<<10], verbs.AccessLocalWrite)) // overlapping regions count twice
		_, err := pd.RegMR(buf[:1], verbs.AccessLocalWrite)
		wantLimit(t, err, "mr-bytes")
		_, err = pd.RegMR(buf, verbs.AccessLocalWrite)
		wantLimit(t, err, "mr-bytes")
		obuf := must[[]byte](t)(other.AllocBuffer(64 << 10))
		must[*verbs.MR](t)(must[*verbs.PD](t)(other.AllocPD()).RegMR(obuf, verbs.AccessLocalWrite))
		if err := mr.Dereg(); err != nil {
			t.Fatal(err)
		}
		must[*verbs.MR](t)(pd.RegMR(buf[64<<10:112<<10], verbs.AccessLocalWrite))
	})
	t.Run("listeners", func(t *testing.T) {
		d := r.dial()
		l := must[*verbs.Listener](t)(d.Listen(netip.AddrPortFrom(daemonAddr.Addr(), 9001), 4))
		_, err := d.Listen(netip.AddrPortFrom(daemonAddr.Addr(), 9002), 4)
		wantLimit(t, err, "listeners")
		must[*verbs.Listener](t)(other.Listen(netip.AddrPortFrom(daemonAddr.Addr(), 9003), 4)).Close()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		must[*verbs.Listener](t)(d.Listen(netip.AddrPortFrom(daemonAddr.Addr(), 9002), 4))
	})
	t.Run("raw status", func(t *testing.T) {
		rc := r.raw(t)
		for range 2 {
			if st, msg, _ := rc.req(uabi.OpAllocPD, nil); st != uabi.StOK {
				t.Fatalf("AllocPD: %d %s", st, msg)
			}
		}
		st, msg, _ := rc.req(uabi.OpAllocPD, nil)
		if st != uabi.StLimit {
			t.Fatalf("third AllocPD: status %d (%s), want StLimit", st, msg)
		}
		if st, msg, _ := rc.req(uabi.OpHello, &uabi.Hello{Version: uabi.Version}); st != uabi.StOK {
			t.Fatalf("hello after the limit: %d %s", st, msg)
		}
	})
}
