package test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPerfAnatomy: siwtun perf write --lat --anatomy between two daemons
// takes the 4 B round trip apart: every leg of both directions rests on
// (nearly) every message, the legs of a direction add up to its one-way
// trip, and the two one-way trips to the round trip.
func TestPerfAnatomy(t *testing.T) {
	r := newTwoRNICs(t, 1500)
	const iters = 300
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	common := []string{"perf", "write", "--lat", "--anatomy", "-s", "4", "-I", "0", "-n", fmt.Sprint(iters), "-p", "18700"}
	var wg sync.WaitGroup
	var cout, sout bytes.Buffer
	var cerr, serr error
	run := func(out *bytes.Buffer, errp *error, args ...string) {
		defer wg.Done()
		cmd := exec.CommandContext(c, r.bin, append(common, args...)...)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = out, &stderr
		if err := cmd.Run(); err != nil {
			*errp = fmt.Errorf("%v: %s", err, stderr.String())
			cancel()
		}
	}
	wg.Add(2)
	go run(&sout, &serr, "--dev", "siwtun1", "--socket-dir", r.d1.socketDir)
	time.Sleep(200 * time.Millisecond)
	go run(&cout, &cerr, "--dev", "siwtun0", "--socket-dir", r.d0.socketDir, "--peer-socket-dir", r.d1.socketDir, r.a1.String())
	wg.Wait()
	if cerr != nil || serr != nil {
		t.Fatalf("client %v; server %v\n--- client\n%s\n--- server\n%s", cerr, serr, cout.String(), sout.String())
	}
	if !strings.Contains(sout.String(), "stamps handed to siwtun1") {
		t.Errorf("the server did not hand its stamps over:\n%s", sout.String())
	}
	out := cout.String()
	t.Logf("client:\n%s", out)
	row := regexp.MustCompile(`(?m)^(=? ?(?:post|->|one way)[^0-9]*?)\s+(-?[0-9.]+)\s+(-?[0-9.]+)\s+(\d+)\s+(-?[0-9.]+)\s+(-?[0-9.]+)\s+(\d+)$`)
	rows := row.FindAllStringSubmatch(out, -1)
	if len(rows) != 11 {
		t.Fatalf("%d rows of legs, want 10 and the one-way trip:\n%s", len(rows), out)
	}
	var sum [2]float64
	var oneWay [2]float64
	for i, m := range rows {
		for d := range 2 {
			med, _ := strconv.ParseFloat(m[2+3*d], 64)
			n, _ := strconv.Atoi(m[4+3*d])
			if n < iters*9/10 {
				t.Errorf("%q, direction %d: over %d messages, want nearly %d", m[1], d, n, iters)
			}
			if med < 0 {
				t.Errorf("%q, direction %d: median %v µs", m[1], d, med)
			}
			if i < 10 {
				sum[d] += med
			} else {
				oneWay[d] = med
			}
		}
	}
	// Medians do not add up exactly; the legs must account for most of
	// the trip and not for much more.
	for d := range 2 {
		if sum[d] < 0.5*oneWay[d] || sum[d] > 1.5*oneWay[d] {
			t.Errorf("direction %d: the legs' medians add up to %.1f µs, the one-way trip's is %.1f", d, sum[d], oneWay[d])
		}
	}
	if !regexp.MustCompile(`round trip: post -> seen the answer \(client's application\): median [0-9.]+ us, p99 [0-9.]+ us over \d+ round trips`).MatchString(out) {
		t.Errorf("no round trip line:\n%s", out)
	}
}

// TestCtlAnatomy: siwtun ctl anatomy around a ping-pong of programs that
// hand over no stamps of their own (siwtun perf without --anatomy): the
// daemons' legs of the test connection rest on every message, the
// applications' are empty.
func TestCtlAnatomy(t *testing.T) {
	r := newTwoRNICs(t, 1500)
	const iters = 200
	ctlArgs := func(action string) []string {
		return []string{"ctl", "anatomy", action, "--dev", "siwtun0", "--socket-dir", r.d0.socketDir,
			"--peer", "siwtun1", "--peer-socket-dir", r.d1.socketDir}
	}
	if out, err := exec.Command(r.bin, ctlArgs("show")...).CombinedOutput(); err == nil || !strings.Contains(string(out), "no messages") {
		t.Errorf("show before start: %v\n%s", err, out)
	}
	if out, err := exec.Command(r.bin, ctlArgs("start")...).CombinedOutput(); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	runPerf(t, r, "18710", "write", "--lat", "-s", "4", "-I", "0", "-n", fmt.Sprint(iters))
	out, err := exec.Command(r.bin, ctlArgs("show")...).CombinedOutput()
	if err != nil {
		t.Fatalf("show: %v\n%s", err, out)
	}
	t.Logf("\n%s", out)
	// perftest's control exchange has a connection of its own; the test
	// connection carries the iterations.
	row := regexp.MustCompile(`(?m)^-> the peer's TUN read returned \(kernel\)\s+[0-9.]+\s+[0-9.]+\s+(\d+)\s+[0-9.]+\s+[0-9.]+\s+(\d+)$`)
	found := false
	for _, m := range row.FindAllStringSubmatch(string(out), -1) {
		a, _ := strconv.Atoi(m[1])
		b, _ := strconv.Atoi(m[2])
		found = found || (a >= iters && b >= iters-1)
	}
	if !found || !strings.Contains(string(out), "no stamps of the applications") {
		t.Errorf("no connection with the test's %d messages each way, or application legs filled:\n%s", iters, out)
	}
}
