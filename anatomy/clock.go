package anatomy

import (
	_ "unsafe" // for go:linkname
)

// Now returns the CLOCK_MONOTONIC time in nanoseconds. On one host every
// process reads the same clock, so the stamps of two daemons and their
// applications can be subtracted from one another. It is the Go runtime's
// own clock read (the vDSO, no system call, no allocation): time.Now's
// monotonic reading is relative to the process's start and so is not
// comparable across processes.
func Now() int64 { return nanotime() }

// nanotime is the runtime's CLOCK_MONOTONIC read; the runtime keeps it
// open to linkname for packages like this one.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64
