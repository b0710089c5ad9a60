package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/internal/netns"
	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/verbs"
)

type demoOptions struct {
	mtu     int
	size    int
	rev     uint8
	crc     bool
	markers bool
	wire    bool
	imp     string
	inProc  bool
	pcap    string
	html    string // write the view here (demo_view.go)
	serve   string // serve the view live here
	pace    time.Duration
	lesson  *lesson // the lesson being run (lesson.go), or nil
	config  func(*offload.Config)
	app     func(w io.Writer, cdev, sdev *verbs.Device, srv netip.Addr, size int) (*verbs.QP, error)
	// gate, if set, sees every TCP segment siwtun1 receives and may damage
	// it (a lesson's fault: netstack.Gate).
	gate netstack.GateRule
	// anatomy runs, instead of the application, the anatomy lesson's
	// ping-pong with the RNICs' recorders of hop stamps on
	// (lesson_anatomy.go).
	anatomy bool
}

func newDemoCmd() *cobra.Command {
	o := demoOptions{}
	var lessonName string
	cmd := &cobra.Command{
		Use:   "demo [--lesson [NAME]]",
		Short: "Run two RNICs and show a Send, an RDMA Write and an RDMA Read",
		Long: `demo runs two RNICs and a verbs application that connects a queue pair
across them and does a Send, an RDMA Write and an RDMA Read with every byte
verified.

As root, it creates a private network namespace with two TUN devices
(siwtun0, siwtun1), each served by its own siwtun up process, routed by the
namespace's kernel; the application uses them through their verbs sockets.
Everything is removed at the end.

With --in-process (and whenever the namespace version cannot run), both
RNICs live in this process, joined by an in-memory link (no root, no TUN),
and demo prints what crossed the wire, segment by segment.

--html FILE writes the in-process run's web view (the ladder of segments,
each segment's byte map, the memory strips, the queue pairs; see siwtun
web) as one self-contained file; --serve ADDR shows it live in a browser.
--lesson NAME runs one of the guided lessons (--lesson alone lists them).`,
		Args: cobra.MaximumNArgs(1), // the lesson's name after --lesson
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			if err := offload.CheckMTU(o.mtu, nil); err != nil {
				return fmt.Errorf("--mtu: %w", err)
			}
			if cmd.Flags().Changed("lesson") {
				if len(args) == 1 && lessonName == lessonList {
					lessonName = args[0]
				} else if len(args) == 1 {
					return fmt.Errorf("demo: unexpected argument %q", args[0])
				}
				return runLesson(w, o, lessonName)
			}
			if len(args) > 0 {
				return fmt.Errorf("demo: unexpected argument %q", args[0])
			}
			if !o.inProc && o.pcap == "" && o.html == "" && o.serve == "" {
				err := netns.CanRun()
				if err == nil {
					return runNetnsDemo(w, o)
				}
				fmt.Fprintf(w, "(the two-daemon demo %v; running both RNICs in this process instead)\n\n", err)
			}
			return runDemo(w, o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.mtu, "mtu", 1500, "link MTU")
	f.IntVar(&o.size, "size", 4096, "bytes per RDMA Write and Read")
	f.Uint8Var(&o.rev, "mpa-rev", 2, "MPA revision (1 or 2)")
	switchVar(f, &o.crc, "crc", true, "request MPA CRC32c: on or off (--crc off, --crc=off; --crc alone is on)")
	switchVar(f, &o.markers, "markers", false, "ask for MPA markers in both directions: on or off (--markers alone is on)")
	f.BoolVar(&o.wire, "wire", true, "print every TCP segment that carries iWARP data")
	f.StringVar(&o.imp, "impair", "", "link impairments, e.g. loss=1%,reorder=2%,seed=7 (in-process)")
	f.BoolVar(&o.inProc, "in-process", false, "run both RNICs in this process over an in-memory link")
	f.StringVarP(&o.pcap, "write", "w", "", "write the in-process demo's segments to this pcapng file (implies --in-process)")
	addDemoViewFlags(cmd, &o)
	addLessonFlag(cmd, &lessonName)
	return cmd
}

// wireLog prints each TCP segment of the demo connection, decoding MPA
// frames and aligned FPDUs.
type wireLog struct {
	mu      sync.Mutex
	w       io.Writer
	start   time.Time
	markers bool
	names   map[netip.Addr]string
	on      bool
	an      *inspect.Analyzer
	pcap    *demoPcap // with -w
}

func (l *wireLog) Segment(s *netstack.Segment) {
	if s.Dir != netstack.Outbound {
		return // each segment once: as its sender sends it
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// The checker sees every segment (control ones too), so it knows each
	// stream's start and the markers' positions.
	reports := l.an.Add(inspect.Segment{Src: s.Src, Dst: s.Dst, Seq: s.Seq, Flags: s.Flags, Payload: s.Payload})
	l.pcap.write(s, reports)
	if !l.on || len(s.Payload) == 0 {
		return
	}
	fmt.Fprintf(l.w, "  %8.3fms  %s -> %s  seq %d len %d\n", float64(time.Since(l.start).Microseconds())/1000,
		l.names[s.Src.Addr()], l.names[s.Dst.Addr()], s.Seq, len(s.Payload))
	lines := describe(s.Payload, l.markers)
	if l.markers {
		lines = describeReports(reports)
	}
	for _, line := range lines {
		fmt.Fprintf(l.w, "              %s\n", line)
	}
}

// describe decodes the iWARP content of one segment payload.
func describe(p []byte, markers bool) []string {
	if f, err := mpa.ParseFrame(p); err == nil {
		return []string{f.String()}
	}
	if markers {
		return []string{"FPDU data (markers inside; see siwtun trace)"}
	}
	var out []string
	for len(p) >= 2 {
		n := int(binary.BigEndian.Uint16(p))
		total := 2 + n + (4-(2+n)%4)%4 + 4
		if n < ddp.TaggedHeaderLen || total > len(p) {
			out = append(out, fmt.Sprintf("FPDU continues (%d bytes)", len(p)))
			break
		}
		var h ddp.Header
		if _, err := h.Unmarshal(p[2 : 2+n]); err != nil {
			break
		}
		_, op := rdmap.ParseCtrl(h.ULPCtrl)
		crc := binary.LittleEndian.Uint32(p[total-4:])
		line := fmt.Sprintf("FPDU %-14v len %-5d %v crc %08x", op, n, h, crc)
		if op == rdmap.OpReadRequest && n >= ddp.UntaggedHeaderLen+rdmap.ReadRequestLen {
			var rr rdmap.ReadRequest
			if rr.Unmarshal(p[2+ddp.UntaggedHeaderLen:]) == nil {
				line += fmt.Sprintf(" [%v]", rr)
			}
		}
		if (op == rdmap.OpImmediate || op == rdmap.OpImmediateSE) && !h.Tagged && n >= ddp.UntaggedHeaderLen+rdmap.ImmediateDataLen {
			var m rdmap.Immediate
			if m.Unmarshal(p[2+ddp.UntaggedHeaderLen:]) == nil {
				line += fmt.Sprintf(" [%v]", m)
			}
		}
		if op == rdmap.OpAtomicRequest && !h.Tagged && n >= ddp.UntaggedHeaderLen+rdmap.AtomicRequestLen {
			var m rdmap.AtomicRequest
			if m.Unmarshal(p[2+ddp.UntaggedHeaderLen:]) == nil {
				line += fmt.Sprintf(" [%v]", m)
			}
		}
		if op == rdmap.OpAtomicResponse && !h.Tagged && n >= ddp.UntaggedHeaderLen+rdmap.AtomicResponseLen {
			var m rdmap.AtomicResponse
			if m.Unmarshal(p[2+ddp.UntaggedHeaderLen:]) == nil {
				line += fmt.Sprintf(" [%v]", m)
			}
		}
		out = append(out, line)
		p = p[total:]
	}
	return out
}

// runDemo runs the in-process demo, or a lesson: each of the lesson's
// parts (one part for the demo) on two RNICs of their own, one after the
// other, into one view.
func runDemo(w io.Writer, o demoOptions) error {
	var r demoRun
	if o.pcap != "" {
		p, err := newDemoPcap(o.pcap)
		if err != nil {
			return err
		}
		defer p.close(w)
		r.pcap = p
	}
	parts := []lessonPart{{}}
	if o.lesson != nil && len(o.lesson.parts) > 0 {
		parts = o.lesson.parts
	}
	for i, p := range parts {
		po := o
		if p.set != nil {
			p.set(&po) // the part's link and RNIC settings (lesson.go)
		}
		if err := r.part(w, po, i, p); err != nil {
			return err
		}
	}
	return r.view.close(w, o)
}

// demoRun is what the parts of one demo run share: the pcapng file (-w)
// and the view (nil without --html or --serve), with the writer the
// application tells its steps to.
type demoRun struct {
	pcap *demoPcap
	view *demoView
	appW io.Writer
}

// part runs part i of the demo: two RNICs joined by an in-memory link
// (siwtun0 at 198.18.0.1 and siwtun1 at .2 in the first part, .3 and .4
// in the second, and so on: the view tells the parts' connections apart),
// the application, and the disconnect.
func (r *demoRun) part(w io.Writer, o demoOptions, i int, p lessonPart) error {
	imp, err := netstack.ParseImpairments(o.imp)
	if err != nil {
		return err
	}
	cliAddr := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(2*i + 1)}), 24)
	srvAddr := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(2*i + 2)}), 24)
	log := &wireLog{w: w, markers: o.markers, names: map[netip.Addr]string{cliAddr.Addr(): "siwtun0", srvAddr.Addr(): "siwtun1"}, on: o.wire, an: inspect.New(), pcap: r.pcap}
	cli, srv, err := newDemoRNICs(o, imp, log, cliAddr, srvAddr)
	if err != nil {
		return err
	}
	defer cli.Close()
	defer srv.Close()
	if p.title != "" {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s\n", p.title)
	}
	fmt.Fprintf(w, "siwtun demo: two RNICs in one process, joined by an in-memory link (MTU %d", o.mtu)
	if o.imp != "" {
		fmt.Fprintf(w, ", impairments %v", imp)
	}
	fmt.Fprintf(w, ")\n  siwtun0 %v   <->   siwtun1 %v\n\n", cliAddr.Addr(), srvAddr.Addr())

	log.start = time.Now()
	engs := [2]*offload.Device{cli.Engine, srv.Engine}
	if i == 0 {
		r.appW, r.view, err = startDemoViewFor(w, o, engs)
		if err != nil {
			return err
		}
	} else {
		r.view.attach(engs)
	}
	defer r.view.detach() // before the engines close
	if p.title != "" {
		r.view.step(p.title, p.text)
	}
	if o.anatomy {
		err = r.anatomyPart(w, r.appW, cli, srv, srvAddr.Addr())
	} else {
		err = runPartApp(w, r.appW, o, cli.Device, srv.Device, srvAddr.Addr())
	}
	if err != nil {
		return err
	}
	log.mu.Lock()
	log.on = false
	log.mu.Unlock()
	writeDemoStats(w, o, cli.Engine, srv.Engine)
	return nil
}

// newDemoRNICs makes a part's two RNICs, joined by an in-memory link with
// the impairments imp (and o's gate), their segments logged by log.
func newDemoRNICs(o demoOptions, imp netstack.Impairments, log *wireLog, cliAddr, srvAddr netip.Prefix) (cli, srv *rnic.RNIC, err error) {
	la, lb := netstack.Pipe(o.mtu, imp)
	if o.gate != nil {
		var g *netstack.Gate
		lb, g = netstack.NewGate(lb)
		g.SetRule(o.gate)
	}
	newRNIC := func(link *netstack.Link, addr netip.Prefix, name string) (*rnic.RNIC, error) {
		cfg := offload.DefaultConfig(name)
		cfg.MPARev, cfg.CRC, cfg.Markers = o.rev, o.crc, o.markers
		if o.config != nil {
			o.config(&cfg) // a lesson's settings (lesson.go)
		}
		return rnic.New(link, rnic.Config{Stack: netstack.Options{Addrs: []netip.Prefix{addr}, MTU: o.mtu, Hook: log}, Engine: cfg})
	}
	if cli, err = newRNIC(la, cliAddr, "siwtun0"); err != nil {
		return nil, nil, err
	}
	if srv, err = newRNIC(lb, srvAddr, "siwtun1"); err != nil {
		cli.Close()
		return nil, nil, err
	}
	return cli, srv, nil
}

// runPartApp runs a part's application (the demo's, or a lesson's), its
// steps told to appW, and disconnects.
func runPartApp(w, appW io.Writer, o demoOptions, cdev, sdev *verbs.Device, srv netip.Addr) error {
	app := runApp
	if o.app != nil {
		app = o.app // a lesson's application (lesson.go)
	}
	c, err := app(appW, cdev, sdev, srv, o.size)
	if err != nil {
		return err
	}
	if o.app == nil {
		fmt.Fprintf(w, "5. disconnect\n")
	} else {
		fmt.Fprintf(w, "then disconnect\n")
	}
	c.Disconnect()
	return nil
}

// writeDemoStats prints what the two engines counted.
func writeDemoStats(w io.Writer, o demoOptions, cli, srv *offload.Device) {
	st := cli.Stats()
	ss := srv.Stats()
	fmt.Fprintf(w, "\nsiwtun0: %d FPDUs out (%d bytes), %d in; siwtun1: %d FPDUs out, %d in, %d bytes placed; CRC errors %d\n",
		st.FPDUsTx.Load(), st.BytesTx.Load(), st.FPDUsRx.Load(), ss.FPDUsTx.Load(), ss.FPDUsRx.Load(), ss.PlacedBytes.Load()+st.PlacedBytes.Load(), st.CRCErrors.Load()+ss.CRCErrors.Load())
	if o.app == nil {
		fmt.Fprintln(w, strings.Repeat("-", 8), "all data verified")
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
