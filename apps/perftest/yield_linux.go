package perftest

import "golang.org/x/sys/unix"

// yieldCPU gives the processor to any other runnable thread on it (the
// daemons a busy-polling test waits for) and returns at once when there is
// none: sched_yield(2). A short sleep would do the first but not the second:
// time.Sleep(time.Microsecond) took 262 µs on average on the 2-core test
// machine under load, which is what 4-byte latencies measured.
func yieldCPU() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
