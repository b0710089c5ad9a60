package netstack

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
)

// fpduGrid is where the FPDUs of a stream of aligned writes start and end
// (stream offsets): every mss octets from a write's start, and its end.
type fpduGrid struct {
	boundary, writeEnd map[int]bool
	mss                int
}

func newFPDUGrid(writes [][2]int, mss int) *fpduGrid {
	g := &fpduGrid{boundary: map[int]bool{}, writeEnd: map[int]bool{}, mss: mss}
	for _, w := range writes {
		for o := w[0]; o < w[1]; o += mss {
			g.boundary[o] = true
		}
		g.boundary[w[1]] = true
		g.writeEnd[w[1]] = true
	}
	return g
}

// aligned reports whether a wire segment [start, end) starts and ends on
// FPDU boundaries, is at most one MSS and holds several FPDUs only when
// they are whole writes packed together.
func (g *fpduGrid) aligned(start, end int) bool {
	if !g.boundary[start] || !g.boundary[end] || end-start > g.mss {
		return false
	}
	for o := start + 1; o < end; o++ {
		if g.boundary[o] && !g.writeEnd[o] {
			return false
		}
	}
	return true
}

// lossyWire is a superDevice that records every data segment written to
// it and drops those drop picks. With frames it also takes offloaded
// frames, which it cuts into segments every gso octets as the kernel does.
type lossyWire struct {
	*superDevice
	frames bool
	mu     sync.Mutex
	wire   [][2]uint32 // [seq, end) of each data segment written
	drop   func(seq, end uint32) bool
}

func (d *lossyWire) SupportsFrames() bool { return d.frames }

func (d *lossyWire) WritePacket(p []byte) error {
	if _, plen, seq, ok := tcpData(p); ok && plen > 0 {
		d.mu.Lock()
		d.wire = append(d.wire, [2]uint32{seq, seq + uint32(plen)})
		lost := d.drop != nil && d.drop(seq, seq+uint32(plen))
		d.mu.Unlock()
		if lost {
			return nil
		}
	}
	return d.superDevice.WritePacket(p)
}

func (d *lossyWire) WriteFrame(pieces [][]byte, gso, hdrLen, csumStart, csumOffset int) error {
	var p []byte
	for _, b := range pieces {
		p = append(p, b...)
	}
	ipLen := int(p[0]&0xf) * 4
	hl := ipLen + int(p[ipLen+12]>>4)*4
	payload := p[hl:]
	seq := binary.BigEndian.Uint32(p[ipLen+4:])
	size := len(payload)
	if gso > 0 {
		size = gso
	}
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
		if err := d.WritePacket(seg); err != nil {
			return err
		}
		if len(payload) == 0 {
			break
		}
	}
	return nil
}

// misaligned returns the data segments of w (stream offsets from base:
// start, end, 1 for a retransmission) that are not on g, and how many
// segments were retransmissions (they start below the highest octet sent
// before).
func (d *lossyWire) misaligned(g *fpduGrid, base uint32) (bad [][3]int, segs, retrans int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sentEnd := 0
	for _, s := range d.wire {
		start, end := int(s[0]-base), int(s[1]-base)
		re := 0
		if start < sentEnd {
			retrans++
			re = 1
		}
		sentEnd = max(sentEnd, end)
		if !g.aligned(start, end) {
			bad = append(bad, [3]int{start, end, re})
		}
	}
	return bad, len(d.wire), retrans
}

// mixedWrites is a stream of aligned writes of mixed sizes, as an RNIC
// makes them: whole MSS multiples, writes that end in a short FPDU, short
// ones that TCP packs together.
func mixedWrites(mss, rounds int) (writes [][2]int, total int) {
	sizes := []int{3 * mss, mss + 100, 52, 52, 7 * mss, 46 * mss, 200, mss, 5*mss + 7, 1, 30 * mss}
	for range rounds {
		for _, n := range sizes {
			writes = append(writes, [2]int{total, total + n})
			total += n
		}
	}
	return writes, total
}

// sendWrites writes the pattern of writes with WriteAligned, then
// CloseWrite.
func sendWrites(c *Conn, writes [][2]int) error {
	buf := make([]byte, 64<<10)
	for _, w := range writes {
		p := buf[:w[1]-w[0]]
		fillPattern(p, int64(w[0]))
		if _, err := c.WriteAligned(p); err != nil {
			return err
		}
	}
	return c.CloseWrite()
}

// TestRetransmissionsOnGrid: segments lost on the wire at chosen stream
// offsets (the first time a segment holding the offset leaves: the
// connection's first, in the middle of a long write, right behind short
// writes TCP packed, several in a row, the last) are retransmitted, and every data
// segment on the wire, retransmissions and everything after them
// included, is cut on the FPDU grid of the writes. With segmentation
// offload gVisor retransmits a segment it built from several writes one
// MSS from its start, off the grid; the link sends it again on the grid
// (resend.go).
func TestRetransmissionsOnGrid(t *testing.T) {
	// Without offload the link does not re-cut what gVisor sends, and
	// gVisor may cut a long write at a window edge smaller than the MSS
	// (doc/segmentation-offload.md): only offload is held to the grid here.
	for _, gso := range []bool{true} {
		for _, tc := range []struct {
			name  string
			drops []int // stream offsets, in MSS-sized FPDUs from the start of the second round of writes (see mixedWrites)
			first bool  // drops count from the stream's start instead
		}{
			{"the connection's first", []int{0}, true},
			{"the connection's first three", []int{0, 1, 2}, true},
			{"first of a round", []int{0}, false},
			{"inside a long write", []int{60}, false},
			{"behind packed short writes", []int{5}, false},
			{"several in a row", []int{40, 41, 42, 43, 44}, false},
			{"every seventh", []int{10, 17, 24, 31, 38, 45, 52, 59, 66}, false},
			{"the last", []int{-1}, false},
		} {
			t.Run(fmt.Sprintf("gso=%v/%s", gso, tc.name), func(t *testing.T) {
				da, db := devicePair(1500)
				wa := &lossyWire{superDevice: &superDevice{chanDevice: da}, frames: true}
				// RACK off, as siwtun up runs the stack: gVisor's tail
				// loss probe can leave a lost tail (or FIN) with no
				// retransmission timer (rescue.go).
				a, b := newPair(t, pairOpts{linkA: NewDeviceLink(wa), linkB: NewDeviceLink(&superDevice{chanDevice: db}), noRACK: true})
				if !a.gso {
					t.Fatal("the stack did not take up segmentation offload")
				}
				ca, cb := connect(t, a, b, addrB4.Addr())
				mss := ca.MSS()
				writes, total := mixedWrites(mss, 4)
				round := writes[len(writes)/4][0]
				base, _, _ := ca.StreamSeqs()
				lost := map[int]bool{}
				wa.mu.Lock()
				wa.drop = func(seq, end uint32) bool {
					for _, d := range tc.drops {
						o := round + d*mss
						if tc.first {
							o = d * mss
						}
						if d < 0 {
							o = total - 1
						}
						if !lost[o] && int(seq-base) <= o && o < int(end-base) {
							lost[o] = true
							return true
						}
					}
					return false
				}
				wa.mu.Unlock()
				errc := make(chan error, 1)
				go func() { errc <- sendWrites(ca, writes) }()
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
				bad, segs, retrans := wa.misaligned(newFPDUGrid(writes, mss), base)
				st := a.Stats()
				t.Logf("%d data segments on the wire, %d of them retransmissions (%d resent on the grid, %d/%d/%d as TCP cut them), %d lost on purpose; tails held %d, alone %d",
					segs, retrans, st.ResentOnGrid, a.resendAsIs[0].Load(), a.resendAsIs[1].Load(), a.resendAsIs[2].Load(), len(lost), st.HeldTails, st.HeldTailsAlone)
				if len(lost) != len(tc.drops) {
					t.Errorf("%d segments dropped, want %d", len(lost), len(tc.drops))
				}
				if retrans < len(tc.drops) {
					t.Errorf("%d retransmissions, want at least %d", retrans, len(tc.drops))
				}
				for i, s := range bad {
					if i < 10 {
						t.Errorf("wire segment [%d, %d) (%d octets, retransmission %v) is not cut on the FPDU grid", s[0], s[1], s[1]-s[0], s[2] == 1)
					}
				}
				if n := len(bad); n > 0 {
					t.Errorf("%d of %d data segments off the FPDU grid", n, segs)
				}
			})
		}
	}
}

// TestResendPieces: a retransmission is sent again as the FPDUs that start
// inside it, each whole; one inside a single FPDU sends that FPDU; one
// whose last FPDU has not been sent whole stops before it.
func TestResendPieces(t *testing.T) {
	var w writeEnds
	const mss = 100
	// Writes [0, 250) and [250, 302) and [302, 702) from seq 1000.
	w.add(1000, 1250)
	w.add(1250, 1302)
	w.add(1302, 1702)
	for _, tc := range []struct {
		p          uint32
		start, end uint32
		ok         bool
	}{
		{1000, 1000, 1100, true},
		{1050, 1000, 1100, true},
		{1210, 1200, 1250, true},
		{1250, 1250, 1302, true},
		{1302, 1302, 1402, true},
		{1450, 1402, 1502, true},
		{1702, 1702, 1702, true},
		{999, 0, 0, false},
		{1800, 0, 0, false},
	} {
		s, e, ok := w.fpduAt(tc.p, mss)
		if s != tc.start || e != tc.end || ok != tc.ok {
			t.Errorf("fpduAt(%d) = %d, %d, %v; want %d, %d, %v", tc.p, s, e, ok, tc.start, tc.end, tc.ok)
		}
	}
	w.acked(1250)
	if s, e, ok := w.fpduAt(1260, mss); s != 1250 || e != 1302 || !ok {
		t.Errorf("after an ACK: fpduAt(1260) = %d, %d, %v; want 1250, 1302, true", s, e, ok)
	}
	if _, _, ok := w.fpduAt(1200, mss); ok {
		t.Error("fpduAt of an acknowledged write's octet is known")
	}
}

// TestImpairedGSOOnGrid: an impaired link over a device with segmentation
// offload keeps it (the stack builds super-segments; the impairment cuts
// them into wire segments with complete checksums before it drops and
// reorders them), and under 2 % loss and 2 % reordering both ways every
// data segment that reaches the device, retransmissions included, is cut
// on the FPDU grid, and the data arrives intact.
func TestImpairedGSOOnGrid(t *testing.T) {
	for _, seed := range []int64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			da, db := devicePair(1500)
			wa := &lossyWire{superDevice: &superDevice{chanDevice: da}, frames: true}
			imp := Impairments{Seed: seed, Loss: 0.02, Reorder: 0.02}
			// RACK off, as siwtun up runs the stack (see
			// TestRetransmissionsOnGrid).
			a, b := newPair(t, pairOpts{linkA: Impair(NewDeviceLink(wa), imp), linkB: Impair(NewDeviceLink(&superDevice{chanDevice: db}), imp), noRACK: true})
			if !a.gso {
				t.Fatal("an impaired link over a device with segmentation offload does not offer it")
			}
			ca, cb := connect(t, a, b, addrB4.Addr())
			mss := ca.MSS()
			writes, total := mixedWrites(mss, 8)
			base, _, _ := ca.StreamSeqs()
			errc := make(chan error, 1)
			go func() { errc <- sendWrites(ca, writes) }()
			v, err := receivePattern(cb)
			if err != nil {
				t.Fatalf("%v after %d octets; sender: %s; %+v", err, v.off, ca.SendState(), a.Stats())
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if v.off != int64(total) || v.mismatches != 0 {
				t.Fatalf("received %d bytes, %d wrong, want %d intact", v.off, v.mismatches, total)
			}
			bad, segs, retrans := wa.misaligned(newFPDUGrid(writes, mss), base)
			st := a.Stats()
			t.Logf("%d data segments reached the device, %d of them retransmissions (%d resent on the grid, %d/%d/%d as TCP cut them); tails held %d, alone %d",
				segs, retrans, st.ResentOnGrid, a.resendAsIs[0].Load(), a.resendAsIs[1].Load(), a.resendAsIs[2].Load(), st.HeldTails, st.HeldTailsAlone)
			if retrans == 0 {
				t.Error("no retransmission: the impairment did not act")
			}
			for i, s := range bad {
				if i < 10 {
					t.Errorf("wire segment [%d, %d) (%d octets, retransmission %v) is not cut on the FPDU grid", s[0], s[1], s[1]-s[0], s[2] == 1)
				}
			}
			// A held FPDU start that left without its rest (not within
			// holdProbes window probes) and its rest are two split
			// segments.
			if len(bad) > 2*int(st.HeldTailsAlone) {
				t.Errorf("%d of %d data segments off the FPDU grid, more than the %d holds left alone explain", len(bad), segs, st.HeldTailsAlone)
			}
		})
	}
}

// TestResend drives the link with the packets gVisor hands it — new data,
// then retransmissions cut where gVisor cuts them — and checks what goes on
// the wire: the FPDUs that start inside a retransmitted range, each whole;
// the FPDU holding a range that holds no FPDU start; the whole FPDU whose
// start the peer has acknowledged but not its rest; no data for octets the
// peer has acknowledged.
func TestResend(t *testing.T) {
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
	// Writes of 250 and 52 octets: FPDUs [0,100) [100,200) [200,250) [250,302).
	f.kept.used.Store(true)
	f.writeEnds.add(seq0, seq0+250)
	f.writeEnds.add(seq0+250, seq0+302)
	wire := func() [][2]uint32 {
		fa.mu.Lock()
		defer fa.mu.Unlock()
		w := make([][2]uint32, len(fa.wire))
		for i, x := range fa.wire {
			w[i] = [2]uint32{x[0] - seq0, x[1] - seq0}
		}
		fa.wire = fa.wire[:0]
		return w
	}
	send := func(from, to int) {
		pkt := gsoPacket(src, dst, seq0+uint32(from), to-from, mss)
		defer pkt.DecRef()
		if err := s.ep.sendGSO(pkt); err != nil {
			t.Fatalf("sendGSO: %v", err)
		}
	}
	ack := func(n int) {
		f.ackSeen(seq0 + uint32(n))
		f.writeEnds.acked(seq0 + uint32(n))
		f.kept.acked(seq0 + uint32(n))
	}
	send(0, 302) // new data, one gVisor segment of both writes
	if got, want := wire(), [][2]uint32{{0, 100}, {100, 200}, {200, 250}, {250, 302}}; !slices.Equal(got, want) {
		t.Fatalf("new data: %v, want %v", got, want)
	}
	ack(0)
	for _, tc := range []struct {
		name     string
		ack      int
		from, to int
		want     [][2]uint32
	}{
		{"one MSS from the segment's start", 0, 0, 100, [][2]uint32{{0, 100}}},
		{"gVisor's next piece, on the grid", 0, 100, 200, [][2]uint32{{100, 200}}},
		{"a piece cut inside FPDUs", 0, 120, 220, [][2]uint32{{200, 250}}},
		{"a piece ending in the next write", 0, 220, 302, [][2]uint32{{250, 302}}},
		{"a piece in one FPDU", 0, 130, 170, [][2]uint32{{100, 200}}},
		{"the rest of an FPDU whose start the peer has", 150, 150, 250, [][2]uint32{{100, 200}, {200, 250}}},
		{"acknowledged octets", 150, 0, 100, nil},
	} {
		ack(tc.ack)
		for len(db.in) > 0 {
			<-db.in
		}
		send(tc.from, tc.to)
		if got := wire(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: gVisor retransmits [%d, %d): %v on the wire, want %v", tc.name, tc.from, tc.to, got, tc.want)
		}
		if tc.want == nil {
			select {
			case p := <-db.in:
				if len(p) != 40 {
					t.Errorf("%s: a %d-octet packet, want one without data", tc.name, len(p))
				}
			default:
				t.Errorf("%s: nothing left, want a segment without data", tc.name)
			}
		}
	}
	if n := s.resent.Load(); n != 6 {
		t.Errorf("%d retransmissions resent on the grid, want 6", n)
	}
}
