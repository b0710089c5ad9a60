package uabi

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

func newSleepers(t *testing.T) *Sleepers {
	t.Helper()
	s, err := NewSleepers()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newDoorbell(t *testing.T, s *Sleepers) *Doorbell {
	t.Helper()
	fd, err := NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.NewDoorbell(fd)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDoorbellWait: a signal before the wait is taken at once, a signal
// during it wakes it, in poll(2) (a long hold) and
// parked on the Sleepers (no hold, or after a short one); each wait clears
// the doorbell; Close ends a parked wait.
func TestDoorbellWait(t *testing.T) {
	d := newDoorbell(t, newSleepers(t))
	defer d.Close()
	d.Signal()
	d.Signal()
	if err := d.Wait(-1); err != nil {
		t.Fatalf("Wait after two signals: %v", err)
	}
	if ok, err := d.clear(); ok || err != nil {
		t.Fatalf("after Wait the doorbell is still set (%v, %v)", ok, err)
	}
	for _, hold := range []time.Duration{-1, time.Hour, 0, time.Millisecond} {
		done := make(chan error, 1)
		go func() { done <- d.Wait(hold) }()
		if hold == time.Millisecond {
			time.Sleep(20 * time.Millisecond) // let the hold run out
		}
		d.Signal()
		if err := <-done; err != nil {
			t.Fatalf("Wait(%v): %v", hold, err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- d.Wait(0) }()
	time.Sleep(10 * time.Millisecond)
	d.Close()
	if err := <-done; err == nil {
		t.Fatal("a parked Wait returned no error when the doorbell was closed")
	}
}

// threads is the process's number of threads.
func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("Threads:"))
	if i < 0 {
		t.Fatal("no Threads in /proc/self/status")
	}
	f := bytes.Fields(b[i+len("Threads:"):])
	n, err := strconv.Atoi(string(f[0]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDoorbellSleepersHoldNoThreads: 300 doorbells waited on parked hold
// no thread each (in poll(2) each held one: Go keeps a thread per
// blocking system call), and every one still wakes when signalled.
func TestDoorbellSleepersHoldNoThreads(t *testing.T) {
	const n = 300
	s := newSleepers(t)
	before := threads(t)
	dbs := make([]*Doorbell, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range dbs {
		dbs[i] = newDoorbell(t, s)
		defer dbs[i].Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- dbs[i].Wait(0)
		}()
	}
	// Every waiter has found its doorbell clear and parked once the
	// signals below wake them all; meanwhile count the threads.
	time.Sleep(100 * time.Millisecond)
	if now := threads(t); now > before+n/10 {
		t.Errorf("%d threads with %d sleepers, %d before", now, n, before)
	}
	for _, d := range dbs {
		d.Signal()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
