package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// perfModes are the in-process modes of apps/perftest (TestModes) whose
// golden reports these runs must match: the same parameters, as siwtun
// perf flags.
var perfModes = []struct {
	name string
	args []string
}{
	{"write-bw", []string{"write", "-n", "200", "-s", "65536"}},
	{"read-bw", []string{"read", "-n", "200", "-s", "65536"}},
	{"send-bw", []string{"send", "-n", "2000", "-s", "4096"}},
	{"write-lat", []string{"write", "--lat", "-n", "200"}},
	{"read-lat", []string{"read", "--lat", "-n", "200"}},
	{"send-lat", []string{"send", "--lat", "-n", "200"}},
	{"write-bw-b", []string{"write", "-n", "200", "-s", "65536", "-b"}},
	{"read-bw-b", []string{"read", "-n", "200", "-s", "65536", "-b"}},
	{"send-bw-b", []string{"send", "-n", "2000", "-s", "4096", "-b"}},
	{"write-bw-q2", []string{"write", "-n", "200", "-s", "65536", "-q", "2"}},
	{"read-bw-q2", []string{"read", "-n", "200", "-s", "65536", "-q", "2"}},
	{"send-bw-q2", []string{"send", "-n", "2000", "-s", "4096", "-q", "2"}},
	{"write-bw-gbits", []string{"write", "-n", "200", "-s", "1024", "--report_gbits"}},
	{"send-lat-D1", []string{"send", "--lat", "-D", "1"}},
	{"write-imm-bw", []string{"write", "--imm", "-n", "2000", "-s", "4096"}},
	{"write-imm-lat", []string{"write", "--imm", "--lat", "-n", "200"}},
	{"write-imm-bw-b", []string{"write", "--imm", "-n", "2000", "-s", "4096", "-b"}},
	{"write-imm-bw-q2", []string{"write", "--imm", "-n", "2000", "-s", "4096", "-q", "2"}},
}

// TestPerfModes: siwtun perf as server on siwtun1 and as client on
// siwtun0, each a process on its daemon's verbs socket, for every mode;
// both reports must match apps/perftest's golden files (figures, QP
// numbers, PSNs and GIDs masked), and both processes exit 0.
func TestPerfModes(t *testing.T) {
	r := newTwoRNICs(t, 1500)
	for i, m := range perfModes {
		t.Run(m.name, func(t *testing.T) {
			port := fmt.Sprint(18515 + i)
			cli, srv := runPerf(t, r, port, m.args...)
			timed := strings.Contains(m.name, "-D")
			for role, out := range map[string]string{"client": cli, "server": srv} {
				want, err := os.ReadFile(filepath.Join("..", "apps", "perftest", "testdata", m.name+"."+role+".golden"))
				if err != nil {
					t.Fatal(err)
				}
				if got := maskPerf(out, timed); got != maskGID(string(want)) {
					t.Errorf("%s report differs from the golden file:\n--- got ---\n%s\n--- want ---\n%s\n--- output ---\n%s",
						role, got, maskGID(string(want)), out)
				}
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		cli, _ := runPerf(t, r, "18600", "read", "-n", "100", "-s", "4096", "-q", "2", "--json")
		var doc struct {
			Info    map[string]any   `json:"test_info"`
			Results []map[string]any `json:"results"`
		}
		if err := json.Unmarshal([]byte(cli), &doc); err != nil {
			t.Fatalf("--json: %v\n%s", err, cli)
		}
		if doc.Info["test"] != "RDMA_Read_BW_Test" || doc.Info["Number_of_qps"] != 2.0 || len(doc.Results) != 1 ||
			doc.Results[0]["MsgSize"] != 4096.0 || doc.Results[0]["n_iterations"] != 200.0 {
			t.Fatalf("--json: %s", cli)
		}
	})
}

// runPerf runs siwtun perf as server (siwtun1) and client (siwtun0).
func runPerf(t *testing.T, r *twoRNICs, port string, args ...string) (cli, srv string) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var cout, sout bytes.Buffer
	var cerr, serr error
	run := func(out *bytes.Buffer, errp *error, extra ...string) {
		defer wg.Done()
		cmd := exec.CommandContext(c, r.bin, append(append([]string{"perf"}, args...), extra...)...)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = out, &stderr
		if err := cmd.Run(); err != nil {
			*errp = fmt.Errorf("%v: %s", err, stderr.String())
			cancel()
		}
	}
	wg.Add(2)
	go run(&sout, &serr, "-p", port, "--dev", "siwtun1", "--socket-dir", r.d1.socketDir)
	go run(&cout, &cerr, "-p", port, "--dev", "siwtun0", "--socket-dir", r.d0.socketDir, r.a1.String())
	wg.Wait()
	if cerr != nil || serr != nil {
		t.Fatalf("siwtun perf %s: client %v; server %v\n--- client\n%s\n--- server\n%s",
			strings.Join(args, " "), cerr, serr, cout.String(), sout.String())
	}
	return cout.String(), sout.String()
}

// The masks of apps/perftest's golden files, and the GIDs, which carry
// the addresses of each topology.
var (
	perfQPN    = regexp.MustCompile(`(QPN|PSN) (0x)?[0-9a-f]+`)
	perfFloat  = regexp.MustCompile(`\d+\.\d+`)
	perfIters  = regexp.MustCompile(`(?m)^( \d+ +)\d+`)
	perfRow    = regexp.MustCompile(`(?m)^ \d.*$`)
	perfBlanks = regexp.MustCompile(`[ \t]+`)
	perfGID    = regexp.MustCompile(`(?m)^ GID: .*$`)
)

func maskGID(s string) string { return perfGID.ReplaceAllString(s, " GID: *") }

func maskPerf(s string, timed bool) string {
	s = perfQPN.ReplaceAllString(s, "$1 *")
	if timed {
		s = perfIters.ReplaceAllString(s, "${1}N")
	}
	s = perfRow.ReplaceAllStringFunc(s, func(row string) string {
		return strings.TrimRight(perfBlanks.ReplaceAllString(perfFloat.ReplaceAllString(row, "#.##"), " "), " ")
	})
	return maskGID(s)
}

// TestPerfSamePort: the user guide's sequence, every run on the default port
// 18515 one right after the other — write, read, write --lat — with the
// earlier runs' connections still draining: the second server must not
// fail with "address already in use" for the minute those drain.
func TestPerfSamePort(t *testing.T) {
	r := newTwoRNICs(t, 1500)
	for _, args := range [][]string{
		{"write", "-n", "50", "-s", "4096"},
		{"read", "-n", "50", "-s", "4096"},
		{"write", "--lat", "-n", "50"},
	} {
		runPerf(t, r, "18515", args...)
	}
}
