package netstack

import (
	"net/netip"
	"sync"
	"testing"
)

// lenRecorder records segments with their payload lengths (Segment.Payload is only valid during
// the call, so the recorder copies the length).
type lenRecorder struct {
	mu   sync.Mutex
	segs []recSeg
}

type recSeg struct {
	dir      Direction
	src, dst netip.AddrPort
	seq      uint32
	flags    uint8
	mss      uint16
	n        int
}

func (r *lenRecorder) Segment(s *Segment) {
	r.mu.Lock()
	r.segs = append(r.segs, recSeg{s.Dir, s.Src, s.Dst, s.Seq, s.Flags, s.MSS, len(s.Payload)})
	r.mu.Unlock()
}

func (r *lenRecorder) get() []recSeg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recSeg(nil), r.segs...)
}

func TestSegmentHook(t *testing.T) {
	recA, recB := &lenRecorder{}, &lenRecorder{}
	a, b := newPair(t, pairOpts{hookA: recA, hookB: recB})
	ca, cb := connect(t, a, b, addrB4.Addr())
	perConn := &lenRecorder{}
	cb.SetSegmentHook(perConn)
	const n = 1 << 20
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ca, n, 1000) }()
	v, err := receivePattern(cb)
	if err != nil || v.off != n || v.mismatches != 0 {
		t.Fatalf("transfer: %v, %d bytes, %d mismatches", err, v.off, v.mismatches)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	cb.SetSegmentHook(nil)

	segsA := recA.get()
	var synOut, synIn bool
	var outA, inA int
	var next uint32
	var haveNext bool
	var dataOut, retrans int
	for _, s := range segsA {
		if s.dir == Outbound {
			outA++
			if s.src != ca.LocalAddr() {
				continue
			}
			if s.flags&FlagSYN != 0 {
				synOut = true
				if s.mss != 1460 {
					t.Errorf("outbound SYN MSS = %d, want 1460", s.mss)
				}
				next, haveNext = s.seq+1, true
				continue
			}
			if s.n > 0 {
				end := s.seq + uint32(s.n)
				if haveNext && int32(end-next) <= 0 {
					retrans++ // e.g. a tail loss probe
					continue
				}
				dataOut += s.n
				if haveNext && s.seq != next {
					t.Fatalf("seq discontinuity: got %d, want %d", s.seq, next)
				}
				next = end
			}
		} else {
			inA++
			if s.flags&(FlagSYN|FlagACK) == FlagSYN|FlagACK {
				synIn = true
				if s.mss != 1460 {
					t.Errorf("inbound SYN-ACK MSS = %d, want 1460", s.mss)
				}
			} else if s.mss != 0 {
				t.Errorf("MSS %d on a non-SYN segment", s.mss)
			}
		}
	}
	if !synOut || !synIn || outA == 0 || inA == 0 {
		t.Errorf("hook missed segments: synOut=%v synIn=%v out=%d in=%d", synOut, synIn, outA, inA)
	}
	if dataOut != n {
		t.Errorf("outbound new data seen by hook = %d, want %d", dataOut, n)
	}
	t.Logf("a: %d outbound, %d inbound segments, %d retransmissions", outA, inA, retrans)
	// b's inbound data mirrors a's outbound data.
	var dataInB int
	for _, s := range recB.get() {
		if s.dir == Inbound && s.dst == cb.LocalAddr() {
			dataInB += s.n
		}
	}
	if dataInB < n {
		t.Errorf("inbound data at b = %d, want >= %d", dataInB, n)
	}
	var pc int
	for _, s := range perConn.get() {
		if s.dst != cb.LocalAddr() && s.src != cb.LocalAddr() {
			t.Fatalf("per-connection hook saw a foreign segment %v→%v", s.src, s.dst)
		}
		pc += s.n
	}
	if pc < n {
		t.Errorf("per-connection hook saw %d payload bytes, want >= %d", pc, n)
	}
}
