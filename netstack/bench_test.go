package netstack

import (
	"testing"
	"time"
)

// discardWriter is a ReadTo sink that drops everything.
type discardWriter struct{ n int64 }

func (d *discardWriter) Write(p []byte) (int, error) {
	d.n += int64(len(p))
	return len(p), nil
}

// BenchmarkWriteAligned measures the FPDU transmit path: one MSS-sized
// WriteAligned per op over an in-process Pipe at MTU 9000, drained by ReadTo
// into a discarding writer. allocs/op counts every allocation of the
// process (both stacks, the Pipe and the reader) per FPDU.
func BenchmarkWriteAligned(b *testing.B) {
	sa, sb := newPair(b, pairOpts{mtu: 9000})
	ca, cb := connect(b, sa, sb, addrB4.Addr())
	mss := ca.MSS()
	buf := make([]byte, mss)
	fillPattern(buf, 0)
	done := make(chan int64, 1)
	go func() {
		d := &discardWriter{}
		for {
			if _, err := cb.ReadTo(d); err != nil {
				done <- d.n
				return
			}
		}
	}()
	b.SetBytes(int64(mss))
	b.ReportAllocs()
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
}
