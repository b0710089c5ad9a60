package test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/syncbuf"
	"github.com/siwtun/siwtun/verbs"
)

// TestOffloadWireAlignment: with segmentation offload (siwtun up
// --offload) each daemon writes runs of FPDU-aligned segments as one TCP
// super-segment and leaves the cutting to the kernel. The RNICs live in two
// namespaces joined by a veth pair with TSO, GSO and GRO off, so the
// kernel cuts every super-segment before the wire; tcpdump captures the
// wire and `siwtun check` counts the data segments that are FPDU-aligned
// where the kernel cut them: at least 99.9 %, markers off and on.
func TestOffloadWireAlignment(t *testing.T) {
	requireRoot(t)
	for _, tool := range []string{"tcpdump", "ethtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (.ci/run installs it): %v", tool, err)
		}
	}
	bin := siwtunBin(t)
	for _, mtu := range []int{1500, 9000} {
		for _, markers := range []bool{false, true} {
			t.Run(fmt.Sprintf("mtu%d/markers=%v", mtu, markers), func(t *testing.T) {
				wireAlignment(t, bin, mtu, markers)
			})
		}
	}
}

func wireAlignment(t *testing.T, bin string, mtu int, markers bool) {
	a, b := newNetns(t), newNetns(t)
	// The wire: veth a0 (198.18.3.1, in a) to a1 (198.18.3.2, in b).
	a.run("ip", "link", "add", "wire0", "mtu", fmt.Sprint(mtu), "type", "veth", "peer", "name", "wire1", "mtu", fmt.Sprint(mtu), "netns", b.name)
	a.run("ip", "addr", "add", "198.18.3.1/24", "dev", "wire0")
	b.run("ip", "addr", "add", "198.18.3.2/24", "dev", "wire1")
	for _, x := range []struct {
		n   *netns
		dev string
	}{{a, "wire0"}, {b, "wire1"}} {
		x.n.run("ethtool", "-K", x.dev, "tso", "off", "gso", "off", "gro", "off")
		x.n.run("ip", "link", "set", x.dev, "up")
	}
	flags := []string{"--offload", fmt.Sprintf("--markers=%v", markers)}
	d0 := startDaemon(t, a, bin, "siwtun0", "198.18.1.2/24", "198.18.1.1/24", mtu, flags...)
	d1 := startDaemon(t, b, bin, "siwtun1", "198.18.2.2/24", "198.18.2.1/24", mtu, flags...)
	a.run("ip", "route", "add", "198.18.2.0/24", "via", "198.18.3.2")
	b.run("ip", "route", "add", "198.18.1.0/24", "via", "198.18.3.1")

	pcap := filepath.Join(t.TempDir(), "wire.pcap")
	dump := a.command("tcpdump", "-i", "wire0", "-s", "0", "-B", "131072", "-w", pcap, "tcp")
	dumpErr := &syncbuf.Buffer{}
	dump.Stderr = dumpErr
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stopDump := func() {
		if !stopped {
			stopped = true
			dump.Process.Signal(syscall.SIGINT)
			dump.Wait()
		}
	}
	defer stopDump()
	// The capture must hold the MPA handshake (siwtun check learns CRC
	// and markers from it): traffic starts once tcpdump says it listens,
	// not after a fixed wait (500 ms was once too short under load, and
	// the capture then held no FPDU that check could read).
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(dumpErr.String(), "listening on"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("tcpdump on wire0 not listening after 30 s: %s", dumpErr.String())
		}
	}

	r := &twoRNICs{ns: a, bin: bin, d0: d0, d1: d1, mtu: mtu,
		a0: netip.MustParseAddr("198.18.1.2"), a1: netip.MustParseAddr("198.18.2.2")}
	r.dial(t)
	cli, srv := r.connect(t, 7174, 16)
	const msg, total = 1 << 20, 48 << 20
	smr, sbuf := cli.mr(t, msg, verbs.AccessLocalWrite)
	copy(sbuf, pattern(msg, 3))
	dmr, dbuf := srv.mr(t, msg, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	writeInBatches(t, cli, smr, dmr, msg, total/msg)
	if string(dbuf) != string(sbuf) {
		t.Fatal("the data written differs from the source")
	}
	time.Sleep(300 * time.Millisecond)
	stopDump()

	out, err := exec.Command(bin, "check", "-j", pcap).Output()
	if err != nil && len(out) == 0 {
		t.Fatalf("siwtun check: %v", err)
	}
	var res struct {
		Directions []struct {
			Src, Dst     string
			FPDUSegments int `json:"fpdu_segments"`
			Aligned      int `json:"aligned"`
			CRCBad       int `json:"crc_bad"`
			MarkersBad   int `json:"markers_bad"`
		} `json:"directions"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("siwtun check -j: %v\n%.2000s", err, out)
	}
	best := 0
	for _, d := range res.Directions {
		if d.FPDUSegments == 0 {
			continue
		}
		pct := 100 * float64(d.Aligned) / float64(d.FPDUSegments)
		t.Logf("MTU %d markers %v, on the wire %s > %s: %d data segments, %d FPDU-aligned (%.3f %%), bad CRC %d, bad markers %d",
			mtu, markers, d.Src, d.Dst, d.FPDUSegments, d.Aligned, pct, d.CRCBad, d.MarkersBad)
		if d.FPDUSegments > best {
			best = d.FPDUSegments
		}
		if d.FPDUSegments > 100 && pct < 99.9 {
			t.Errorf("%s > %s: %d of %d segments aligned on the wire", d.Src, d.Dst, d.Aligned, d.FPDUSegments)
		}
		if d.CRCBad != 0 || d.MarkersBad != 0 {
			t.Errorf("%s > %s: %d bad CRCs, %d bad markers", d.Src, d.Dst, d.CRCBad, d.MarkersBad)
		}
	}
	if best < total/mtu {
		t.Fatalf("the capture holds %d data segments in its busiest direction, want at least %d", best, total/mtu)
	}
	// The engine's own counts (its segment hook sees the wire segments
	// inside each super-segment, a run at a time) agree with the wire:
	// every data segment there was counted, and as many were aligned.
	st := ctlStats(t, d0)
	sent, aligned := st["mpaAlignedSegsTx"]+st["mpaSplitSegsTx"], st["mpaAlignedSegsTx"]
	t.Logf("siwtun0 sent %d data segments (%d aligned) as the stack made them", sent, aligned)
	if sent < uint64(best) {
		t.Errorf("siwtun0 counted %d data segments sent, fewer than the %d the capture's busiest direction holds", sent, best)
	}
	if float64(aligned) < 0.999*float64(sent) {
		t.Errorf("siwtun0 counted %d of %d data segments aligned, under 99.9 %%", aligned, sent)
	}
}
