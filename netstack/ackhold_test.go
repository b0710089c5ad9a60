package netstack

import (
	"io"
	"testing"
	"time"
)

// TestDelayedACKPingPong: with delayed ACKs, a request/response exchange
// is exact, and answers carry ACKs that were held (the pure ACKs are
// dropped), so fewer packets cross the link.
func TestDelayedACKPingPong(t *testing.T) {
	a, b := newPair(t, pairOpts{delayedACK: true})
	ca, cb := connect(t, a, b, addrB4.Addr())
	const rounds, size = 300, 64
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range rounds {
			if _, err := io.ReadFull(cb, buf); err != nil {
				done <- err
				return
			}
			if _, err := cb.Write(buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	req, resp := make([]byte, size), make([]byte, size)
	for i := range rounds {
		fillPattern(req, int64(i*size))
		if _, err := ca.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(ca, resp); err != nil {
			t.Fatal(err)
		}
		if string(resp) != string(req) {
			t.Fatalf("round %d: answer differs", i)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	held := a.ep.acks.nHeld.Load() + b.ep.acks.nHeld.Load()
	carried := a.ep.acks.nCarried.Load() + b.ep.acks.nCarried.Load()
	t.Logf("held %d ACKs, %d carried by an answer; packets a->b %d, b->a %d", held, carried,
		a.link.Stats().Tx.Delivered, b.link.Stats().Tx.Delivered)
	if carried == 0 {
		t.Errorf("no held ACK was carried by an answer (held %d)", held)
	}
}

// TestDelayedACKOneWay: a receiver that never answers still acknowledges
// everything: every second ACK goes out at once, and a lone held ACK when
// its time is up.
func TestDelayedACKOneWay(t *testing.T) {
	a, b := newPair(t, pairOpts{delayedACK: true})
	ca, cb := connect(t, a, b, addrB4.Addr())
	go io.Copy(io.Discard, cb)
	if _, err := ca.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if !ca.WaitAcked(10 * time.Second) {
		t.Fatal("a lone segment was never acknowledged")
	}
	if b.ep.acks.nExpired.Load() == 0 {
		t.Errorf("the lone segment's ACK was not held until its time was up (held %d)", b.ep.acks.nHeld.Load())
	}
	if err := sendPattern(ca, 4<<20, ca.MSS()); err != nil {
		t.Fatal(err)
	}
	if !ca.WaitAcked(10 * time.Second) {
		t.Fatal("a stream was not acknowledged to its end")
	}
}

// TestDelayedACKBulk: both directions at once, exact, with delayed ACKs.
func TestDelayedACKBulk(t *testing.T) {
	a, b := newPair(t, pairOpts{delayedACK: true})
	ca, cb := connect(t, a, b, addrB4.Addr())
	bulk(t, ca, cb, 8<<20)
}

func TestOnlyTimestamps(t *testing.T) {
	for _, tc := range []struct {
		opts []byte
		want bool
	}{
		{nil, true},
		{[]byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}, true},
		{[]byte{8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0}, true},
		{[]byte{1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2}, false}, // SACK block
		{[]byte{8, 9, 0, 0, 0, 1, 0, 0, 0}, false},
		{[]byte{8}, false},
		{[]byte{3, 3, 7}, false}, // window scale: not on an ACK
	} {
		if got := onlyTimestamps(tc.opts); got != tc.want {
			t.Errorf("onlyTimestamps(%v) = %v, want %v", tc.opts, got, tc.want)
		}
	}
}

// TestDelayedACKForgetsClosed: nothing is kept for connections that were
// closed, whatever their last segments did.
func TestDelayedACKForgetsClosed(t *testing.T) {
	a, b := newPair(t, pairOpts{delayedACK: true})
	for range 5 {
		ca, cb := connect(t, a, b, addrB4.Addr())
		if _, err := ca.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(cb, buf); err != nil {
			t.Fatal(err)
		}
		ca.Close()
		cb.Close()
	}
	for name, s := range map[string]*Stack{"a": a, "b": b} {
		h := s.ep.acks
		h.mu.Lock()
		n, m := len(h.last), len(h.held)
		h.mu.Unlock()
		if n != 0 || m != 0 {
			t.Errorf("stack %s keeps %d connections' last ACKs and %d held ACKs after they closed", name, n, m)
		}
	}
}
