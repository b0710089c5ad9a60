package netstack

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
)

// fpduGrid is where the FPDUs of a stream of aligned writes start and end:
// every mss octets from a write's start, and its end.
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

// aligned reports whether a wire segment [start, end) of stream offsets
// starts and ends on FPDU boundaries, is at most one MSS and holds several
// FPDUs only when they are whole writes packed together.
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

// lossyWire is a superDevice (optionally taking offloaded frames, which it
// cuts as the kernel does) that records every data segment written and
// drops those drop picks.
type lossyWire struct {
	*superDevice
	frames bool
	mu     sync.Mutex
	wire   [][2]uint32
	drop   func(seq, end uint32) bool
}

func (d *lossyWire) SupportsFrames() bool { return d.frames }

func (d *lossyWire) WritePacket(p []byte) error {
	if hl, plen, seq, ok := tcpData(p); ok && plen > 0 {
		_ = hl
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

func TestGSORetransReproducer(t *testing.T) {
	for _, gso := range []bool{true, false} {
		for _, tc := range []struct{ first, every, count int }{{0, 1, 1}, {5, 1, 1}, {40, 1, 3}, {40, 2, 5}, {90, 7, 10}, {150, 1, 8}, {20, 3, 30}, {380, 1, 5}} {
			t.Run(fmt.Sprint(gso, tc), func(t *testing.T) {
				da, db := devicePair(1500)
				fa := &lossyWire{superDevice: &superDevice{chanDevice: da}, frames: true}
				a, b := newPair(t, pairOpts{linkA: NewDeviceLink(fa), linkB: NewDeviceLink(&superDevice{chanDevice: db}), noGSOA: !gso})
				if a.gso != gso {
					t.Fatal("gso")
				}
				ca, cb := connect(t, a, b, addrB4.Addr())
				mss := ca.MSS()
				base, _, _ := ca.StreamSeqs()
				sizes := []int{3 * mss, mss + 100, 52, 52, 7 * mss, 46 * mss, 200, mss, 5*mss + 7, 1, 30 * mss}
				var writes [][2]int
				total := 0
				for r := 0; r < 4; r++ {
					for _, n := range sizes {
						writes = append(writes, [2]int{total, total + n})
						total += n
					}
				}
				nth := 0
				dropped := 0
				fa.mu.Lock()
				fa.drop = func(seq, end uint32) bool {
					nth++
					if dropped < tc.count && nth > tc.first && (nth-tc.first-1)%tc.every == 0 {
						dropped++
						return true
					}
					return false
				}
				fa.mu.Unlock()
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
					t.Fatalf("received %d bytes, %d wrong", v.off, v.mismatches)
				}
				g := newFPDUGrid(writes, mss)
				fa.mu.Lock()
				defer fa.mu.Unlock()
				sentEnd, bad, re := 0, 0, 0
				for i, s := range fa.wire {
					start, end := int(s[0]-base), int(s[1]-base)
					isRe := start < sentEnd
					if isRe {
						re++
					}
					sentEnd = max(sentEnd, end)
					if !g.aligned(start, end) {
						bad++
						t.Errorf("segment %d [%d, %d) (%d octets, retransmission %v) off the FPDU grid", i, start, end, end-start, isRe)
					}
				}
				t.Logf("%d segments (%d retransmitted), %d misaligned", len(fa.wire), re, bad)
			})
		}
	}
}
