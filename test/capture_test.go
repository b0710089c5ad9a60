package test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/verbs"
)

// needTshark returns tshark's path, installing Debian's tshark package
// when it is missing; it skips the test, saying why, when that cannot be
// done.
func needTshark(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("tshark"); err == nil {
		return p
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("tshark is not installed and there is no apt-get to install it")
	}
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	install := func() ([]byte, error) {
		cmd := exec.Command("apt-get", "install", "-y", "--no-install-recommends", "tshark")
		cmd.Env = env
		return cmd.CombinedOutput()
	}
	out, err := install()
	if err != nil {
		// The package lists may be missing or stale.
		upd := exec.Command("apt-get", "update")
		upd.Env = env
		if uout, uerr := upd.CombinedOutput(); uerr != nil {
			t.Skipf("tshark is not installed and apt-get update failed: %v\n%s", uerr, uout)
		}
		out, err = install()
	}
	if err != nil {
		t.Skipf("tshark is not installed and apt-get install tshark failed: %v\n%s", err, out)
	}
	p, err := exec.LookPath("tshark")
	if err != nil {
		t.Skipf("apt-get installed tshark but it is not on PATH: %v", err)
	}
	return p
}

// watcher is a `siwtun capture` or `siwtun trace` process of the test.
type watcher struct {
	cmd    *exec.Cmd
	stdout *syncbuf.Buffer
	stderr *syncbuf.Buffer
	done   chan error
}

// startWatcher starts `siwtun <args>` and waits until it says its watch
// has started.
func startWatcher(t *testing.T, bin string, args ...string) *watcher {
	t.Helper()
	w := &watcher{cmd: exec.Command(bin, args...), stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, done: make(chan error, 1)}
	w.cmd.Stdout, w.cmd.Stderr = w.stdout, w.stderr
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.done <- w.cmd.Wait() }()
	t.Cleanup(func() {
		if w.cmd.ProcessState == nil {
			w.cmd.Process.Kill()
		}
	})
	eventually(t, 20*time.Second, "siwtun "+args[0]+" to start watching", func() (bool, string) {
		return strings.Contains(w.stderr.String(), "watching"), w.stderr.String()
	})
	return w
}

// stop interrupts the process (by its PID) and waits for it.
func (w *watcher) stop(t *testing.T) {
	t.Helper()
	if err := w.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w.done:
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(w.cmd.Args, " "), err, w.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not stop within 20 s", strings.Join(w.cmd.Args, " "))
	}
}

// TestCaptureMarkersCRC runs two daemons with CRC and markers on, captures
// siwtun0's traffic with `siwtun capture` (and traces it with `siwtun
// trace -j`) while an application does RDMA Writes, Reads and Sends, and
// checks the capture twice: Wireshark's dissectors (tshark, with the
// RPC-over-RDMA and SMB Direct heuristics off) decode every FPDU with
// "Good CRC32" and find nothing malformed; siwtun's checker finds every
// marker at its place with a correct FPDUPTR and every CRC good.
func TestCaptureMarkersCRC(t *testing.T) {
	requireRoot(t)
	tshark := needTshark(t)
	r := newTwoRNICs(t, 1500, "--crc", "--markers")
	file := filepath.Join(t.TempDir(), "siwtun0.pcapng")
	capt := startWatcher(t, r.bin, "capture", "--dev", "siwtun0", "--socket-dir", r.d0.socketDir, "-w", file)
	trace := startWatcher(t, r.bin, "trace", "--dev", "siwtun0", "--socket-dir", r.d0.socketDir, "-j")

	cli, srv := r.connect(t, 7174, 16)
	for _, size := range []int{100, 4096, 65536} {
		src := pattern(size, byte(size))
		smr, sbuf := cli.mr(t, size, verbs.AccessLocalWrite)
		copy(sbuf, src)
		dmr, dbuf := srv.mr(t, size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		kmr, kbuf := cli.mr(t, size, verbs.AccessLocalWrite)
		rmr, rbuf := srv.mr(t, size, verbs.AccessLocalWrite)
		if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{rmr.SGE(0, size)}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.qp.PostSend([]verbs.SendWR{
			{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, size)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()},
			{ID: 2, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{kmr.SGE(0, size)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()},
			{ID: 3, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, size)}},
		}); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if wc := cli.wait(t, cli.scq); wc.Status != verbs.WCSuccess {
				t.Fatalf("size %d: %+v", size, wc)
			}
		}
		if wc := srv.wait(t, srv.rcq); wc.Status != verbs.WCSuccess || int(wc.ByteLen) != size {
			t.Fatalf("size %d: receive %+v", size, wc)
		}
		if !bytes.Equal(dbuf, src) || !bytes.Equal(kbuf, src) || !bytes.Equal(rbuf, src) {
			t.Fatalf("size %d: data differ", size)
		}
	}
	time.Sleep(300 * time.Millisecond) // the last ACKs and placements reach the watchers
	capt.stop(t)
	trace.stop(t)

	// siwtun's checker.
	out, err := exec.Command(r.bin, "check", file).CombinedOutput()
	t.Logf("siwtun check %s:\n%s", filepath.Base(file), out)
	if err != nil {
		t.Fatalf("siwtun check: %v", err)
	}
	segs, err := capture.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	a := inspect.New()
	// What Wireshark's MPA dissector cannot frame when markers are on: it
	// assumes one FPDU per segment, and it counts a marker at a segment's
	// very end (a stream offset that is a multiple of 512) as inside it.
	var split, multi, endsAtMarker int
	for _, s := range segs {
		for _, rep := range a.Add(s) {
			if rep.Aligned != nil && !*rep.Aligned {
				split++
			}
			ends := 0
			for _, f := range rep.FPDUs {
				if f.Ends {
					ends++
					if (f.Offset+uint64(f.Len))%512 == 0 {
						endsAtMarker++
					}
				}
			}
			if ends > 1 {
				multi++
			}
		}
	}
	sums := a.Summary()
	fpdus := 0
	for _, s := range sums {
		if s.Frame == "" {
			continue // another connection (none expected)
		}
		if !s.CRC || !s.Markers || s.FPDUs == 0 || s.CRCGood != s.FPDUs || s.CRCBad != 0 || s.MarkersOK == 0 || s.MarkersBad != 0 || s.Note != "" {
			t.Errorf("%v > %v: %+v", s.Src, s.Dst, s)
		}
		fpdus += s.FPDUs
	}
	if fpdus == 0 {
		t.Fatalf("no FPDU in the capture: %+v", sums)
	}

	// Wireshark's dissectors.
	res := capture.RunTshark(context.Background(), tshark, file)
	t.Logf("tshark: %d frames (%d with comments), MPA Request %d, Reply %d, %d FPDUs, %d Good CRC32, %d Bad CRC32, %d malformed, %d expert errors",
		res.Frames, res.Comments, res.Requests, res.Replies, res.FPDUs, res.GoodCRC, res.BadCRC, res.Malformed, res.ExpertErrors)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.Requests != 1 || res.Replies != 1 || res.FPDUs != fpdus || res.GoodCRC != res.FPDUs || res.BadCRC != 0 || res.Malformed != 0 || res.ExpertErrors != 0 {
		t.Errorf("tshark: %+v; the checker found %d FPDUs, %d segments not FPDU-aligned, %d segments with more than one FPDU, %d FPDUs ending on a marker position", res, fpdus, split, multi, endsAtMarker)
	}

	// The trace saw the same connection, with placements and completions.
	var tfpdus, places, wcs int
	for _, line := range strings.Split(strings.TrimSpace(trace.stdout.String()), "\n") {
		var l struct {
			Reports []inspect.Report  `json:"reports"`
			Places  []json.RawMessage `json:"places"`
			WCs     []json.RawMessage `json:"wcs"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("trace line %q: %v", line, err)
		}
		for _, rep := range l.Reports {
			for _, f := range rep.FPDUs {
				if f.Ends {
					tfpdus++
				}
			}
		}
		places += len(l.Places)
		wcs += len(l.WCs)
	}
	if tfpdus != fpdus || places == 0 || wcs != 9 {
		t.Errorf("trace: %d FPDUs (capture %d), %d placements, %d completions (want 9)", tfpdus, fpdus, places, wcs)
	}
}
