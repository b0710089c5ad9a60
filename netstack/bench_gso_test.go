package netstack

import (
	"encoding/binary"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// benchFrameDevice is an in-memory device with segmentation offload for
// benchmarks: it takes offloaded frames and cuts them into wire segments
// as the kernel does, and a write waits for room rather than dropping (no
// loss, so the benchmark measures the transmit path, not recovery).
// Buffers are recycled.
type benchFrameDevice struct {
	in, out chan []byte
	done    chan struct{}
	once    *sync.Once
	free    chan []byte // recycled buffers
	mtu     int
}

// get returns a recycled buffer, empty.
func (d *benchFrameDevice) get() []byte {
	select {
	case b := <-d.free:
		return b[:0]
	default:
		return make([]byte, 0, maxFrame)
	}
}

// put recycles b.
func (d *benchFrameDevice) put(b []byte) {
	select {
	case d.free <- b:
	default:
	}
}

func benchFramePair(mtu int) (a, b *benchFrameDevice) {
	ab, ba := make(chan []byte, 4096), make(chan []byte, 4096)
	done, once := make(chan struct{}), &sync.Once{}
	free := make(chan []byte, 8192)
	return &benchFrameDevice{in: ba, out: ab, done: done, once: once, free: free, mtu: mtu},
		&benchFrameDevice{in: ab, out: ba, done: done, once: once, free: free, mtu: mtu}
}

func (d *benchFrameDevice) ReadPacket(p []byte) (int, error) {
	select {
	case b := <-d.in:
		n := copy(p, b)
		d.put(b)
		return n, nil
	case <-d.done:
		return 0, os.ErrClosed
	}
}

func (d *benchFrameDevice) ReadSuper(p []byte) (int, int, error) {
	n, err := d.ReadPacket(p)
	return n, 0, err
}

func (d *benchFrameDevice) SupportsSuper() bool  { return true }
func (d *benchFrameDevice) SupportsFrames() bool { return true }
func (d *benchFrameDevice) MTU() int             { return d.mtu }

func (d *benchFrameDevice) Close() error {
	d.once.Do(func() { close(d.done) })
	return nil
}

func (d *benchFrameDevice) WritePacket(p []byte) error {
	b := append(d.get(), p...)
	select {
	case d.out <- b:
		return nil
	case <-d.done:
		return os.ErrClosed
	}
}

func (d *benchFrameDevice) WriteFrame(pieces [][]byte, gso, hdrLen, csumStart, csumOffset int) error {
	hdr := pieces[0][:hdrLen]
	size := gso
	total := -hdrLen
	for _, pc := range pieces {
		total += len(pc)
	}
	if size == 0 {
		size = max(total, 1)
	}
	ipLen := int(hdr[0]&0xf) * 4
	seq := binary.BigEndian.Uint32(hdr[ipLen+4:])
	skip, pi := hdrLen, 0
	for off := 0; off < total || off == 0; off += size {
		n := min(size, total-off)
		b := append(d.get(), hdr...)
		for need := n; need > 0; {
			pc := pieces[pi][skip:]
			k := min(len(pc), need)
			b = append(b, pc[:k]...)
			need -= k
			if skip += k; skip == len(pieces[pi]) {
				pi, skip = pi+1, 0
			}
		}
		binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
		binary.BigEndian.PutUint32(b[ipLen+4:], seq+uint32(off))
		select {
		case d.out <- b:
		case <-d.done:
			return os.ErrClosed
		}
		if total == 0 {
			break
		}
	}
	return nil
}

// BenchmarkWriteAlignedGSO measures the FPDU transmit path with
// segmentation offload: one aligned write of as many MSS-sized FPDUs as
// fit 64 KiB per op (as the engine writes a long message: 7 at MTU
// 9000) over device links at MTU 9000
// whose device cuts the super-segments, drained by ReadTo. allocs/op
// counts every allocation of the process per write, and CPU-s/GB the
// process's CPU time (both stacks, the device and the reader) per GB
// moved, which a loaded machine distorts less than MB/s.
func BenchmarkWriteAlignedGSO(b *testing.B) {
	da, db := benchFramePair(9000)
	sa, sb := newPair(b, pairOpts{linkA: NewDeviceLink(da), linkB: NewDeviceLink(db)})
	if !sa.gso {
		b.Fatal("no segmentation offload")
	}
	ca, cb := connect(b, sa, sb, addrB4.Addr())
	buf := make([]byte, MaxAlignedWrite/ca.MSS()*ca.MSS())
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
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU()
	for b.Loop() {
		if _, err := ca.WriteAligned(buf); err != nil {
			b.Fatal(err)
		}
	}
	ca.CloseWrite()
	total := <-done
	el, cpu := time.Since(start), processCPU()-cpu0
	b.StopTimer()
	b.ReportMetric(float64(total)/el.Seconds()/1e6, "MB/s")
	b.ReportMetric(cpu.Seconds()/(float64(total)/1e9), "CPU-s/GB")
}

// processCPU returns the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestWriteAlignedGSONoAllocs: with segmentation offload, the aligned
// write path — the runs cut along the grid, the writes' ends recorded,
// the data kept for retransmission until acknowledged — does not allocate
// per write in steady state (allocations counted process-wide: both
// stacks, the device and the reader).
func TestWriteAlignedGSONoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("-race: sync.Pool drops items, gVisor's pools allocate")
	}
	da, db := benchFramePair(9000)
	sa, sb := newPair(t, pairOpts{linkA: NewDeviceLink(da), linkB: NewDeviceLink(db)})
	if !sa.gso {
		t.Fatal("no segmentation offload")
	}
	ca, cb := connect(t, sa, sb, addrB4.Addr())
	buf := make([]byte, MaxAlignedWrite/ca.MSS()*ca.MSS())
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
	short := buf[:ca.MSS()+52] // a write whose last FPDU is short
	for range 500 {
		if _, err := ca.WriteAligned(buf); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := ca.WriteAligned(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := ca.WriteAligned(short); err != nil {
			t.Fatal(err)
		}
	})
	ca.CloseWrite()
	wg.Wait()
	t.Logf("allocs per pair of aligned writes: %.3f", allocs)
	if !ca.flow.kept.used.Load() {
		t.Error("the connection kept nothing for retransmission: the test missed the path")
	}
	// Not 0: a GC in the window makes gVisor's sync.Pools refill, and the
	// runtime allocates sudogs and timers now and then.
	if allocs > 0.1 {
		t.Errorf("allocs per pair of aligned writes with segmentation offload: %.3f; want ~0", allocs)
	}
}
