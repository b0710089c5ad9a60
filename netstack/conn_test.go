package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestOrderlyClose(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB4.Addr())
	if _, err := ca.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := ca.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(cb)
	if err != nil || string(got) != "hello" {
		t.Fatalf("ReadAll = %q, %v; want hello, nil", got, err)
	}
	// Half-close: b can still answer.
	if _, err := cb.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	cb.Close()
	got, err = io.ReadAll(ca)
	if err != nil || string(got) != "bye" {
		t.Fatalf("ReadAll = %q, %v; want bye, nil", got, err)
	}
	if _, err := ca.ReadTo(io.Discard); !errors.Is(err, io.EOF) {
		t.Errorf("ReadTo after EOF: %v, want io.EOF", err)
	}
	ca.Close()
	if _, err := ca.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v, want net.ErrClosed", err)
	}
	if _, err := ca.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v, want net.ErrClosed", err)
	}
}

func TestAbort(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB4.Addr())
	err := readEnd(t, cb, func() { ca.Abort() }, "ReadTo not unblocked by RST")
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("ReadTo after peer abort: %v, want ECONNRESET", err)
	}
	if _, err := cb.Write([]byte("x")); err == nil {
		t.Errorf("Write after RST succeeded")
	}
	if a.Stats().OutRsts == 0 || b.Stats().InRsts == 0 {
		t.Errorf("OutRsts=%d InRsts=%d, want > 0", a.Stats().OutRsts, b.Stats().InRsts)
	}
}

func TestDialRefused(t *testing.T) {
	a, _ := newPair(t, pairOpts{})
	_, err := a.Dial(context.Background(), netip.Addr{}, netip.AddrPortFrom(addrB4.Addr(), 9))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Dial to closed port: %v, want ECONNREFUSED", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Dial(ctx, netip.Addr{}, netip.AddrPortFrom(addrB4.Addr(), 9)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial with cancelled ctx: %v", err)
	}
}

func TestReadDeadline(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB6.Addr())
	start := time.Now()
	cb.SetReadDeadline(start.Add(50 * time.Millisecond))
	_, err := cb.ReadTo(io.Discard)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadTo: %v, want os.ErrDeadlineExceeded", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 5*time.Second {
		t.Errorf("deadline fired after %v", d)
	}
	if _, err := cb.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read after deadline: %v", err)
	}
	cb.SetReadDeadline(time.Time{})
	if _, err := ca.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 1)
	if n, err := cb.Read(p); n != 1 || err != nil {
		t.Fatalf("Read after clearing deadline: %d, %v", n, err)
	}
	// A deadline in the past fails at once; a later one can be re-armed.
	cb.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := cb.Read(p); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with past deadline: %v", err)
	}
	cb.SetReadDeadline(time.Now().Add(time.Hour))
	ca.Write([]byte("y"))
	if n, err := cb.Read(p); n != 1 || err != nil || p[0] != 'y' {
		t.Fatalf("Read with future deadline: %d, %v", n, err)
	}
}

func TestListenerCloseUnblocksAccept(t *testing.T) {
	_, b := newPair(t, pairOpts{})
	l, err := b.Listen(netip.AddrPortFrom(addrB4.Addr(), 4791))
	if err != nil {
		t.Fatal(err)
	}
	if l.Addr() != netip.AddrPortFrom(addrB4.Addr(), 4791) {
		t.Errorf("Addr = %v", l.Addr())
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept(context.Background())
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	l.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept not unblocked by Close")
	}
	if _, err := b.Listen(netip.AddrPortFrom(addrB4.Addr(), 4791)); err != nil {
		t.Errorf("re-Listen after Close: %v", err)
	}
}

func TestBlockedReadUnblockedByClose(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	_, cb := connect(t, a, b, addrB4.Addr())
	err := readEnd(t, cb, func() { cb.Close() }, "ReadTo not unblocked by Close")
	if !errors.Is(err, net.ErrClosed) {
		t.Fatalf("ReadTo: %v, want net.ErrClosed", err)
	}
}

// readEnd starts c.ReadTo(io.Discard), lets it block, calls act and
// returns the error that ended the read; the test fails with why if the
// read has not ended 5 s later.
func readEnd(t *testing.T, c *Conn, act func(), why string) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := c.ReadTo(io.Discard)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	act()
	select {
	case err := <-errc:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal(why)
		return nil
	}
}

// shortWriter accepts limit bytes, then fails.
type shortWriter struct {
	limit int
	got   []byte
	err   error
}

func (w *shortWriter) Write(p []byte) (int, error) {
	n := min(len(p), w.limit-len(w.got))
	w.got = append(w.got, p[:n]...)
	if n < len(p) {
		return n, w.err
	}
	return n, nil
}

// lyingWriter returns a short count without an error.
type lyingWriter struct{}

func (lyingWriter) Write(p []byte) (int, error) { return len(p) / 2, nil }

type sentinelError struct{}

func (sentinelError) Error() string { return "sentinel" }

func TestReadToWriterErrors(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB4.Addr())
	msg := []byte("0123456789")
	if _, err := ca.Write(msg); err != nil {
		t.Fatal(err)
	}
	w := &shortWriter{limit: 4, err: sentinelError{}}
	n, err := waitReadTo(cb, w)
	var se sentinelError
	if n != 4 || !errors.As(err, &se) {
		t.Fatalf("ReadTo = %d, %v; want 4, sentinel", n, err)
	}
	// The rest is still queued; a short count without error is an error.
	n, err = cb.ReadTo(lyingWriter{})
	if !errors.Is(err, io.ErrShortWrite) || n != 3 {
		t.Fatalf("ReadTo(lying) = %d, %v; want 3, io.ErrShortWrite", n, err)
	}
	rest := make([]byte, 16)
	n, err = cb.Read(rest)
	if err != nil || string(rest[:n]) != "789" {
		t.Fatalf("Read rest = %q, %v; want 789", rest[:n], err)
	}
}

// waitReadTo retries ReadTo until it returns something (the data may still be
// in flight).
func waitReadTo(c *Conn, w io.Writer) (int, error) {
	for {
		n, err := c.ReadTo(w)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// TestAcceptSkipsResetConnection: a connection its peer resets while it
// waits in the accept queue (a connection flood's "connect, reset") does
// not end the listener: Accept skips it and returns the next one (before
// the fix Accept returned the dead connection's "remote address: not
// connected", and the MPA listener's accept loop stopped for good).
func TestAcceptSkipsResetConnection(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	l, err := b.Listen(netip.AddrPortFrom(addrB4.Addr(), 4792))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		c, err := a.Dial(ctx, netip.Addr{}, l.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c.Abort()
	}
	// Let the resets reach b's accept queue before anything accepts.
	deadline := time.Now().Add(5 * time.Second)
	for b.Stats().InRsts < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := b.Stats().InRsts; n < 3 {
		t.Fatalf("%d resets received, want 3", n)
	}
	ca, cb := dialAccept(ctx, t, a, l, addrB4.Addr())
	defer ca.Close()
	defer cb.Close()
	if cb.RemoteAddr() != ca.LocalAddr() {
		t.Fatalf("accepted %v, want the live connection from %v", cb.RemoteAddr(), ca.LocalAddr())
	}
}
