package netstack

import (
	"encoding/binary"
	"gvisor.dev/gvisor/pkg/buffer"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Segmentation offload on the way out (host GSO). On a device link whose
// device takes offloaded frames (FrameWriter), gVisor's TCP builds
// super-segments of up to gsoMaxSize octets, one header for many wire
// segments of one MSS each, and the kernel (or a NIC) cuts them: gVisor's
// per-packet work is paid once per super-segment.
//
// gVisor builds a super-segment by joining queued writes whole, so one may
// hold a write that ends in a short FPDU followed by the next write; cut at
// MSS multiples, every FPDU after the short one would straddle segments.
// So each connection records where its aligned writes end (writeEnds), and
// the hook endpoint cuts a super-segment into runs that end where a wire
// segment shorter than the MSS ends, forming the wire segments as gVisor
// does without GSO: a write is cut at MSS multiples from its start, and a
// short rest is packed with the whole writes after it while they fit one
// segment. Each run leaves as one frame; the kernel cuts it at the MSS,
// which is where the wire segments end. Retransmissions are sent again
// along the same grid from the data kept until acknowledged (resend.go).
// doc/segmentation-offload.md tells the whole story.

// gsoMaxSize is the largest super-segment gVisor builds (its GSOMaxSize):
// IPv4's total length. gVisor's payload limit is gsoMaxSize less 121
// octets, which an aligned write must not exceed (MaxAlignedWrite).
const gsoMaxSize = 65535

// MaxAlignedWrite is the largest aligned write gVisor never cuts for size:
// a larger one may be cut at gVisor's super-segment limit, which is no MSS
// multiple.
const MaxAlignedWrite = gsoMaxSize - header.TCPTotalHeaderMaximumSize - 1

// writeEnds records the sequence numbers where a connection's aligned
// writes end, until the peer acknowledges them (the last acknowledged one
// is kept as the start of the write after it).
type writeEnds struct {
	mu     sync.Mutex
	ends   []uint32 // ascending in sequence space from head; guarded by mu
	head   int      // guarded by mu
	last   uint32   // the last end acknowledged; guarded by mu
	lastOK bool     // guarded by mu
}

// add records the end of a write that starts at start (after every end
// recorded before; the first write's start is recorded too).
func (w *writeEnds) add(start, seq uint32) {
	w.mu.Lock()
	if !w.lastOK && len(w.ends) == 0 {
		w.last, w.lastOK = start, true
	}
	if w.head > 0 && w.head >= len(w.ends)/2 {
		n := copy(w.ends, w.ends[w.head:])
		w.ends = w.ends[:n]
		w.head = 0
	}
	w.ends = append(w.ends, seq)
	w.mu.Unlock()
}

// acked forgets the ends the cumulative ACK ack covers.
func (w *writeEnds) acked(ack uint32) {
	w.mu.Lock()
	for w.head < len(w.ends) && int32(w.ends[w.head]-ack) <= 0 {
		w.last, w.lastOK = w.ends[w.head], true
		w.head++
	}
	if w.head == len(w.ends) {
		w.ends, w.head = w.ends[:0], 0
	}
	w.mu.Unlock()
}

// around appends to out the offsets from seq of the ends strictly inside
// (seq, seq+n). into is how far seq lies into the write that holds it (0
// when a write starts there); atEnd reports whether a write ends at seq+n;
// known is false when no write start at or before seq is known (a
// connection without aligned writes).
func (w *writeEnds) around(seq uint32, n int, out []int) (into int, ends []int, atEnd, known bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.aroundLocked(seq, n, out)
}

// aroundLocked is around with w.mu held.
func (w *writeEnds) aroundLocked(seq uint32, n int, out []int) (into int, ends []int, atEnd, known bool) {
	start, ok := w.last, w.lastOK
	for _, e := range w.ends[w.head:] {
		d := int32(e - seq)
		if d <= 0 {
			start, ok = e, true
			continue
		}
		if d >= int32(n) {
			atEnd = d == int32(n)
			break
		}
		out = append(out, int(d))
	}
	if ok && int32(seq-start) > 0 {
		into = int(seq - start)
	}
	return into, out, atEnd, ok
}

// cutRuns appends to out the ends of the runs a super-segment of n payload
// octets is sent in (the last is n). ends holds the offsets of the writes
// ending inside it, ascending; lead is how far its start lies before the
// next FPDU boundary of the write it starts in (0: it starts on one), which
// happens when gVisor cut a write at the edge of the peer's window. Wire
// segments are formed as gVisor forms them without GSO: a write is cut at
// mss multiples from its start, a short rest is packed with the whole
// writes after it while they fit one segment, and a lead is a segment of
// its own. A run ends after each wire segment shorter than mss, and before
// a segment that would take it past maxRun octets.
func cutRuns(n, mss, lead, maxRun int, ends, out []int) []int {
	pos, i, runStart := 0, 0, 0
	if lead > 0 {
		pos = min(lead, n)
		if len(ends) > 0 && ends[0] < pos {
			pos = ends[0]
		}
		if pos < n {
			out = append(out, pos)
		}
		runStart = pos
	}
	for pos < n {
		for i < len(ends) && ends[i] <= pos {
			i++
		}
		we := n
		if i < len(ends) {
			we = ends[i]
		}
		seg, short := pos+mss, false
		if we-pos < mss {
			seg, short = we, true
			for j := i + 1; seg < n; j++ {
				next := n
				if j < len(ends) {
					next = ends[j]
				}
				if next-pos > mss {
					break
				}
				seg = next
			}
		}
		if seg-runStart > maxRun && pos > runStart {
			out = append(out, pos)
			runStart = pos
		}
		pos = seg
		if short && pos < n {
			out = append(out, pos)
			runStart = pos
		}
	}
	return append(out, n)
}

// tcpGSO reports whether pkt is a TCP packet gVisor built for host GSO,
// and its MSS and payload length.
func tcpGSO(pkt *stack.PacketBuffer) (mss, plen int, ok bool) {
	g := pkt.GSOOptions
	if (g.Type != stack.GSOTCPv4 && g.Type != stack.GSOTCPv6) || g.MSS == 0 {
		return 0, 0, false
	}
	return int(g.MSS), pkt.Data().Size(), true
}

// gsoPlan is how an outbound packet of a connection with aligned writes
// leaves: the ends of its runs, and the offset of a tail to hold back
// (frag, -1 for none), the start of an FPDU whose rest gVisor has not
// sent yet (it cut the write at the edge of the peer's window).
type gsoPlan struct {
	runs []int
	frag int
}

// plan computes how a packet of plen octets from seq leaves; mayHold
// allows a tail to be held (new data without FIN).
func (f *flow) plan(seq uint32, mss, plen int, mayHold bool, scratch []int) gsoPlan {
	p := gsoPlan{frag: -1}
	into, ends, atEnd, known := f.writeEnds.around(seq, plen, scratch[:0])
	n := plen
	if known && !atEnd && mayHold {
		last := into + plen
		if len(ends) > 0 {
			last = plen - ends[len(ends)-1]
		}
		if r := last % mss; r != 0 {
			p.frag = max(plen-r, 0)
			n = p.frag
			for len(ends) > 0 && ends[len(ends)-1] >= n {
				ends = ends[:len(ends)-1]
			}
		}
	}
	if n > 0 {
		p.runs = cutRuns(n, mss, (mss-into%mss)%mss, MaxAlignedWrite, ends, ends[len(ends):])
	}
	return p
}

// writeGSO is WritePackets for a link with segmentation offload (see the
// top of this file): each packet leaves whole or in runs, the hooks seeing
// its wire segments.
func (e *hookEndpoint) writeGSO(pkts stack.PacketBufferList) (int, tcpip.Error) {
	for i, pkt := range pkts.AsSlice() {
		if err := e.sendGSO(pkt); err != nil {
			return i, err
		}
	}
	return pkts.Len(), nil
}

// sendGSO sends one packet. The caller keeps its reference.
func (e *hookEndpoint) sendGSO(pkt *stack.PacketBuffer) tcpip.Error {
	mss, plen, ok := tcpGSO(pkt)
	if !ok {
		return e.emit(pkt)
	}
	h, ok := parseIPAndTCP(pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice())
	if !ok {
		return e.emit(pkt)
	}
	f := e.s.flows.get(flowKey{local: h.src, remote: h.dst})
	if f == nil || h.flags&(FlagSYN|FlagRST) != 0 {
		return e.emit(pkt)
	}
	f.hold.mu.Lock()
	defer f.hold.mu.Unlock()
	if plen > 0 && f.kept.used.Load() && !f.kept.add(h.seq, plen, pkt) {
		// A retransmission: sent again on the FPDU grid (a held tail
		// stays held: it never left, and this cannot carry it whole).
		if done, err := e.resend(f, pkt, h.seq, plen, mss); done {
			return err
		}
	}
	joined := false
	if held := f.hold.pkt; held != nil {
		switch {
		case plen > 0 && h.seq == f.hold.end:
			// The rest of the held FPDU: one packet from the held start.
			pkt = joinPackets(held, pkt)
			h.seq, plen = f.hold.seq, int(f.hold.end-f.hold.seq)+plen
			joined = true
			f.hold.drop()
		case plen > 0 || h.flags&FlagFIN != 0:
			// Anything else with data (a retransmission that could
			// not be sent on the grid) or a FIN: the held bytes go
			// first, as they are.
			if err := e.flushHeld(f); err != nil {
				return err
			}
		}
	}
	if joined {
		defer pkt.DecRef()
	}
	if plen == 0 {
		if f.hold.pkt != nil && h.flags&FlagFIN == 0 && pkt.GSOOptions.NeedsCsum {
			return e.emitAt(pkt, f.hold.seq)
		}
		return e.emit(pkt)
	}
	// Only new data may wait for its continuation: a retransmission's has
	// been sent already.
	sent, ok := f.sentEdge()
	mayHold := h.flags&FlagFIN == 0 && (!ok || int32(h.seq+uint32(plen)-sent) > 0)
	var scratch [32]int
	p := f.plan(h.seq, mss, plen, mayHold, scratch[:])
	if !joined && p.frag < 0 && len(p.runs) == 1 {
		return e.emit(pkt) // the common case: whole
	}
	off, segs := 0, 0
	for _, end := range p.runs {
		r := runPacket(pkt, off, end, segs)
		err := e.emit(r)
		r.DecRef()
		if err != nil {
			return err
		}
		segs += (end - off + mss - 1) / mss
		off = end
	}
	if p.frag >= 0 {
		f.hold.set(e, f, runPacket(pkt, p.frag, plen, segs), h.seq+uint32(p.frag), h.seq+uint32(plen))
	}
	return nil
}

// emit runs the outbound hooks on pkt and writes it. The caller keeps its
// reference.
func (e *hookEndpoint) emit(pkt *stack.PacketBuffer) tcpip.Error {
	e.s.outbound(pkt)
	l, _ := e.lists.Get().(*stack.PacketBufferList)
	if l == nil {
		l = new(stack.PacketBufferList)
	}
	l.PushBack(pkt.IncRef())
	_, err := e.Endpoint.WritePackets(*l)
	l.Reset()
	e.lists.Put(l)
	return err
}

// emitAt emits a copy of the pure ACK pkt numbered seq, the first held
// octet: the held octets have not left, and an ACK numbered past them
// would tell the peer, and a capture, that they had (tshark then takes
// them for a retransmission when they leave, and loses the FPDUs that
// follow). pkt's checksum is partial (NeedsCsum), which the sequence
// number is not part of. The caller keeps its reference.
func (e *hookEndpoint) emitAt(pkt *stack.PacketBuffer, seq uint32) tcpip.Error {
	a := runPacket(pkt, 0, 0, 0)
	defer a.DecRef()
	header.TCP(a.TransportHeader().Slice()).SetSequenceNumber(seq)
	return e.emit(a)
}

// withHeaders builds a packet of payload behind a copy of pkt's IP and
// TCP headers, with pkt's protocol numbers and GSO options.
func withHeaders(pkt *stack.PacketBuffer, payload buffer.Buffer) *stack.PacketBuffer {
	nh, th := pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice()
	r := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: len(nh) + len(th),
		Payload:            payload,
	})
	r.NetworkProtocolNumber = pkt.NetworkProtocolNumber
	r.TransportProtocolNumber = pkt.TransportProtocolNumber
	r.GSOOptions = pkt.GSOOptions
	copy(r.TransportHeader().Push(len(th)), th)
	copy(r.NetworkHeader().Push(len(nh)), nh)
	return r
}

// runPacket builds the packet of the run of pkt's payload [off, end): a
// copy of pkt's headers with the run's sequence number, length, IPv4 ID
// (pkt's plus the wire segments before it, as the kernel numbers the
// segments it cuts) and partial checksum; PSH and FIN only on the last run,
// CWR only on the first. The payload is shared, not copied.
func runPacket(pkt *stack.PacketBuffer, off, end, segsBefore int) *stack.PacketBuffer {
	nh, th := pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice()
	payload := pkt.Data().ToBuffer()
	payload.TrimFront(int64(off))
	payload.Truncate(int64(end - off))
	r := withHeaders(pkt, payload)
	t := header.TCP(r.TransportHeader().Slice())
	n := header.IPv4(r.NetworkHeader().Slice())
	t.SetSequenceNumber(t.SequenceNumber() + uint32(off))
	flags := t.Flags()
	if end < pkt.Data().Size() {
		flags &^= header.TCPFlagPsh | header.TCPFlagFin
	}
	if off > 0 {
		flags &^= header.TCPFlagCwr
	}
	t.SetFlags(uint8(flags))
	tcpLen := len(th) + end - off
	var src, dst tcpip.Address
	if pkt.NetworkProtocolNumber == header.IPv4ProtocolNumber {
		n.SetTotalLength(uint16(len(nh) + tcpLen))
		n.SetID(n.ID() + uint16(segsBefore))
		n.SetChecksum(0)
		n.SetChecksum(^n.CalculateChecksum())
		src, dst = n.SourceAddress(), n.DestinationAddress()
	} else {
		v6 := header.IPv6(n)
		binary.BigEndian.PutUint16(v6[4:], uint16(tcpLen))
		src, dst = v6.SourceAddress(), v6.DestinationAddress()
	}
	if pkt.GSOOptions.NeedsCsum {
		t.SetChecksum(header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(tcpLen)))
	}
	return r
}

// frameOffload says how the kernel must complete pkt: the segment size of
// a super-segment (0 for one segment), the header length, and where the
// partial TCP checksum starts and lies (csumOffset 0: complete).
func frameOffload(pkt *stack.PacketBuffer) (gso, hdrLen, csumStart, csumOffset int) {
	g := pkt.GSOOptions
	if g.Type != stack.GSOTCPv4 && g.Type != stack.GSOTCPv6 {
		return 0, 0, 0, 0
	}
	nh := len(pkt.NetworkHeader().Slice())
	hdrLen = nh + len(pkt.TransportHeader().Slice())
	if g.NeedsCsum {
		csumStart, csumOffset = nh, int(g.CsumOffset)
	}
	if g.MSS > 0 && pkt.Size()-hdrLen > int(g.MSS) {
		gso = int(g.MSS)
	}
	return gso, hdrLen, csumStart, csumOffset
}
