package ctlsrv

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

	"github.com/siwtun/siwtun/ctl"
)

// ReadProc reads the calling process's Proc from the runtime and /proc.
func ReadProc() (ctl.Proc, error) {
	p := ctl.Proc{PID: os.Getpid(), Goroutines: runtime.NumGoroutine()}
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
func (s *Server) proc(gc bool) ctl.Response {
	if gc {
		debug.FreeOSMemory()
	}
	p, err := ReadProc()
	if err != nil {
		return errorResponse(err)
	}
	return ctl.Response{OK: true, Proc: &p}
}
