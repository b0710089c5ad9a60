package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/monoclock"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/offload/mpa/inspect"
	"github.com/siwtun/siwtun/verbs"
)

// watchedPair is two in-process RNICs with markers on, the client's
// control socket served in dir.
type watchedPair struct {
	cli, srv *testRNIC
	dir      string
	server   *ctl.Server
}

func newWatchedPair(t *testing.T) *watchedPair {
	t.Helper()
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	markers := func(c *offload.Config) { c.Markers = true }
	p := &watchedPair{cli: newRNICConfig(t, la, "siwtun0", cliPrefix, markers), srv: newRNICConfig(t, lb, "siwtun1", srvPrefix, markers), dir: t.TempDir()}
	s, err := ctl.Listen(ctl.SocketPath(p.dir, "siwtun0"), ctl.NewProvider("", p.cli.eng, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	p.server = s
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	return p
}

// waitWatching waits until the client device has an open Watch.
func (p *watchedPair) waitWatching(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(ctlTestTimeout)
	for p.cli.eng.Watching() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the watch did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// traffic connects the pair and runs an RDMA Write of n bytes followed by
// an RDMA Read of it back, then a Send.
func (p *watchedPair) traffic(t *testing.T, n int) {
	t.Helper()
	cli, srv := p.cli, p.srv
	ctx, cancel := context.WithTimeout(context.Background(), ctlTestTimeout)
	defer cancel()
	remote := netip.AddrPortFrom(srvPrefix.Addr(), 7174)
	l, err := srv.dev.Listen(remote, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := acceptOne(ctx, l, srv.qp, verbs.ConnParam{})
	if err := cli.qp.Connect(ctx, remote, verbs.ConnParam{InitiatorDepth: 4}); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	cli.waitEstablished(t)
	srv.waitEstablished(t)
	src := bytes.Repeat([]byte("siwtun capture "), n/15+1)[:n]
	smr, err := cli.pd.RegMR(src, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, n)
	dmr, err := srv.pd.RegMR(dst, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	sink := make([]byte, n)
	kmr, err := cli.pd.RegMR(sink, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	rbuf := make([]byte, 64)
	rmr, err := srv.pd.RegMR(rbuf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{rmr.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.qp.PostSend([]verbs.SendWR{
		{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, n)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()},
		{ID: 2, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{kmr.SGE(0, n)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()},
		{ID: 3, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("done")},
	}); err != nil {
		t.Fatal(err)
	}
	cli.complete(t, 3)
	srv.complete(t, 1)
	if !bytes.Equal(sink, src) || !bytes.Equal(dst, src) {
		t.Fatal("data differ")
	}
	time.Sleep(50 * time.Millisecond) // the last ACKs
}

// TestCaptureAndTrace runs `siwtun capture` and `siwtun trace -j` against
// an in-process device's control socket while a connection with markers
// and CRC on does an RDMA Write, a Read and a Send, then checks the pcapng
// with the checker (and tshark, when installed) and the trace lines.
func TestCaptureAndTrace(t *testing.T) {
	p := newWatchedPair(t)
	file := filepath.Join(t.TempDir(), "out.pcapng")
	var wg sync.WaitGroup
	var capOut, traceOut string
	var capErr, traceErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		capOut, capErr = runRoot(t, "capture", "--socket-dir", p.dir, "--dev", "siwtun0", "-w", file)
	}()
	go func() {
		defer wg.Done()
		traceOut, traceErr = runRoot(t, "trace", "--socket-dir", p.dir, "--dev", "siwtun0", "-j")
	}()
	deadline := time.Now().Add(ctlTestTimeout)
	for p.cli.eng.Watching() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	p.traffic(t, 20000)
	time.Sleep(2 * joinAge) // let the joiners hand on their last segments
	p.server.Close()        // ends both streams
	wg.Wait()
	if capErr != nil || traceErr != nil {
		t.Fatalf("capture: %v\n%s\ntrace: %v", capErr, capOut, traceErr)
	}
	if !strings.Contains(capOut, "packets written to") {
		t.Errorf("capture said %q", capOut)
	}

	// The checker on the pcapng.
	out, err := runRoot(t, "check", file)
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	segs, err := capture.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	a := inspect.New()
	for _, s := range segs {
		a.Add(s)
	}
	for _, s := range a.Summary() {
		if !s.CRC || !s.Markers || s.FPDUs == 0 || s.CRCGood != s.FPDUs || s.MarkersOK == 0 || s.MarkersBad != 0 {
			t.Errorf("%v > %v: %+v\n%s", s.Src, s.Dst, s, out)
		}
	}
	if tshark, err := exec.LookPath("tshark"); err == nil {
		res := capture.RunTshark(context.Background(), tshark, file)
		if res.Err != nil || res.BadCRC != 0 || res.Malformed != 0 || res.ExpertErrors != 0 || res.GoodCRC == 0 || res.GoodCRC != res.FPDUs || res.Comments == 0 {
			t.Errorf("tshark: %+v", res)
		}
		t.Logf("tshark: %d frames, %d FPDUs, %d Good CRC32, %d malformed", res.Frames, res.FPDUs, res.GoodCRC, res.Malformed)
	}

	// The trace: segments with FPDUs, the Read Response placements and
	// the three completions.
	var placed, wcs, fpdus int
	for _, line := range strings.Split(strings.TrimSpace(traceOut), "\n") {
		if strings.HasPrefix(line, "siwtun trace: watching siwtun0") {
			continue // standard error, which runRoot mixes in
		}
		var l traceLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("trace line %q: %v", line, err)
		}
		for _, r := range l.Reports {
			fpdus += len(r.FPDUs)
		}
		for _, pl := range l.Places {
			if pl.Op == "RDMA Read Response" {
				placed += pl.Len
			}
		}
		wcs += len(l.WCs)
	}
	if placed != 20000 || wcs != 3 || fpdus == 0 {
		t.Errorf("trace: %d octets of Read Response placed, %d completions, %d FPDUs", placed, wcs, fpdus)
	}
}

// TestWatchStreamClock: a daemon's watch stream stamps every event with
// CLOCK_MONOTONIC nanoseconds that never go back, and says it is idle
// with heartbeats, so a viewer can merge two daemons' streams by time; a
// stream asked for headers only leaves the payloads out, giving lengths.
func TestWatchStreamClock(t *testing.T) {
	p := newWatchedPair(t)
	c, err := ctl.Dial(ctl.SocketPath(p.dir, "siwtun0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ws, err := c.Watch()
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan ctl.WatchEvent, 1<<16)
	go func() {
		defer close(events)
		for {
			e, err := ws.Next()
			if err != nil {
				return
			}
			events <- e
		}
	}()
	hc, err := ctl.Dial(ctl.SocketPath(p.dir, "siwtun0"))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	hs, err := hc.WatchHeaders()
	if err != nil {
		t.Fatal(err)
	}
	for p.cli.eng.Watching() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	p.traffic(t, 20000)
	// The stream without payloads gives their lengths.
	for data := 0; data < 5; {
		e, err := hs.Next()
		if err != nil {
			t.Fatal(err)
		}
		if s := e.Segment; s != nil && s.Len > 0 {
			if s.Payload != nil || s.PayloadLen() != s.Len {
				t.Fatalf("headers-only segment %+v", s)
			}
			data++
		}
	}
	var last int64
	segs, beats := 0, 0
	for deadline := time.After(ctlTestTimeout); beats < 3; {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("the stream ended")
			}
			if e.Mono <= 0 || e.Mono < last {
				t.Fatalf("event at %d after one at %d: %+v", e.Mono, last, e)
			}
			if now := monoclock.Now(); e.Mono > now {
				t.Fatalf("event at %d, later than now (%d)", e.Mono, now)
			}
			last = e.Mono
			if e.Segment != nil {
				segs++
			}
			if e.Heartbeat() {
				beats++
			}
		case <-deadline:
			t.Fatalf("%d segments, %d heartbeats", segs, beats)
		}
	}
	if segs == 0 {
		t.Error("no segment in the stream")
	}
}
