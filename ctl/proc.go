package ctl

import (
	"fmt"
	"io"
)

// Proc is the daemon process's own footprint, for leak checks (memory,
// goroutines, descriptors and mappings returning to their baseline after a
// load) and `siwtun ctl proc`.
type Proc struct {
	// PID is the daemon's process id.
	PID int `json:"pid"`
	// Goroutines is runtime.NumGoroutine.
	Goroutines int `json:"goroutines"`
	// Threads is the process's OS threads (/proc/self/status Threads).
	Threads int `json:"threads"`
	// RSSKiB and HWMKiB are its resident set now and at its peak
	// (/proc/self/status VmRSS and VmHWM).
	RSSKiB uint64 `json:"rss_kib"`
	HWMKiB uint64 `json:"hwm_kib"`
	// HeapBytes is the Go heap in use: the bytes of live and not yet swept
	// objects (runtime/metrics /memory/classes/heap/objects:bytes).
	HeapBytes uint64 `json:"heap_bytes"`
	// FDs is the open file descriptors (/proc/self/fd).
	FDs int `json:"fds"`
	// Mappings is the memory mappings (lines of /proc/self/maps): client
	// memory and rings the daemon has mapped show here.
	Mappings int `json:"mappings"`
}

// Proc asks for the daemon process's footprint; with gc, after a garbage
// collection that returns the freed memory to the system (Request.GC).
func (c *Client) Proc(gc bool) (Proc, error) {
	resp, err := c.Call(Request{Op: OpProc, GC: gc})
	if err != nil {
		return Proc{}, err
	}
	if resp.Proc == nil {
		return Proc{}, fmt.Errorf("ctl %s: proc: empty answer", c.dev)
	}
	return *resp.Proc, nil
}

// WriteProc prints p as `siwtun ctl proc` does: one "key value" line each.
func WriteProc(w io.Writer, p Proc) error {
	_, err := fmt.Fprintf(w, "pid %d\ngoroutines %d\nthreads %d\nrss %d KiB\nrss_peak %d KiB\nheap %d bytes\nfds %d\nmappings %d\n",
		p.PID, p.Goroutines, p.Threads, p.RSSKiB, p.HWMKiB, p.HeapBytes, p.FDs, p.Mappings)
	return err
}
