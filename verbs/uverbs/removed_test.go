package uverbs

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// TestEveryCallAfterDaemonStops: once the daemon behind a verbs socket
// stops, every call on the device and its objects fails with an error
// that matches verbs.ErrDeviceRemoved — calls made afterwards and the
// calls that were waiting in the daemon when it stopped (a listener's
// Accept) — except the calls that release (Destroy, Dereg, Dealloc,
// Close), which succeed: not "verbs daemon: context canceled" from Accept
// or "verbs socket: write unixpacket @: sendmsg: broken pipe" from AllocPD,
// which say nothing of the daemon.
func TestEveryCallAfterDaemonStops(t *testing.T) {
	for round := range 3 { // the broken pipe came and went with timing
		r := newRig(t)
		dev := r.dial()
		cli := newEnd(t, dev, 8)
		srv := newEnd(t, r.peer, 8)
		connect(t, cli, srv)
		mr := cli.region(t, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		buf, err := dev.AllocBuffer(4096)
		if err != nil {
			t.Fatal(err)
		}
		idle := newEnd(t, dev, 8) // a QP in INIT, never connected

		// A listener with an Accept waiting in the daemon, and one with a
		// connection request waiting to be answered.
		waiting, err := dev.Listen(netip.AddrPortFrom(daemonAddr.Addr(), 7000), 4)
		if err != nil {
			t.Fatal(err)
		}
		acceptErr := make(chan error, 1)
		go func() {
			_, err := waiting.Accept(context.Background())
			acceptErr <- err
		}()
		pending, err := dev.Listen(netip.AddrPortFrom(daemonAddr.Addr(), 7001), 4)
		if err != nil {
			t.Fatal(err)
		}
		peerQP := newEnd(t, r.peer, 8)
		go peerQP.qp.Connect(context.Background(), netip.AddrPortFrom(daemonAddr.Addr(), 7001), verbs.ConnParam{})
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		req, err := pending.Accept(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(round) * time.Millisecond)

		r.srv.Close()

		select {
		case err := <-acceptErr:
			if !errors.Is(err, verbs.ErrDeviceRemoved) {
				t.Errorf("the Accept waiting when the daemon stopped: %v, want ErrDeviceRemoved", err)
			}
		case <-time.After(testTimeout):
			t.Fatal("Accept still waiting after the daemon stopped")
		}
		ctx, cancel = context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		wcs := make([]verbs.WorkCompletion, 8)
		sge := []verbs.SGE{mr.SGE(0, 64)}
		calls := []struct {
			name string
			call func() error
		}{
			{"Device.AllocPD", func() error { _, err := dev.AllocPD(); return err }},
			{"Device.CreateCQ", func() error { _, err := dev.CreateCQ(16); return err }},
			{"Device.AllocBuffer", func() error { _, err := dev.AllocBuffer(4096); return err }},
			{"Device.Listen", func() error { _, err := dev.Listen(netip.AddrPortFrom(daemonAddr.Addr(), 7002), 4); return err }},
			{"PD.RegMR", func() error { _, err := cli.pd.RegMR(buf, verbs.AccessLocalWrite); return err }},
			{"PD.RegMRAt", func() error { _, err := cli.pd.RegMRAt(buf, 0x1000, verbs.AccessLocalWrite); return err }},
			{"PD.CreateQP", func() error {
				_, err := cli.pd.CreateQP(verbs.QPInitAttr{SendCQ: cli.scq, RecvCQ: cli.rcq, MaxSendWR: 4, MaxRecvWR: 4})
				return err
			}},
			{"QP.Modify", func() error { return idle.qp.Modify(verbs.QPInit) }},
			{"QP.PostRecv", func() error { _, err := cli.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: sge}}); return err }},
			{"QP.PostSend", func() error {
				_, err := cli.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRSend, SGL: sge}})
				return err
			}},
			{"QP.Connect", func() error {
				return idle.qp.Connect(ctx, netip.AddrPortFrom(peerAddr.Addr(), peerPort), verbs.ConnParam{})
			}},
			{"Listener.Accept", func() error { _, err := pending.Accept(ctx); return err }},
			{"ConnRequest.Accept", func() error { return req.Accept(idle.qp, verbs.ConnParam{}) }},
			{"ConnRequest.Reject", func() error { return req.Reject(nil) }},
			{"CQ.ReqNotify", func() error { return cli.scq.ReqNotify(false) }},
			{"CQ.Poll", func() error { // after the flushed completions
				for {
					n, err := cli.rcq.Poll(wcs)
					if err != nil || n == 0 {
						return err
					}
				}
			}},
			{"CQ.Wait", func() error {
				for {
					if _, err := cli.scq.Wait(ctx, wcs); err != nil {
						return err
					}
				}
			}},
		}
		for _, c := range calls {
			if err := c.call(); !errors.Is(err, verbs.ErrDeviceRemoved) {
				t.Errorf("round %d: %s after the daemon stopped: %v, want ErrDeviceRemoved", round, c.name, err)
			}
		}
		if err := dev.Removed(); !errors.Is(err, verbs.ErrDeviceRemoved) || err.Error() != "device siwtun0 removed (daemon stopped)" {
			t.Errorf("Device.Removed: %v", err)
		}
		// The calls that release succeed (the daemon has released
		// everything) and free what the process holds, so a program's
		// deferred cleanup runs through.
		releases := []struct {
			name string
			call func() error
		}{
			{"MR.Dereg", mr.Dereg},
			{"QP.Destroy", idle.qp.Destroy},
			{"CQ.Destroy", idle.scq.Destroy},
			{"CQ.Destroy", idle.rcq.Destroy},
			{"PD.Dealloc", idle.pd.Dealloc},
			{"Listener.Close", waiting.Close},
			{"Device.Close", dev.Close},
		}
		for _, c := range releases {
			if err := c.call(); err != nil {
				t.Errorf("round %d: %s after the daemon stopped: %v, want nil", round, c.name, err)
			}
		}
	}
}
