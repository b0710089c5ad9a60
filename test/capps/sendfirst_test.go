package capps

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSendFirst runs test/interop's sendfirst (an rdma_cm program whose
// server posts a Send the moment it sees ESTABLISHED, its client sending
// nothing before it has that message) between the two daemons, 50
// connections, built with ASan and UBSan over the library built with
// them. RFC 5044 §7.1.2 has the server's RNIC hold the Send until the
// client's first FPDU; between two siwtuns that is the RTR of the
// peer-to-peer mode the client offers by default, so no timer is
// involved: no connection's hold ends at --startup-hold's bound, no first
// FPDU waits --first-fpdu-delay.
func TestSendFirst(t *testing.T) {
	e := newEnv(t)
	prog := filepath.Join(filepath.Dir(e.ctest), "sendfirst-asan")
	args := []string{"-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
		"-o", prog, "../interop/sendfirst/sendfirst.c", "-lrdmacm", "-libverbs"}
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	asan := []string{"ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0", "SIWTUN_LIB=" + e.asanLib()}
	const runs = "50"
	srv := e.start("siwtun1", asan, prog, "-s", "-a", "198.18.2.2", "-p", "7400", "-n", runs)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(srv.stdoutString(), "listening on"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			out, _ := srv.wait(t, time.Second)
			t.Fatalf("sendfirst -s does not listen:\n%s", out)
		}
	}
	cout, cerr := e.start("siwtun0", asan, prog, "-c", "-a", "198.18.2.2", "-p", "7400", "-n", runs).wait(t, 2*time.Minute)
	sout, serr := srv.wait(t, 30*time.Second)
	for _, side := range []struct {
		who, out string
		err      error
	}{{"client", cout, cerr}, {"server", sout, serr}} {
		if side.err != nil || !strings.Contains(side.out, "runs: "+runs+"\nfailures: 0\n") {
			t.Errorf("sendfirst %s: %v\n%s", side.who, side.err, side.out)
		}
	}
	if n := counter(t, e, "siwtun1", "mpaStartupHoldsBounded"); n != 0 {
		t.Errorf("siwtun1 mpaStartupHoldsBounded = %d, want 0 (the client's RTR ends every hold)", n)
	}
	if n := counter(t, e, "siwtun0", "mpaFirstFpduDelays"); n != 0 {
		t.Errorf("siwtun0 mpaFirstFpduDelays = %d, want 0 (siwtun's Reply says it reads at once)", n)
	}
}

// counter is one of a device's counters (siwtun ctl stats).
func counter(t *testing.T, e *env, dev, name string) int {
	t.Helper()
	b, err := e.command(e.bin, "ctl", "stats", "--socket-dir", e.sockDir, "--dev", dev).CombinedOutput()
	if err != nil {
		t.Fatalf("siwtun ctl stats --dev %s: %v\n%s", dev, err, b)
	}
	fs := strings.Fields(string(b))
	for i := 0; i+1 < len(fs); i++ {
		if fs[i] == name {
			n, err := strconv.Atoi(fs[i+1])
			if err != nil {
				t.Fatalf("%s %q", name, fs[i+1])
			}
			return n
		}
	}
	t.Fatalf("no %s in ctl stats:\n%s", name, b)
	return 0
}
