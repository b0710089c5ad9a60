package monoclock

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestNanosIsClockMonotonic: Nanos of time.Now lies between two direct
// CLOCK_MONOTONIC readings taken around it (within a microsecond of
// calibration error), and it never goes back.
func TestNanosIsClockMonotonic(t *testing.T) {
	read := func() int64 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		return ts.Nano()
	}
	last := int64(0)
	for i := 0; i < 1000; i++ {
		before := read()
		n := Now()
		after := read()
		if n < before-1000 || n > after+1000 {
			t.Fatalf("Nanos %d outside the CLOCK_MONOTONIC readings [%d, %d] around it", n, before, after)
		}
		if n < last {
			t.Fatalf("Nanos went back from %d to %d", last, n)
		}
		last = n
	}
	// A time without a monotonic reading (decoded from text) still lands
	// near its instant.
	now := time.Now()
	wall := now.Round(0)
	if d := Nanos(wall) - Nanos(now); d < -int64(time.Millisecond) || d > int64(time.Millisecond) {
		t.Errorf("a wall-clock time is %d ns from the same instant's monotonic one", d)
	}
}
