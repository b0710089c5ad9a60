package perftest

import (
	"bytes"
	"encoding/json"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

// TestBWResult: the average over the whole run, and the peak as perftest
// searches it (the best rate over any post-to-later-completion span).
func TestBWResult(t *testing.T) {
	c := &Config{Size: 65536, TxDepth: 128} // cq moderation 1 above 8 KiB
	tm := &bwTimes{posted: []int64{0, 4000, 4100, 4200}, completed: []int64{4000, 4100, 4200, 4300}}
	r := bwResult(c, 65536, 4, tm, 0, 4300, false)
	wantAvg := 4 * 65536 / 4.3e-6 / (1 << 20)
	wantPeak := 65536 / 100e-9 / (1 << 20) // requests 1..3 complete 100 ns apart
	if !near(r.Average, wantAvg) || !near(r.Peak, wantPeak) || !near(r.MsgRate, 4/4.3e-6/1e6) || r.Iters != 4 {
		t.Fatalf("bwResult = %+v, want avg %v peak %v", r, wantAvg, wantPeak)
	}
	c.Gbits = true
	if r := bwResult(c, 65536, 4, tm, 0, 4300, true); !near(r.Average, 4*65536/4.3e-6/125e6) || r.Peak != 0 {
		t.Fatalf("Gb/s without peak = %+v", r)
	}
	// Completion moderation: only every cqMod-th entry (and the last) has
	// a time; the others are skipped.
	c = &Config{Size: 1024, TxDepth: 128}
	tm = &bwTimes{posted: []int64{0, 10, 20, 30, 40}, completed: []int64{-1, -1, -1, -1, 500}}
	if r := bwResult(c, 1024, 5, tm, 0, 500, false); !near(r.Peak, r.Average) {
		t.Fatalf("moderated peak %v, want the average %v", r.Peak, r.Average)
	}
	if r := bwResult(c, 1024, 0, nil, 0, 0, true); r.Average != 0 || r.Peak != 0 {
		t.Fatalf("empty run: %+v", r)
	}
}

// TestLatResult: perftest's statistics on post-to-post times: halved for
// ping-pongs, the two slowest left out, median, truncated-deviation stdev,
// percentiles by ceil index.
func TestLatResult(t *testing.T) {
	// Round trips of 2,2,2,2,2,2,4,10,20 µs: one-way 1,1,1,1,1,1,2,5,10.
	var posted []int64
	at := int64(0)
	for _, us := range []int64{0, 2, 2, 2, 2, 2, 2, 4, 10, 20} {
		at += us * 1000
		posted = append(posted, at)
	}
	r := latResult(2, posted, 2)
	want := LatResult{Size: 2, Iters: 10, Min: 1, Max: 5, Typical: 1, Avg: 8.0 / 7, Stdev: 0, P99: 5, P999: 5}
	if r.Size != want.Size || r.Iters != want.Iters || !near(r.Min, want.Min) || !near(r.Max, want.Max) ||
		!near(r.Typical, want.Typical) || !near(r.Avg, want.Avg) || !near(r.Stdev, want.Stdev) ||
		!near(r.P99, want.P99) || !near(r.P999, want.P999) {
		t.Fatalf("latResult = %+v\nwant %+v", r, want)
	}
	// Read: the round trip itself; an even count takes the middle pair.
	r = latResult(8, []int64{0, 3000, 6000, 10000, 14000, 19000, 26000}, 1)
	// deltas 3,3,4,4,5,7 µs; without the two slowest: 3,3,4,4 -> median 3.5
	if !near(r.Typical, 3.5) || !near(r.Min, 3) || !near(r.Max, 5) || !near(r.Avg, 3.5) {
		t.Fatalf("read latResult = %+v", r)
	}
	d := latDurationResult(2, 1000, 20*time.Millisecond, 2)
	if !near(d.Avg, 10) || !near(d.TPS, 50000) || !d.Duration {
		t.Fatalf("latDurationResult = %+v", d)
	}
}

// TestRows: the table rows byte for byte (perftest's REPORT_FMT,
// REPORT_FMT_EXT, REPORT_FMT_LAT, REPORT_FMT_LAT_DUR).
func TestRows(t *testing.T) {
	var b bytes.Buffer
	c := &Config{}
	printBWRow(&b, c, BWResult{Size: 65536, Iters: 5000, Peak: 8609.87, Average: 6595.36, MsgRate: 0.105526})
	c.Gbits = true
	printBWRow(&b, c, BWResult{Size: 2, Iters: 1000, Peak: 0.0123, Average: 0.0456, MsgRate: 2.85})
	printLatRow(&b, LatResult{Size: 2, Iters: 1000, Min: 10.56, Max: 30.66, Typical: 12.2, Avg: 12.39, Stdev: 1.64, P99: 30.66, P999: 30.66})
	printLatRow(&b, LatResult{Size: 2, Iters: 51234, Avg: 12.5, TPS: 40000, Duration: true})
	want := " 65536      5000             8609.87            6595.36\t\t     0.105526\n" +
		" 2          1000           0.012300            0.045600            2.850000\n" +
		" 2       1000          10.56          30.66        12.20    \t       12.39       \t1.64   \t\t30.66   \t\t30.66  \n" +
		" 2             51234            12.50          40000.00\n"
	if b.String() != want {
		t.Fatalf("rows:\n%q\nwant\n%q", b.String(), want)
	}
}

func TestAddressLines(t *testing.T) {
	var b bytes.Buffer
	d := Dest{QPN: 4, PSN: 0x5e3e06, GID: gidFor(netip.MustParseAddr("198.18.1.2"))}
	printAddress(&b, "local", &d)
	d = Dest{}
	printAddress(&b, "remote", &d)
	want := " local address: LID 0000 QPN 0x0004 PSN 0x5e3e06\n" +
		" GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:01:02\n" +
		" remote address: LID 0000 QPN 000000 PSN 000000\n" +
		" GID: 00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00\n"
	if b.String() != want {
		t.Fatalf("addresses:\n%q\nwant\n%q", b.String(), want)
	}
}

// TestHeaders: the column headers, MiB/sec by default (perftest since
// 24.07), Gb/sec, and perftest 4.5's MB/sec names on request.
func TestHeaders(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "BW peak[MiB/sec]    BW average[MiB/sec]"},
		{Config{Gbits: true}, "BW peak[Gb/sec]    BW average[Gb/sec]"},
		{Config{LegacyUnits: true}, "BW peak[MB/sec]    BW average[MB/sec]"},
	} {
		var b bytes.Buffer
		printBWHeader(&b, &c.cfg)
		if !strings.HasPrefix(b.String(), resultLine) || !strings.Contains(b.String(), c.want) {
			t.Errorf("%+v: %q", c.cfg, b.String())
		}
	}
	var b bytes.Buffer
	printLatHeader(&b, &Config{Duration: time.Second})
	if b.String() != resultLine+" #bytes        #iterations       t_avg[usec]    tps average\n" {
		t.Errorf("timed latency header %q", b.String())
	}
}

// TestReportJSONEmpty: a side that measured nothing (the server of a read
// latency test) still has the results key.
func TestReportJSONEmpty(t *testing.T) {
	r := &Report{Info: TestInfo{Test: "RDMA_Read_Latency_Test", latency: true}}
	b, err := json.Marshal(r)
	if err != nil || !strings.Contains(string(b), `"results":[]`) {
		t.Fatalf("%s %v", b, err)
	}
}
