package netstack

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestCloseAfter: the FIN comes no sooner than the delay, after the data
// written before; the closing side's reads and writes end at once; a
// second close changes nothing.
func TestCloseAfter(t *testing.T) {
	const delay = 150 * time.Millisecond
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB4.Addr())
	if _, err := ca.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if !ca.CloseAfter(delay) {
		t.Fatal("CloseAfter on an open connection = false")
	}
	if ca.CloseAfter(delay) {
		t.Error("second CloseAfter = true")
	}
	ca.Close() // must not send the FIN early
	if _, err := ca.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after CloseAfter: %v, want net.ErrClosed", err)
	}
	if _, err := ca.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after CloseAfter: %v, want net.ErrClosed", err)
	}
	got, err := io.ReadAll(cb)
	if err != nil || string(got) != "last words" {
		t.Fatalf("peer ReadAll = %q, %v; want the data, then EOF", got, err)
	}
	if waited := time.Since(start); waited < delay {
		t.Errorf("peer saw the FIN %v after CloseAfter(%v)", waited, delay)
	}
	cb.Close()
}

// TestCloseAfterAbort: Abort during the delay resets the connection at
// once; the connection's hook saw nothing after CloseAfter.
func TestCloseAfterAbort(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB4.Addr())
	var seen atomic.Int64
	ca.SetSegmentHook(HeaderHookFunc(func(*Segment) { seen.Add(1) }))
	if _, err := cb.Write([]byte("before")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for seen.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if seen.Load() == 0 {
		t.Fatal("the connection's hook saw no segment before CloseAfter")
	}
	ca.CloseAfter(time.Hour)
	before := seen.Load()
	if _, err := cb.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	err := readEnd(t, cb, func() { ca.Abort() }, "Abort during CloseAfter's delay sent no reset")
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("peer's read after Abort: %v, want ECONNRESET", err)
	}
	if n := seen.Load(); n != before {
		t.Errorf("the connection's hook saw %d segments after CloseAfter", n-before)
	}
}
