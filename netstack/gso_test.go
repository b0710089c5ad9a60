package netstack

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

func TestCutRuns(t *testing.T) {
	const mss = 100
	for _, tc := range []struct {
		name     string
		n, lead  int
		maxRun   int
		ends     []int
		wantRuns []int
	}{
		{name: "one write of full segments", n: 400, ends: nil, wantRuns: []int{400}},
		{name: "full segments then a short last", n: 350, wantRuns: []int{350}},
		{name: "a short write end inside", n: 500, ends: []int{250}, wantRuns: []int{250, 500}},
		{name: "a write ending on a segment boundary", n: 500, ends: []int{300}, wantRuns: []int{500}},
		{name: "short writes packed into one segment", n: 290, ends: []int{30, 60, 90, 190}, wantRuns: []int{90, 290}},
		{name: "a short rest packed with the next short write", n: 400, ends: []int{150, 180}, wantRuns: []int{180, 400}},
		{name: "a short rest not packed with a long write", n: 400, ends: []int{150}, wantRuns: []int{150, 400}},
		{name: "a lead (cut at a window edge)", n: 330, lead: 30, wantRuns: []int{30, 330}},
		{name: "a lead longer than the packet", n: 20, lead: 30, wantRuns: []int{20}},
		{name: "a lead ended by a write end", n: 300, lead: 60, ends: []int{40}, wantRuns: []int{40, 300}},
		{name: "runs capped", n: 1000, maxRun: 350, wantRuns: []int{300, 600, 900, 1000}},
		{name: "cap and short ends", n: 1000, maxRun: 350, ends: []int{450}, wantRuns: []int{300, 450, 750, 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			maxRun := tc.maxRun
			if maxRun == 0 {
				maxRun = 1 << 20
			}
			got := cutRuns(tc.n, mss, tc.lead, maxRun, tc.ends, nil)
			if !slices.Equal(got, tc.wantRuns) {
				t.Errorf("cutRuns(%d, %d, lead %d, ends %v) = %v, want %v", tc.n, mss, tc.lead, tc.ends, got, tc.wantRuns)
			}
		})
	}
}

// frameDevice is a superDevice that also takes offloaded frames, cutting
// each super-segment into wire segments as the kernel does and recording
// the data segments (their sequence ranges) it puts on the wire.
type frameDevice struct {
	*superDevice
	mu   sync.Mutex
	wire [][2]uint32 // [seq, end) of each data segment sent
	gsos int         // super-segments written
}

func (d *frameDevice) SupportsFrames() bool { return true }

func (d *frameDevice) WriteFrame(pieces [][]byte, gso, hdrLen, csumStart, csumOffset int) error {
	var p []byte
	for _, b := range pieces {
		p = append(p, b...)
	}
	if len(p) < 40 || p[0]>>4 != 4 {
		return d.WritePacket(p)
	}
	ipLen := int(p[0]&0xf) * 4
	thl := int(p[ipLen+12]>>4) * 4
	hl := ipLen + thl
	payload := p[hl:]
	seq := binary.BigEndian.Uint32(p[ipLen+4:])
	size := len(payload)
	if gso > 0 {
		if hdrLen != hl {
			return errors.New("frameDevice: wrong hdrLen")
		}
		size = gso
	}
	d.mu.Lock()
	if gso > 0 {
		d.gsos++
	}
	d.mu.Unlock()
	for off := 0; off < len(payload) || off == 0; off += size {
		n := min(size, len(payload)-off)
		seg := make([]byte, hl+n)
		copy(seg, p[:hl])
		copy(seg[hl:], payload[off:off+n])
		binary.BigEndian.PutUint16(seg[2:], uint16(len(seg)))
		binary.BigEndian.PutUint32(seg[ipLen+4:], seq+uint32(off))
		if off+n < len(payload) {
			seg[ipLen+13] &^= FlagFIN | FlagPSH
		}
		if n > 0 {
			d.mu.Lock()
			d.wire = append(d.wire, [2]uint32{seq + uint32(off), seq + uint32(off+n)})
			d.mu.Unlock()
		}
		if err := d.WritePacket(seg); err != nil {
			return err
		}
		if len(payload) == 0 {
			break
		}
	}
	return nil
}

// TestGSOWireFollowsWrites: with segmentation offload, a stream of aligned
// writes of mixed sizes (whole MSS multiples, short ones, writes ending
// short) reaches the wire in segments that start and end on the writes'
// FPDU boundaries (every MSS from a write's start, and its end), with
// several writes in one segment only when they fit it whole; the data
// arrives intact. Retransmissions (a full device queue drops packets, a
// slow machine's spurious ones) are held to the same grid: the link sends
// them again along it (resend.go).
func TestGSOWireFollowsWrites(t *testing.T) {
	da, db := devicePair(1500)
	fa := &frameDevice{superDevice: &superDevice{chanDevice: da}}
	la := NewDeviceLink(fa)
	if la.gso == nil || !la.gso() {
		t.Fatal("a device link over a SuperReader and FrameWriter does not offer segmentation offload")
	}
	a, b := newPair(t, pairOpts{linkA: la, linkB: NewDeviceLink(&superDevice{chanDevice: db})})
	if !a.gso {
		t.Fatal("the stack did not take up segmentation offload")
	}
	ca, cb := connect(t, a, b, addrB4.Addr())
	mss := ca.MSS()
	sizes := []int{3 * mss, mss + 100, 52, 52, 7 * mss, 46 * mss, 200, mss, 5*mss + 7, 1, 30 * mss}
	var writes [][2]int // [start, end) stream offsets
	total := 0
	for r := 0; r < 40; r++ {
		for _, n := range sizes {
			writes = append(writes, [2]int{total, total + n})
			total += n
		}
	}
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for _, w := range writes {
			p := buf[:w[1]-w[0]]
			fillPattern(p, int64(w[0]))
			if _, err := ca.WriteAligned(p); err != nil {
				errc <- err
				return
			}
		}
		errc <- ca.CloseWrite()
	}()
	v, err := receivePattern(cb)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if v.off != int64(total) || v.mismatches != 0 {
		t.Fatalf("received %d bytes, %d wrong, want %d intact", v.off, v.mismatches, total)
	}
	boundary := map[int]bool{}
	writeEnd := map[int]bool{}
	for _, w := range writes {
		for o := w[0]; o < w[1]; o += mss {
			boundary[o] = true
		}
		boundary[w[1]] = true
		writeEnd[w[1]] = true
	}
	send, _, ok := ca.StreamSeqs()
	if !ok {
		t.Fatal("no sequence numbers")
	}
	iss := send - uint32(total)
	fa.mu.Lock()
	defer fa.mu.Unlock()
	bad, retrans, sentEnd := 0, 0, 0
	for _, s := range fa.wire {
		start, end := int(s[0]-iss), int(s[1]-iss)
		re := start < sentEnd
		if re {
			// A retransmission (a slow machine's spurious ones too).
			retrans++
		}
		sentEnd = max(sentEnd, end)
		ok := boundary[start] && boundary[end] && end-start <= mss
		for o := start + 1; ok && o < end; o++ {
			if boundary[o] && !writeEnd[o] {
				ok = false // an FPDU boundary inside a segment that is not a packed write's end
			}
		}
		if !ok {
			if bad < 5 {
				t.Logf("wire segment [%d, %d) (%d octets, retransmission %v) is not cut at FPDU boundaries", start, end, end-start, re)
			}
			bad++
		}
	}
	alone := int(a.tailsAlone.Load())
	t.Logf("%d writes, %d octets: %d super-segments written, %d data segments on the wire (%d retransmitted, %d resent on the grid, %d/%d/%d as TCP cut them), %d misaligned; tails held %d, alone %d",
		len(writes), total, fa.gsos, len(fa.wire), retrans, a.resent.Load(), a.resendAsIs[0].Load(), a.resendAsIs[1].Load(), a.resendAsIs[2].Load(), bad, a.tailsHeld.Load(), alone)
	// A held FPDU start that left without its rest (a starved machine:
	// not after holdProbes window probes, or a FIN overtook it) and
	// its rest are two split segments.
	if bad > 2*alone {
		t.Errorf("%d misaligned segments, more than the %d that %d holds left alone explain", bad, 2*alone, alone)
	}
	if fa.gsos == 0 {
		t.Error("no super-segment was written: the stack did not use segmentation offload")
	}
}

// TestNoGSOWritesSegments: a stack told NoGSO on a link that offers
// segmentation offload builds every segment itself, and the link writes
// them as packets (batched), not as offloaded frames.
func TestNoGSOWritesSegments(t *testing.T) {
	da, db := devicePair(1500)
	fa := &frameDevice{superDevice: &superDevice{chanDevice: da}}
	a, b := newPair(t, pairOpts{linkA: NewDeviceLink(fa), linkB: NewDeviceLink(&superDevice{chanDevice: db}), noGSOA: true})
	if a.gso {
		t.Fatal("Options.NoGSO left segmentation offload on")
	}
	ca, cb := connect(t, a, b, addrB4.Addr())
	const total = 1 << 20
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ca, total, 8*ca.MSS()) }()
	v, err := receivePattern(cb)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if v.off != total || v.mismatches != 0 {
		t.Fatalf("received %d bytes, %d wrong, want %d intact", v.off, v.mismatches, total)
	}
	fa.mu.Lock()
	defer fa.mu.Unlock()
	if len(fa.wire) != 0 {
		t.Errorf("%d segments went out as offloaded frames from a stack without GSO", len(fa.wire))
	}
}

// gsoPacket builds an outbound IPv4 TCP packet as gVisor builds one for
// host GSO: seq, payload octets of zeros, segment size mss.
func gsoPacket(src, dst netip.AddrPort, seq uint32, plen, mss int) *stack.PacketBuffer {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: header.IPv4MinimumSize + header.TCPMinimumSize,
		Payload:            buffer.MakeWithData(make([]byte, plen)),
	})
	header.TCP(pkt.TransportHeader().Push(header.TCPMinimumSize)).Encode(&header.TCPFields{
		SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq, AckNum: 1,
		DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagAck, WindowSize: 65535,
	})
	header.IPv4(pkt.NetworkHeader().Push(header.IPv4MinimumSize)).Encode(&header.IPv4Fields{
		TotalLength: uint16(header.IPv4MinimumSize + header.TCPMinimumSize + plen), TTL: 64,
		Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr:  tcpip.AddrFrom4(src.Addr().As4()), DstAddr: tcpip.AddrFrom4(dst.Addr().As4()),
	})
	pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
	pkt.TransportProtocolNumber = header.TCPProtocolNumber
	pkt.GSOOptions = stack.GSO{Type: stack.GSOTCPv4, NeedsCsum: true, CsumOffset: header.TCPChecksumOffset, MSS: uint16(mss), L3HdrLen: header.IPv4MinimumSize}
	return pkt
}

// TestHeldTail: a super-segment that ends inside an FPDU (gVisor cut the
// write at a window edge) leaves its whole FPDUs at once and holds the
// FPDU's start; the rest, when it comes, leaves joined with it as one
// segment, even after window probes; a start whose rest does not come
// leaves alone after holdProbes window probes.
func TestHeldTail(t *testing.T) {
	da, db := devicePair(1500)
	fa := &frameDevice{superDevice: &superDevice{chanDevice: da}}
	s, err := New(NewDeviceLink(fa), Options{Addrs: []netip.Prefix{addrA4}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := netip.AddrPortFrom(addrA4.Addr(), 1000)
	dst := netip.AddrPortFrom(addrB4.Addr(), 2000)
	f := s.flows.getOrCreate(flowKey{local: src, remote: dst})
	const mss, seq0 = 100, 5000
	// One write of 250 octets: FPDUs of 100, 100 and 50 from seq0.
	f.writeEnds.add(seq0, seq0+250)
	wire := func() [][2]uint32 {
		fa.mu.Lock()
		defer fa.mu.Unlock()
		w := slices.Clone(fa.wire)
		fa.wire = fa.wire[:0]
		return w
	}
	send := func(seq uint32, n int) {
		pkt := gsoPacket(src, dst, seq, n, mss)
		defer pkt.DecRef()
		if err := s.ep.sendGSO(pkt); err != nil {
			t.Fatalf("sendGSO: %v", err)
		}
	}
	// gVisor cut the write at 230: [0, 200) leaves, [200, 230) waits.
	send(seq0, 230)
	if got, want := wire(), [][2]uint32{{seq0, seq0 + 100}, {seq0 + 100, seq0 + 200}}; !slices.Equal(got, want) {
		t.Fatalf("first part on the wire: %v, want %v", got, want)
	}
	// The rest: [200, 250) leaves as one segment.
	send(seq0+230, 20)
	if got, want := wire(), [][2]uint32{{seq0 + 200, seq0 + 250}}; !slices.Equal(got, want) {
		t.Fatalf("held start and its rest: %v, want %v", got, want)
	}
	// A second write of 250 cut at 30: its start waits, then leaves alone.
	f.writeEnds.add(seq0+250, seq0+500)
	send(seq0+250, 30)
	if got := wire(); len(got) != 0 {
		t.Fatalf("a held start left at once: %v", got)
	}
	// A pure ACK meanwhile is numbered at the held start, not past it.
	for len(db.in) > 0 {
		<-db.in
	}
	send(seq0+280, 0)
	select {
	case p := <-db.in:
		if len(p) != 40 || binary.BigEndian.Uint32(p[24:]) != seq0+250 {
			t.Fatalf("pure ACK while a tail is held: %d octets, seq %d; want 40, %d", len(p), binary.BigEndian.Uint32(p[24:]), seq0+250)
		}
	default:
		t.Fatal("the pure ACK did not leave")
	}
	// Its rest does not come: window probes (no data, numbered one below
	// the held start) ask the peer for its window, holdProbes of them,
	// and only then does the start leave alone.
	probes := 0
	deadline := time.After(10 * time.Second)
	for left := false; !left; {
		select {
		case p := <-db.in:
			seq := binary.BigEndian.Uint32(p[24:])
			switch {
			case len(p) == 40 && seq == seq0+249:
				probes++
			case len(p) == 70 && seq == seq0+250:
				left = true
			default:
				t.Fatalf("while a tail is held: %d octets, seq %d; want window probes (40 octets, seq %d), then the start alone", len(p), seq, seq0+249)
			}
		case <-deadline:
			t.Fatalf("the held start never left (%d probes)", probes)
		}
	}
	if got, want := wire(), [][2]uint32{{seq0 + 250, seq0 + 280}}; !slices.Equal(got, want) {
		t.Fatalf("after %d probes: %v, want %v", probes, got, want)
	}
	if probes != holdProbes {
		t.Errorf("%d window probes before the held start left alone, want %d", probes, holdProbes)
	}
	// A third write, cut at 30 too, whose rest comes after a probe (a
	// starved machine): it still leaves joined.
	f.writeEnds.add(seq0+500, seq0+750)
	send(seq0+500, 30)
	for stop := time.Now().Add(10 * time.Second); s.holdProbes.Load() == holdProbes; time.Sleep(time.Millisecond) {
		if time.Now().After(stop) {
			t.Fatal("no window probe for the third held start")
		}
	}
	send(seq0+530, 220)
	if got, want := wire(), [][2]uint32{{seq0 + 500, seq0 + 600}, {seq0 + 600, seq0 + 700}, {seq0 + 700, seq0 + 750}}; !slices.Equal(got, want) {
		t.Fatalf("held start and its rest after a probe: %v, want %v", got, want)
	}
	if h, x := s.tailsHeld.Load(), s.tailsAlone.Load(); h != 3 || x != 1 {
		t.Errorf("tails held %d, left alone %d; want 3, 1", h, x)
	}
}
