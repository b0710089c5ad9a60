package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// envFDLimitClient makes the test binary the client of
// TestClientAtOpenFileLimit: its value is the verbs socket.
const envFDLimitClient = "SIWTUN_TEST_FDLIMIT_CLIENT"

// TestFDLimitClientProcess is the client process of
// TestClientAtOpenFileLimit (it skips when run directly): with its
// open-file limit at 64 it creates QPs (each reply brings the QP's ring
// descriptors) until a call fails, and prints the error.
func TestFDLimitClientProcess(t *testing.T) {
	sock := os.Getenv(envFDLimitClient)
	if sock == "" {
		t.Skip("client process of TestClientAtOpenFileLimit")
	}
	fail := func(f string, a ...any) { fmt.Fprintf(os.Stderr, "client: "+f+"\n", a...); os.Exit(2) }
	dev, err := verbs.DialPath(sock)
	if err != nil {
		fail("%v", err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		fail("%v", err)
	}
	cq, err := dev.CreateCQ(4)
	if err != nil {
		fail("%v", err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 64, Max: 64}); err != nil {
		fail("setrlimit: %v", err)
	}
	for i := range 1000 {
		if _, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1}); err != nil {
			fmt.Printf("CreateQP %d: %v\n", i, err)
			os.Exit(0)
		}
	}
	fail("1000 QPs created with 64 descriptors")
}

// TestClientAtOpenFileLimit: a verbs client process at its open-file
// limit creates QPs. The daemon's reply to the one whose ring descriptors
// the kernel cannot pass arrives without them; the call must fail with an
// error saying so (before the fix the reply was dropped and CreateQP
// waited for ever: make soak's 10,000 QPs of both sides in one process,
// with RLIMIT_NOFILE at 20,000, hung at the 9,991st). The daemon goes on
// serving.
func TestClientAtOpenFileLimit(t *testing.T) {
	r := newTwoRNICs(t, 1500)
	child := exec.Command(os.Args[0], "-test.run=^TestFDLimitClientProcess$", "-test.count=1")
	child.Env = append(os.Environ(), envFDLimitClient+"="+filepath.Join(r.d0.socketDir, "siwtun0.sock"))
	done := make(chan error, 1)
	var out []byte
	go func() {
		var err error
		out, err = child.CombinedOutput()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("client: %v\n%s", err, out)
		}
	case <-time.After(time.Minute):
		child.Process.Kill() // by its PID
		<-done
		t.Fatalf("client still creating QPs after a minute (a call waiting for ever?)\n%s", out)
	}
	if !strings.Contains(string(out), "CreateQP ") || !strings.Contains(string(out), "open-file limit") {
		t.Fatalf("client output:\n%s\nwant a CreateQP error naming the open-file limit", out)
	}
	t.Logf("client: %s", strings.TrimSpace(strings.Split(string(out), "\n")[0]))
	d, err := verbs.DialPath(filepath.Join(r.d0.socketDir, "siwtun0.sock"))
	if err != nil {
		t.Fatalf("siwtun0 after the client: %v", err)
	}
	d.Close()
}
