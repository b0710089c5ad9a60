package netstack

import (
	"fmt"
	"io"
	"net/netip"
	"sync"
	"testing"
)

// maxSegHook tracks the largest outbound payload and write alignment.
type maxSegHook struct {
	mu          sync.Mutex
	local       netip.AddrPort
	maxPayload  int
	iss         uint32
	haveISS     bool
	mss         int
	data        int
	misaligned  int
	maxSeqEnd   uint32
	retransmits int
}

func (h *maxSegHook) Segment(s *Segment) {
	if s.Dir != Outbound {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.local.IsValid() && s.Src != h.local {
		return
	}
	if s.Flags&FlagSYN != 0 {
		h.iss, h.haveISS = s.Seq, true
		h.maxSeqEnd = s.Seq + 1
		return
	}
	n := len(s.Payload)
	if n == 0 {
		return
	}
	h.maxPayload = max(h.maxPayload, n)
	if h.mss > 0 && h.haveISS {
		end := s.Seq + uint32(n)
		if int32(end-h.maxSeqEnd) <= 0 {
			h.retransmits++
		} else {
			h.maxSeqEnd = end
		}
		h.data++
		off := s.Seq - (h.iss + 1)
		if int(off)%h.mss != 0 || n%h.mss != 0 {
			h.misaligned++
		}
	}
}

func TestMSS(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mtu, mtuB  int
		remote     netip.Addr
		want       int
		wantPeerTo int // b's MSS towards a
	}{
		{"ipv4-1500", 1500, 0, addrB4.Addr(), 1420, 1420},
		{"ipv4-9000", 9000, 0, addrB4.Addr(), 8920, 8920},
		{"ipv6-1500", 1500, 0, addrB6.Addr(), 1400, 1400},
		{"ipv6-9000", 9000, 0, addrB6.Addr(), 8900, 8900},
		// b runs at MTU 1500 on a 9000 link, so it announces MSS 1460:
		// a's sender is bounded by the peer's MSS, not by its own MTU.
		{"ipv4-peer-smaller", 9000, 1500, addrB4.Addr(), 1420, 1420},
		{"ipv4-65535", 65535, 0, addrB4.Addr(), 65455, 65455},
		{"ipv6-65535", 65535, 0, addrB6.Addr(), 65435, 65435},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &maxSegHook{}
			a, b := newPair(t, pairOpts{mtu: tc.mtu, mtuB: tc.mtuB, hookA: h})
			ca, cb := connect(t, a, b, tc.remote)
			if got := ca.MSS(); got != tc.want {
				t.Errorf("a.MSS() = %d, want %d", got, tc.want)
			}
			if got := cb.MSS(); got != tc.wantPeerTo {
				t.Errorf("b.MSS() = %d, want %d", got, tc.wantPeerTo)
			}
			// Large plain writes make gVisor split at its MaxPayloadSize.
			const n = 4 << 20
			errc := make(chan error, 1)
			go func() {
				buf := make([]byte, 256<<10)
				for off := 0; off < n; off += len(buf) {
					if _, err := ca.Write(buf); err != nil {
						errc <- err
						return
					}
				}
				errc <- ca.CloseWrite()
			}()
			if _, err := io.Copy(io.Discard, cb); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.maxPayload != ca.MSS() {
				t.Errorf("largest outbound data segment = %d, MSS() = %d", h.maxPayload, ca.MSS())
			}
		})
	}
}

func TestMSSFormula(t *testing.T) {
	for _, tc := range []struct {
		mtu      int
		v6       bool
		peer     uint16
		ts, sack bool
		want     int
	}{
		{1500, false, 1460, true, true, 1420},
		{9000, false, 8960, true, true, 8920},
		{1500, true, 1440, true, true, 1400},
		{1500, false, 1460, false, true, 1424},
		{1500, false, 1460, true, false, 1448},
		{1500, false, 1460, false, false, 1460},
		{1500, false, 536, true, true, 496},
		{9000, false, 1000, true, true, 960},
		{65535, false, 65495, true, true, 65455},
		{65535, true, 65475, true, true, 65435},
	} {
		if got := effectiveMSS(networkMTU(tc.mtu, tc.v6), tc.peer, tc.ts, tc.sack); got != tc.want {
			t.Errorf("effectiveMSS(mtu %d v6=%v peer %d ts=%v sack=%v) = %d, want %d", tc.mtu, tc.v6, tc.peer, tc.ts, tc.sack, got, tc.want)
		}
	}
}

func TestWriteAlignedSegments(t *testing.T) {
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprint(mtu), func(t *testing.T) {
			h := &maxSegHook{}
			a, b := newPair(t, pairOpts{mtu: mtu, hookA: h})
			ca, cb := connect(t, a, b, addrB4.Addr())
			h.mu.Lock()
			h.mss, h.local = ca.MSS(), ca.LocalAddr()
			h.mu.Unlock()
			n := int64(ca.MSS()) * 8000
			errc := make(chan error, 1)
			go func() { errc <- sendPattern(ca, n, ca.MSS()) }()
			v, err := receivePattern(cb)
			if err != nil || v.off != n || v.mismatches != 0 {
				t.Fatalf("transfer: %v, %d bytes, %d mismatches", err, v.off, v.mismatches)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			pct := 100 * float64(h.misaligned) / float64(h.data)
			t.Logf("MTU %d MSS %d: %d data segments, %d misaligned (%.3f%%), %d partial writes, %d ReadTo writes for %d bytes",
				mtu, ca.MSS(), h.data, h.misaligned, pct, ca.partialWrites.Load(), v.calls, v.off)
			if pct > 5 {
				t.Errorf("%.2f%% of data segments misaligned, want < 5%%", pct)
			}
		})
	}
}

// TestWriteAlignedWholeBatches writes batches of several MSS-sized units per
// WriteAligned through a small send buffer, where gVisor's own accounting of
// the buffer lags the ACKs waitRoom counts: a batch gVisor took only in part
// used to leave a short segment and start every later segment of the batch
// inside a unit. Every batch must go whole (partialWrites 0) and every data
// segment must start and end on a unit boundary. RACK is off, as siwtun up
// runs its stacks: its tail loss probes, spurious on a loaded machine, are
// retransmissions gVisor cuts anew.
func TestWriteAlignedWholeBatches(t *testing.T) {
	for i := range 3 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			h := &maxSegHook{}
			a, b := newPair(t, pairOpts{mtu: 9000, hookA: h, sndBuf: 96 << 10, noRACK: true})
			ca, cb := connect(t, a, b, addrB4.Addr())
			h.mu.Lock()
			h.mss, h.local = ca.MSS(), ca.LocalAddr()
			h.mu.Unlock()
			k := (64 << 10) / ca.MSS()
			n := int64(ca.MSS()) * int64(k) * 2000
			errc := make(chan error, 1)
			go func() { errc <- sendPattern(ca, n, ca.MSS()*k) }()
			v, err := receivePattern(cb)
			if err != nil || v.off != n || v.mismatches != 0 {
				t.Fatalf("transfer: %v, %d bytes, %d mismatches", err, v.off, v.mismatches)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			t.Logf("%d data segments (%d retransmitted), %d batches refused for short room and tried again", h.data, h.retransmits, ca.ShortRoomRetries())
			if p := ca.partialWrites.Load(); p != 0 {
				t.Errorf("%d batches went to gVisor in parts", p)
			}
			if h.misaligned != 0 {
				t.Errorf("%d of %d data segments not on unit boundaries", h.misaligned, h.data)
			}
		})
	}
}
