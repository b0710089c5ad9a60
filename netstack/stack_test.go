package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// chanDevice is an in-memory PacketDevice; two of them form a wire.
type chanDevice struct {
	in, out chan []byte
	done    chan struct{}
	once    sync.Once
	mtu     int
}

func devicePair(mtu int) (a, b *chanDevice) {
	ab, ba := make(chan []byte, 1024), make(chan []byte, 1024)
	return &chanDevice{in: ba, out: ab, done: make(chan struct{}), mtu: mtu},
		&chanDevice{in: ab, out: ba, done: make(chan struct{}), mtu: mtu}
}

func (d *chanDevice) ReadPacket(p []byte) (int, error) {
	select {
	case b := <-d.in:
		return copy(p, b), nil
	case <-d.done:
		return 0, os.ErrClosed
	}
}

func (d *chanDevice) WritePacket(p []byte) error {
	select {
	case d.out <- append([]byte(nil), p...):
	case <-d.done:
		return os.ErrClosed
	default: // full: drop, like a TUN
	}
	return nil
}

func (d *chanDevice) MTU() int { return d.mtu }

func (d *chanDevice) Close() error {
	d.once.Do(func() { close(d.done) })
	return nil
}

// segCounter counts ReadTo Write calls and their sizes.
type segCounter struct {
	calls, bytes int
	sizes        map[int]int
}

func (s *segCounter) Write(p []byte) (int, error) {
	s.calls++
	s.bytes += len(p)
	s.sizes[len(p)]++
	return len(p), nil
}

func TestDeviceLink(t *testing.T) {
	da, db := devicePair(1500)
	a, b := newPair(t, pairOpts{linkA: NewDeviceLink(da), linkB: NewDeviceLink(db)})
	ca, cb := connect(t, a, b, addrB4.Addr())
	mss := ca.MSS()
	if mss != 1420 {
		t.Errorf("MSS = %d, want 1420", mss)
	}
	const writes = 2000
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ca, int64(writes*mss), mss) }()
	sc := &segCounter{sizes: map[int]int{}}
	for {
		_, err := cb.ReadTo(sc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if sc.bytes != writes*mss {
		t.Fatalf("got %d bytes, want %d", sc.bytes, writes*mss)
	}
	// One view per packet: ReadTo sees one slice per segment, mostly
	// exactly MSS bytes.
	t.Logf("ReadTo: %d calls, %d of them %d bytes; link a %+v", sc.calls, sc.sizes[mss], mss, a.link.Stats().Tx)
	if sc.sizes[mss] < writes*9/10 {
		t.Errorf("only %d of %d slices were one full segment", sc.sizes[mss], writes)
	}
}

func TestNewErrors(t *testing.T) {
	la, lb := Pipe(1500, Impairments{})
	defer la.Close()
	defer lb.Close()
	if _, err := New(la, Options{}); err == nil {
		t.Error("New without addresses succeeded")
	}
	if _, err := New(la, Options{Addrs: []netip.Prefix{addrA4}, MTU: 9000}); err == nil {
		t.Error("New with MTU above the link's succeeded")
	}
	s, err := New(la, Options{Addrs: []netip.Prefix{addrA4}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := New(la, Options{Addrs: []netip.Prefix{addrA4}}); !errors.Is(err, ErrLinkInUse) {
		t.Errorf("second New on the same link: %v, want ErrLinkInUse", err)
	}
	if s.MTU() != 1500 || len(s.Addrs()) != 1 || s.Addrs()[0] != addrA4 {
		t.Errorf("MTU %d Addrs %v", s.MTU(), s.Addrs())
	}
	s.Close()
	if _, err := s.Listen(netip.AddrPort{}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Listen after Close: %v", err)
	}
	if _, err := s.Dial(context.Background(), netip.Addr{}, netip.AddrPortFrom(addrB4.Addr(), 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Dial after Close: %v", err)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		a, b := newPair(t, pairOpts{imp: Impairments{Delay: time.Millisecond, Loss: 0.01, Seed: 1}, noCleanups: true})
		ca, cb := connect(t, a, b, addrB4.Addr())
		var done atomic.Bool
		go func() {
			buf := make([]byte, 64<<10)
			for !done.Load() {
				if _, err := ca.Write(buf); err != nil {
					return
				}
			}
		}()
		go io.Copy(io.Discard, cb)
		time.Sleep(50 * time.Millisecond)
		done.Store(true)
		a.Close()
		b.Close()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		after := runtime.NumGoroutine()
		if after <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines: %d before, %d after Stack.Close\n%s", before, after, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStackCloseResetsPeers(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	_, cb := connect(t, a, b, addrB4.Addr())
	err := readEnd(t, cb, func() { a.Close() }, "peer not reset by Stack.Close")
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("peer read after Stack.Close: %v, want ECONNRESET", err)
	}
}

func BenchmarkPipeThroughput(b *testing.B) {
	for _, mtu := range []int{1500, 9000} {
		b.Run(fmt.Sprintf("mtu=%d", mtu), func(b *testing.B) {
			sa, sb := newPair(b, pairOpts{mtu: mtu})
			ca, cb := connect(b, sa, sb, addrB4.Addr())
			mss := ca.MSS()
			buf := make([]byte, mss)
			fillPattern(buf, 0)
			b.SetBytes(int64(mss))
			b.ReportAllocs()
			done := make(chan int64, 1)
			go func() {
				var total int64
				for {
					n, err := cb.ReadTo(io.Discard)
					total += int64(n)
					if err != nil {
						done <- total
						return
					}
				}
			}()
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				if _, err := ca.WriteAligned(buf); err != nil {
					b.Fatal(err)
				}
			}
			ca.CloseWrite()
			total := <-done
			el := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(total)/el.Seconds()/1e6, "MB/s")
		})
	}
}
