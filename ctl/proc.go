package ctl

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
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

// ReadProc reads the calling process's Proc from the runtime and /proc.
func ReadProc() (Proc, error) {
	p := Proc{PID: os.Getpid(), Goroutines: runtime.NumGoroutine()}
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		p.HeapBytes = s[0].Value.Uint64()
	}
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return p, fmt.Errorf("process status: %w", err)
	}
	if p.RSSKiB, p.HWMKiB, p.Threads, err = parseStatus(st); err != nil {
		return p, err
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return p, fmt.Errorf("process descriptors: %w", err)
	}
	p.FDs = len(fds) - 1 // the directory ReadDir had open
	maps, err := os.Open("/proc/self/maps")
	if err != nil {
		return p, fmt.Errorf("process mappings: %w", err)
	}
	defer maps.Close()
	if p.Mappings, err = countLines(maps); err != nil {
		return p, fmt.Errorf("process mappings: %w", err)
	}
	return p, nil
}

// parseStatus takes VmRSS, VmHWM (kB) and Threads from /proc/<pid>/status.
func parseStatus(b []byte) (rss, hwm uint64, threads int, err error) {
	var seen int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, perr := strconv.ParseUint(f[0], 10, 64)
		switch k {
		case "VmRSS":
			rss, seen = n, seen|1
		case "VmHWM":
			hwm, seen = n, seen|2
		case "Threads":
			threads, seen = int(n), seen|4
		default:
			continue
		}
		if perr != nil {
			return 0, 0, 0, fmt.Errorf("process status: %s: %w", k, perr)
		}
	}
	if seen != 7 {
		return 0, 0, 0, fmt.Errorf("process status: VmRSS, VmHWM or Threads missing")
	}
	return rss, hwm, threads, nil
}

func countLines(r io.Reader) (int, error) {
	n := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		n++
	}
	return n, sc.Err()
}

// proc answers OpProc, after a collection that returns freed memory to
// the system if gc.
func (s *Server) proc(gc bool) Response {
	if gc {
		debug.FreeOSMemory()
	}
	p, err := ReadProc()
	if err != nil {
		return errorResponse(err)
	}
	return Response{OK: true, Proc: &p}
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
