package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
)

// ctlQPs lists the daemon's queue pairs through its control socket.
func ctlQPs(t testing.TB, d *daemon) []ctl.QP {
	t.Helper()
	c, err := ctl.Dial(ctl.SocketPath(d.socketDir, d.dev))
	if err != nil {
		t.Fatalf("ctl %s: %v", d.dev, err)
	}
	defer c.Close()
	qps, err := c.QPs(0)
	if err != nil {
		t.Fatalf("ctl qp %s: %v", d.dev, err)
	}
	return qps
}

// ctlQPsCLI lists the daemon's queue pairs with `siwtun ctl qp -j`.
func ctlQPsCLI(t testing.TB, bin string, d *daemon) []ctl.QP {
	t.Helper()
	out, err := exec.Command(bin, "ctl", "qp", "-j", "--dev", d.dev, "--socket-dir", d.socketDir).Output()
	if err != nil {
		t.Fatalf("siwtun ctl qp -j --dev %s: %v\n%s", d.dev, err, out)
	}
	var qps []ctl.QP
	if err := json.Unmarshal(out, &qps); err != nil {
		t.Fatalf("siwtun ctl qp -j --dev %s: %v\n%s", d.dev, err, out)
	}
	return qps
}

// ctlVerbsCounters returns the verbs layer of the daemon's stats
// (qpActive, mrActive, sqPosted, ...) by name.
func ctlVerbsCounters(t testing.TB, d *daemon) map[string]uint64 {
	t.Helper()
	c, err := ctl.Dial(ctl.SocketPath(d.socketDir, d.dev))
	if err != nil {
		t.Fatalf("ctl %s: %v", d.dev, err)
	}
	defer c.Close()
	s, err := c.Stats()
	if err != nil {
		t.Fatalf("ctl stats %s: %v", d.dev, err)
	}
	m := make(map[string]uint64, len(s.Verbs))
	for _, c := range s.Verbs {
		m[c.Name] = c.Value
	}
	return m
}

// ctlCounters is every layer's counters of d (ctl stats), by name.
func ctlCounters(t testing.TB, d *daemon) map[string]uint64 {
	t.Helper()
	c, err := ctl.Dial(ctl.SocketPath(d.socketDir, d.dev))
	if err != nil {
		t.Fatalf("ctl %s: %v", d.dev, err)
	}
	defer c.Close()
	s, err := c.Stats()
	if err != nil {
		t.Fatalf("ctl stats %s: %v", d.dev, err)
	}
	m := map[string]uint64{}
	for _, layer := range [][]ctl.Counter{s.TCP, s.MPA, s.DDP, s.RDMAP, s.Verbs} {
		for _, c := range layer {
			m[c.Name] = c.Value
		}
	}
	return m
}

// statesOf counts queue pairs by state.
func statesOf(qps []ctl.QP) map[string]int {
	m := make(map[string]int)
	for _, q := range qps {
		m[q.State]++
	}
	return m
}

// eventually polls cond every 50 ms until it holds or timeout passes; then
// the test fails with cond's last description of what it saw.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, saw := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last seen: %s", what, timeout, saw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// within runs f and fails the test if it has not returned after timeout
// (a hung verbs call is the bug these tests look for). f keeps running
// then; the test's cleanup reaps what it holds.
func within[T any](t testing.TB, timeout time.Duration, what string, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("%s: still blocked after %v", what, timeout)
		panic("unreachable")
	}
}

// timeoutCtx is a context ending after d (and at the test's end).
func timeoutCtx(t testing.TB, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

func describe(v any) string { return fmt.Sprintf("%+v", v) }
