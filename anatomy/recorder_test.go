package anatomy

import (
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestNowIsClockMonotonic: Now reads CLOCK_MONOTONIC, the clock other
// processes of the host read too.
func TestNowIsClockMonotonic(t *testing.T) {
	var ts unix.Timespec
	for range 3 {
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		before := ts.Nano()
		now := Now()
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		after := ts.Nano()
		if now >= before && now <= after {
			return
		}
		t.Logf("Now %d outside [%d, %d]", now, before, after)
	}
	t.Fatal("Now is not CLOCK_MONOTONIC")
}

func TestRecorderStartStopSnapshot(t *testing.T) {
	r := NewRecorder()
	if r.On() {
		t.Fatal("a new recorder is on")
	}
	if s := r.Snapshot(); s.On || len(s.Records) != 0 {
		t.Fatalf("snapshot of a new recorder: %+v", s)
	}
	if err := r.AddApp([]Record{{Hop: Post, T: 1}}); err != ErrNotStarted {
		t.Fatalf("AddApp before Start: %v, want ErrNotStarted", err)
	}
	r.Start()
	if !r.On() {
		t.Fatal("not on after Start")
	}
	r.Stamp(TCPOut, 1000, 2000, 0xfffffff0, 24, 100)
	r.Stamp(Placed, 2000, 1000, 7, 24, 200)
	if err := r.AddApp([]Record{{Hop: Post, SrcPort: 1000, DstPort: 2000, T: 50}}); err != nil {
		t.Fatal(err)
	}
	if err := r.AddApp([]Record{{Hop: TCPOut}}); err == nil {
		t.Fatal("AddApp took a daemon hop")
	}
	r.Stop()
	s := r.Snapshot()
	want := []Record{
		{Hop: TCPOut, SrcPort: 1000, DstPort: 2000, Seq: 0xfffffff0, Len: 24, T: 100},
		{Hop: Placed, SrcPort: 2000, DstPort: 1000, Seq: 7, Len: 24, T: 200},
		{Hop: Post, SrcPort: 1000, DstPort: 2000, T: 50},
	}
	if s.On || s.Lost != 0 || len(s.Records) != len(want) {
		t.Fatalf("snapshot %+v, want %+v", s, want)
	}
	for i := range want {
		if s.Records[i] != want[i] {
			t.Errorf("record %d = %+v, want %+v", i, s.Records[i], want[i])
		}
	}
	// A new run forgets the old one.
	r.Start()
	r.Stamp(Handover, 1, 2, 3, 4, 5)
	if s := r.Snapshot(); len(s.Records) != 1 || s.Records[0].Hop != Handover {
		t.Fatalf("after a second Start: %+v", s.Records)
	}
}

func TestRecorderRingKeepsTheNewest(t *testing.T) {
	r := NewRecorder()
	r.Start()
	for i := range RingSize + 10 {
		r.Stamp(TUNRead, 1, 2, uint32(i), 1, int64(i))
	}
	s := r.Snapshot()
	if s.Lost != 10 || len(s.Records) != RingSize {
		t.Fatalf("lost %d, kept %d; want 10 and %d", s.Lost, len(s.Records), RingSize)
	}
	if s.Records[0].Seq != 10 || s.Records[RingSize-1].Seq != RingSize+9 {
		t.Fatalf("kept %d..%d, want the newest", s.Records[0].Seq, s.Records[RingSize-1].Seq)
	}
}

// TestStampAllocatesNothing: the hot path's stamp makes no garbage, on or
// off.
func TestStampAllocatesNothing(t *testing.T) {
	r := NewRecorder()
	r.Start()
	if n := testing.AllocsPerRun(1000, func() {
		if r.On() {
			r.Stamp(Built, 1, 2, 3, 4, Now())
		}
	}); n != 0 {
		t.Fatalf("%v allocations per stamp", n)
	}
}

// TestStampConcurrent: stamps from many goroutines while a snapshot is
// taken (run with -race).
func TestStampConcurrent(t *testing.T) {
	r := NewRecorder()
	r.Start()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				if r.On() {
					r.Stamp(TCPOut, uint16(g), 2, uint32(i), 1, Now())
				}
			}
		}()
	}
	_ = r.Snapshot()
	wg.Wait()
	r.Stop()
	if n := len(r.Snapshot().Records); n != 4000 {
		t.Fatalf("%d records, want 4000", n)
	}
}

func BenchmarkStamp(b *testing.B) {
	r := NewRecorder()
	b.Run("off", func(b *testing.B) {
		for b.Loop() {
			if r.On() {
				r.Stamp(Built, 1, 2, 3, 4, Now())
			}
		}
	})
	r.Start()
	b.Run("on", func(b *testing.B) {
		for b.Loop() {
			if r.On() {
				r.Stamp(Built, 1, 2, 3, 4, Now())
			}
		}
	})
	_ = time.Now
}
