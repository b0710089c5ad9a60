package ctlsrv

import (
	"bytes"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/ctl"
)

func TestParseStatus(t *testing.T) {
	for _, tc := range []struct {
		name, in     string
		rss, hwm     uint64
		threads      int
		wantErrMatch string
	}{
		{name: "linux", in: "Name:\tsiwtun\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t 1929232 kB\nVmHWM:\t   40960 kB\nVmRSS:\t   30720 kB\nRssAnon:\t   12000 kB\nThreads:\t9\nSigQ:\t0/31405\n",
			rss: 30720, hwm: 40960, threads: 9},
		{name: "no rss", in: "VmHWM:\t1 kB\nThreads:\t1\n", wantErrMatch: "missing"},
		{name: "bad number", in: "VmRSS:\tlots kB\nVmHWM:\t1 kB\nThreads:\t1\n", wantErrMatch: "VmRSS"},
		{name: "empty", in: "", wantErrMatch: "missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rss, hwm, th, err := parseStatus([]byte(tc.in))
			if tc.wantErrMatch != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrMatch) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErrMatch)
				}
				return
			}
			if err != nil || rss != tc.rss || hwm != tc.hwm || th != tc.threads {
				t.Fatalf("parseStatus = %d %d %d %v, want %d %d %d", rss, hwm, th, err, tc.rss, tc.hwm, tc.threads)
			}
		})
	}
}

// TestServerProc: the proc op answers with this process's own figures.
func TestServerProc(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self (Linux)")
	}
	s := startServer(t, fakeProvider{})
	c := dial(t, s.Path())
	p, err := c.Proc(true)
	if err != nil {
		t.Fatal(err)
	}
	if p.PID != os.Getpid() || p.Goroutines < 2 || p.Threads < 1 || p.RSSKiB == 0 || p.HWMKiB < p.RSSKiB ||
		p.HeapBytes == 0 || p.FDs < 4 || p.Mappings < 10 {
		t.Fatalf("Proc = %+v", p)
	}
	var b bytes.Buffer
	if err := ctl.WriteProc(&b, p); err != nil || !strings.Contains(b.String(), "goroutines ") || strings.Count(b.String(), "\n") != 8 {
		t.Fatalf("WriteProc: %v\n%s", err, b.String())
	}
	// A request with a qp field is refused, as for the other ops.
	r := dialRaw(t, s.Path())
	r.send(`{"op":"proc","qp":1}` + "\n")
	r.wantError("only valid with op")
	r.send(`{"op":"stats","gc":true}` + "\n")
	r.wantError("field gc is only valid with op")
}
