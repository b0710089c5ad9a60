package test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/verbs"
)

// tcpdumpOn captures dev's TCP traffic in r's namespace into file until
// the returned stop is called.
func tcpdumpOn(t *testing.T, n *netns, dev, file string) (stop func()) {
	t.Helper()
	dump := n.command("tcpdump", "-i", dev, "-s", "0", "-B", "65536", "-w", file, "tcp")
	errBuf := &syncbuf.Buffer{}
	dump.Stderr = errBuf
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			dump.Process.Signal(syscall.SIGINT)
			dump.Wait()
			if !strings.Contains(errBuf.String(), "\n0 packets dropped by kernel") {
				t.Errorf("tcpdump on %s may have lost packets: %s", dev, errBuf)
			}
		}
	}
	t.Cleanup(stop)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(errBuf.String(), "listening on"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("tcpdump on %s not listening after 30 s: %s", dev, errBuf)
		}
	}
	return stop
}

// alignMiB is how many MiB each configuration of
// TestAlignedThroughRetransmissions moves (SIWTUN_ALIGN_MIB overrides).
func alignMiB(t *testing.T, def int) int {
	if s := os.Getenv("SIWTUN_ALIGN_MIB"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("SIWTUN_ALIGN_MIB=%q: want a positive number", s)
		}
		return n
	}
	return def
}

// TestAlignedThroughRetransmissions: two daemons whose links lose 2 % and
// reorder 2 % of the segments both ways (siwtun up --impair), at MTU 1500
// and 9000, with segmentation offload (the default: the RNIC's TCP builds
// super-segments, which the impairment cuts into wire segments as a NIC
// would) and without (--offload=false). Batches of odd-sized RDMA Writes,
// tiny Sends and RDMA Reads go one way, Read Responses the other, while
// tcpdump captures both TUN devices. Every data segment each daemon sent,
// retransmissions and all that follow them included, must be
// FPDU-aligned, as two independent checkers judge it from the capture:
// siwtun check and tshark's iWARP dissectors (see tsharkSent). Each
// configuration moves SIWTUN_ALIGN_MIB MiB (8 by default) each way;
// SIWTUN_ALIGN_KEEP=dir keeps the captures.
func TestAlignedThroughRetransmissions(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Skipf("needs tcpdump (.ci/run installs it): %v", err)
	}
	tshark := needTshark(t)
	var all alignCounts
	for _, mtu := range []int{1500, 9000} {
		for _, off := range []bool{true, false} {
			t.Run(fmt.Sprintf("mtu%d/offload=%v", mtu, off), func(t *testing.T) {
				c := alignedRun(t, tshark, mtu, off)
				all.check += c.check
				all.tshark += c.tshark
				all.retrans += c.retrans
			})
		}
	}
	t.Logf("in all: %d data segments judged by siwtun check, %d by tshark, %d of them retransmissions",
		all.check, all.tshark, all.retrans)
}

// alignedRun is one configuration of TestAlignedThroughRetransmissions; it
// returns how many data segments the checkers judged.
func alignedRun(t *testing.T, tshark string, mtu int, off bool) alignCounts {
	var tot alignCounts
	r := newTwoRNICs(t, mtu, fmt.Sprintf("--offload=%v", off), "--impair", "loss=2%,reorder=2%,seed=11")
	dir := t.TempDir()
	if keep := os.Getenv("SIWTUN_ALIGN_KEEP"); keep != "" {
		dir = filepath.Join(keep, fmt.Sprintf("mtu%d-offload%v", mtu, off))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pcaps := [2]string{filepath.Join(dir, "siwtun0.pcap"), filepath.Join(dir, "siwtun1.pcap")}
	stop0 := tcpdumpOn(t, r.ns, "siwtun0", pcaps[0])
	stop1 := tcpdumpOn(t, r.ns, "siwtun1", pcaps[1])
	cli, srv := r.connect(t, 7174, 16)
	mib := alignMiB(t, 8)
	const msg = 1 << 20
	smr, sbuf := cli.mr(t, msg, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	copy(sbuf, pattern(msg, 5))
	kmr, _ := cli.mr(t, msg, verbs.AccessLocalWrite)
	dmr, _ := srv.mr(t, msg, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	rmr, _ := srv.mr(t, msg, verbs.AccessLocalWrite)
	// Each batch is posted at once, so the engine's aligned writes queue
	// in TCP behind each other: long messages of odd lengths (their last
	// FPDU short), tiny Sends and Writes, and Read Responses the other
	// way. TCP joins queued writes into one segment object, which is what
	// it then cuts off the FPDU grid when it retransmits.
	type op struct {
		code verbs.WROpcode
		n    int
	}
	batch := []op{
		{verbs.WRWrite, 3<<16 + 7}, {verbs.WRSend, 52}, {verbs.WRWrite, 100}, {verbs.WRSend, 3000},
		{verbs.WRWrite, 1}, {verbs.WRWrite, 200003}, {verbs.WRSend, 700}, {verbs.WRRead, 100003},
		{verbs.WRWrite, 9 * mtu}, {verbs.WRRead, 777},
	}
	moved := 0
	for moved < mib<<20 {
		var wrs []verbs.SendWR
		var recvs []verbs.RecvWR
		for i, o := range batch {
			wr := verbs.SendWR{ID: uint64(i), Opcode: o.code, SGL: []verbs.SGE{smr.SGE(0, o.n)}}
			switch o.code {
			case verbs.WRWrite:
				wr.RemoteAddr, wr.RKey = dmr.Addr(), dmr.RKey()
			case verbs.WRRead:
				wr.SGL = []verbs.SGE{kmr.SGE(0, o.n)}
				wr.RemoteAddr, wr.RKey = dmr.Addr(), dmr.RKey()
			case verbs.WRSend:
				recvs = append(recvs, verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{rmr.SGE(0, 4096)}})
			}
			moved += o.n
			wrs = append(wrs, wr)
		}
		wrs[len(wrs)-1].Flags = verbs.FlagSignaled
		if _, err := srv.qp.PostRecv(recvs); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
		expectOK(t, "batch", cli.wait(t, cli.scq))
		for range recvs {
			expectOK(t, "receive", srv.wait(t, srv.rcq))
		}
	}
	for _, d := range []*daemon{r.d0, r.d1} {
		st := ctlStats(t, d)
		t.Logf("%s: retransmitted segments %d, resent on the FPDU grid %d, FPDU starts held %d (alone %d), tail rescues %d",
			d.dev, st["tcpRetransSegs"], st["tcpResentOnGrid"], st["tcpHeldTails"], st["tcpHeldTailsAlone"], st["tcpTailRescues"])
	}
	time.Sleep(300 * time.Millisecond)
	stop0()
	stop1()
	for i, p := range pcaps {
		// Each TUN device's capture holds what its own daemon sent
		// whole; the other direction there is what the namespace's
		// kernel forwarded toward it.
		src := []string{"198.18.1.2", "198.18.2.2"}[i]
		c := checkSent(t, r.bin, p, src)
		ts := tsharkSent(t, tshark, p, src)
		t.Logf("%s, sent by %s: siwtun check: %d data segments, %d FPDU-aligned (%d retransmitted ones judged, %d aligned, of %d); tshark: %d data segments, %d FPDU-aligned, %d FPDUs, %d Good CRC32, %d bad",
			filepath.Base(p), src, c.FPDUSegments+c.RetransJudged, c.Aligned+c.RetransAligned, c.RetransJudged, c.RetransAligned, c.Retransmissions,
			ts.segments, ts.aligned, ts.fpdus, ts.goodCRC, ts.badCRC)
		if c.Aligned != c.FPDUSegments || c.RetransAligned != c.RetransJudged || c.CRCBad != 0 {
			t.Errorf("siwtun check: %d of %d segments aligned, %d of %d retransmissions, %d bad CRCs", c.Aligned, c.FPDUSegments, c.RetransAligned, c.RetransJudged, c.CRCBad)
		}
		for _, seg := range c.problems {
			t.Errorf("siwtun check: %s", seg)
		}
		if ts.aligned != ts.segments || ts.goodCRC != ts.fpdus || ts.badCRC != 0 {
			t.Errorf("tshark: %d of %d data segments FPDU-aligned, %d of %d FPDUs with a good CRC, %d bad; first split: %v", ts.aligned, ts.segments, ts.goodCRC, ts.fpdus, ts.badCRC, ts.split)
		}
		if ts.segments < c.FPDUSegments {
			t.Errorf("tshark saw %d data segments, siwtun check %d in order", ts.segments, c.FPDUSegments)
		}
		tot.check += c.FPDUSegments + c.RetransJudged
		tot.tshark += ts.segments
		tot.retrans += c.Retransmissions
	}
	if tot.retrans == 0 {
		t.Error("no retransmission in the captures: the impairment did not act")
	}
	return tot
}

// checkDir is one direction of `siwtun check -j`, with its problem
// segments.
type checkDir struct {
	Src             string
	FPDUSegments    int `json:"fpdu_segments"`
	Aligned         int `json:"aligned"`
	CRCBad          int `json:"crc_bad"`
	Retransmissions int `json:"retransmissions"`
	RetransJudged   int `json:"retransmissions_judged"`
	RetransAligned  int `json:"retransmissions_aligned"`
	problems        []string
}

// checkSent runs `siwtun check -j` on pcap and returns the direction sent
// by src: an address, or an address and port.
func checkSent(t *testing.T, bin, pcap, src string) checkDir {
	t.Helper()
	out, err := exec.Command(bin, "check", "-j", pcap).Output()
	if err != nil && len(out) == 0 {
		t.Fatalf("siwtun check %s: %v", pcap, err)
	}
	var res struct {
		Directions []checkDir        `json:"directions"`
		Segments   []json.RawMessage `json:"segments"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("siwtun check -j %s: %v", pcap, err)
	}
	var d checkDir
	n := 0
	for _, x := range res.Directions {
		if (x.Src == src || strings.HasPrefix(x.Src, src+":")) && x.FPDUSegments > 0 {
			d = x
			n++
		}
	}
	if n != 1 {
		t.Fatalf("siwtun check %s: %d connections with FPDUs sent by %s, want 1: %+v", pcap, n, src, res.Directions)
	}
	for _, raw := range res.Segments {
		var seg struct {
			Src string `json:"src"`
		}
		if json.Unmarshal(raw, &seg) == nil && (seg.Src == src || strings.HasPrefix(seg.Src, src+":")) && len(d.problems) < 10 {
			d.problems = append(d.problems, string(raw))
		}
	}
	return d
}

// tsharkCount is what tshark found in the data segments one side sent.
type tsharkCount struct {
	segments, aligned      int
	fpdus, goodCRC, badCRC int
	split                  []string // the first segments not FPDU-aligned
}

// tsharkSent has Wireshark's iWARP dissectors judge every data segment src
// (an address, or an address and port) sent after its MPA frame, retransmissions and segments the impairment
// reordered included: with TCP's sequence analysis and reassembly off,
// each segment is dissected on its own, so it is FPDU-aligned when the
// FPDUs tshark frames from its first octet (tcp.pdu.size) add up to its
// whole length; that those are the real FPDUs shows in their CRCs, every
// one of which must be good.
func tsharkSent(t *testing.T, tshark, pcap, src string) tsharkCount {
	t.Helper()
	filter := "ip.src==" + src + " && tcp.len>0"
	if ap, err := netip.ParseAddrPort(src); err == nil {
		filter = fmt.Sprintf("ip.src==%v && tcp.srcport==%d && tcp.len>0", ap.Addr(), ap.Port())
	}
	opts := append([]string{"-r", pcap, "-n", "-o", "tcp.analyze_sequence_numbers:FALSE", "-o", "tcp.desegment_tcp_streams:FALSE",
		"-Y", filter}, capture.TsharkHeuristicsOff...)
	out, err := exec.Command(tshark, append(opts, "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,",
		"-e", "frame.number", "-e", "tcp.seq_raw", "-e", "tcp.len", "-e", "tcp.pdu.size", "-e", "iwarp_mpa.key.req", "-e", "iwarp_mpa.key.rep")...).Output()
	if err != nil {
		t.Fatalf("tshark fields %s: %v", pcap, err)
	}
	var c tsharkCount
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 6 || f[4] != "" || f[5] != "" {
			continue // the MPA Request or Reply
		}
		c.segments++
		n, _ := strconv.Atoi(f[2])
		sum := 0
		for _, x := range strings.Split(f[3], ",") {
			v, _ := strconv.Atoi(x)
			sum += v
		}
		if sum == n {
			c.aligned++
		} else if len(c.split) < 5 {
			c.split = append(c.split, fmt.Sprintf("frame %s seq %s len %d: FPDUs %s", f[0], f[1], n, f[3]))
		}
	}
	v, err := exec.Command(tshark, append(opts, "-V")...).Output()
	if err != nil {
		t.Fatalf("tshark -V %s: %v", pcap, err)
	}
	for _, line := range strings.Split(string(v), "\n") {
		switch {
		case strings.TrimSpace(line) == "FPDU":
			c.fpdus++
		case strings.Contains(line, "(Good CRC32)"):
			c.goodCRC++
		case strings.Contains(line, "(Bad CRC32"):
			c.badCRC++
		}
	}
	return c
}

// alignCounts sums the data segments judged.
type alignCounts struct{ check, tshark, retrans int }

// TestAlignmentCheckersSeeSplits: the two checkers of
// TestAlignedThroughRetransmissions find segments that cut FPDUs, first
// transmissions and retransmissions alike. A capture of Linux siw (rping,
// CRC on, every segment one whole FPDU) is changed: one FPDU is sent in
// two halves, the second half is retransmitted, and a whole segment is
// retransmitted; both checkers must count exactly those three as split and
// the rest as aligned.
func TestAlignmentCheckersSeeSplits(t *testing.T) {
	tshark := needTshark(t)
	bin := siwtunBin(t)
	segs, err := capture.ReadFile("../iwarp/mpa/testdata/siw-rping-crc-mtu1500.pcap")
	if err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddrPort("198.18.0.2:46647") // the initiator
	var out []capture.Packet
	data, split := 0, false
	var whole capture.Packet
	for _, s := range segs {
		p := capture.Packet{Time: s.Time, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Flags: s.Flags, Window: 65535, Payload: s.Payload}
		if s.Src == src && len(s.Payload) > 40 && s.Flags&inspect.FlagSYN == 0 {
			data++
			switch data {
			case 3: // the MPA Request is the first; keep one whole to retransmit
				whole = p
			case 6:
				h := len(p.Payload) / 2
				first, second := p, p
				first.Payload, second.Payload = p.Payload[:h], p.Payload[h:]
				second.Seq += uint32(h)
				out = append(out, first, second, whole, second)
				split = true
				continue
			}
		}
		out = append(out, p)
	}
	if !split {
		t.Fatalf("the capture has %d data segments from %v, too few", data, src)
	}
	file := filepath.Join(t.TempDir(), "split.pcapng")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	w, err := capture.NewWriter(f, "test")
	if err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if err := w.Write(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c := checkSent(t, bin, file, src.String())
	if split := c.FPDUSegments - c.Aligned + c.RetransJudged - c.RetransAligned; split != 3 || c.RetransJudged != 2 {
		t.Errorf("siwtun check: %d segments, %d aligned, %d retransmissions judged, %d aligned; want 3 split, 2 retransmissions judged", c.FPDUSegments, c.Aligned, c.RetransJudged, c.RetransAligned)
	}
	ts := tsharkSent(t, tshark, file, src.String())
	if ts.segments-ts.aligned != 3 {
		t.Errorf("tshark: %d of %d data segments aligned, want all but 3: %v", ts.aligned, ts.segments, ts.split)
	}
	t.Logf("siwtun check: %+v; tshark: %+v", c, ts)
}
