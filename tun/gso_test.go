package tun

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// segment builds an IPv4 (or IPv6) TCP segment with valid checksums.
func segment(v6 bool, id uint16, seq uint32, flags uint8, payload []byte) []byte {
	ipLen := ipv4HeaderMinLen
	if v6 {
		ipLen = ipv6HeaderLen
	}
	tcpLen := 32 // 12 octets of options (timestamps)
	p := make([]byte, ipLen+tcpLen+len(payload))
	if v6 {
		p[0] = 6 << 4
		binary.BigEndian.PutUint16(p[4:], uint16(tcpLen+len(payload)))
		p[6], p[7] = protoTCP, 64
		copy(p[8:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
		copy(p[24:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 2})
	} else {
		p[0] = 0x45
		binary.BigEndian.PutUint16(p[4:], id)
		p[6] = 0x40 // DF
		p[8], p[9] = 64, protoTCP
		copy(p[12:], []byte{198, 18, 1, 2, 198, 18, 2, 2})
	}
	t := tcpPacket{v6: v6, ipLen: ipLen, hdrLen: ipLen + tcpLen, payload: len(payload)}
	setIPLength(p, t, len(p))
	tcp := p[ipLen:]
	binary.BigEndian.PutUint16(tcp[0:], 7174)
	binary.BigEndian.PutUint16(tcp[2:], 40000)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], 0x11223344)
	tcp[12] = byte(tcpLen/4) << 4
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:], 512)
	copy(tcp[20:], []byte{1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9})
	copy(tcp[tcpLen:], payload)
	sum := pseudoSum(p, t, len(p)-ipLen)
	binary.BigEndian.PutUint16(tcp[16:], ^checksumFold(checksumAdd(sum, tcp)))
	return p
}

// kernelSum finishes a NEEDS_CSUM super-segment's checksum as the kernel
// does before cutting it (the cut segments' sums are recomputed anyway).
func TestCoalesceSplitRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		v6    bool
		sizes []int // payload sizes
		flags []uint8
		runs  []int // expected run lengths
	}{
		{"equal", false, []int{1400, 1400, 1400, 1400}, nil, []int{4}},
		{"short last", false, []int{1400, 1400, 600}, nil, []int{3}},
		{"short middle ends the run", false, []int{1400, 600, 1400, 1400}, nil, []int{2, 2}},
		{"psh on every segment", false, []int{1000, 1000, 1000}, []uint8{0x18, 0x18, 0x18}, []int{3}},
		{"fin ends", false, []int{1000, 1000}, []uint8{0x10, 0x11}, []int{1, 1}},
		{"ipv6", true, []int{1200, 1200, 1200, 100}, nil, []int{4}},
		{"64 KiB bound", false, []int{8900, 8900, 8900, 8900, 8900, 8900, 8900, 8900}, nil, []int{7, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pkts [][]byte
			seq := uint32(1000)
			for i, n := range tc.sizes {
				f := uint8(tcpFlagACK | tcpFlagPSH)
				if tc.flags != nil {
					f = tc.flags[i]
				}
				pl := bytes.Repeat([]byte{byte('a' + i)}, n)
				pkts = append(pkts, segment(tc.v6, uint16(100+i), seq, f, pl))
				seq += uint32(n)
			}
			var got []int
			for i := 0; i < len(pkts); {
				r := nextRun(pkts, 0, i)
				got = append(got, r.end-i)
				if r.end-i > 1 {
					// Build the super-segment as Write does, then split it as
					// Read does: the segments must come back byte for byte
					// (PSH only on the last, as the kernel cuts it).
					hdr := append([]byte(nil), pkts[i][:r.t.hdrLen]...)
					var vh virtioHdr
					superHeader(hdr, r.t, r.total, r.gso, r.psh, &vh)
					super := hdr
					for k := i; k < r.end; k++ {
						super = append(super, pkts[k][r.t.hdrLen:]...)
					}
					if len(super) != r.total || int(vh.gsoSize) != r.gso || int(vh.hdrLen) != r.t.hdrLen {
						t.Fatalf("super-segment %d octets (want %d), vh %+v", len(super), r.total, vh)
					}
					var sp splitter
					if err := sp.start(super, &vh); err != nil {
						t.Fatal(err)
					}
					bufs := make([][]byte, OffloadBatch)
					for b := range bufs {
						bufs[b] = make([]byte, 2+9000)
					}
					sizes := make([]int, len(bufs))
					n, err := sp.fill(bufs, sizes, 2)
					if err != nil || n != r.end-i || !sp.done() {
						t.Fatalf("split into %d (want %d), done %v: %v", n, r.end-i, sp.done(), err)
					}
					for k := range n {
						want := append([]byte(nil), pkts[i+k]...)
						if i+k != r.end-1 {
							want[r.t.ipLen+13] &^= tcpFlagPSH
							// Fix the expected checksum for the cleared flag.
							want[r.t.ipLen+16], want[r.t.ipLen+17] = 0, 0
							sum := pseudoSum(want, r.t, len(want)-r.t.ipLen)
							binary.BigEndian.PutUint16(want[r.t.ipLen+16:], ^checksumFold(checksumAdd(sum, want[r.t.ipLen:])))
						}
						if g := bufs[k][2 : 2+sizes[k]]; !bytes.Equal(g, want) {
							t.Fatalf("segment %d differs after the round trip:\ngot  %x\nwant %x", k, g[:60], want[:60])
						}
					}
				}
				i = r.end
			}
			if !equalInts(got, tc.runs) {
				t.Fatalf("runs %v, want %v", got, tc.runs)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCompleteChecksum: a NEEDS_CSUM packet whose TCP checksum field holds
// the pseudo-header sum gets the full checksum.
func TestCompleteChecksum(t *testing.T) {
	p := segment(false, 1, 5, tcpFlagACK, []byte("hello, RNIC"))
	want := append([]byte(nil), p...)
	tp, _ := parseTCP(p)
	binary.BigEndian.PutUint16(p[tp.ipLen+16:], checksumFold(pseudoSum(p, tp, len(p)-tp.ipLen)))
	h := virtioHdr{flags: virtioNeedsCsum, csumStart: uint16(tp.ipLen), csumOffset: tcpChecksumOffset}
	if err := completeChecksum(p, &h); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p, want) {
		t.Fatalf("checksum %x, want %x", p[tp.ipLen+16:tp.ipLen+18], want[tp.ipLen+16:tp.ipLen+18])
	}
	if err := completeChecksum(p[:10], &h); err == nil {
		t.Fatal("a checksum offset beyond the packet was accepted")
	}
}

// FuzzSplit: splitting whatever the kernel (or a bug) hands over never
// panics and never writes outside the buffers, and neither does checking
// its checksums (what ReadSuper does with a frame the kernel did not vouch
// for).
func FuzzSplit(f *testing.F) {
	f.Add(segment(false, 1, 1, tcpFlagACK, make([]byte, 3000)), uint16(1000), uint8(virtioGSOTCPv4))
	f.Add(segment(true, 1, 1, tcpFlagACK, make([]byte, 2500)), uint16(1200), uint8(virtioGSOTCPv6))
	f.Fuzz(func(t *testing.T, pkt []byte, gso uint16, typ uint8) {
		_ = checksumsValid(pkt)
		h := virtioHdr{gsoType: typ, gsoSize: gso}
		var sp splitter
		if err := sp.start(pkt, &h); err != nil {
			return
		}
		bufs := make([][]byte, 8)
		for i := range bufs {
			bufs[i] = make([]byte, 1600)
		}
		sizes := make([]int, len(bufs))
		for range 100 {
			n, err := sp.fill(bufs, sizes, 0)
			if err != nil || sp.done() {
				return
			}
			if n == 0 {
				t.Fatal("no progress")
			}
		}
	})
}

// TestChecksumAdd checks the word-at-a-time sum against the definition (16
// bits at a time) for every length up to 80 octets and every starting sum
// class, including the all-ones data that carries the most.
func TestChecksumAdd(t *testing.T) {
	slow := func(sum uint32, b []byte) uint16 {
		s := uint64(sum)
		for len(b) >= 2 {
			s += uint64(b[0])<<8 | uint64(b[1])
			b = b[2:]
		}
		if len(b) == 1 {
			s += uint64(b[0]) << 8
		}
		for s > 0xffff {
			s = s&0xffff + s>>16
		}
		return uint16(s)
	}
	ones := bytes.Repeat([]byte{0xff}, 80)
	seq := make([]byte, 80)
	for i := range seq {
		seq[i] = byte(i*37 + 11)
	}
	for _, data := range [][]byte{ones, seq} {
		for n := 0; n <= len(data); n++ {
			for _, start := range []uint32{0, 1, 0xffff, 0x1fffe, 0xffffffff} {
				if got, want := checksumFold(checksumAdd(start, data[:n])), slow(start, data[:n]); got != want {
					t.Fatalf("checksumAdd(%#x, %d octets of %#x...) = %#04x, want %#04x", start, n, data[0], got, want)
				}
			}
		}
	}
}

// TestChecksumsValid: what ReadSuper verifies for frames the kernel did not
// vouch for.
func TestChecksumsValid(t *testing.T) {
	good4 := segment(false, 7, 1000, tcpFlagACK, []byte("hello, rnic"))
	good6 := segment(true, 0, 1000, tcpFlagACK|tcpFlagPSH, []byte("odd"))
	flip := func(p []byte, i int) []byte {
		q := append([]byte(nil), p...)
		q[i] ^= 0x40
		return q
	}
	udp := func(sum bool) []byte {
		p := make([]byte, 20+8+5)
		p[0], p[8], p[9] = 0x45, 64, protoUDP
		copy(p[12:], []byte{198, 18, 1, 2, 198, 18, 2, 2})
		setIPLength(p, tcpPacket{ipLen: 20}, len(p))
		u := p[20:]
		binary.BigEndian.PutUint16(u[0:], 5000)
		binary.BigEndian.PutUint16(u[2:], 6000)
		binary.BigEndian.PutUint16(u[4:], 13)
		copy(u[8:], "rdma!")
		if sum {
			s := pseudoSumProto(p, tcpPacket{ipLen: 20}, 13, protoUDP)
			binary.BigEndian.PutUint16(u[6:], ^checksumFold(checksumAdd(s, u)))
		}
		return p
	}
	for _, tc := range []struct {
		name string
		p    []byte
		want bool
	}{
		{"ipv4 tcp", good4, true},
		{"ipv6 tcp, odd payload", good6, true},
		{"ipv4 header damaged", flip(good4, 8), false},
		{"tcp payload damaged", flip(good4, len(good4)-1), false},
		{"ipv6 tcp payload damaged", flip(good6, len(good6)-2), false},
		{"udp with checksum", udp(true), true},
		{"udp without checksum", udp(false), true},
		{"udp damaged", flip(udp(true), len(udp(true))-1), false},
		{"too short", good4[:10], false},
		{"not ip", append([]byte{0x10}, good4[1:]...), false},
	} {
		if got := checksumsValid(tc.p); got != tc.want {
			t.Errorf("%s: checksumsValid = %v, want %v", tc.name, got, tc.want)
		}
	}
}
