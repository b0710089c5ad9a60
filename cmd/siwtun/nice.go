package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// `siwtun up --nice N` gives the daemon's threads the nice value N. At
// -10 they take the processor from applications that busy-poll without
// yielding (perftest's latency tests spin on memory, as they may with a
// hardware RNIC): on the 2-core machine Debian's ib_write_lat through
// libsiwtun then had about half the mean round trip, and siwtun perf,
// which yields while it waits, a quarter more median round trip (doc/performance.md,
// "C programs"). The default, 0, leaves the priority
// the daemon was started with.

// reniceThreads gives every thread of the process the nice value n. Linux
// sets it per thread (setpriority's PRIO_PROCESS names one thread), and a
// new thread inherits its creator's: once every thread has n, so do the
// threads the Go runtime starts later. A thread started while a pass runs
// may be missed, so passes repeat until one finds every thread at n.
func reniceThreads(n int) error {
	for pass := 0; pass < 10; pass++ {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		changed := false
		var errs []error
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			// getpriority(2) returns 20 - nice, so that it is never negative.
			if p, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil && 20-p == n {
				continue
			}
			changed = true
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("thread %d: %w", tid, err))
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		if !changed {
			return nil
		}
	}
	return errors.New("threads keep starting without the new priority")
}

// threadNice returns the nice value of the calling thread.
func threadNice() (int, error) {
	// getpriority(2) returns 20 - nice, so that it is never negative.
	p, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		return 0, err
	}
	return 20 - p, nil
}
