package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/apps/perftest"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/web"
)

// The anatomy lesson: perftest's 4-byte RDMA Write ping-pong (ib_write_lat)
// between the two in-process RNICs with both RNICs' recorders of hop
// stamps on, taken apart hop by hop (package anatomy) into the view's
// anatomy table and, step by step, into what each hop is in an RNIC and
// which were the big ones in this run, and why.

// anatomyIters is how many round trips the lesson takes apart, and
// anatomyPort the ping-pong's port.
const (
	anatomyIters = 300
	anatomyPort  = 18515
)

// pipeLegs name the legs that differ in one process from the daemons'
// (the lesson's RNICs are joined by netstack.Pipe, and verbs calls the
// engine directly).
var pipeLegs = map[anatomy.Leg]string{
	{From: anatomy.Post, To: anatomy.Pickup}:      "post -> the engine takes it (a call, in one process)",
	{From: anatomy.TCPOut, To: anatomy.TUNWrite}:  "-> into the in-memory link's queue",
	{From: anatomy.TUNWrite, To: anatomy.TUNRead}: "-> the link's goroutine delivered it to the peer",
}

// pipeLegName names a leg of the in-process lesson.
func pipeLegName(l anatomy.Leg) string {
	if n, ok := pipeLegs[l]; ok {
		return n
	}
	return l.Name()
}

// legTeaching says what a leg is in an RNIC, and whether it is a hand-off
// between goroutines (a wake-up) rather than the RNIC's own work.
var legTeaching = map[anatomy.Leg]struct {
	text    string
	handoff bool
}{
	{From: anatomy.Post, To: anatomy.Pickup}:      {"ibv_post_send: through siwtun up the work request goes into the send queue's ring in shared memory and an eventfd doorbell wakes the daemon's ring goroutine; in this one process verbs calls the engine directly (offload.QP.PostSend). A hardware RNIC's doorbell is a write to a device register, after which it fetches the request by DMA.", false},
	{From: anatomy.Pickup, To: anatomy.TXStart}:   {"the engine hands the request to the queue pair's TX goroutine, which has to wake up: a hand-off between goroutines. A hardware RNIC's send engine is a pipeline that never sleeps.", true},
	{From: anatomy.TXStart, To: anatomy.Built}:    {"the TX goroutine builds the FPDU straight in TCP's send buffer: MPA length, DDP tagged header (STag, tagged offset), the 4 payload octets copied from the registered region, CRC32c (RFC 5044 §4, RFC 5041 §4). Real work, but little of it for 4 octets.", false},
	{From: anatomy.Built, To: anatomy.TCPOut}:     {"the RNIC's own TCP (gVisor's, as a hardware iWARP RNIC runs a TCP engine of its own) makes the segment: sequence number, window, checksums, IP header.", false},
	{From: anatomy.TCPOut, To: anatomy.TUNWrite}:  {"the segment goes to the link: with siwtun up the TUN device's write system call, here the in-memory link's queue, after the lesson's own tap (the view's segment log reads every segment on its way out).", false},
	{From: anatomy.TUNWrite, To: anatomy.TUNRead}: {"the wire. With siwtun up the kernel routes the packet from one TUN device to the other and Go's netpoller wakes the peer daemon's reader goroutine: a daemon's largest leg. Here the link's goroutine takes the packet from its queue and delivers it: a hand-off too.", true},
	{From: anatomy.TUNRead, To: anatomy.Queued}:   {"the peer's TCP runs its receive path on gVisor's processor goroutine (another hand-off), checks the segment and queues its data for the reader.", true},
	{From: anatomy.Queued, To: anatomy.Handover}:  {"the queue pair's RX goroutine, parked in its read, wakes up and takes the payload: a hand-off again.", true},
	{From: anatomy.Handover, To: anatomy.Placed}:  {"the MPA receiver finds the FPDU, checks its CRC and its DDP header, and places the 4 octets straight into the registered region named by STag and tagged offset (RFC 5041 §5): no receive buffer, no copy in between.", false},
	{From: anatomy.Placed, To: anatomy.Seen}:      {"the application sees the new value in the last byte of its buffer. An RDMA Write makes no completion at its target: the application polls memory, and how soon it looks is up to its loop and the scheduler.", true},
}

// anatomyPart runs the lesson's application on the part's RNICs: the
// ping-pong with both recorders on, then the anatomy into the view and,
// as steps, onto appW.
func (r *demoRun) anatomyPart(w, appW io.Writer, cli, srv *rnic.RNIC, srvAddr netip.Addr) error {
	fmt.Fprintf(appW, "1. ib_write_lat siwtun0 -> siwtun1: %d RDMA Writes of 4 bytes each way, every hop stamped\n", anatomyIters)
	fmt.Fprintln(appW, "   perftest's ping-pong: siwtun0's application writes its counter into the last byte of siwtun1's buffer; siwtun1's, polling that byte, sees it and writes back. Both RNICs stamp each message at every hop into a ring (CLOCK_MONOTONIC, one clock in one host); the applications stamp their posts and sights. The ladder shows the Writes (24-octet FPDUs: MPA length, DDP tagged header, 4 octets, CRC) and perftest's own TCP control connection.")
	an, err := pingPongAnatomy(w, cli, srv, srvAddr)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("siwtun0:%d <-> siwtun1:%d", an.Dirs[0].Flow.Src, an.Dirs[0].Flow.Dst)
	r.view.setAnatomy(web.Anatomy{Conns: []web.AnatomyConn{web.AnatomyConnOf(title, an, pipeLegName)}})
	fmt.Fprintf(w, "\nanatomy of the round trip (in one process, over an in-memory link):\n%s\n", an.Table(pipeLegName))
	teachAnatomy(appW, an)
	return nil
}

// pingPongAnatomy runs ib_write_lat between the RNICs (siwtun0 the
// client) with their recorders on from the first message, and assembles
// the stamps.
func pingPongAnatomy(w io.Writer, cli, srv *rnic.RNIC, srvAddr netip.Addr) (anatomy.Anatomy, error) {
	recs := [2]*anatomy.Recorder{cli.Stack.Anatomy(), srv.Stack.Anatomy()}
	start := func(netip.AddrPort, netip.AddrPort) error {
		recs[0].Start()
		recs[1].Start()
		return nil
	}
	stamps := [2]*perftest.Stamps{{Clock: anatomy.Now, Start: start}, {Clock: anatomy.Now}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var errs [2]error
	var outs [2]strings.Builder
	run := func(i int) {
		defer wg.Done()
		cfg := perftest.Config{Verb: perftest.Write, Latency: true, Size: 4, Iters: anatomyIters, Inline: 0, Stamps: stamps[i],
			ConnectRetries: 100, ConnectRetryDelay: 20 * time.Millisecond}
		if i == 0 {
			_, errs[i] = perftest.RunClient(ctx, cli.Device, netip.AddrPortFrom(srvAddr, anatomyPort), cfg, &outs[i])
		} else {
			_, errs[i] = perftest.RunServer(ctx, srv.Device, anatomyPort, cfg, &outs[i])
		}
		if errs[i] != nil {
			cancel()
		}
	}
	wg.Add(2)
	go run(1)
	go run(0)
	wg.Wait()
	recs[0].Stop()
	recs[1].Stop()
	if errs[0] != nil || errs[1] != nil {
		return anatomy.Anatomy{}, fmt.Errorf("ib_write_lat: client %v, server %v", errs[0], errs[1])
	}
	fmt.Fprintf(w, "\n%s", outs[0].String())
	var sides [2]anatomy.Side
	for i, name := range []string{"siwtun0", "siwtun1"} {
		st := stamps[i]
		sides[i] = anatomy.Side{Name: name, Records: append(recs[i].Snapshot().Records, appStamps(st)...)}
	}
	flow := anatomy.Flow{Src: stamps[0].Local.Port(), Dst: stamps[0].Remote.Port()}
	return anatomy.Assemble(sides[0], sides[1], flow), nil
}

// appStamps are an application's stamps as records of its connection's
// flows: its posts out, its sights in.
func appStamps(st *perftest.Stamps) []anatomy.Record {
	out := anatomy.Flow{Src: st.Local.Port(), Dst: st.Remote.Port()}
	var recs []anatomy.Record
	for _, t := range st.Posts {
		recs = append(recs, anatomy.Record{Hop: anatomy.Post, SrcPort: out.Src, DstPort: out.Dst, T: t})
	}
	for _, t := range st.Seen {
		recs = append(recs, anatomy.Record{Hop: anatomy.Seen, SrcPort: out.Dst, DstPort: out.Src, T: t})
	}
	return recs
}

// anatomyStages group the legs for the lesson's steps: the sender's
// RNIC, the wire, the receiver's RNIC, the application.
var anatomyStages = []struct {
	title string
	legs  []anatomy.Leg
}{
	{"the sending RNIC: from the post to a TCP segment", anatomy.Legs[:4]},
	{"the wire: from one RNIC's link to the other's", anatomy.Legs[4:6]},
	{"the receiving RNIC: from the segment to the placed payload", anatomy.Legs[6:9]},
	{"the receiving application", anatomy.Legs[9:]},
}

// teachAnatomy writes the lesson's steps about the anatomy an: each
// stage's legs with what they are and what they took (siwtun0 -> siwtun1,
// the other way in brackets), then the big ones and why.
func teachAnatomy(w io.Writer, an anatomy.Anatomy) {
	d0, d1 := an.Dirs[0], an.Dirs[1]
	for k, st := range anatomyStages {
		fmt.Fprintf(w, "%d. %s\n", k+2, st.title)
		for _, l := range st.legs {
			i := slices.Index(anatomy.Legs, l)
			fmt.Fprintf(w, "   %s → %s: median %s µs (%s the other way), p99 %s µs — %s\n", l.From, l.To,
				usFig(d0.Legs[i].Median), usFig(d1.Legs[i].Median), usFig(d0.Legs[i].P99), legTeaching[l].text)
		}
	}
	fmt.Fprintf(w, "%d. the big ones, and why\n", len(anatomyStages)+2)
	for _, line := range bigOnes(an) {
		fmt.Fprintf(w, "   %s\n", line)
	}
}

// bigOnes says which legs of siwtun0 -> siwtun1 took longest, how the
// hand-offs between goroutines weigh against the RNIC's own work, and
// why.
func bigOnes(an anatomy.Anatomy) []string {
	d := an.Dirs[0]
	legs := slices.Clone(d.Legs[:len(anatomy.Legs)])
	slices.SortStableFunc(legs, func(a, b anatomy.Stat) int { return int(b.Median - a.Median) })
	var top []string
	for _, s := range legs[:3] {
		top = append(top, fmt.Sprintf("%s → %s (%s µs)", s.Leg.From, s.Leg.To, usFig(s.Median)))
	}
	var hand, work time.Duration
	for _, s := range d.Legs[:len(anatomy.Legs)] {
		if legTeaching[s.Leg].handoff {
			hand += s.Median
		} else {
			work += s.Median
		}
	}
	oneWay, rt := d.Legs[len(anatomy.Legs)], an.RoundTrip
	out := []string{
		fmt.Sprintf("The largest legs siwtun0 -> siwtun1 were %s, of a one-way trip of %s µs (median; the round trip %s µs, p99 %s µs).", strings.Join(top, ", "), usFig(oneWay.Median), usFig(rt.Median), usFig(rt.P99)),
		fmt.Sprintf("The legs that hand the message from one goroutine to another (pickup → tx, the link, tun-read → queued, queued → handover, placed → seen) add up to %s µs of medians; the RNIC's own work (building the FPDU, TCP, parsing and placing) to %s µs.", usFig(hand), usFig(work)),
	}
	if hand > work {
		out = append(out, "So the time goes to wake-ups, not work: each hand-off makes a parked goroutine runnable, and it must then get a processor (on a busy machine, an operating-system thread's turn). A hardware RNIC has no such hand-offs: its stages are a pipeline in silicon, and its round trip takes a few microseconds.")
	} else {
		out = append(out, "In this run the work weighed more than the wake-ups (idle cores make a wake-up cheap); on a busy machine every hand-off waits for a processor, and the hand-offs grow first. A hardware RNIC has no such hand-offs: its stages are a pipeline in silicon.")
	}
	out = append(out, "The 99th percentiles are far above the medians for the same reason: any hand-off can wait for a processor. With two siwtun up daemons the wire is the kernel's TUN devices and the largest leg (doc/latency-anatomy.md); siwtun web's Record button takes their round trips apart the same way.")
	return out
}

// usFig formats d in microseconds with one decimal.
func usFig(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Microsecond)) }

// setAnatomy puts a on the view. Nothing for a nil view.
func (v *demoView) setAnatomy(a web.Anatomy) {
	if v == nil {
		return
	}
	v.b.SetAnatomy(a)
}
