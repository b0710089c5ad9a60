package test

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// TestDaemonsIPv6: the two RNICs with IPv6 addresses only (2001:db8::/32,
// the documentation prefix), a Write and a Read verified across them.
func TestDaemonsIPv6(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	bin := siwtunBin(t)
	d0 := startDaemon(t, ns, bin, "siwtun0", "2001:db8:1::2/64", "2001:db8:1::1/64", 1500)
	d1 := startDaemon(t, ns, bin, "siwtun1", "2001:db8:2::2/64", "2001:db8:2::1/64", 1500)
	r := &twoRNICs{ns: ns, bin: bin, d0: d0, d1: d1, mtu: 1500,
		a0: netip.MustParseAddr("2001:db8:1::2"), a1: netip.MustParseAddr("2001:db8:2::2")}
	r.dial(t)
	cli, srv := r.connect(t, 7174, 8)
	const n = 256 << 10
	smr, sbuf := cli.mr(t, n, verbs.AccessLocalWrite)
	copy(sbuf, pattern(n, 9))
	dmr, dbuf := srv.mr(t, n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	kmr, kbuf := cli.mr(t, n, verbs.AccessLocalWrite)
	if _, err := cli.qp.PostSend([]verbs.SendWR{
		{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, n)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()},
		{ID: 2, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{kmr.SGE(0, n)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()},
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{1, 2} {
		if wc := cli.wait(t, cli.scq); wc.Status != verbs.WCSuccess || wc.ID != id {
			t.Fatalf("completion %+v, want id %d success", wc, id)
		}
	}
	if !bytes.Equal(dbuf, sbuf) || !bytes.Equal(kbuf, sbuf) {
		t.Fatal("IPv6: Write or Read bytes differ")
	}
}

// TestDaemonShutdownCleansUp: SIGTERM ends siwtun up cleanly; its sockets
// and lock are removed and the TUN device is deleted; a connected client
// is told (its calls fail with ErrDeviceRemoved).
func TestDaemonShutdownCleansUp(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	bin := siwtunBin(t)
	d := startDaemon(t, ns, bin, "siwtun0", "198.18.1.2/24", "198.18.1.1/24", 1500)
	dev, err := verbs.DialPath(filepath.Join(d.socketDir, "siwtun0.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if _, err := dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if err := d.stop(); err != nil {
		t.Fatalf("siwtun up after SIGTERM: %v\n%s", err, d.log.String())
	}
	for _, f := range []string{"siwtun0.sock", "siwtun0.ctl", "siwtun0.lock"} {
		if _, err := os.Stat(filepath.Join(d.socketDir, f)); !os.IsNotExist(err) {
			t.Errorf("%s still there after shutdown (%v)", f, err)
		}
	}
	if out, err := ns.command("ip", "link", "show", "siwtun0").CombinedOutput(); err == nil {
		t.Errorf("siwtun0 still exists after shutdown:\n%s", out)
	}
	if _, err := dev.AllocPD(); err == nil {
		t.Error("AllocPD on a device whose daemon stopped succeeded")
	}
}
