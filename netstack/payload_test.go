package netstack

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
)

// patternPayload is a Payload generating the test pattern directly into
// gVisor's buffer, recording the length of every slice Read is given.
type patternPayload struct {
	off   int64 // stream offset of the next byte
	left  int
	limit int // if > 0, fill at most limit bytes per Read
	sizes []int
}

func (p *patternPayload) Len() int { return p.left }

func (p *patternPayload) Read(b []byte) (int, error) {
	p.sizes = append(p.sizes, len(b))
	if p.left == 0 {
		return 0, io.EOF
	}
	n := min(len(b), p.left)
	if p.limit > 0 {
		n = min(n, p.limit)
	}
	fillPattern(b[:n], p.off)
	p.off += int64(n)
	p.left -= n
	return n, nil
}

// TestWriteAlignedPayloadSlices verifies what WriteAlignedPayload's doc
// says about gVisor's reads: one Read with one slice of the whole length per
// MSS-sized write (1420 bytes at MTU 1500, 8920 at 9000).
func TestWriteAlignedPayloadSlices(t *testing.T) {
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprint(mtu), func(t *testing.T) {
			a, b := newPair(t, pairOpts{mtu: mtu})
			ca, cb := connect(t, a, b, addrB4.Addr())
			size := ca.MSS()
			want := map[int]int{1500: 1420, 9000: 8920}[mtu]
			if size != want {
				t.Fatalf("MSS %d, want %d", size, want)
			}
			// 64 writes fit the 1 MiB send buffer at either MTU, so
			// none waits or is accepted in part.
			const writes = 64
			n := int64(writes * size)
			recv := make(chan *verifier, 1)
			go func() {
				v, err := receivePattern(cb)
				if err != nil {
					t.Error(err)
				}
				recv <- v
			}()
			var off int64
			for i := range writes {
				p := &patternPayload{off: off, left: size}
				m, err := ca.WriteAlignedPayload(p)
				if err != nil || m != size {
					t.Fatalf("write %d: %d, %v", i, m, err)
				}
				if len(p.sizes) != 1 || p.sizes[0] != size {
					t.Fatalf("write %d of %d bytes: Read got slices of %v, want [%d]", i, size, p.sizes, size)
				}
				off += int64(size)
			}
			t.Logf("MTU %d: each of %d writes of %d bytes: one Read of one %d-byte slice", mtu, writes, size, size)
			ca.CloseWrite()
			v := <-recv
			if v.off != n || v.mismatches != 0 {
				t.Fatalf("received %d bytes, %d mismatches, want %d exact", v.off, v.mismatches, n)
			}
		})
	}
}

// TestWriteAlignedPayloadBulk moves a large stream through
// WriteAlignedPayload with payloads that fill only part of each slice per
// Read, so partial reads, send-buffer waits and partial gVisor writes all
// continue from the payload.
func TestWriteAlignedPayloadBulk(t *testing.T) {
	a, b := newPair(t, pairOpts{mtu: 9000, sndBuf: 64 << 10})
	ca, cb := connect(t, a, b, addrB4.Addr())
	const n = 8 << 20
	errc := make(chan error, 1)
	go func() {
		var off int64
		sizes := []int{ca.MSS(), 1, 3000, 70000, ca.MSS() - 1}
		for i := 0; off < n; i++ {
			k := int(min(int64(sizes[i%len(sizes)]), n-off))
			p := &patternPayload{off: off, left: k, limit: 1000 + i%700}
			m, err := ca.WriteAlignedPayload(p)
			if err != nil || m != k || p.left != 0 {
				errc <- fmt.Errorf("write at %d: %d of %d, %v (left %d)", off, m, k, err, p.left)
				return
			}
			off += int64(k)
		}
		errc <- ca.CloseWrite()
	}()
	v, err := receivePattern(cb)
	if err != nil || v.off != n || v.mismatches != 0 {
		t.Fatalf("transfer: %v, %d bytes, %d mismatches (first at %d)", err, v.off, v.mismatches, v.firstBad)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

type shortPayload struct{ n, left int }

func (p *shortPayload) Len() int { return p.n }
func (p *shortPayload) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	k := min(len(b), p.left)
	p.left -= k
	return k, nil
}

type failingPayload struct{ err error }

func (p failingPayload) Len() int                 { return 100 }
func (p failingPayload) Read([]byte) (int, error) { return 10, p.err }

type stuckPayload struct{}

func (stuckPayload) Len() int                 { return 100 }
func (stuckPayload) Read([]byte) (int, error) { return 0, nil }

func TestWriteAlignedPayloadErrors(t *testing.T) {
	sentinel := errors.New("sentinel")
	for _, tc := range []struct {
		name string
		p    Payload
		want error
	}{
		{"early EOF", &shortPayload{n: 100, left: 40}, io.ErrUnexpectedEOF},
		{"read error", failingPayload{sentinel}, sentinel},
		{"no progress", stuckPayload{}, io.ErrNoProgress},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newPair(t, pairOpts{})
			ca, _ := connect(t, a, b, addrB4.Addr())
			n, err := ca.WriteAlignedPayload(tc.p)
			if n != 0 || !errors.Is(err, tc.want) {
				t.Fatalf("WriteAlignedPayload = %d, %v; want 0, %v", n, err, tc.want)
			}
			// The Conn stays usable for the next write.
			if n, err := ca.WriteAligned([]byte("ok")); n != 2 || err != nil {
				t.Fatalf("WriteAligned after error = %d, %v", n, err)
			}
		})
	}
}

// TestWriteAlignedNoAllocs checks that the aligned write path, the Pipe and
// the ReadTo receive path do not allocate per write in steady state
// (allocations counted process-wide, so both stacks and the Pipe count).
func TestWriteAlignedNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("-race: sync.Pool drops items, gVisor's pools allocate")
	}
	a, b := newPair(t, pairOpts{mtu: 9000})
	ca, cb := connect(t, a, b, addrB4.Addr())
	buf := make([]byte, ca.MSS())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		d := &discardWriter{}
		for {
			if _, err := cb.ReadTo(d); err != nil {
				return
			}
		}
	}()
	pp := &patternPayload{}
	for range 2000 { // warm gVisor's pools and the buffers' auto-tuning
		if _, err := ca.WriteAligned(buf); err != nil {
			t.Fatal(err)
		}
	}
	aligned := testing.AllocsPerRun(5000, func() {
		if _, err := ca.WriteAligned(buf); err != nil {
			t.Fatal(err)
		}
	})
	payload := testing.AllocsPerRun(5000, func() {
		pp.left, pp.sizes = len(buf), pp.sizes[:0]
		if _, err := ca.WriteAlignedPayload(pp); err != nil {
			t.Fatal(err)
		}
	})
	ca.CloseWrite()
	wg.Wait()
	t.Logf("allocs per write: WriteAligned %.3f, WriteAlignedPayload %.3f", aligned, payload)
	// Not 0: a GC in the window makes gVisor's sync.Pools refill, and the
	// runtime allocates sudogs and timers now and then.
	if aligned > 0.1 || payload > 0.1 {
		t.Errorf("allocs per write: WriteAligned %.3f, WriteAlignedPayload %.3f; want ~0", aligned, payload)
	}
}
