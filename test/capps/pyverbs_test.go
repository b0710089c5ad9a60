package capps

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// pyverbsTests is where Debian's python3-pyverbs ships rdma-core's tests/
// directory (its Python files, most of them gzipped).
const pyverbsTests = "/usr/share/doc/rdma-core/tests"

// pyverbsFiles are the generic files of rdma-core's test suite (v44), the
// ones that concern any device (the others are for mlx5, EFA, CUDA, RSS and
// tag matching hardware). For each: the tests that must pass (they pass on
// Linux siw in the peer VM, doc/pyverbs.md), and the tests allowed to fail
// because they expect InfiniBand's rdma_cm behaviour, which no iWARP
// device has (doc/pyverbs.md says why, test by test). Every other test
// passes or skips.
var pyverbsFiles = []struct {
	file   string
	args   []string // extra run_tests.py arguments
	pass   []string // Class.test
	ibOnly []string
	// ibSays are what the failures of ibOnly say (the test's own words).
	ibSays []string
}{
	{file: "test_device", pass: []string{"DeviceTest.test_dev_list", "DeviceTest.test_open_dev", "DeviceTest.test_phys_port_cnt_ex",
		"DeviceTest.test_query_device", "DeviceTest.test_query_device_ex", "DeviceTest.test_query_gid", "DeviceTest.test_query_gid_ex",
		"DeviceTest.test_query_gid_table", "DeviceTest.test_query_gid_table_bad_flow", "DeviceTest.test_query_pkey",
		"DeviceTest.test_query_port", "DeviceTest.test_query_port_bad_flow"}},
	{file: "test_pd", pass: []string{"PDTest.test_alloc_pd", "PDTest.test_dealloc_pd", "PDTest.test_destroy_pd_twice",
		"PDTest.test_multiple_pd_creation"}},
	{file: "test_mr"},
	{file: "test_cq", pass: []string{"CQAPITest.test_create_cq_bad_flow", "CQEXAPITest.test_create_cq_ex"}},
	{file: "test_qp", pass: []string{"QPTest.test_create_rc_qp_ex_no_attr", "QPTest.test_create_rc_qp_ex_with_attr",
		"QPTest.test_create_rc_qp_no_attr", "QPTest.test_create_rc_qp_with_attr", "QPTest.test_query_rc_qp"}},
	{file: "test_cq_events"},
	// --gid 0: the suite takes an iWARP GID (a MAC, then zeros) for an
	// empty one and would skip every connection test, as it does on siw;
	// with the GID named, it runs them over the interface device/net
	// names (Linux siw has no device/ directory: they skip there).
	{file: "test_rdmacm", args: []string{"--gid", "0"},
		pass: []string{"CMTestCase.test_rdmacm_async_read", "CMTestCase.test_rdmacm_async_reject_traffic",
			"CMTestCase.test_rdmacm_async_write", "CMTestCase.test_rdmacm_sync_traffic"},
		ibOnly: []string{"CMTestCase.test_rdmacm_async_traffic", "CMTestCase.test_rdmacm_async_traffic_external_qp",
			"CMTestCase.test_rdmacm_async_udp_traffic"},
		ibSays: []string{"Expected this event: 5, got this event: RDMA_CM_EVENT_ESTABLISHED", "Listen Failed. Errno: 95"}},
	{file: "test_atomic"},
	{file: "test_relaxed_ordering"},
	{file: "test_odp"},
	{file: "test_addr"},
	{file: "test_flow"},
	{file: "test_parent_domain"},
	{file: "test_shared_pd"},
	{file: "test_cqex", pass: []string{"CQEXAPITest.test_create_cq_ex"}},
	{file: "test_qpex"},
}

// pyverbsHeader starts a test's report in run_tests.py -v output: "name
// (tests.module.Class.name)", then maybe its docstring's first line, then
// "... " and the verdict, which the test's own output may push to a later
// line. Failures and errors are listed again at the end ("FAIL: name
// (...)").
var (
	pyverbsHeader = regexp.MustCompile(`(?m)^test_\w+ \(tests\.\w+\.(\w+\.test_\w+)\)`)
	pyverbsFailed = regexp.MustCompile(`(?m)^(FAIL|ERROR): test_\w+ \(tests\.\w+\.(\w+\.test_\w+)\)`)
	pyverbsOK     = regexp.MustCompile(`(?m)(\.\.\. ok|^ok)$`)
)

// pyverbsOutcomes maps each test of a run, by class and name
// (DeviceTest.test_query_port), to "ok", "skip", "FAIL", "ERROR" or "?" (no
// verdict found).
func pyverbsOutcomes(out string) map[string]string {
	res := map[string]string{}
	failed := map[string]string{}
	for _, m := range pyverbsFailed.FindAllStringSubmatch(out, -1) {
		failed[m[2]] = m[1]
	}
	hs := pyverbsHeader.FindAllStringSubmatchIndex(out, -1)
	for i, h := range hs {
		name, end := out[h[2]:h[3]], len(out)
		if i+1 < len(hs) {
			end = hs[i+1][0]
		}
		seg := out[h[1]:end]
		switch {
		case failed[name] != "":
			res[name] = failed[name]
		case strings.Contains(seg, "... skipped "):
			res[name] = "skip"
		case pyverbsOK.MatchString(seg):
			res[name] = "ok"
		default:
			res[name] = "?"
		}
	}
	return res
}

// TestPyverbs runs rdma-core's own test suite (Debian's python3-pyverbs)
// through siwtun exec on siwtun0, file by file, on a host of the
// shared-address mode: a namespace whose LAN interface (lan0, a veth pair)
// has 198.18.40.1, which siwtun up --shared gives the RNIC too. The suite
// finds that address through /sys/class/infiniband/siwtun0/device/net
// (siwtun exec's view). Client and server of the rdma_cm tests are the
// same RNIC, which reaches its own shared address through the host.
func TestPyverbs(t *testing.T) {
	if _, err := os.Stat(filepath.Join(pyverbsTests, "run_tests.py")); err != nil {
		t.Skipf("rdma-core's tests missing (%v): install python3-pyverbs (.ci/run does)", err)
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import pyverbs.device").CombinedOutput(); err != nil {
		t.Skipf("/usr/bin/python3 cannot import pyverbs (%v: %s): install python3-pyverbs", err, out)
	}
	e := newNamespace(t, "-host")
	dir := t.TempDir()
	if out, err := exec.Command("sh", "-c", "cp -r "+pyverbsTests+" "+dir+"/ && gunzip -f "+dir+"/tests/*.gz").CombinedOutput(); err != nil {
		t.Fatalf("copying the tests: %v\n%s", err, out)
	}
	e.run("ip", "link", "add", "lan0", "type", "veth", "peer", "name", "lan1")
	e.run("ip", "addr", "add", hostA+"/24", "dev", "lan0")
	e.run("ip", "link", "set", "lan0", "up")
	e.run("ip", "link", "set", "lan1", "up")
	e.up("siwtun0", "--shared", hostA)
	for _, f := range pyverbsFiles {
		t.Run(f.file, func(t *testing.T) {
			args := append([]string{e.bin, "exec", "--socket-dir", e.sockDir, "--dev", "siwtun0", "--",
				"/usr/bin/python3", "tests/run_tests.py", "--dev", "siwtun0", "-v"}, f.args...)
			cmd := e.command(append(args, "-k", f.file)...)
			cmd.Dir = dir
			timer := time.AfterFunc(10*time.Minute, func() { cmd.Process.Kill() })
			b, err := cmd.CombinedOutput()
			timer.Stop()
			out := string(b)
			res := pyverbsOutcomes(out)
			ran := regexp.MustCompile(`(?m)^Ran (\d+) tests?`).FindStringSubmatch(out)
			if ran == nil || ran[1] == "0" || len(res) == 0 {
				t.Fatalf("%s: no tests ran (%v):\n%s", f.file, err, out)
			}
			var count = map[string]int{}
			var bad []string
			for name, v := range res {
				count[v]++
				if v != "ok" && v != "skip" && !contains(f.ibOnly, name) {
					bad = append(bad, name+" "+v)
				}
			}
			sort.Strings(bad)
			if len(bad) > 0 {
				t.Errorf("%s: %d tests failed: %v\n%s", f.file, len(bad), bad, out)
			}
			for _, name := range f.pass {
				if res[name] != "ok" {
					t.Errorf("%s: %s: %q, want ok (it passes on Linux siw)", f.file, name, res[name])
				}
			}
			for _, name := range f.ibOnly {
				if res[name] == "" {
					t.Errorf("%s: %s did not run", f.file, name)
				}
			}
			for _, says := range f.ibSays {
				if !strings.Contains(out, says) {
					t.Errorf("%s: the output does not say %q:\n%s", f.file, says, out)
				}
			}
			t.Logf("%s: %s tests: %d ok, %d skipped, %d failed (%d of them expecting InfiniBand's rdma_cm)", f.file, ran[1],
				count["ok"], count["skip"], count["FAIL"]+count["ERROR"], len(f.ibOnly))
		})
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestPyverbsOutcomes: the verdicts of run_tests.py -v output, with
// docstrings, a test's own output before its verdict, and repeated method
// names in two classes.
func TestPyverbsOutcomes(t *testing.T) {
	out := `test_create_cq (tests.test_cq.CQAPITest.test_create_cq) ... ok
test_create_cq (tests.test_cqex.CQEXAPITest.test_create_cq)
Test ibv_create_cq_ex() ... skipped 'not supported'
test_a (tests.test_rdmacm.CMTestCase.test_a) ... Player passive got: boom
ERROR
test_b (tests.test_rdmacm.CMTestCase.test_b)
Doc line ... FAIL

======================================================================
ERROR: test_a (tests.test_rdmacm.CMTestCase.test_a)
----------------------------------------------------------------------
FAIL: test_b (tests.test_rdmacm.CMTestCase.test_b)
Ran 4 tests in 0.1s
`
	got := pyverbsOutcomes(out)
	want := map[string]string{"CQAPITest.test_create_cq": "ok", "CQEXAPITest.test_create_cq": "skip",
		"CMTestCase.test_a": "ERROR", "CMTestCase.test_b": "FAIL"}
	if len(got) != len(want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}
