package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic/rnictest"
	"github.com/siwtun/siwtun/verbs"
)

const ctlTestTimeout = 30 * time.Second

// runRoot runs the siwtun command with args and returns what it printed.
func runRoot(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// mustRun runs the siwtun command and fails the test on error.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runRoot(t, args...)
	if err != nil {
		t.Fatalf("siwtun %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// testRNIC is one in-process device with one queue pair.
type testRNIC struct {
	eng *offload.Device
	dev *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
}

// newRNIC is one in-process device on link with one queue pair.
func newRNIC(t *testing.T, link *netstack.Link, name string, addr netip.Prefix) *testRNIC {
	return newRNICConfig(t, link, name, addr, nil)
}

// newRNICConfig is newRNIC with a configuration change.
func newRNICConfig(t *testing.T, link *netstack.Link, name string, addr netip.Prefix, mod func(*offload.Config)) *testRNIC {
	t.Helper()
	r := rnictest.New(t, link, addr, 1500, name, mod)
	eng, dev := r.Engine, r.Device
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	return &testRNIC{eng: eng, dev: dev, pd: pd, cq: cq, qp: qp}
}

func (r *testRNIC) waitEstablished(t *testing.T) {
	t.Helper()
	timer := time.NewTimer(ctlTestTimeout)
	defer timer.Stop()
	for {
		select {
		case e := <-r.qp.Events():
			if e.Type == verbs.EventEstablished {
				return
			}
		case <-timer.C:
			t.Fatalf("%s: not established", r.dev.Name())
		}
	}
}

func (r *testRNIC) complete(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ctlTestTimeout)
	defer cancel()
	wcs := make([]verbs.WorkCompletion, n)
	for got := 0; got < n; {
		k, err := r.cq.Wait(ctx, wcs[got:])
		if err != nil {
			t.Fatalf("%s: completions: %v", r.dev.Name(), err)
		}
		for _, wc := range wcs[got : got+k] {
			if wc.Status != verbs.WCSuccess {
				t.Fatalf("%s: completion %+v", r.dev.Name(), wc)
			}
		}
		got += k
	}
}

var (
	cliPrefix  = netip.MustParsePrefix("198.18.0.1/24")
	srvPrefix  = netip.MustParsePrefix("198.18.0.2/24")
	hostPrefix = netip.MustParsePrefix("198.18.0.254/24")
)

// startEngines builds two RNICs on an in-memory link, connects a queue
// pair across them, does a 4 KiB RDMA Write and Read, and serves both
// devices' control sockets in a fresh directory, which it returns.
func startEngines(t *testing.T) string {
	t.Helper()
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cli := newRNIC(t, la, "siwtun0", cliPrefix)
	srv := newRNIC(t, lb, "siwtun1", srvPrefix)

	ctx, cancel := context.WithTimeout(context.Background(), ctlTestTimeout)
	defer cancel()
	remote := netip.AddrPortFrom(srvPrefix.Addr(), 7174)
	l, err := srv.dev.Listen(remote, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := acceptOne(ctx, l, srv.qp, verbs.ConnParam{})
	if err := cli.qp.Connect(ctx, remote, verbs.ConnParam{}); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	cli.waitEstablished(t)
	srv.waitEstablished(t)

	src := bytes.Repeat([]byte("siwtun"), 4096/6+1)[:4096]
	smr, err := cli.pd.RegMR(src, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	sink := make([]byte, 4096)
	kmr, err := cli.pd.RegMR(sink, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	tmr, err := srv.pd.RegMR(make([]byte, 4096), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.qp.PostSend([]verbs.SendWR{
		{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, 4096)}, RemoteAddr: tmr.Addr(), RKey: tmr.RKey()},
		{ID: 2, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{kmr.SGE(0, 4096)}, RemoteAddr: tmr.Addr(), RKey: tmr.RKey()},
	}); err != nil {
		t.Fatal(err)
	}
	cli.complete(t, 2)
	if !bytes.Equal(sink, src) {
		t.Fatal("RDMA Read returned other bytes than the RDMA Write wrote")
	}

	dir := t.TempDir()
	for _, r := range []*testRNIC{cli, srv} {
		name := r.dev.Name()
		s, err := ctl.Listen(ctl.SocketPath(dir, name), ctl.NewProvider(name, r.eng, []netip.Prefix{hostPrefix}), nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve() }()
		t.Cleanup(func() {
			s.Close()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	// A socket left behind by a daemon that died: `ctl link` skips it.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: ctl.SocketPath(dir, "siwtun9"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	return dir
}

func TestCtlCommands(t *testing.T) {
	dir := startEngines(t)
	run := func(args ...string) string {
		t.Helper()
		return mustRun(t, append([]string{"ctl"}, append(args, "--socket-dir", dir)...)...)
	}

	t.Run("devinfo", func(t *testing.T) {
		out := run("devinfo")
		for _, want := range []string{
			"hca_id:\tsiwtun0\n\ttransport:\t\t\tiWARP (1)\n\tfw_ver:\t\t\t\t0.1.0\n",
			"\tvendor_id:\t\t\t0x736977\n",
			"\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tmax_mtu:\t\t1024 (3)\n\t\t\tactive_mtu:\t\t1024 (3)\n",
			"\t\t\tlink_layer:\t\tEthernet\n\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("devinfo lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "netdev_mtu") || strings.Contains(out, "max_qp") {
			t.Errorf("devinfo without -v prints verbose keys:\n%s", out)
		}
		out = run("devinfo", "-v")
		for _, want := range []string{"\tmax_qp:\t\t\t\t4096\n", "\tmax_sge_rd:\t\t\t1\n", "\t\t\tnetdev_mtu:\t\t1500\n", "\t\t\temss:\t\t\t1420\n", "\t\t\tmpa_rev:\t\t2\n", "\t\t\tcrc:\t\t\ton\n", "\tatomic_cap:\t\t\tATOMIC_HCA (1)\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("devinfo -v lacks %q:\n%s", want, out)
			}
		}
		out = run("devinfo", "--dev", "siwtun1", "-j")
		var d ctl.DevInfo
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("devinfo -j: %v\n%s", err, out)
		}
		if d.HCAID != "siwtun1" || d.VendorID != verbs.VendorID || d.Port.ActiveMTU != 3 || d.Port.NetdevMTU != 1500 || d.Port.EMSS != 1420 || d.MaxSGERd != verbs.MaxSGERead {
			t.Errorf("devinfo -j = %+v", d)
		}
		if strings.Count(out, "\n") != 1 {
			t.Errorf("devinfo -j is not one line:\n%s", out)
		}
		if out := run("devinfo", "-p"); !strings.HasPrefix(out, "{\n  \"hca_id\": \"siwtun0\",\n") {
			t.Errorf("devinfo -p:\n%s", out)
		}
	})

	t.Run("link", func(t *testing.T) {
		want := "link siwtun0/1 state ACTIVE physical_state LINK_UP netdev siwtun0 addrs 198.18.0.1/24 host_addrs 198.18.0.254/24\n" +
			"link siwtun1/1 state ACTIVE physical_state LINK_UP netdev siwtun1 addrs 198.18.0.2/24 host_addrs 198.18.0.254/24\n"
		if out := run("link"); out != want {
			t.Errorf("link:\n%s\nwant\n%s", out, want)
		}
		if out := run("link", "--dev", "siwtun1"); out != strings.SplitAfter(want, "\n")[1] {
			t.Errorf("link --dev siwtun1:\n%s", out)
		}
		var links []ctl.Link
		if err := json.Unmarshal([]byte(run("link", "-j")), &links); err != nil || len(links) != 2 || links[1].Addrs[0] != "198.18.0.2/24" {
			t.Errorf("link -j = %+v, %v", links, err)
		}
	})

	qpLine := regexp.MustCompile(`^link siwtun0/1 lqpn (\d+) rqpn - type RC state RTS pdn 1 src 198\.18\.0\.1:\d+ dst 198\.18\.0\.2:7174 ` +
		`mpa_rev 2 crc on markers_tx off markers_rx off p2p write ird \d+ ord \d+ sq_depth 16 sq_used 0 rq_depth 16 rq_used 0 emss 1420 ` +
		`bytes_tx (\d+) bytes_rx (\d+) fpdus_tx (\d+) fpdus_rx (\d+)$`)
	t.Run("qp", func(t *testing.T) {
		out := run("qp")
		m := qpLine.FindStringSubmatch(strings.TrimSuffix(out, "\n"))
		if m == nil {
			t.Fatalf("qp:\n%s", out)
		}
		atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
		if atoi(m[2]) < 4096 || atoi(m[4]) < 3 || atoi(m[3]) < 4096 || atoi(m[5]) < 3 {
			t.Errorf("qp counters too small (a 4 KiB Write and Read went each way):\n%s", out)
		}
		lqpn := m[1]
		out = run("qp", "--qp", lqpn)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != 6 || !qpLine.MatchString(lines[0]) || !strings.Contains(out, "\nlink siwtun0/1 lqpn "+lqpn+" OutRdmaWrites 1 OutRdmaWriteOctets 4096 ") {
			t.Errorf("qp --qp %s:\n%s", lqpn, out)
		}
		var qps []ctl.QP
		if err := json.Unmarshal([]byte(run("qp", "--qp", lqpn, "-j")), &qps); err != nil || len(qps) != 1 || qps[0].State != "RTS" || len(qps[0].Counters) == 0 {
			t.Errorf("qp -j = %+v, %v", qps, err)
		}
		if _, err := runRoot(t, "ctl", "qp", "--qp", "99", "--socket-dir", dir); err == nil || err.Error() != "siwtun0: no queue pair 99" {
			t.Errorf("qp --qp 99: %v", err)
		}
	})

	t.Run("stats", func(t *testing.T) {
		out := run("stats")
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != 5 {
			t.Fatalf("stats: %d lines, want 5 (tcp mpa ddp rdmap verbs):\n%s", len(lines), out)
		}
		for i, prefix := range []string{"link siwtun0/1 tcpActiveOpens 1 ", "link siwtun0/1 mpaFpduTx ", "link siwtun0/1 ddpPlacedOctets 4096 ",
			"link siwtun0/1 OutRdmaWrites 1 OutRdmaWriteOctets 4096 ", "link siwtun0/1 sqPosted 2 sqCompleted 2 "} {
			if !strings.HasPrefix(lines[i], prefix) {
				t.Errorf("stats line %d = %q, want prefix %q", i, lines[i], prefix)
			}
		}
		if !strings.Contains(lines[4], " qpActive 1 mrActive 2") {
			t.Errorf("stats verbs line = %q", lines[4])
		}
		var s ctl.Stats
		if err := json.Unmarshal([]byte(run("stats", "--dev", "siwtun1", "-j")), &s); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, l := range s.Layers() {
			for _, c := range l.Counters {
				if c.Doc == "" {
					t.Errorf("stats -j: %s has no doc", c.Name)
				}
				if c.Name == "InRdmaReads" && c.Value == 1 {
					found = true
				}
			}
		}
		if !found || s.Link != "siwtun1/1" {
			t.Errorf("stats -j of siwtun1 = %+v", s)
		}
	})
}

func TestCtlNoDaemon(t *testing.T) {
	dir := t.TempDir()
	_, err := runRoot(t, "ctl", "devinfo", "--dev", "siwtun5", "--socket-dir", dir)
	if want := "no siwtun daemon for siwtun5 (is `siwtun up --dev siwtun5` running?)"; err == nil || err.Error() != want {
		t.Errorf("devinfo without a daemon: %v, want %q", err, want)
	}
	if _, err := runRoot(t, "ctl", "link", "--socket-dir", dir); err == nil || !strings.Contains(err.Error(), "no siwtun daemon is running") {
		t.Errorf("link without a daemon: %v", err)
	}
	if _, err := runRoot(t, "ctl", "stats", "--dev", "../etc/x", "--socket-dir", dir); err == nil || !strings.Contains(err.Error(), "invalid device name") {
		t.Errorf("stats --dev ../etc/x: %v", err)
	}
	if _, err := runRoot(t, "ctl", "qp", "extra", "--socket-dir", dir); err == nil {
		t.Errorf("qp with an argument succeeded")
	}
	// The socket path names the device in the message, whatever the dir.
	if got := ctl.DevFromPath(filepath.Join(dir, "siwtun5.ctl")); got != "siwtun5" {
		t.Errorf("DevFromPath = %q", got)
	}
}

func TestCompletionAndVersion(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"completion", "bash"}, "# bash completion V2 for siwtun"},
		{[]string{"completion", "zsh"}, "#compdef siwtun"},
		{[]string{"completion", "fish"}, "# fish completion for siwtun"},
		{[]string{"completion", "powershell"}, "# powershell completion for siwtun"},
		{[]string{"--version"}, "siwtun version " + version + "\n"},
		{[]string{"ctl", "--help"}, "devinfo"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out := mustRun(t, tt.args...)
			if !strings.Contains(out, tt.want) {
				t.Errorf("output lacks %q:\n%.400s", tt.want, out)
			}
		})
	}
	// Dynamic completion of --dev lists the running devices' sockets.
	dir := startEngines(t)
	out := mustRun(t, "__complete", "ctl", "devinfo", "--socket-dir", dir, "--dev", "")
	if !strings.HasPrefix(out, "siwtun0\nsiwtun1\nsiwtun9\n:4\n") {
		t.Errorf("--dev completion:\n%s", out)
	}
}
