// Package monoclock reads times as CLOCK_MONOTONIC nanoseconds: the one
// clock every process on a host shares that never steps (wall time can be
// set back, or slewed by NTP). Two daemons on one host stamp their events
// with it, so a viewer of both can put their events in one order.
package monoclock

import (
	"time"

	"golang.org/x/sys/unix"
)

// calibration ties the monotonic readings of Go's time.Time (the
// runtime's nanotime, CLOCK_MONOTONIC counted from an unexported origin)
// to CLOCK_MONOTONIC itself.
type calibration struct {
	at   time.Time // a time.Time with a monotonic reading
	mono int64     // CLOCK_MONOTONIC nanoseconds at that instant
}

var cal = calibrate()

// calibrate reads time.Now and CLOCK_MONOTONIC close together, keeping the
// pair read in the shortest interval: the offset is then known to a
// fraction of a microsecond.
func calibrate() calibration {
	best, bestSpan := calibration{}, time.Duration(1<<62)
	for range 16 {
		t0 := time.Now()
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			// Linux always has CLOCK_MONOTONIC; elsewhere fall back
			// to a process-local origin (one process's order still holds).
			return calibration{at: t0}
		}
		t1 := time.Now()
		if span := t1.Sub(t0); span < bestSpan {
			mid := t0.Add(span / 2)
			best, bestSpan = calibration{at: mid, mono: ts.Nano()}, span
		}
	}
	return best
}

// Nanos returns t as CLOCK_MONOTONIC nanoseconds. t should carry a
// monotonic reading (time.Now's does); for one without (a time decoded
// from text) the wall clock difference to now is used instead.
func Nanos(t time.Time) int64 {
	return cal.mono + int64(t.Sub(cal.at))
}

// Now returns the current CLOCK_MONOTONIC time in nanoseconds.
func Now() int64 { return Nanos(time.Now()) }
