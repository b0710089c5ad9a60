package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// lesson is a scripted in-process run that writes the web view with a
// short text per step: what to look at, and where.
type lesson struct {
	name, summary string
	// intro is the first step's text; notes add text to the steps whose
	// title starts with the key ("3." for the third).
	intro string
	notes map[string]string
	// set, if not nil, changes the demo's options (MTU, markers,
	// impairments, the application, the engines' configuration).
	set func(o *demoOptions)
	// parts, when set, run the application once per part, each on two
	// RNICs of its own set up as the part says, one after the other into
	// the same view: the way to compare settings that a running RNIC
	// cannot change (its MPA revision and CRC, its link's MTU).
	parts []lessonPart
}

// lessonPart is one part of a lesson: a step of the view titled title
// with text, before the part's application runs with set's options.
type lessonPart struct {
	title, text string
	set         func(o *demoOptions)
}

// lessons are the lessons of `siwtun demo --lesson`, in teaching order.
var lessons = []lesson{
	{
		name: "negotiation", summary: "MPA Request/Reply: revision 1 vs 2, CRC off and on, IRD/ORD, peer-to-peer RTR",
		intro: "Two connections between the same two RNICs, set up differently: the first at MPA revision 1 (RFC 5044) without CRC, the second at revision 2 (RFC 6581) with CRC and peer-to-peer mode. Choose each MPA Req arrow, then its MPA Rep: the byte map shows the key, the flags byte (M markers, C CRC, R reject), the revision, PD_Length and, at revision 2 only, RFC 6581's IRD/ORD block with the P2P bit and the RTR types. The negotiation table below sums up what each side sent and what was agreed; the queue pairs' cards show the result (rev, CRC, markers each way, IRD/ORD, the RTR type).",
		notes: map[string]string{"1.": "The TCP handshake, then the MPA Request (initiator) and Reply (responder): RFC 5044 §7.1, RFC 6581."},
		parts: []lessonPart{
			{
				title: "Revision 1, CRC off: an RFC 5044 Request and Reply",
				text:  "Both RNICs speak MPA revision 1 and ask for no CRC. The Request and Reply say Rev 1 with C clear and carry no IRD/ORD block: PD_Length counts the application's private data alone, each side keeps its configured IRD and ORD without telling the other, and there is no peer-to-peer mode, so the initiator's first FPDU is its Send, and the responder sends no FPDU before that one has arrived (RFC 5044 §7.1.2). Without CRC every FPDU still ends in the 4-octet CRC field, which the receiver does not check (the byte map says not negotiated).",
				set: func(o *demoOptions) {
					o.rev, o.crc = 1, false
				},
			},
			{
				title: "Revision 2, CRC on, peer-to-peer RTR: an RFC 6581 Request and Reply",
				text:  "The RNICs are set up again (new addresses) at MPA revision 2 with CRC and peer-to-peer mode. The Request's private data begins with RFC 6581's IRD/ORD block: the initiator's IRD and ORD, the P2P bit and the RTR types it offers; the Reply answers with its own IRD/ORD and picks one RTR type. C is set, so every FPDU now ends in a CRC32c the receiver checks (the byte map says good). The initiator's first FPDU after the Reply is the zero-length RTR, here an RDMA Write of no octets: the responder waits for it before it sends anything.",
				set: func(o *demoOptions) {
					o.rev, o.crc = 2, true
					o.config = func(c *offload.Config) { c.P2P = mpa.RTRWrite }
				},
			},
		},
	},
	{
		name: "markers", summary: "MPA markers every 512 octets of the stream and their FPDUPTR, at MTU 1500 and 9000",
		intro: "Both sides asked for markers (M set in Request and Reply). Choose an RDMA Write segment: every 512 octets of the FPDU stream (counted from the first FPDU octet after the MPA frames) sits a 4-octet Marker whose FPDUPTR points back to the header of the FPDU it is in; the arrows above the byte map draw those pointers. The stream position line tells where the segment starts in that stream, which is why its markers fall where they do. The same transfer runs twice: over a link of MTU 1500, then of MTU 9000.",
		set: func(o *demoOptions) {
			o.markers = true
			o.size = 16384
		},
		parts: []lessonPart{
			{
				title: "MTU 1500: two or three Markers per FPDU",
				text:  "At MTU 1500 an FPDU fills one TCP segment of about 1,400 octets (the queue pair's EMSS), so each holds two or three Markers, and an FPDUPTR is never more than that back from its Marker.",
				set:   func(o *demoOptions) { o.mtu = 1500 },
			},
			{
				title: "MTU 9000: 17 or 18 Markers per FPDU",
				text:  "The RNICs are set up again (new addresses) on a link of MTU 9000: an FPDU now fills a segment of 8,920 octets and carries 17 or 18 Markers, one every 512 octets of the stream, their FPDUPTRs pointing back as far as nearly 9,000 octets to the same FPDU header. The Markers cost the same 4 octets per 512 either way.",
				set:   func(o *demoOptions) { o.mtu = 9000 },
			},
		},
	},
	{
		name: "placement", summary: "RDMA Write and Read: payload placed straight into registered memory (zero copy)",
		intro: "Each FPDU's DDP header names a region (STag) and an offset in it (Tagged Offset): the receiving RNIC copies the payload straight into the application's memory, once, with no receive buffer in between. Choose the Write segments one by one and watch siwtun1's memory strip fill (only up to the chosen segment); the Read Responses fill siwtun0's sink the same way. The strip's header shows the region's bounds and access rights.",
		set:   func(o *demoOptions) { o.size = 16384 },
	},
	{
		name: "out-of-order", summary: "loss and reorder: tagged payload placed ahead of the gap, placed again when it fills",
		intro: "The link drops 3% and reorders 5% of the packets (seeded: the run repeats). A segment that arrives after a gap is marked OUT OF ORDER; its RDMA Write or Read Response payload is still placed at once (hatched in the memory strip), because the DDP header says where it goes. When the retransmission fills the gap, TCP delivers the octets in order and they are placed again (outlined): idempotent, and completions still come in order. Segments one end sent and the other never received are marked DROPPED (a cross). Press f to jump to the next flagged segment.",
		set: func(o *demoOptions) {
			o.size = 262144
			o.imp = "loss=3%,reorder=5%,seed=7"
		},
	},
	{
		name: "terminate", summary: "three broken rules, three Terminates: an STag that names no region, a Write beyond a region, a bad CRC",
		intro: "Three connections, each ended by the server's Terminate (RFC 5040 §7) with the rule it broke. First the client writes to STag 0xdead00, which the server never registered: DDP tagged buffer error, invalid STag (RFC 5041 §7.2). Then it writes 128 octets into a 64-octet region: DDP tagged buffer error, base or bounds violation. Last, a Send whose FPDU the link damages on the way (the TCP checksum still good, as when a link's error slips past TCP): the MPA CRC catches it (RFC 5044 §8, LLP error, CRC error). Each Terminate copies the offending header where the rule asks for it; both queue pairs go to ERR and outstanding work is flushed. Choose a Terminate arrow: its byte map shows the Terminate control field and the copied header, and the Terminates section names the rule.",
		set: func(o *demoOptions) {
			o.app = faultApp("bad-stag", "out-of-bounds", "bad-crc")
			o.gate = corruptNth(faultPort(2), 2) // the third connection's first FPDU after the MPA Request
		},
	},
	{
		name: "credits", summary: "a Send with no receive posted: RDMAP has no flow control of its own",
		intro: "iWARP Sends consume a posted receive at the peer; there is no credit scheme in the protocol, so the application must post receives before the peer sends (perftest sends credits itself with RDMA Writes). Here the server posts none: the Send arrives, DDP finds no buffer for queue 0 (RFC 5041 §7.2: untagged buffer error, no buffer available, 0x02) and the server terminates the stream.",
		set:   func(o *demoOptions) { o.app = faultApp("no-receive") },
	},
	{
		name: "anatomy", summary: "a 4-byte RDMA Write round trip taken apart hop by hop: where an RNIC's time goes, and why",
		intro: "An RDMA Write is placed by the RNIC into the target's memory without the target's CPU, but on its way it passes many hands. Here siwtun0 and siwtun1 play perftest's ib_write_lat ping-pong with every hop stamped: the application's post, the RNIC taking the request, the TX goroutine, the FPDU built, TCP's segment, the link, the peer's TCP, its RX goroutine, the FPDU parsed and placed, the peer application's sight of it. The anatomy section (right, at the bottom) shows each leg's median and 99th percentile in each direction, with a bar per leg; the steps below walk through the legs, what each is in an RNIC and what it took in this run, and end with the big ones and why. Choose a Write arrow in the ladder: its byte map is the whole 24-octet FPDU that crossed.",
		set: func(o *demoOptions) {
			o.anatomy = true
		},
	},
}

// addLessonFlag adds --lesson.
func addLessonFlag(cmd interface{ Flags() *pflag.FlagSet }, name *string) {
	f := cmd.Flags()
	f.StringVar(name, "lesson", "", "run a guided lesson and write its view (--html, default siwtun-lesson-NAME.html); --lesson alone (or --lesson list) lists them")
	f.Lookup("lesson").NoOptDefVal = lessonList
}

// lessonList is the --lesson value that lists the lessons (what --lesson
// alone means).
const lessonList = "list"

// runLesson runs the lesson name, or lists the lessons.
func runLesson(w io.Writer, o demoOptions, name string) error {
	name = strings.TrimSpace(name)
	if name == "" || name == lessonList {
		fmt.Fprintln(w, "lessons (siwtun demo --lesson NAME [--html FILE]):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, l := range lessons {
			fmt.Fprintf(tw, "  %s\t%s\n", l.name, l.summary)
		}
		return tw.Flush()
	}
	for i := range lessons {
		l := &lessons[i]
		if l.name != name {
			continue
		}
		o.inProc, o.wire, o.lesson = true, false, l
		if o.html == "" && o.serve == "" {
			o.html = "siwtun-lesson-" + l.name + ".html"
		}
		if l.set != nil {
			l.set(&o)
		}
		fmt.Fprintf(w, "lesson %s: %s\n\n", l.name, l.summary)
		return runDemo(w, o)
	}
	var names []string
	for _, l := range lessons {
		names = append(names, l.name)
	}
	return fmt.Errorf("no lesson %q (lessons: %s)", name, strings.Join(names, ", "))
}

// faultPort is the server port of a fault application's i-th connection.
func faultPort(i int) uint16 { return 7174 + uint16(i) }

// corruptNth returns a Gate rule that damages the n-th TCP segment with a
// payload sent to port (the first is the MPA Request), once.
func corruptNth(port uint16, n int) netstack.GateRule {
	seen := 0
	return func(s *netstack.Segment) netstack.GateVerdict {
		if s.Dst.Port() != port || s.Len == 0 {
			return netstack.GatePass
		}
		seen++
		if seen == n {
			return netstack.GateCorrupt
		}
		return netstack.GatePass
	}
}

// faultApp returns a demo application that, for each fault, connects a
// queue pair (the i-th on port faultPort(i)) and breaks a rule: "bad-stag"
// writes to an STag the server never registered, "out-of-bounds" writes
// past the end of a region, "bad-crc" sends a message whose FPDU the link
// damages (the lesson's Gate), "no-receive" sends with no receive posted.
// It waits for each client queue pair to leave RTS, tells what it saw, and
// returns the last one.
func faultApp(faults ...string) func(io.Writer, *verbs.Device, *verbs.Device, netip.Addr, int) (*verbs.QP, error) {
	return func(w io.Writer, cdev, sdev *verbs.Device, srv netip.Addr, size int) (*verbs.QP, error) {
		var last *verbs.QP
		for i, fault := range faults {
			qp, err := runFault(w, cdev, sdev, srv, faultPort(i), fault, 2*i+1)
			if err != nil {
				return nil, err
			}
			last = qp
		}
		return last, nil
	}
}

// runFault connects one queue pair on port, breaks the rule fault and
// waits for the Terminate to end it; step numbers its output.
func runFault(w io.Writer, cdev, sdev *verbs.Device, srv netip.Addr, port uint16, fault string, step int) (*verbs.QP, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, s, err := newDemoEnds(cdev, sdev)
	if err != nil {
		return nil, err
	}
	at := netip.AddrPortFrom(srv, port)
	l, err := sdev.Listen(at, 1)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if _, err := connectDemo(ctx, w, step, l, at, c, s, verbs.ConnParam{InitiatorDepth: 4, ResponderResources: 4}, verbs.ConnParam{}); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "   established\n\n")
	_, mr, err := c.region(128, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	var wr verbs.SendWR
	switch fault {
	case "bad-stag":
		fmt.Fprintf(w, "%d. RDMA Write 64 bytes to rkey 0x00dead00, which names no region at siwtun1\n", step+1)
		wr = verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{mr.SGE(0, 64)}, RemoteAddr: 0x1000, RKey: 0xdead00}
	case "out-of-bounds":
		_, dst, err := s.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(w, "%d. RDMA Write 128 bytes into siwtun1's 64-byte region (rkey 0x%08x)\n", step+1, dst.RKey())
		wr = verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{mr.SGE(0, 128)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}
	case "bad-crc":
		_, rmr, err := s.region(64, verbs.AccessLocalWrite)
		if err != nil {
			return nil, err
		}
		if _, err := s.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{rmr.SGE(0, 64)}}}); err != nil {
			return nil, err
		}
		fmt.Fprintf(w, "%d. Send 64 bytes; the link damages its FPDU on the way (TCP's checksum fixed up)\n", step+1)
		wr = verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{mr.SGE(0, 64)}}
	default:
		fmt.Fprintf(w, "%d. Send 64 bytes; siwtun1 has posted no receive\n", step+1)
		wr = verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{mr.SGE(0, 64)}}
	}
	if _, err := c.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		return nil, err
	}
	for c.qp.State() != verbs.QPErr {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: the queue pair stayed in %v", fault, c.qp.State())
		}
		time.Sleep(time.Millisecond)
	}
	fmt.Fprintf(w, "   siwtun1 terminated the stream: siwtun0's queue pair is in %v\n\n", c.qp.State())
	return c.qp, nil
}
