package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/siwtun/siwtun/internal/browsertest"
	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// liveRow is what the live view tests read of a ladder row in the page.
type liveRow struct {
	Addr  string `json:"addr"`
	Seq   uint32 `json:"seq"`
	Len   int    `json:"len"`
	Out   bool   `json:"o"`
	OOO   bool   `json:"ooo"`
	Retx  bool   `json:"rx"`
	Drop  bool   `json:"drop"`
	NotAl bool   `json:"notal"`
	Al    int    `json:"al"` // 1 aligned, 0 not, -1 no verdict
	T     int64  `json:"t"`
	FPDUs int    `json:"fpdus"`
	Kind  string `json:"k"`
}

// liveTableRow is a row of the page's MPA negotiation and alignment table.
type liveTableRow struct {
	Src      string `json:"src"`
	Dst      string `json:"dst"`
	FPDUs    int    `json:"fpdus"`
	Aligned  int    `json:"aligned"`
	FPDUSegs int    `json:"fpduSegs"`
}

// livePage is the page's state, read in one go after drawing it.
type livePage struct {
	Rows  []liveRow      `json:"rows"`
	Table []liveTableRow `json:"table"`
	Gaps  int            `json:"gaps"`
	// GapRows are the rows before which the windows left out sit, and
	// GapDevs the devices that left them out.
	GapRows []int    `json:"gapRows"`
	GapDevs []string `json:"gapDevs"`
	Meta    string   `json:"meta"`
}

const livePageJS = `(() => {
  siwtunView.render();
  const V = siwtunView.view;
  const rows = V.segs.map((s) => { const d = siwtunView.detail(s); return {addr: V.addrs[s.a], seq: s.seq, len: s.len, o: s.o, ooo: !!s.ooo, rx: !!s.rx, drop: !!s.drop,
    notal: s.al === false, al: s.al === undefined ? -1 : (s.al ? 1 : 0), t: siwtunView.rowTime(s), fpdus: (d.fp || []).filter((f) => f.e).length, k: s.k}; });
  const table = [...document.querySelectorAll('#negbody tbody tr')].map((r) => ({src: r.dataset.src, dst: r.dataset.dst, fpdus: +r.dataset.fpdus,
    aligned: +r.dataset.aligned, fpduSegs: +r.dataset.fpduSegments}));
  return {rows, table, gaps: V.gaps.length, gapRows: V.gaps.map((g) => g.seg), gapDevs: V.gaps.map((g) => g.dev), meta: document.getElementById('meta').textContent};
})()`

// liveRun is one run of the live view test: two daemons in a namespace,
// sharing a socket directory; siwtun web watching them (the receiver,
// siwtun1, on the ladder's left) with the directory from
// SIWTUN_SOCKET_DIR; tcpdump capturing siwtun1's TUN device; and `siwtun
// perf write -s 65536 -D seconds` from siwtun0 to siwtun1, with the page
// open in Chromium from two seconds into the transfer.
type liveRun struct {
	page    livePage
	pcap    string
	bin     string
	maxEval time.Duration // the slowest page evaluation during the transfer
}

// pageReady is true in a live page that has loaded and drawn its view and
// decoded the segments' details (FPDUs, byte maps): a page that fell
// behind reloads itself, and is not ready meanwhile.
const pageReady = `(document.body !== null && document.body.dataset.ready === '1' && document.body.dataset.details === '1' && typeof siwtunView !== 'undefined')`

func runLiveView(t *testing.T, mtu, seconds int, impair string) *liveRun {
	t.Helper()
	requireRoot(t)
	for _, tool := range []string{"tcpdump", "ethtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (tools/setup/debian.sh installs it): %v", tool, err)
		}
	}
	br := browsertest.New(t)
	ns := newNetns(t)
	bin := siwtunBin(t)
	dir := t.TempDir()
	sender := []string{"--socket-dir", dir}
	if impair != "" {
		sender = append(sender, "--impair", impair)
	}
	startDaemon(t, ns, bin, "siwtun0", "198.18.1.2/24", "198.18.1.1/24", mtu, sender...)
	startDaemon(t, ns, bin, "siwtun1", "198.18.2.2/24", "198.18.2.1/24", mtu, "--socket-dir", dir)
	// The kernel forwards siwtun0's super-segments to siwtun1 as they
	// are when siwtun1's TUN device takes segmentation offload: tcpdump
	// would capture 64 KiB packets where the page (like the daemon's tap)
	// shows wire segments. Without it the kernel cuts them first, and the
	// capture holds the segments siwtun1 reads.
	ns.run("ethtool", "-K", "siwtun1", "tso", "off", "gso", "off")

	run := &liveRun{pcap: filepath.Join(t.TempDir(), "siwtun1.pcap"), bin: bin}
	dump := ns.command("tcpdump", "-i", "siwtun1", "-s", "0", "-B", "262144", "-w", run.pcap, "tcp")
	dumpErr := &syncbuf.Buffer{}
	dump.Stderr = dumpErr
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dump.Process.Kill(); dump.Wait() })
	eventually(t, 30*time.Second, "tcpdump to listen", func() (bool, string) {
		return strings.Contains(dumpErr.String(), "listening on"), dumpErr.String()
	})

	web := exec.Command(bin, "web", "--dev", "siwtun1", "--dev", "siwtun0", "--listen", "127.0.0.1:0")
	web.Env = append(os.Environ(), "SIWTUN_SOCKET_DIR="+dir)
	webOut := &syncbuf.Buffer{}
	web.Stdout, web.Stderr = webOut, webOut
	if err := web.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { web.Process.Kill(); web.Wait() })
	var url string
	eventually(t, 20*time.Second, "siwtun web to serve", func() (bool, string) {
		m := regexp.MustCompile(`open (http://\S+)`).FindStringSubmatch(webOut.String())
		if m != nil {
			url = m[1]
		}
		return m != nil, webOut.String()
	})

	srv := ns.command(bin, "perf", "write", "--dev", "siwtun1", "--socket-dir", dir)
	srvOut := &syncbuf.Buffer{}
	srv.Stdout, srv.Stderr = srvOut, srvOut
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	cli := ns.command(bin, "perf", "write", "--dev", "siwtun0", "--socket-dir", dir, "-s", "65536", "-D", fmt.Sprint(seconds), "198.18.2.2")
	cliOut := &syncbuf.Buffer{}
	cli.Stdout, cli.Stderr = cliOut, cliOut
	start := time.Now()
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	cliDone := make(chan error, 1)
	go func() { cliDone <- cli.Wait() }()

	// The page opens during the transfer, as a class would open it, and
	// must answer while it runs.
	time.Sleep(2 * time.Second)
	br.Do(t, 60*time.Second, chromedp.Navigate(url))
	eventually(t, 60*time.Second, "the live page to get ready", func() (bool, string) {
		return browsertest.Eval[bool](t, br, pageReady), fmt.Sprint(br.Errors())
	})
	var cliErr error
	liveChecked := false
	for waiting := true; waiting; {
		select {
		case cliErr = <-cliDone:
			waiting = false
		case <-time.After(time.Second):
			t0 := time.Now()
			n := browsertest.Eval[int](t, br, pageReady+` ? (siwtunView.select(siwtunView.view.segs.length - 1), siwtunView.view.segs.length) : -1`)
			if d := time.Since(t0); d > run.maxEval {
				run.maxEval = d
			}
			if n < 0 {
				// The page fell further behind than the server keeps
				// updates for, and loads itself again (web.Handler).
				t.Logf("%.1f s into the transfer: the page is loading itself again", time.Since(start).Seconds())
				continue
			}
			t.Logf("%.1f s into the transfer: the page shows %d segments", time.Since(start).Seconds(), n)
			if !liveChecked && time.Since(start) > time.Duration(seconds)*time.Second/2 {
				// The table counts what the ladder shows while it grows.
				live := browsertest.Eval[livePage](t, br, livePageJS)
				checkTable(t, &live, fmt.Sprintf("%.1f s into the transfer", time.Since(start).Seconds()))
				liveChecked = true
			}
		}
	}
	if cliErr != nil {
		t.Fatalf("perf write: %v\n%s", cliErr, cliOut)
	}
	t.Logf("perf write, MTU %d%s: %s", mtu, map[bool]string{true: ", impair " + impair}[impair != ""], lastLine(cliOut.String()))

	// The page catches up with the server's view, then is read whole.
	var served struct {
		Segs []json.RawMessage `json:"segs"`
	}
	eventually(t, 120*time.Second, "the page to show every segment the server's view holds", func() (bool, string) {
		resp, err := http.Get(url + "view.json")
		if err != nil {
			return false, err.Error()
		}
		err = json.NewDecoder(resp.Body).Decode(&served)
		resp.Body.Close()
		if err != nil {
			return false, err.Error()
		}
		shown := browsertest.Eval[int](t, br, pageReady+` ? siwtunView.view.segs.length : -1`)
		return shown == len(served.Segs) && shown > 0, fmt.Sprintf("page %d, server %d", shown, len(served.Segs))
	})
	run.page = browsertest.Eval[livePage](t, br, livePageJS)
	if errs := br.Errors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
	br.Screenshot(t, fmt.Sprintf("liveview-mtu%d%s.png", mtu, map[bool]string{true: "-impaired"}[impair != ""]))
	t.Logf("page: %s; slowest answer during the transfer %v", run.page.Meta, run.maxEval)
	if run.maxEval > 15*time.Second {
		t.Errorf("the page took %v to answer during the transfer", run.maxEval)
	}

	dump.Process.Signal(syscall.SIGINT)
	dump.Wait()
	if m := regexp.MustCompile(`(\d+) packets dropped by kernel`).FindStringSubmatch(dumpErr.String()); m == nil || m[1] != "0" {
		t.Fatalf("tcpdump lost packets, the capture is no reference: %s", dumpErr.String())
	}
	return run
}

// lastLine returns the last line of perf's report that has figures.
func lastLine(s string) string {
	var last string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 4 && f[0] == "65536" {
			last = strings.Join(f, " ")
		}
	}
	return last
}

// capturedReport is a segment of the capture as siwtun check reports it.
type capturedReport struct {
	Src     string         `json:"src"`
	Dst     string         `json:"dst"`
	Seq     uint32         `json:"seq"`
	Len     int            `json:"len"`
	Kind    inspect.Kind   `json:"kind"`
	Aligned *bool          `json:"aligned"`
	Held    bool           `json:"held"`
	FPDUs   []inspect.FPDU `json:"fpdus"`
}

// checkCapture runs `siwtun check -v -j` on the run's capture and returns
// its reports by "src > dst seq len".
func (r *liveRun) checkCapture(t *testing.T) map[string][]capturedReport {
	t.Helper()
	cmd := exec.Command(r.bin, "check", "-v", "-j", r.pcap)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Directions []inspect.DirSummary `json:"directions"`
		Segments   []capturedReport     `json:"segments"`
	}
	if err := json.NewDecoder(out).Decode(&res); err != nil {
		t.Fatalf("siwtun check -v -j: %v", err)
	}
	io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("siwtun check: %v", err)
	}
	byKey := map[string][]capturedReport{}
	for _, s := range res.Segments {
		k := fmt.Sprintf("%s > %s %d %d", s.Src, s.Dst, s.Seq, s.Len)
		byKey[k] = append(byKey[k], s)
	}
	for _, d := range res.Directions {
		t.Logf("capture: %v > %v: %d segments, %d FPDUs, %d/%d aligned, %d out of order, %d retransmissions", d.Src, d.Dst, d.Segments, d.FPDUs, d.Aligned, d.FPDUSegments, d.Held, d.Retransmissions)
	}
	return byKey
}

// checkPage checks what every run must show: time in order, the table
// counting what the ladder shows, and every flag true of the capture.
// It returns the page's rows flagged out of order and the capture's
// out-of-order segments among the rows the page shows.
func (r *liveRun) checkPage(t *testing.T, capt map[string][]capturedReport) (pageOOO, captOOO map[string]bool) {
	t.Helper()
	rows := r.page.Rows
	if len(rows) == 0 {
		t.Fatal("the page shows no segment")
	}
	for i := 1; i < len(rows); i++ {
		if rows[i].T < rows[i-1].T {
			t.Errorf("the time column goes back: row %d at %d µs, row %d at %d µs", i-1, rows[i-1].T, i, rows[i].T)
		}
	}
	pageOOO, captOOO = map[string]bool{}, map[string]bool{}
	for i, row := range rows {
		k := fmt.Sprintf("%s %d %d", row.Addr, row.Seq, row.Len)
		got := capt[k]
		inCapture := len(got) > 0
		held, retx, notAligned := false, false, false
		for _, c := range got {
			held = held || c.Held || c.Kind == inspect.KindHeld
			retx = retx || c.Kind == inspect.KindRetransmission
			notAligned = notAligned || (c.Aligned != nil && !*c.Aligned)
		}
		// siwtun1, on the left, sees what its TUN device delivers: the
		// rows it saw are in the capture, those it sent too.
		if row.T >= 0 && row.Kind != "unseen" && !inCapture && !row.Out && row.Len > 0 {
			t.Errorf("row %d (%s) is not in the capture", i, k)
		}
		if held && row.T >= 0 && row.Kind != "unseen" {
			captOOO[k] = true // out of order in the capture, and the page saw it
		}
		if row.OOO {
			pageOOO[k] = true
			if !held {
				t.Errorf("row %d (%s) flagged OUT OF ORDER; the capture has it in order", i, k)
			}
		}
		if row.Retx && !retx {
			t.Errorf("row %d (%s) flagged RETX; the capture does not", i, k)
		}
		if row.NotAl && !notAligned {
			t.Errorf("row %d (%s) flagged NOT ALIGNED; the capture has it aligned", i, k)
		}
		if row.Drop && inCapture && !row.Out {
			t.Errorf("row %d (%s) flagged DROPPED; siwtun1's capture has it", i, k)
		}
	}
	checkTable(t, &r.page, "after the transfer")
	return pageOOO, captOOO
}

// checkTable checks that the page's negotiation and alignment table counts
// the FPDUs and the aligned segments its ladder shows.
func checkTable(t *testing.T, p *livePage, when string) {
	t.Helper()
	ladder := map[string][3]int{} // per direction: FPDUs, aligned, with a verdict
	for _, row := range p.Rows {
		a := ladder[row.Addr]
		a[0] += row.FPDUs
		if row.Al >= 0 {
			a[1] += row.Al
			a[2]++
		}
		ladder[row.Addr] = a
	}
	fpdus := 0
	for _, tr := range p.Table {
		a := ladder[tr.Src+" > "+tr.Dst]
		fpdus += a[0]
		if tr.FPDUs != a[0] {
			t.Errorf("%s: table: %s > %s has %d FPDUs, the ladder shows %d", when, tr.Src, tr.Dst, tr.FPDUs, a[0])
		}
		if tr.Aligned != a[1] || tr.FPDUSegs != a[2] {
			t.Errorf("%s: table: %s > %s has %d/%d aligned, the ladder shows %d/%d", when, tr.Src, tr.Dst, tr.Aligned, tr.FPDUSegs, a[1], a[2])
		}
	}
	if fpdus == 0 {
		t.Errorf("%s: the table and the ladder show no FPDU", when)
	}
	t.Logf("%s: the table counts the %d FPDUs the ladder shows", when, fpdus)
}

// TestLiveViewBulk: a 12 s bulk RDMA Write at MTU 1500 and 9000, watched
// live by siwtun web in Chromium. The page answers throughout; afterwards
// its time column never goes back, its table counts the FPDUs the ladder
// shows, and no segment on it is flagged out of order (or with any other
// flag) that a tcpdump capture of the receiver, read by siwtun check, does
// not flag.
func TestLiveViewBulk(t *testing.T) {
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprintf("mtu%d", mtu), func(t *testing.T) {
			r := runLiveView(t, mtu, 12, "")
			capt := r.checkCapture(t)
			pageOOO, captOOO := r.checkPage(t, capt)
			if len(captOOO) == 0 && len(pageOOO) > 0 {
				t.Errorf("%d rows flagged out of order; the capture has none", len(pageOOO))
			}
			t.Logf("%d rows, %d windows not observed; out of order: page %d, capture (rows shown) %d", len(r.page.Rows), r.page.Gaps, len(pageOOO), len(captOOO))
		})
	}
}

// TestLiveViewReorder: with the sender's link reordering 2% of segments,
// the rows the page flags out of order are the segments the capture of
// the receiver has out of order, among the rows it shows (all of them
// when the view kept up; otherwise none it does not have, and those
// before the first window left out).
func TestLiveViewReorder(t *testing.T) {
	r := runLiveView(t, 1500, 6, "reorder=2%,seed=7")
	capt := r.checkCapture(t)
	pageOOO, captOOO := r.checkPage(t, capt)
	if len(captOOO) == 0 {
		t.Fatal("the capture has no segment out of order: the impairment did nothing")
	}
	missed := 0
	for i, row := range r.page.Rows {
		k := fmt.Sprintf("%s %d %d", row.Addr, row.Seq, row.Len)
		if captOOO[k] && !pageOOO[k] {
			if missed < 10 {
				t.Logf("not flagged: row %d (%s, %s); windows before rows %v of %v", i, k, row.Kind, r.page.GapRows, r.page.GapDevs)
			}
			missed++
		}
	}
	t.Logf("%d rows, %d windows not observed; out of order: page %d, capture (rows shown) %d, not flagged %d", len(r.page.Rows), r.page.Gaps, len(pageOOO), len(captOOO), missed)
	if r.page.Gaps == 0 && missed > 0 {
		t.Errorf("the view kept up, yet %d of the capture's %d out-of-order segments are not flagged", missed, len(captOOO))
	}
	if len(pageOOO) == 0 {
		t.Error("the page flags no segment out of order")
	}
}
