package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/browsertest"
	"github.com/siwtun/siwtun/internal/syncbuf"
)

// pageAnatomy is what the page shows of one connection's anatomy: its
// title, its rows (the figures in the rows' data, in ns, and the text of
// their cells) and its round trip line.
type pageAnatomy struct {
	Title string `json:"title"`
	Rows  []struct {
		From  string   `json:"from"`
		To    string   `json:"to"`
		Total bool     `json:"total"`
		Med   [2]int64 `json:"med"`
		P99   [2]int64 `json:"p99"`
		N     [2]int   `json:"n"`
		Cells []string `json:"cells"`
		Bars  int      `json:"bars"`
		Same  bool     `json:"same"` // the other direction's row is the same leg
	} `json:"rows"`
	RT struct {
		Med  int64  `json:"med"`
		N    int    `json:"n"`
		Text string `json:"text"`
	} `json:"rt"`
}

const pageAnatomyJS = `(() => { siwtunView.render(); return [...document.querySelectorAll('#anat .anatconn')].map((c) => {
  const dirs = [...c.querySelectorAll('table.anatomy')].map((t) => [...t.querySelectorAll('tbody tr')]);
  const rt = c.querySelector('p.rt');
  return {title: c.querySelector('h3').textContent,
    rows: dirs[0].map((r, k) => { const rs = [r, dirs[1][k]]; return {from: r.dataset.from, to: r.dataset.to, total: r.dataset.total === '1',
      med: rs.map((x) => +x.dataset.med), p99: rs.map((x) => +x.dataset.p99), n: rs.map((x) => +x.dataset.n),
      cells: rs.flatMap((x) => [...x.querySelectorAll('td.num')].map((td) => td.textContent)), bars: rs.filter((x) => x.querySelector('.abar')).length,
      same: rs[1].dataset.from === r.dataset.from && rs[1].dataset.to === r.dataset.to}; }),
    rt: {med: +rt.dataset.med, n: +rt.dataset.n, text: rt.textContent}}; }); })()`

// cliAnatomy is `siwtun ctl anatomy show -j`'s output for a connection.
type cliAnatomy struct {
	Dirs [2]struct {
		Flow struct {
			Src uint16 `json:"src_port"`
			Dst uint16 `json:"dst_port"`
		} `json:"flow"`
		Legs []struct {
			Leg struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"leg"`
			N      int   `json:"n"`
			Median int64 `json:"median_ns"`
			P99    int64 `json:"p99_ns"`
		} `json:"legs"`
	} `json:"directions"`
	RoundTrip struct {
		N      int   `json:"n"`
		Median int64 `json:"median_ns"`
	} `json:"round_trip"`
}

// TestWebAnatomy: siwtun web's page records the round trip's anatomy of
// two daemons: Record switches both daemons' recorders on, Stop and show
// switches them off and shows, for each connection, every leg's median
// and 99th percentile both ways — the very figures `siwtun ctl anatomy
// show` takes from the same stamps; after a run of `siwtun perf --anatomy`
// Show so far adds the applications' legs and the round trip. A page
// that leaves while recording leaves the recorders off behind it.
func TestWebAnatomy(t *testing.T) {
	requireRoot(t)
	br := browsertest.New(t)
	ns := newNetns(t)
	bin := siwtunBin(t)
	dir := t.TempDir()
	startDaemon(t, ns, bin, "siwtun0", "198.18.1.2/24", "198.18.1.1/24", 1500, "--socket-dir", dir)
	startDaemon(t, ns, bin, "siwtun1", "198.18.2.2/24", "198.18.2.1/24", 1500, "--socket-dir", dir)
	url := startWeb(t, bin, dir)
	openLive(t, br, url)
	if !browsertest.Eval[bool](t, br, `!document.getElementById('anat').hidden && document.getElementById('anatstate').dataset.recording === '0'`) {
		t.Fatalf("no anatomy section, or it says recording: %s", browsertest.Eval[string](t, br, `document.getElementById('anat').outerHTML`))
	}
	recording := func() [2]bool {
		var on [2]bool
		for i, dev := range []string{"siwtun0", "siwtun1"} {
			c, err := ctl.Dial(ctl.SocketPath(dir, dev))
			if err != nil {
				t.Fatal(err)
			}
			st, err := c.Anatomy(ctl.AnatomyGet)
			c.Close()
			if err != nil {
				t.Fatal(err)
			}
			on[i] = st.On
		}
		return on
	}
	if on := recording(); on[0] || on[1] {
		t.Fatalf("recorders on before anyone asked: %v", on)
	}

	clickAndWait(t, br, "#anatstart", `document.getElementById('anatstate').dataset.recording === '1'`)
	if on := recording(); !on[0] || !on[1] {
		t.Fatalf("Record left recorders off: %v", on)
	}
	const iters = 200
	perfPair(t, ns, bin, dir, "18720", "write", "--lat", "-s", "4", "-I", "0", "-n", fmt.Sprint(iters))
	clickAndWait(t, br, "#anatstop", `document.querySelectorAll('#anat table.anatomy').length > 0`)
	if on := recording(); on[0] || on[1] {
		t.Errorf("Stop left recorders on: %v", on)
	}
	page := browsertest.Eval[[]pageAnatomy](t, br, pageAnatomyJS)
	cli := ctlAnatomyJSON(t, bin, dir)
	checkPageAnatomy(t, page, cli, iters, false)
	browsertest.Eval[bool](t, br, `(document.querySelector('#anat .anatconn:last-child').scrollIntoView(), true)`)
	br.Screenshot(t, "web-anatomy-daemons.png")

	// The applications' legs: perf --anatomy drives the recorders itself
	// and hands its stamps over; the page shows what they hold.
	perfPair(t, ns, bin, dir, "18722", "write", "--lat", "--anatomy", "-s", "4", "-I", "0", "-n", fmt.Sprint(iters))
	clickAndWait(t, br, "#anatshow", `[...document.querySelectorAll('#anat p.rt')].some((p) => +p.dataset.n > 0)`)
	page = browsertest.Eval[[]pageAnatomy](t, br, pageAnatomyJS)
	cli = ctlAnatomyJSON(t, bin, dir)
	checkPageAnatomy(t, page, cli, iters, true)
	if errs := br.Errors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
	browsertest.Eval[bool](t, br, `(document.querySelector('#anat .anatconn:last-child').scrollIntoView(), true)`)
	br.Screenshot(t, "web-anatomy-applications.png")

	// A page that leaves while recording: the recorders go off.
	clickAndWait(t, br, "#anatstart", `document.getElementById('anatstate').dataset.recording === '1'`)
	br.Do(t, 30*time.Second, chromedp.Navigate("about:blank"))
	eventually(t, 30*time.Second, "the recorders to stop after the page left", func() (bool, string) {
		on := recording()
		return !on[0] && !on[1], fmt.Sprint(on)
	})
}

// startWeb runs siwtun web on siwtun0 and siwtun1 (control sockets in
// dir) and returns its page's address.
func startWeb(t *testing.T, bin, dir string) string {
	t.Helper()
	web := exec.Command(bin, "web", "--dev", "siwtun0", "--dev", "siwtun1", "--listen", "127.0.0.1:0", "--socket-dir", dir)
	out := &syncbuf.Buffer{}
	web.Stdout, web.Stderr = out, out
	if err := web.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { web.Process.Signal(os.Interrupt); web.Wait() })
	var url string
	eventually(t, 20*time.Second, "siwtun web to serve", func() (bool, string) {
		m := regexp.MustCompile(`open (http://\S+)`).FindStringSubmatch(out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil, out.String()
	})
	return url
}

// openLive loads a live page and waits until it is ready.
func openLive(t *testing.T, br *browsertest.Browser, url string) {
	t.Helper()
	br.Do(t, 60*time.Second, chromedp.Navigate(url))
	eventually(t, 60*time.Second, "the live page to get ready", func() (bool, string) {
		return browsertest.Eval[bool](t, br, `document.body !== null && document.body.dataset.ready === '1'`), fmt.Sprint(br.Errors())
	})
}

// clickAndWait clicks the button sel and waits until cond (JavaScript)
// holds on the page.
func clickAndWait(t *testing.T, br *browsertest.Browser, sel, cond string) {
	t.Helper()
	br.Do(t, 30*time.Second, chromedp.Click(chromedp.CSS(sel)))
	eventually(t, 60*time.Second, sel+" to take effect", func() (bool, string) {
		return browsertest.Eval[bool](t, br, `(siwtunView.render(), `+cond+`)`),
			browsertest.Eval[string](t, br, `document.getElementById('anatbody').innerText.slice(0, 400)`) + fmt.Sprint(br.Errors())
	})
}

// perfPair runs siwtun perf's server on siwtun1 and its client on
// siwtun0 with args, on port.
func perfPair(t *testing.T, ns *netns, bin, dir, port string, args ...string) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var outs [2]bytes.Buffer
	var errs [2]error
	run := func(i int, extra ...string) {
		defer wg.Done()
		full := append(append(append([]string{"ip", "netns", "exec", ns.name, bin, "perf"}, args...), "-p", port, "--socket-dir", dir), extra...)
		cmd := exec.CommandContext(c, full[0], full[1:]...)
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if errs[i] = cmd.Run(); errs[i] != nil {
			cancel()
		}
	}
	wg.Add(2)
	go run(1, "--dev", "siwtun1")
	time.Sleep(200 * time.Millisecond)
	go run(0, "--dev", "siwtun0", "198.18.2.2")
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("siwtun perf %s: client %v, server %v\n--- client\n%s\n--- server\n%s", strings.Join(args, " "), errs[0], errs[1], &outs[0], &outs[1])
	}
}

// ctlAnatomyJSON is `siwtun ctl anatomy show -j` of siwtun0 and siwtun1.
func ctlAnatomyJSON(t *testing.T, bin, dir string) []cliAnatomy {
	t.Helper()
	out, err := exec.Command(bin, "ctl", "anatomy", "show", "-j", "--dev", "siwtun0", "--peer", "siwtun1", "--socket-dir", dir).Output()
	if err != nil {
		t.Fatalf("ctl anatomy show: %v\n%s", err, out)
	}
	var all []cliAnatomy
	if err := json.Unmarshal(out, &all); err != nil {
		t.Fatalf("ctl anatomy show -j: %v\n%s", err, out)
	}
	return all
}

// checkPageAnatomy compares the page's tables with the CLI's figures,
// connection by connection and leg by leg, the text of each cell with
// the CLI's rounding, and checks that the test connection's legs rest on
// its iters messages (with the applications' legs when app is set).
func checkPageAnatomy(t *testing.T, page []pageAnatomy, cli []cliAnatomy, iters int, app bool) {
	t.Helper()
	if len(page) != len(cli) || len(page) == 0 {
		t.Fatalf("the page shows %d connections, ctl anatomy %d", len(page), len(cli))
	}
	us := func(n int, ns int64) string {
		if n == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", float64(ns)/1000)
	}
	busiest := -1
	for i, c := range cli {
		p := page[i]
		want := fmt.Sprintf("siwtun0:%d <-> siwtun1:%d", c.Dirs[0].Flow.Src, c.Dirs[0].Flow.Dst)
		if p.Title != want || len(p.Rows) != len(c.Dirs[0].Legs) {
			t.Fatalf("connection %d: page %q with %d rows, ctl anatomy %q with %d legs", i, p.Title, len(p.Rows), want, len(c.Dirs[0].Legs))
		}
		for k, row := range p.Rows {
			if !row.Same {
				t.Errorf("%s: row %d is not the same leg in both directions' tables", p.Title, k)
			}
			var cells []string
			for d := range 2 {
				l := c.Dirs[d].Legs[k]
				if row.From != l.Leg.From || row.To != l.Leg.To || row.Med[d] != l.Median || row.P99[d] != l.P99 || row.N[d] != l.N {
					t.Errorf("%s, %s -> %s, direction %d: page %+v, ctl anatomy %+v", p.Title, row.From, row.To, d, row, l)
				}
				cells = append(cells, us(l.N, l.Median), us(l.N, l.P99), fmt.Sprint(l.N))
			}
			if strings.Join(row.Cells, " ") != strings.Join(cells, " ") {
				t.Errorf("%s, %s -> %s: the page reads %q, ctl anatomy %q", p.Title, row.From, row.To, row.Cells, cells)
			}
		}
		if p.RT.N != c.RoundTrip.N || p.RT.Med != c.RoundTrip.Median {
			t.Errorf("%s: round trip on the page %+v, ctl anatomy %+v", p.Title, p.RT, c.RoundTrip)
		}
		if busiest < 0 || c.Dirs[0].Legs[5].N > cli[busiest].Dirs[0].Legs[5].N {
			busiest = i
		}
	}
	// The test connection: the daemons' legs (and with app the
	// applications') rest on its messages, and take time.
	p := page[busiest]
	for _, row := range p.Rows {
		appLeg := row.From == "post" || row.To == "seen"
		for d := range 2 {
			if appLeg && !app {
				if row.N[d] != 0 {
					t.Errorf("%s -> %s, direction %d: over %d messages without the applications' stamps", row.From, row.To, d, row.N[d])
				}
				continue
			}
			if row.N[d] < iters*9/10 || row.Med[d] <= 0 || row.P99[d] < row.Med[d] {
				t.Errorf("%s -> %s, direction %d: median %d ns, p99 %d ns over %d messages (of %d)", row.From, row.To, d, row.Med[d], row.P99[d], row.N[d], iters)
			}
		}
		if !row.Total && row.N[0] > 0 && row.Bars != 2 {
			t.Errorf("%s -> %s: %d bars, want one per direction", row.From, row.To, row.Bars)
		}
	}
	if app && (p.RT.N < iters*9/10 || !strings.Contains(p.RT.Text, "round trip")) {
		t.Errorf("no round trip of the applications: %+v", p.RT)
	}
	t.Logf("%s on the page: %d legs; one way %s µs median", p.Title, len(p.Rows), p.Rows[len(p.Rows)-1].Cells[0])
}
