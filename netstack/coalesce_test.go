package netstack

import (
	"bytes"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// TestTinyWritesCoalesce writes a long stream of tiny aligned writes (the
// size of the FPDU of a 32-byte inline RDMA Write) to a reader that pauses
// now and then, as a starved receiver does. Every byte must arrive in order,
// the writer must have coalesced (so that the receiver is not flooded with
// tiny segments), and every data segment must still hold whole writes only.
func TestTinyWritesCoalesce(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: streams for a few seconds; make test runs it")
	}
	const unit = 52
	var badSegs, dataSegs atomic.Int64
	hook := HeaderHookFunc(func(s *Segment) {
		if s.Dir != Outbound || s.Len == 0 {
			return
		}
		dataSegs.Add(1)
		if s.Len%unit != 0 {
			badSegs.Add(1)
		}
	})
	sa, sb := newPair(t, pairOpts{mtu: 1500, hookA: hook})
	ca, cb := connect(t, sa, sb, addrB4.Addr())

	const writes = 100_000
	got := make(chan error, 1)
	go func() {
		want := make([]byte, unit)
		buf := make([]byte, 32<<10)
		var off int64
		for reads := 0; off < writes*unit; reads++ {
			n, err := cb.Read(buf)
			if err != nil {
				got <- err
				return
			}
			for p := buf[:n]; len(p) > 0; {
				i := int(off % unit)
				fillUnit(want, (off/unit)%251)
				k := min(len(p), unit-i)
				if !bytes.Equal(p[:k], want[i:i+k]) {
					got <- io.ErrUnexpectedEOF
					return
				}
				p, off = p[k:], off+int64(k)
			}
			if reads%50 == 49 {
				time.Sleep(20 * time.Millisecond)
			}
		}
		got <- nil
	}()
	w := make([]byte, unit)
	for i := range writes {
		fillUnit(w, int64(i%251))
		if _, err := ca.WriteAligned(w); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("reader: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("reader did not get the whole stream")
	}
	if ca.CoalescedWrites() == 0 {
		t.Error("no write was coalesced")
	}
	if n := badSegs.Load(); n != 0 {
		t.Errorf("%d of %d data segments held part of a write", n, dataSegs.Load())
	}
	t.Logf("%d writes in %d data segments, %d written while coalescing", writes, dataSegs.Load(), ca.CoalescedWrites())
}

// fillUnit fills p with a pattern derived from k.
func fillUnit(p []byte, k int64) {
	for i := range p {
		p[i] = byte(k*7 + int64(i))
	}
}
