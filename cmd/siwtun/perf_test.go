package main

import (
	"encoding/json"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/verbs/uverbs"
)

// TestPerfBadFlags: what perftest refuses is refused before any device is
// opened, with a message naming the flag.
func TestPerfBadFlags(t *testing.T) {
	dir := t.TempDir() // no daemon here
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"perf", "swap"}, `unknown test "swap": want write, read, send or atomic`},
		{[]string{"perf", "atomic", "-A", "SWAP"}, `atomic type "SWAP": want FETCH_AND_ADD or CMP_AND_SWAP`},
		{[]string{"perf", "atomic", "-s", "64"}, "atomic tests move 8 bytes"},
		{[]string{"perf", "atomic", "--lat"}, "atomic tests measure bandwidth only"},
		{[]string{"perf", "atomic", "-I", "8"}, "--inline_size does not apply to atomic tests"},
		{[]string{"perf", "write", "--lat", "-q", "2"}, "latency tests run on one queue pair"},
		{[]string{"perf", "send", "--lat", "-b"}, "--bidirectional is only available in bandwidth tests"},
		{[]string{"perf", "write", "-s", "-1"}, "--size -1"},
		{[]string{"perf", "read", "-a", "-D", "2"}, "--duration does not run on all sizes"},
		{[]string{"perf", "write", "-n", "100", "-D", "2"}, "--iters and --duration exclude each other"},
		{[]string{"perf", "write", "-n", "3"}, "iterations 3"},
		{[]string{"perf", "write", "-p", "0"}, "--port 0"},
		{[]string{"perf", "write", "-I", "1000"}, "inline size 1000: the device allows 256"},
		{[]string{"perf", "read", "-I", "8"}, "--inline_size does not apply to RDMA Read"},
		{[]string{"perf", "write", "-o", "4"}, "--outs applies to RDMA Read and atomic tests only"},
		{[]string{"perf", "write", "-r", "8"}, "--rx-depth applies to send and write --imm tests only"},
		{[]string{"perf", "send", "-r", "2"}, "at least 3"},
		{[]string{"perf", "write", "--rdma_cm=false"}, "always connects with rdma_cm"},
		{[]string{"perf", "write", "1.2.3"}, `server address "1.2.3": want an IPv4 or IPv6 address`},
		{[]string{"perf", "write", "a", "b"}, "accepts at most 1 arg"},
		{[]string{"perf", "write", "--dev", "../x"}, `invalid device name "../x"`},
		{[]string{"perf", "write", "-q", "0"}, "--qp 0"},
		{[]string{"perf", "write", "--anatomy"}, "the anatomy is taken of the RDMA Write latency test"},
		{[]string{"perf", "write", "--lat", "--anatomy", "-a"}, "no --all"},
		{[]string{"perf", "write", "--lat", "--anatomy", "--imm"}, "no --imm"},
		{[]string{"perf", "write", "--lat", "--anatomy", "--json"}, "leave out --json"},
		{[]string{"perf", "write", "--lat", "--anatomy", "198.18.2.2"}, "no daemon with a control socket"},
		{[]string{"perf", "read", "--lat", "--anatomy"}, "unknown flag: --anatomy"},
		{[]string{"ctl", "anatomy", "show"}, "--peer: name the other daemon's device"},
		{[]string{"ctl", "anatomy", "start", "--peer", "siwtun0"}, "is --dev itself"},
		{[]string{"ctl", "anatomy", "look", "--peer", "siwtun1"}, `unknown action "look"`},
	}
	for _, c := range cases {
		_, err := runRoot(t, append(c.args, "--socket-dir", dir)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("siwtun %s: %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	_, err := runRoot(t, "perf", "write", "--socket-dir", dir)
	if err == nil || !strings.Contains(err.Error(), "is `siwtun up --dev siwtun0` running?") {
		t.Errorf("no daemon: %v", err)
	}
}

// servePair serves two in-process RNICs (siwtun0 at 198.18.0.1, siwtun1 at
// 198.18.0.2) on verbs sockets in a temp dir.
func servePair(t *testing.T) string {
	t.Helper()
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	dir := t.TempDir()
	for _, r := range []*testRNIC{
		newRNIC(t, la, "siwtun0", netip.MustParsePrefix("198.18.0.1/24")),
		newRNIC(t, lb, "siwtun1", netip.MustParsePrefix("198.18.0.2/24")),
	} {
		l, err := uverbs.Listen(filepath.Join(dir, r.dev.Name()+".sock"), -1)
		if err != nil {
			t.Fatal(err)
		}
		s, err := uverbs.NewServer(r.dev, nil)
		if err != nil {
			t.Fatal(err)
		}
		go s.Serve(l)
		t.Cleanup(func() { s.Close() })
	}
	return dir
}

// runPerfPair runs `siwtun perf` as server on siwtun1 and as client on
// siwtun0 with the same arguments.
func runPerfPair(t *testing.T, dir string, args ...string) (cli, srv string) {
	t.Helper()
	var wg sync.WaitGroup
	var cerr, serr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		srv, serr = runRoot(t, append([]string{"perf"}, append(args, "--dev", "siwtun1", "--socket-dir", dir)...)...)
	}()
	go func() {
		defer wg.Done()
		cli, cerr = runRoot(t, append([]string{"perf"}, append(args, "--dev", "siwtun0", "--socket-dir", dir, "198.18.0.2")...)...)
	}()
	wg.Wait()
	if cerr != nil || serr != nil {
		t.Fatalf("siwtun perf %s: client %v, server %v\n--- client\n%s\n--- server\n%s", strings.Join(args, " "), cerr, serr, cli, srv)
	}
	return cli, srv
}

// TestPerfCommand runs siwtun perf between two RNICs served on verbs
// sockets: the text report and the JSON document.
func TestPerfCommand(t *testing.T) {
	dir := servePair(t)
	cli, srv := runPerfPair(t, dir, "write", "-n", "100", "-s", "8192", "-p", "18531")
	row := regexp.MustCompile(`(?m)^ 8192       100              \d+\.\d\d +\d+\.\d\d *\t\t     \d+\.\d{6}$`)
	for name, out := range map[string]string{"client": cli, "server": srv} {
		if !strings.Contains(out, "                    RDMA_Write BW Test\n") ||
			!strings.Contains(out, " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n") ||
			!row.MatchString(out) {
			t.Errorf("%s report:\n%s", name, out)
		}
	}
	if !strings.Contains(srv, "* Waiting for client to connect... *") || !strings.Contains(cli, "Device         : siwtun0\n") {
		t.Errorf("server/client banners:\n%s\n%s", srv, cli)
	}
	cli, _ = runPerfPair(t, dir, "send", "--lat", "-n", "50", "--json", "-p", "18532")
	var doc struct {
		Info    map[string]any   `json:"test_info"`
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(cli), &doc); err != nil {
		t.Fatalf("--json: %v\n%s", err, cli)
	}
	if doc.Info["test"] != "Send_Latency_Test" || doc.Info["Device"] != "siwtun0" || len(doc.Results) != 1 {
		t.Fatalf("--json: %+v", doc)
	}
	for _, k := range []string{"MsgSize", "n_iterations", "t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"} {
		if _, ok := doc.Results[0][k]; !ok {
			t.Errorf("--json result has no %q: %v", k, doc.Results[0])
		}
	}
}
