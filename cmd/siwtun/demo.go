package main

import (
	"bytes"
	"context"
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
	cli, err := newRNIC(la, cliAddr, "siwtun0")
	if err != nil {
		return err
	}
	defer cli.Close()
	srv, err := newRNIC(lb, srvAddr, "siwtun1")
	if err != nil {
		return err
	}
	defer srv.Close()
	cdev, sdev := cli.Device, srv.Device

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
	app := runApp
	if o.app != nil {
		app = o.app // a lesson's application (lesson.go)
	}
	c, err := app(r.appW, cdev, sdev, srvAddr.Addr(), o.size)
	if err != nil {
		return err
	}
	if o.app == nil {
		fmt.Fprintf(w, "5. disconnect\n")
	} else {
		fmt.Fprintf(w, "then disconnect\n")
	}
	c.Disconnect()
	log.mu.Lock()
	log.on = false
	log.mu.Unlock()
	st := cli.Engine.Stats()
	ss := srv.Engine.Stats()
	fmt.Fprintf(w, "\nsiwtun0: %d FPDUs out (%d bytes), %d in; siwtun1: %d FPDUs out, %d in, %d bytes placed; CRC errors %d\n",
		st.FPDUsTx.Load(), st.BytesTx.Load(), st.FPDUsRx.Load(), ss.FPDUsTx.Load(), ss.FPDUsRx.Load(), ss.PlacedBytes.Load()+st.PlacedBytes.Load(), st.CRCErrors.Load()+ss.CRCErrors.Load())
	if o.app == nil {
		fmt.Fprintln(w, strings.Repeat("-", 8), "all data verified")
	}
	return nil
}

// demoEnd is one side of a demo application's connection: on dev a PD, a
// send and a receive CQ and a QP in INIT.
type demoEnd struct {
	dev      *verbs.Device
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	qp       *verbs.QP
}

// newDemoEnd creates a demoEnd on d.
func newDemoEnd(d *verbs.Device) (*demoEnd, error) {
	pd, err := d.AllocPD()
	if err != nil {
		return nil, err
	}
	scq, err := d.CreateCQ(64)
	if err != nil {
		return nil, err
	}
	rcq, err := d.CreateCQ(64)
	if err != nil {
		return nil, err
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		return nil, err
	}
	if err := qp.Modify(verbs.QPInit); err != nil {
		return nil, err
	}
	return &demoEnd{d, pd, scq, rcq, qp}, nil
}

// region allocates n bytes on the end's device and registers them with
// access.
func (e *demoEnd) region(n int, access verbs.Access) ([]byte, *verbs.MR, error) {
	buf, err := e.dev.AllocBuffer(n)
	if err != nil {
		return nil, nil, err
	}
	buf = buf[:n]
	mr, err := e.pd.RegMR(buf, access)
	if err != nil {
		return nil, nil, err
	}
	return buf, mr, nil
}

// newDemoEnds creates the client's demoEnd on cdev and the server's on
// sdev.
func newDemoEnds(cdev, sdev *verbs.Device) (c, s *demoEnd, err error) {
	if c, err = newDemoEnd(cdev); err != nil {
		return nil, nil, err
	}
	if s, err = newDemoEnd(sdev); err != nil {
		return nil, nil, err
	}
	return c, s, nil
}

// acceptOne accepts the first connection request on l into qp with p, in
// a goroutine; the channel gives the result.
func acceptOne(ctx context.Context, l *verbs.Listener, qp *verbs.QP, p verbs.ConnParam) <-chan error {
	acc := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			acc <- err
			return
		}
		acc <- req.Accept(qp, p)
	}()
	return acc
}

// connectDemo connects c's queue pair with cp to addr, where l listens,
// and accepts the request there into s's queue pair with sp, telling it
// as step. It returns how long the connection took from the Connect call.
func connectDemo(ctx context.Context, w io.Writer, step int, l *verbs.Listener, addr netip.AddrPort, c, s *demoEnd, cp, sp verbs.ConnParam) (time.Duration, error) {
	acc := acceptOne(ctx, l, s.qp, sp)
	fmt.Fprintf(w, "%d. connect siwtun0 -> %v:%d (TCP, then MPA Request/Reply)\n", step, addr.Addr(), addr.Port())
	t0 := time.Now()
	if err := c.qp.Connect(ctx, addr, cp); err != nil {
		return 0, err
	}
	if err := <-acc; err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// runApp is the demo's verbs application: it connects a QP on cdev to one
// accepted on sdev at srv:7174 and does a Send, an RDMA Write and an RDMA
// Read with every byte verified, telling what it does. It returns the
// client QP, still connected.
func runApp(w io.Writer, cdev, sdev *verbs.Device, srv netip.Addr, size int) (*verbs.QP, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, s, err := newDemoEnds(cdev, sdev)
	if err != nil {
		return nil, err
	}

	// Server memory: a receive buffer and a region the client may write and read.
	recvBuf, err := sdev.AllocBuffer(256)
	if err != nil {
		return nil, err
	}
	recvMR, err := s.pd.RegMR(recvBuf, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	target, targetMR, err := s.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		return nil, err
	}
	if _, err := s.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{recvMR.SGE(0, len(recvBuf))}}}); err != nil {
		return nil, err
	}
	at := netip.AddrPortFrom(srv, 7174)
	l, err := sdev.Listen(at, 1)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	took, err := connectDemo(ctx, w, 1, l, at, c, s,
		verbs.ConnParam{PrivateData: []byte("siwtun demo client"), InitiatorDepth: 4, ResponderResources: 4},
		verbs.ConnParam{PrivateData: []byte("siwtun demo server")})
	if err != nil {
		return nil, err
	}
	p := c.qp.Info()
	fmt.Fprintf(w, "   established in %v: MPA rev %d, CRC %v, markers tx/rx %v/%v, IRD %d ORD %d, EMSS %d\n\n",
		took.Round(time.Microsecond), p.Params.Rev, onOff(p.Params.CRC), onOff(p.Params.MarkersTx), onOff(p.Params.MarkersRx), p.IRD, p.ORD, p.EMSS)

	wcs := make([]verbs.WorkCompletion, 4)
	wait := func(cq *verbs.CQ, what string) (verbs.WorkCompletion, error) {
		n, err := cq.Wait(ctx, wcs[:1])
		if err != nil {
			return verbs.WorkCompletion{}, fmt.Errorf("%s: %w", what, err)
		}
		if n != 1 || wcs[0].Status != verbs.WCSuccess {
			return wcs[0], fmt.Errorf("%s: completion status %v", what, wcs[0].Status)
		}
		return wcs[0], nil
	}

	// 2. Send: the client tells the server where its buffer is, rping-style.
	cbuf, cmr, err := c.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		return nil, err
	}
	for i := range cbuf {
		cbuf[i] = byte('A' + i%58)
	}
	msg := make([]byte, 16)
	binary.BigEndian.PutUint64(msg, cmr.Addr())
	binary.BigEndian.PutUint32(msg[8:], cmr.RKey())
	binary.BigEndian.PutUint32(msg[12:], uint32(size))
	fmt.Fprintf(w, "2. Send 16 bytes (address 0x%x, rkey 0x%08x, size %d)\n", cmr.Addr(), cmr.RKey(), size)
	t0 := time.Now()
	if _, err := c.qp.PostSend([]verbs.SendWR{{ID: 10, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: msg}}); err != nil {
		return nil, err
	}
	if _, err := wait(c.scq, "send"); err != nil {
		return nil, err
	}
	rwc, err := wait(s.rcq, "receive")
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(recvBuf[:rwc.ByteLen], msg) {
		return nil, fmt.Errorf("send: received bytes differ")
	}
	fmt.Fprintf(w, "   received %d bytes in %v, verified\n\n", rwc.ByteLen, time.Since(t0).Round(time.Microsecond))

	// 3. RDMA Write: client -> server's target region.
	fmt.Fprintf(w, "3. RDMA Write %d bytes to rkey 0x%08x\n", size, targetMR.RKey())
	t0 = time.Now()
	if _, err := s.qp.PostRecv([]verbs.RecvWR{{ID: 2, SGL: []verbs.SGE{recvMR.SGE(0, len(recvBuf))}}}); err != nil {
		return nil, err
	}
	if _, err := c.qp.PostSend([]verbs.SendWR{
		{ID: 11, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{cmr.SGE(0, size)}, RemoteAddr: targetMR.Addr(), RKey: targetMR.RKey()},
		{ID: 12, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("written")},
	}); err != nil {
		return nil, err
	}
	if _, err := wait(c.scq, "write"); err != nil {
		return nil, err
	}
	if _, err := wait(s.rcq, "write notice"); err != nil {
		return nil, err
	}
	if !bytes.Equal(target, cbuf) {
		return nil, fmt.Errorf("RDMA Write: target bytes differ")
	}
	fmt.Fprintf(w, "   placed and verified in %v (the Send behind it arrived: RDMAP keeps order)\n\n", time.Since(t0).Round(time.Microsecond))

	// 4. RDMA Read: the server's region back into a fresh client buffer.
	for i := range target {
		target[i] = byte('z' - i%26)
	}
	sink, smr, err := c.region(size, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "4. RDMA Read %d bytes from rkey 0x%08x\n", size, targetMR.RKey())
	t0 = time.Now()
	if _, err := c.qp.PostSend([]verbs.SendWR{{ID: 13, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, size)}, RemoteAddr: targetMR.Addr(), RKey: targetMR.RKey()}}); err != nil {
		return nil, err
	}
	if _, err := wait(c.scq, "read"); err != nil {
		return nil, err
	}
	if !bytes.Equal(sink, target) {
		return nil, fmt.Errorf("RDMA Read: bytes differ")
	}
	fmt.Fprintf(w, "   read and verified in %v\n\n", time.Since(t0).Round(time.Microsecond))

	return c.qp, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
