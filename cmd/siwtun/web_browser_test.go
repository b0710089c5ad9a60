package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/internal/browsertest"
	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/offload/mpa/inspect"
)

// bmRow is one row of the page's byte map table.
type bmRow struct {
	Field string `json:"field"`
	At    int    `json:"at"`
	Len   int    `json:"len"`
	Value string `json:"value"`
	FPDU  uint64 `json:"fpdu"`
}

const bmRowsJS = `[...document.querySelectorAll('#bytemap tbody tr')].map(r => ({field: r.dataset.field, at: +r.dataset.at, len: +r.dataset.len, value: r.dataset.value, fpdu: +(r.dataset.fpdu || 0)}))`

// pageSeg is what the tests read of a segment of the page's view.
type pageSeg struct {
	Addr  string `json:"addr"`
	Seq   uint32 `json:"seq"`
	Len   int    `json:"len"`
	Class string `json:"cls"`
	Out   bool   `json:"o"`
	Marks int    `json:"marks"`
}

const pageSegsJS = `siwtunView.view.segs.map(s => ({addr: siwtunView.view.addrs[s.a], seq: s.seq, len: s.len, cls: s.cls, o: s.o, marks: (siwtunView.detail(s).mk || []).length}))`

// openPage loads url and waits until the page says it is ready.
func openPage(t *testing.T, br *browsertest.Browser, url string) {
	t.Helper()
	br.Do(t, 60*time.Second, chromedp.Navigate(url))
	deadline := time.Now().Add(60 * time.Second)
	for !browsertest.Eval[bool](t, br, `document.body !== null && document.body.dataset.ready === '1' && document.body.dataset.details === '1'`) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never got ready; console errors: %q", url, br.Errors())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// chooseByKeyboard selects segment i with the ladder's keys: Home, then
// ArrowDown i times.
func chooseByKeyboard(t *testing.T, br *browsertest.Browser, i int) {
	t.Helper()
	br.Do(t, 30*time.Second, chromedp.Focus("#ladder"), chromedp.KeyEvent(kb.Home))
	for k := 0; k < i; k++ {
		br.Do(t, 30*time.Second, chromedp.KeyEvent(kb.ArrowDown))
	}
	if got := browsertest.Eval[int](t, br, `siwtunView.state.sel`); got != i {
		t.Fatalf("keyboard chose segment %d, want %d", got, i)
	}
}

// checkByteMap compares the byte map rows the page shows for a segment
// with the checker's Report of the same segment (what siwtun check says).
func checkByteMap(t *testing.T, rows []bmRow, r *inspect.Report) {
	t.Helper()
	total := 0
	for _, row := range rows {
		if row.At != total {
			t.Errorf("byte map row %+v does not start at octet %d", row, total)
		}
		total += row.Len
	}
	if total != r.Len {
		t.Errorf("byte map covers %d octets, the segment has %d", total, r.Len)
	}
	find := func(field string, fpdu uint64, at int) *bmRow {
		for i := range rows {
			if rows[i].Field == field && (fpdu == 0 || rows[i].FPDU == fpdu) && (at < 0 || rows[i].At == at) {
				return &rows[i]
			}
		}
		return nil
	}
	for _, m := range r.Markers {
		if m.At < 0 {
			continue // begun in the previous segment
		}
		row := find("Marker (FPDUPTR)", 0, m.At)
		want := fmt.Sprintf("FPDUPTR %d → FPDU %d: ok", m.FPDUPTR, m.FPDU)
		if row == nil || row.Len != 4 || !strings.Contains(row.Value, want) {
			t.Errorf("marker at octet %d (stream %d): page shows %+v, check says %q", m.At, m.Offset, row, want)
		}
	}
	for _, f := range r.FPDUs {
		h := f.Header
		if f.Begins && h != nil {
			if row := find("ULPDU_Length", f.Index, -1); row == nil || row.Value != fmt.Sprint(f.ULPDULen) {
				t.Errorf("FPDU %d: ULPDU_Length row %+v, check says %d", f.Index, row, f.ULPDULen)
			}
			if h.Tagged {
				if row := find("STag", f.Index, -1); row == nil || row.Value != fmt.Sprintf("0x%x", h.STag) {
					t.Errorf("FPDU %d: STag row %+v, check says 0x%x", f.Index, row, h.STag)
				}
				if row := find("Tagged Offset", f.Index, -1); row == nil || row.Value != fmt.Sprintf("0x%x", h.TO) {
					t.Errorf("FPDU %d: TO row %+v, check says 0x%x", f.Index, row, h.TO)
				}
			}
			if row := find("RDMAP control RV opcode", f.Index, -1); row == nil || !strings.HasSuffix(row.Value, h.Op) {
				t.Errorf("FPDU %d: RDMAP row %+v, check says %s", f.Index, row, h.Op)
			}
			if f.Ends {
				payload := 0
				for _, row := range rows {
					if row.Field == "payload" && row.FPDU == f.Index {
						payload += row.Len
					}
				}
				if payload != h.Payload {
					t.Errorf("FPDU %d: %d payload octets mapped, check says %d", f.Index, payload, h.Payload)
				}
			}
		}
		if f.Ends && f.CRC != "" {
			row := find("CRC32c", f.Index, f.At+f.Here-4)
			want := f.CRC
			if want == "off" {
				want = "not negotiated"
			}
			if row == nil || row.Value != want {
				t.Errorf("FPDU %d: CRC row %+v, check says %s", f.Index, row, f.CRC)
			}
		}
	}
}

// figureRFCs are the page's figures, each by the CSS selector of the
// links next to its title, with the RFCs those must name.
var figureRFCs = []struct {
	name, links string
	rfcs        []string
}{
	{"ladder", "#ladderhead a, #ladlegend a", []string{"5040", "5044", "9293"}},
	{"byte map", "#bm h2 a", []string{"5040", "5041", "5044"}},
	{"memory strip", "#mem h2 a", []string{"5041"}},
	{"QP state machine", "#qp h2 a", []string{"5040"}},
	{"negotiation", "#neg h2 a", []string{"5044", "6581"}},
	{"counters", "#cnt h2 a", []string{"5040", "5041", "5044", "9293"}},
	{"Terminates", "#term h2 a", []string{"5040"}},
}

// rfcSectionRE matches a link to a section of an RFC on rfc-editor.org.
var rfcSectionRE = regexp.MustCompile(`^https://www\.rfc-editor\.org/rfc/rfc(\d+)\.html#section-\d+(\.\d+)*$`)

// checkFigureLinks checks that every figure of the loaded page links to
// the sections of the RFCs that define it, on rfc-editor.org, and that
// every other link there (byte map rows, cards, strips) names a section.
func checkFigureLinks(t *testing.T, br *browsertest.Browser) {
	t.Helper()
	for _, f := range figureRFCs {
		hrefs := browsertest.Eval[[]string](t, br, `[...document.querySelectorAll('`+f.links+`')].map(a => a.href)`)
		got := map[string]bool{}
		for _, h := range hrefs {
			m := rfcSectionRE.FindStringSubmatch(h)
			if m == nil {
				t.Errorf("%s: link %q is not an RFC section on rfc-editor.org", f.name, h)
				continue
			}
			got[m[1]] = true
		}
		var names []string
		for n := range got {
			names = append(names, n)
		}
		sort.Strings(names)
		if strings.Join(names, " ") != strings.Join(f.rfcs, " ") {
			t.Errorf("%s: links to RFCs %v (%q), want %v", f.name, names, hrefs, f.rfcs)
		}
	}
	all := browsertest.Eval[[]string](t, br, `[...document.querySelectorAll('a[href*="rfc-editor.org"]')].map(a => a.href)`)
	for _, h := range all {
		if !rfcSectionRE.MatchString(h) {
			t.Errorf("link %q names no RFC section", h)
		}
	}
	if len(all) < 20 {
		t.Errorf("only %d RFC links on the page", len(all))
	}
}

// arrowClasses are the classes of the ladder's arrows (web.Segment.Class).
var arrowClasses = []string{"ctl", "fpdu", "mpa-rep", "mpa-req", "other", "rreq", "rresp", "send", "term", "write"}

// checkArrowCues checks that the ladder's arrows are told apart without
// colour: the legend gives every class a name and a line pattern (dashes
// and width) of its own, and every arrow on the page has a label that no
// arrow of another class has.
func checkArrowCues(t *testing.T, br *browsertest.Browser) {
	t.Helper()
	type key struct {
		Cls   string  `json:"cls"`
		Name  string  `json:"name"`
		Dash  string  `json:"dash"`
		Width float64 `json:"width"`
	}
	keys := browsertest.Eval[[]key](t, br, `[...document.querySelectorAll('#ladlegend [data-cls]')].map(e => ({cls: e.dataset.cls, name: e.textContent.trim(), dash: e.dataset.dash, width: +e.dataset.width}))`)
	var classes []string
	names, patterns := map[string]string{}, map[string]string{}
	for _, k := range keys {
		classes = append(classes, k.Cls)
		pattern := fmt.Sprintf("dashes [%s] width %v", k.Dash, k.Width)
		if k.Name == "" {
			t.Errorf("legend: class %s has no name", k.Cls)
		} else if c := names[k.Name]; c != "" {
			t.Errorf("legend: classes %s and %s are both named %q", c, k.Cls, k.Name)
		}
		if c := patterns[pattern]; c != "" {
			t.Errorf("legend: classes %s and %s are both drawn with %s", c, k.Cls, pattern)
		}
		names[k.Name], patterns[pattern] = k.Cls, k.Cls
	}
	sort.Strings(classes)
	if strings.Join(classes, " ") != strings.Join(arrowClasses, " ") {
		t.Errorf("legend: classes %v, want %v", classes, arrowClasses)
	}
	type arrow struct {
		Cls   string `json:"cls"`
		Label string `json:"lb"`
	}
	arrows := browsertest.Eval[[]arrow](t, br, `siwtunView.view.segs.map(s => ({cls: s.cls, lb: s.lb}))`)
	classOf := map[string]string{}
	for i, a := range arrows {
		if a.Label == "" {
			t.Errorf("arrow %d (%s) has no label", i, a.Cls)
		}
		if c, ok := classOf[a.Label]; ok && c != a.Cls {
			t.Errorf("arrow %d: label %q is drawn on arrows of classes %s and %s", i, a.Label, c, a.Cls)
		}
		classOf[a.Label] = a.Cls
	}
}

// TestWebLiveAndTraceHTML runs `siwtun web` and `siwtun trace --html`
// (and `siwtun capture`, for `siwtun check`) against an in-process
// device's control socket in a headless Chromium: the live page must
// update while the traffic runs, and the trace's page must load without
// console errors, hold one arrow per captured segment, and show for a
// chosen RDMA Write segment the byte map siwtun check finds in it.
func TestWebLiveAndTraceHTML(t *testing.T) {
	br := browsertest.New(t)
	p := newWatchedPair(t)
	dir := t.TempDir()
	pcap, page := filepath.Join(dir, "out.pcapng"), filepath.Join(dir, "trace.html")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var webOut syncbuf.Buffer
	var wg sync.WaitGroup
	var webErr, capErr, traceErr error
	var capOut, traceOut string
	wg.Add(3)
	go func() {
		defer wg.Done()
		webErr = runWeb(ctx, &webOut, "127.0.0.1:0", p.dir, []string{"siwtun0"}, defaultWebMaxSegments)
	}()
	go func() {
		defer wg.Done()
		capOut, capErr = runRoot(t, "capture", "--socket-dir", p.dir, "--dev", "siwtun0", "-w", pcap)
	}()
	go func() {
		defer wg.Done()
		traceOut, traceErr = runRoot(t, "trace", "--socket-dir", p.dir, "--dev", "siwtun0", "--html", page)
	}()
	deadline := time.Now().Add(ctlTestTimeout)
	for p.cli.eng.Watching() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	var url []string
	for url == nil {
		url = regexp.MustCompile(`open (http://\S+)`).FindStringSubmatch(webOut.String())
		if time.Now().After(deadline) {
			t.Fatalf("siwtun web said %q", webOut.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	openPage(t, br, url[1])
	before := browsertest.Eval[string](t, br, `document.getElementById('ladder').dataset.arrows`)
	p.traffic(t, 20000)
	// The live page follows the daemon's stream: it must come to show every
	// segment the server's view holds.
	var served struct {
		Segs []json.RawMessage `json:"segs"`
	}
	var live string
	for end := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get(url[1] + "view.json")
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := json.Unmarshal(data, &served); err != nil {
			t.Fatal(err)
		}
		live = browsertest.Eval[string](t, br, `document.getElementById('ladder').dataset.arrows`)
		if live == fmt.Sprint(len(served.Segs)) && len(served.Segs) > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("live page shows %s arrows, the server's view has %d", live, len(served.Segs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("live page: %s arrows before the traffic, %s after", before, live)
	// The connection has ended: the negotiation table counts the FPDUs
	// and the aligned segments the ladder shows, direction by direction.
	type tally struct {
		FPDUs    int `json:"fpdus"`
		Aligned  int `json:"aligned"`
		Verdicts int `json:"verdicts"`
	}
	type tallies struct {
		Table  map[string]tally `json:"table"`
		Ladder map[string]tally `json:"ladder"`
	}
	counts := browsertest.Eval[tallies](t, br, `(() => {
	  siwtunView.render();
	  const V = siwtunView.view, table = {}, ladder = {};
	  document.querySelectorAll('#negbody tbody tr').forEach((r) => { table[r.dataset.src + ' > ' + r.dataset.dst] = {fpdus: +r.dataset.fpdus, aligned: +r.dataset.aligned, verdicts: +r.dataset.fpduSegments}; });
	  for (const s of V.segs) {
	    const d = siwtunView.detail(s), k = V.addrs[s.a], c = ladder[k] || (ladder[k] = {fpdus: 0, aligned: 0, verdicts: 0});
	    c.fpdus += (d.fp || []).filter((f) => f.e).length;
	    if (s.al !== undefined) { c.verdicts++; if (s.al) c.aligned++; }
	  }
	  return {table, ladder};
	})()`)
	fpdus := 0
	for dir, tc := range counts.Table {
		if lc := counts.Ladder[dir]; lc != tc {
			t.Errorf("%s: the table counts %+v, the ladder shows %+v", dir, tc, lc)
		}
		fpdus += tc.FPDUs
	}
	if fpdus == 0 || len(counts.Table) == 0 {
		t.Errorf("the table counts %d FPDUs in %d directions", fpdus, len(counts.Table))
	}
	if before == live {
		t.Errorf("the live page did not change while traffic ran (%s arrows)", live)
	}
	if errs := br.Errors(); len(errs) > 0 {
		t.Errorf("live page: console errors: %q", errs)
	}
	br.Screenshot(t, "web-live.png")
	// Leave the live page before its server goes away.
	br.Do(t, 30*time.Second, chromedp.Navigate("about:blank"))

	time.Sleep(2 * joinAge)
	p.server.Close() // ends the streams of trace, capture and web
	wg.Wait()
	if capErr != nil || traceErr != nil {
		t.Fatalf("capture: %v %s; trace: %v %s", capErr, capOut, traceErr, traceOut)
	}
	_ = webErr // the daemon ending the stream ends siwtun web with an error: expected here

	// The trace's page against siwtun check on the capture of the same
	// device.
	segs, err := capture.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	a := inspect.New()
	reports := map[string]inspect.Report{}
	for _, s := range segs {
		for _, r := range a.Add(s) {
			reports[fmt.Sprintf("%v > %v %d", r.Src, r.Dst, r.Seq)] = r
		}
	}
	openPage(t, br, "file://"+page)
	if errs := br.Errors(); len(errs) > 0 {
		t.Errorf("trace page: console errors: %q", errs)
	}
	if got := browsertest.Eval[string](t, br, `document.getElementById('ladder').dataset.arrows`); got != fmt.Sprint(len(segs)) {
		t.Errorf("the ladder holds %s arrows, the capture has %d segments", got, len(segs))
	}
	pss := browsertest.Eval[[]pageSeg](t, br, pageSegsJS)
	chosen := -1
	for i, s := range pss {
		if s.Class == "write" && s.Marks > 1 {
			chosen = i
			break
		}
	}
	if chosen < 0 {
		t.Fatalf("no RDMA Write segment with markers in the page: %+v", pss)
	}
	chooseByKeyboard(t, br, chosen)
	rows := browsertest.Eval[[]bmRow](t, br, bmRowsJS)
	s := pss[chosen]
	r, ok := reports[fmt.Sprintf("%s %d", s.Addr, s.Seq)]
	if !ok {
		t.Fatalf("segment %+v is not in the capture", s)
	}
	checkByteMap(t, rows, &r)
	t.Logf("segment %d (%s seq %d, %d octets): %d byte map rows match siwtun check", chosen, s.Addr, s.Seq, s.Len, len(rows))
	br.Screenshot(t, "trace-bytemap.png")
	// The Read's sink, described by the daemon (ctl mr), fills completely.
	br.Do(t, 30*time.Second, chromedp.Focus("#ladder"), chromedp.KeyEvent(kb.End))
	type strip struct {
		Known  bool   `json:"known"`
		Access string `json:"access"`
		Len    int    `json:"len"`
		Placed int    `json:"placed"`
	}
	strips := browsertest.Eval[[]strip](t, br, `[...document.querySelectorAll('.strip')].map(d => { const r = siwtunView.view.regions[+d.dataset.region]; return {known: r.known, access: r.access, len: +d.dataset.len, placed: +d.dataset.placed}; })`)
	if len(strips) != 1 || !strips[0].Known || strips[0].Access != "LOCAL_WRITE" || strips[0].Len != 20000 || strips[0].Placed != 20000 {
		t.Errorf("memory strips %+v: want the Read's sink, 20000 octets of LOCAL_WRITE, all placed", strips)
	}
}

// TestDemoHTML writes `siwtun demo --html` with markers and checks the page
// in a headless Chromium: no console errors, the memory strip of the RDMA
// Write's target region shows every byte placed (and so does the Read's
// sink), the byte map of every segment with FPDUs matches the checker,
// every figure links to its RFC sections, and the arrows' classes differ
// in more than colour.
func TestDemoHTML(t *testing.T) {
	br := browsertest.New(t)
	dir := t.TempDir()
	page, pcap := filepath.Join(dir, "demo.html"), filepath.Join(dir, "demo.pcapng")
	var out strings.Builder
	o := demoOptions{mtu: 1500, size: 4096, rev: 2, crc: true, markers: true, inProc: true, html: page, pcap: pcap}
	if err := runDemo(&out, o); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	openPage(t, br, "file://"+page)
	if errs := br.Errors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
	segs, err := capture.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	// The view ends before the demo closes its engines, whose last act is
	// a RST: the capture, written by the stacks' hooks, has it too.
	want := len(segs)
	if segs[want-1].Flags&inspect.FlagRST != 0 {
		want--
	}
	if got := browsertest.Eval[string](t, br, `document.getElementById('ladder').dataset.arrows`); got != fmt.Sprint(want) {
		t.Errorf("the ladder holds %s arrows, the capture has %d segments before the closing RST", got, want)
	}
	type strip struct {
		Dev    string `json:"dev"`
		STag   uint32 `json:"stag"`
		Len    int    `json:"len"`
		Placed int    `json:"placed"`
	}
	const stripsJS = `[...document.querySelectorAll('.strip')].map(d => ({dev: siwtunView.view.regions[+d.dataset.region].dev, stag: siwtunView.view.regions[+d.dataset.region].stag, len: +d.dataset.len, placed: +d.dataset.placed}))`
	// The last segment chosen: the strips show every placement.
	pss := browsertest.Eval[[]pageSeg](t, br, pageSegsJS)
	br.Do(t, 30*time.Second, chromedp.Focus("#ladder"), chromedp.KeyEvent(kb.End))
	strips := browsertest.Eval[[]strip](t, br, stripsJS)
	var write bool
	for _, s := range strips {
		if s.Len != 4096 || s.Placed != s.Len {
			t.Errorf("region %+v: not every byte placed", s)
		}
		write = write || s.Dev == "siwtun1"
	}
	if !write || len(strips) != 2 {
		t.Errorf("strips %+v: want the Write's target on siwtun1 and the Read's sink on siwtun0", strips)
	}
	br.Screenshot(t, "demo-memory.png")
	// Every segment with FPDUs against the checker run over the capture.
	a := inspect.New()
	reports := map[string]inspect.Report{}
	for _, s := range segs {
		for _, r := range a.Add(s) {
			reports[fmt.Sprintf("%v > %v %d", r.Src, r.Dst, r.Seq)] = r
		}
	}
	checked := 0
	for i, s := range pss {
		if s.Len == 0 || s.Class == "mpa-req" || s.Class == "mpa-rep" {
			continue
		}
		browsertest.Eval[bool](t, br, fmt.Sprintf(`(siwtunView.select(%d), true)`, i))
		r := reports[fmt.Sprintf("%s %d", s.Addr, s.Seq)]
		checkByteMap(t, browsertest.Eval[[]bmRow](t, br, bmRowsJS), &r)
		checked++
	}
	if checked < 6 {
		t.Errorf("only %d segments with FPDUs", checked)
	}
	// Every figure links to the RFC sections that define it, and the
	// arrows are told apart without colour.
	checkFigureLinks(t, br)
	checkArrowCues(t, br)
}
