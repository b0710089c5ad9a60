package uverbs

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/verbs/internal/uabi"
)

// TestReservePort: port 0 gets a port at once (rdma_bind_addr); another
// client can neither reserve nor listen on it; the owner listens on it and
// releases it; a released port is free again; a backlog of 0 is accepted.
func TestReservePort(t *testing.T) {
	r := newRig(t)
	a, b := r.raw(t), r.raw(t)
	st, msg, body := a.req(uabi.OpReservePort, &uabi.ReservePort{Addr: netip.AddrPortFrom(daemonAddr.Addr(), 0)})
	if st != uabi.StOK {
		t.Fatalf("ReservePort: status %d %s", st, msg)
	}
	var rep uabi.ReservePortReply
	if err := uabi.Decode(body, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Addr.Port() == 0 || rep.Addr.Addr() != daemonAddr.Addr() {
		t.Fatalf("reserved %v, want %v with a port", rep.Addr, daemonAddr.Addr())
	}
	any := netip.AddrPortFrom(netip.IPv4Unspecified(), rep.Addr.Port())
	if st, msg, _ := b.req(uabi.OpReservePort, &uabi.ReservePort{Addr: any}); st == uabi.StOK || !strings.Contains(msg, "reserved") {
		t.Errorf("second reservation of the port: status %d %q, want refused", st, msg)
	}
	if st, msg, _ := b.req(uabi.OpListen, &uabi.Listen{Addr: rep.Addr}); st == uabi.StOK || !strings.Contains(msg, "reserved by another verbs client") {
		t.Errorf("another client's listen on the port: status %d %q, want refused", st, msg)
	}
	st, msg, lbody := a.req(uabi.OpListen, &uabi.Listen{Addr: rep.Addr, Backlog: 0})
	if st != uabi.StOK {
		t.Fatalf("the owner's listen on its reserved port: status %d %s", st, msg)
	}
	var lrep uabi.ListenReply
	if err := uabi.Decode(lbody, &lrep); err != nil || lrep.Addr != rep.Addr {
		t.Fatalf("listen reply %v (%v), want %v", lrep.Addr, err, rep.Addr)
	}
	if st, msg, _ := a.req(uabi.OpReleasePort, &uabi.Ref{Handle: rep.Handle}); st != uabi.StOK {
		t.Fatalf("ReleasePort: status %d %s", st, msg)
	}
	if st, _, _ := a.req(uabi.OpReleasePort, &uabi.Ref{Handle: rep.Handle}); st != uabi.StBadHandle {
		t.Errorf("releasing twice: status %d, want StBadHandle", st)
	}
	if st, _, _ := a.req(uabi.OpCloseListener, &uabi.Ref{Handle: lrep.Handle}); st != uabi.StOK {
		t.Fatalf("CloseListener: status %d", st)
	}
	if st, msg, _ := b.req(uabi.OpReservePort, &uabi.ReservePort{Addr: rep.Addr}); st != uabi.StOK {
		t.Errorf("reserving the released port: status %d %s", st, msg)
	}
}
