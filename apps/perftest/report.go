package perftest

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// The text layout is perftest's (perftest_parameters.h/.c of the current
// release: ctx_print_test_info, print_full_bw_report, print_report_lat),
// with MiB/sec column names.

const resultLine = "---------------------------------------------------------------------------------------\n"

const (
	bwHeaderMiB     = " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n"
	bwHeaderMB      = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
	bwHeaderGb      = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
	latHeader       = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
	latHeaderTimed  = " #bytes        #iterations       t_avg[usec]    tps average\n"
	waitingBanner   = "\n************************************\n* Waiting for client to connect... *\n************************************\n"
	noPeakWarning   = " WARNING: BW peak won't be measured in this run.\n"
	serverQPWaiting = " Waiting for client rdma_cm QP to connect\n Please run the same command with the IB/RoCE interface IP\n"
)

// BWResult is one row of a bandwidth test.
type BWResult struct {
	Size    int     `json:"MsgSize"`
	Iters   uint64  `json:"n_iterations"`
	Peak    float64 `json:"BW_peak"`
	Average float64 `json:"BW_average"`
	MsgRate float64 `json:"MsgRate"`
}

// add sums a peer's result into r (a bidirectional test reports both
// directions together).
func (r BWResult) add(o BWResult) BWResult {
	r.Peak += o.Peak
	r.Average += o.Average
	r.MsgRate += o.MsgRate
	return r
}

// LatResult is one row of a latency test, in microseconds.
type LatResult struct {
	Size     int     `json:"MsgSize"`
	Iters    uint64  `json:"n_iterations"`
	Min      float64 `json:"t_min"`
	Max      float64 `json:"t_max"`
	Typical  float64 `json:"t_typical"`
	Avg      float64 `json:"t_avg"`
	Stdev    float64 `json:"t_stdev"`
	P99      float64 `json:"percentile_99"`
	P999     float64 `json:"percentile_99.9"`
	Duration bool    `json:"-"`
	// TPS is the transactions per second of a timed (-D) run, whose only
	// other figure is Avg.
	TPS float64 `json:"-"`
}

// latDurJSON is a timed latency row in JSON.
type latDurJSON struct {
	Size  int     `json:"MsgSize"`
	Iters uint64  `json:"n_iterations"`
	Avg   float64 `json:"t_avg"`
	TPS   float64 `json:"tps_average"`
}

// TestInfo describes a run, with the keys of perftest's JSON test_info.
type TestInfo struct {
	Test          string `json:"test"`
	Role          string `json:"role"`
	Device        string `json:"Device"`
	DualPort      string `json:"Dual_port"`
	QPs           int    `json:"Number_of_qps"`
	Transport     string `json:"Transport_type"`
	Connection    string `json:"Connection_type"`
	SRQ           string `json:"Using_SRQ"`
	TxDepth       int    `json:"TX_depth"`
	RxDepth       int    `json:"RX_depth"`
	CQMod         int    `json:"CQ_Moderation"`
	MTU           int    `json:"Mtu"`
	LinkType      string `json:"Link_type"`
	GIDIndex      int    `json:"GID_index"`
	Inline        int    `json:"Max_inline_data"`
	OutReads      int    `json:"Outstand_reads"`
	RDMACM        string `json:"rdma_cm_QPs"`
	DataExchange  string `json:"Data_ex_method"`
	Version       string `json:"version"`
	RemoteVersion string `json:"remote_version"`
	Units         string `json:"units"`
	Duration      int    `json:"duration_s"`
	Bidirectional bool   `json:"bidirectional"`
	PeakMeasured  bool   `json:"peak_measured"`
	latency       bool
}

// Report is what a run measured.
type Report struct {
	Info TestInfo
	// BW holds bandwidth rows, Lat latency rows (one per message size).
	BW  []BWResult
	Lat []LatResult
	// CPU is this process's own CPU time while the runs went on (from
	// after the connection set-up to the last run's end), from getrusage.
	// It is siwtun's addition to perftest's JSON ("siwtun_cpu"), written
	// when known, so a benchmark can tell the application's work from its
	// start-up.
	CPU *CPUUsage
}

// CPUUsage is user and system CPU time in seconds.
type CPUUsage struct {
	User   float64 `json:"user_s"`
	System float64 `json:"system_s"`
}

// MarshalJSON writes {"test_info": {...}, "results": [...]}; the result
// keys depend only on the test kind (bandwidth, latency, timed latency).
func (r *Report) MarshalJSON() ([]byte, error) {
	var res any = r.BW
	switch {
	case r.Info.latency && r.Info.Duration > 0:
		rows := make([]latDurJSON, len(r.Lat))
		for i, l := range r.Lat {
			rows[i] = latDurJSON{l.Size, l.Iters, l.Avg, l.TPS}
		}
		res = rows
	case r.Info.latency:
		res = r.Lat
	}
	if res == nil || (r.Info.latency && len(r.Lat) == 0) || (!r.Info.latency && len(r.BW) == 0) {
		res = []struct{}{}
	}
	return json.Marshal(struct {
		Info    TestInfo  `json:"test_info"`
		Results any       `json:"results"`
		CPU     *CPUUsage `json:"siwtun_cpu,omitempty"`
	}{r.Info, res, r.CPU})
}

// title is the banner's test name ("RDMA_Write BW Test").
func (c *Config) title() string {
	s := c.Verb.String() + " "
	if c.Verb == Atomic {
		s += c.AtomicType.String() + " "
	}
	if c.Latency {
		return s + "Latency Test"
	}
	if c.Bidirectional {
		s += "Bidirectional "
	}
	return s + "BW Test"
}

// printBanner prints ctx_print_test_info's block for an rdma_cm (-R) run
// on an iWARP device.
func printBanner(w io.Writer, c *Config, info *TestInfo, server bool) {
	fmt.Fprint(w, resultLine)
	fmt.Fprintf(w, "                    %s\n", c.title())
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : %s\n", info.Device)
	fmt.Fprintf(w, " Number of qps   : %d\t\tTransport type : IW\n", c.QPs)
	fmt.Fprintf(w, " Connection type : RC\t\tUsing SRQ      : OFF\n")
	fmt.Fprintf(w, " PCIe relax order: Unsupported\t\tLock-free      : OFF\n")
	fmt.Fprintf(w, " ibv_wr* API     : OFF\t\tUsing DDP      : OFF\n")
	if !server || c.Bidirectional {
		fmt.Fprintf(w, " TX depth        : %d\n", c.TxDepth)
	}
	if c.Imm {
		fmt.Fprintf(w, " Write with imm. : ON (RFC 7306 Immediate Data)\n")
	}
	if c.recvs() && (server || c.Bidirectional) {
		fmt.Fprintf(w, " RX depth        : %d\n", c.RxDepth)
	}
	if !c.Latency {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", c.cqMod())
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", info.MTU)
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	fmt.Fprintf(w, " GID index       : 0\n")
	if c.readsOut() {
		fmt.Fprintf(w, " Outstand reads  : %d\n", c.OutReads)
	} else {
		fmt.Fprintf(w, " Max inline data : %d[B]\n", c.Inline)
	}
	fmt.Fprintf(w, " rdma_cm QPs\t : ON\n")
	fmt.Fprintf(w, " Data ex. method : rdma_cm")
	if server {
		fmt.Fprintf(w, "\n%s%s", resultLine, strings.TrimSuffix(serverQPWaiting, "\n"))
	}
	fmt.Fprintf(w, "\n%s", resultLine)
}

// hashHex formats v as C's printf("%#0<width>x"): "0x"-prefixed and
// zero-padded to width in all, except zero, which has no prefix.
func hashHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, v)
	}
	return "0x" + fmt.Sprintf("%0*x", max(width-2, 0), v)
}

// printAddress prints ctx_print_pingpong_data for an rdma_cm run: the
// basic line (no RKey/VAddr: perftest prints the control channel's SEND
// verb there) and the GID, whose index is 0 on an Ethernet link.
func printAddress(w io.Writer, side string, d *Dest) {
	fmt.Fprintf(w, " %s address: LID %s QPN %s PSN %s\n", side,
		hashHex(uint64(d.LID), 4), hashHex(uint64(d.QPN), 6), hashHex(uint64(d.PSN), 6))
	fmt.Fprint(w, " GID: ")
	for i, b := range d.GID {
		if i > 0 {
			fmt.Fprint(w, ":")
		}
		fmt.Fprintf(w, "%02d", b)
	}
	fmt.Fprintln(w)
}

// printBWHeader prints the bandwidth table's header.
func printBWHeader(w io.Writer, c *Config) {
	h := bwHeaderMiB
	switch {
	case c.Gbits:
		h = bwHeaderGb
	case c.LegacyUnits:
		h = bwHeaderMB
	}
	fmt.Fprint(w, resultLine+h)
}

// printLatHeader prints the latency table's header.
func printLatHeader(w io.Writer, c *Config) {
	h := latHeader
	if c.Duration > 0 {
		h = latHeaderTimed
	}
	fmt.Fprint(w, resultLine+h)
}

// printBWRow prints one bandwidth row as print_full_bw_report: two
// decimals, or six when a Gb/s average is below 0.1.
func printBWRow(w io.Writer, c *Config, r BWResult) {
	if c.Gbits && r.Average < 0.1 {
		fmt.Fprintf(w, " %-7d    %d           %-7.6f            %-7.6f            %-7.6f\n", r.Size, r.Iters, r.Peak, r.Average, r.MsgRate)
		return
	}
	fmt.Fprintf(w, " %-7d    %-10d       %-7.2f            %-7.2f\t\t     %-7.6f\n", r.Size, r.Iters, r.Peak, r.Average, r.MsgRate)
}

// printLatRow prints one latency row.
func printLatRow(w io.Writer, r LatResult) {
	if r.Duration {
		fmt.Fprintf(w, " %-7d       %d            %-7.2f        %-7.2f\n", r.Size, r.Iters, r.Avg, r.TPS)
		return
	}
	fmt.Fprintf(w, " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
		r.Size, r.Iters, r.Min, r.Max, r.Typical, r.Avg, r.Stdev, r.P99, r.P999)
}

// bwUnit is the bytes per reported unit: MiB, or Gb (10^9 bits).
func (c *Config) bwUnit() float64 {
	if c.Gbits {
		return 125000000
	}
	return 1 << 20
}

// units names the bandwidth unit in JSON.
func (c *Config) units() string {
	switch {
	case c.Latency:
		return "usec"
	case c.Gbits:
		return "Gb/sec"
	}
	return "MiB/sec"
}

// bwTimes are the timestamps of a bandwidth run, in nanoseconds from its
// start: posted[i] when request i (over all queue pairs, in posting order)
// was posted, completed[j] when the j+1-th request completed (-1 where no
// completion ended exactly there, under completion moderation).
type bwTimes struct {
	posted, completed []int64
}

// bwResult computes print_report_bw's figures: the average over the whole
// run and, unless noPeak, the peak as the best rate over any span from a
// post to a later completion (perftest's search, completions at every
// cqMod-th request and the last).
func bwResult(c *Config, size int, iters uint64, t *bwTimes, first, last int64, noPeak bool) BWResult {
	r := BWResult{Size: size, Iters: iters}
	span := float64(last-first) / 1e9
	if span <= 0 || iters == 0 {
		return r
	}
	unit := c.bwUnit()
	r.Average = float64(size) * float64(iters) / span / unit
	r.MsgRate = float64(iters) / span / 1e6
	if noPeak || t == nil || len(t.posted) == 0 {
		return r
	}
	n := len(t.posted)
	mod := c.cqMod()
	best := float64(last - first)
	consider := func(i, j int) {
		if j >= len(t.completed) || t.completed[j] < 0 {
			return
		}
		d := float64(t.completed[j]-t.posted[i]) / float64(j-i+1)
		if d > 0 && d < best {
			best = d
		}
	}
	for i := 0; i < n; i++ {
		for j := (i+1+mod-1)/mod*mod - 1; j < n; j += mod {
			consider(i, j)
		}
		if n%mod != 0 {
			consider(i, n-1)
		}
	}
	r.Peak = float64(size) / (best / 1e9) / unit
	return r
}

// latMeasureTail is how many of the slowest samples perftest leaves out.
const latMeasureTail = 2

// latResult computes print_report_lat's figures from the post times of
// every iteration; rtt halves the round trip of Write and Send ping-pongs
// (Read measures its own round trip).
func latResult(size int, posted []int64, rtt int) LatResult {
	iters := len(posted)
	r := LatResult{Size: size, Iters: uint64(iters)}
	n := iters - 1
	if n < latMeasureTail+1 {
		return r
	}
	delta := make([]int64, n)
	for i := range delta {
		delta[i] = posted[i+1] - posted[i]
	}
	slices.Sort(delta)
	q := 1000 * float64(rtt) // ns → µs, halved for round trips
	cnt := n - latMeasureTail
	var median float64
	if (cnt-1)%2 != 0 {
		median = float64(delta[cnt/2]+delta[cnt/2-1]) / 2
	} else {
		median = float64(delta[cnt/2])
	}
	sum := 0.0
	for _, d := range delta[:cnt] {
		sum += float64(d) / q
	}
	avg := sum / float64(cnt)
	// perftest squares each deviation after truncating it to a whole
	// microsecond (an int); the same here keeps the two tools' t_stdev
	// comparable.
	var sq float64
	for _, d := range delta[:cnt] {
		dev := math.Trunc(avg - float64(d)/q)
		sq += dev * dev
	}
	r.Min = float64(delta[0]) / q
	r.Max = float64(delta[cnt]) / q
	r.Typical = median / q
	r.Avg = avg
	r.Stdev = math.Sqrt(sq / float64(cnt))
	r.P99 = float64(delta[int(math.Ceil(float64(cnt)*0.99))]) / q
	r.P999 = float64(delta[int(math.Ceil(float64(cnt)*0.999))]) / q
	return r
}

// latDurationResult is print_report_lat_duration: the average one-way
// (or Read round-trip) time and transactions per second over the sample.
func latDurationResult(size int, iters uint64, sample time.Duration, rtt int) LatResult {
	r := LatResult{Size: size, Iters: iters, Duration: true}
	if iters == 0 || sample <= 0 {
		return r
	}
	us := float64(sample) / 1e3
	r.Avg = us / float64(rtt) / float64(iters)
	r.TPS = float64(iters) / sample.Seconds()
	return r
}
