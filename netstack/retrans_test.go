package netstack

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// retransHook watches one sender's segments at the link: it notes every
// retransmitted data segment (one ending at or below the highest sequence
// already sent), whether it was the highest segment sent (a tail loss probe
// retransmits that one), and how long before it the last ACK arrived.
type retransHook struct {
	mu        sync.Mutex
	local     string               // the sender's address
	peer      string               // the receiver's address
	lastPeerA time.Time            // when the receiver last sent an ACK
	sentAcks  map[uint32]time.Time // ACKs the receiver sent, not yet seen by the sender
	transit   time.Duration        // longest Pipe transit of an ACK
	maxEnd    uint32
	haveMax   bool
	lastAck   time.Time
	lastEnd   uint32 // end of the highest segment sent
	events    []retransEvent
	ackGapMax time.Duration
}

type retransEvent struct {
	tail    bool          // the highest segment sent, i.e. a TLP
	sinceA  time.Duration // since the last ACK from the peer arrived
	inPipe  bool          // the peer had sent an ACK that was still in the Pipe
	sinceSA time.Duration // since the peer last sent an ACK
}

// peerHook is the receiver's side of retransHook: it notes when the
// receiver's ACKs leave its stack.
type peerHook struct{ h *retransHook }

func (p peerHook) Segment(s *Segment) {
	h := p.h
	if s.Dir != Outbound || s.Flags&FlagACK == 0 {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.Src.String() != h.peer {
		return
	}
	h.lastPeerA = now
	if _, ok := h.sentAcks[s.Ack]; !ok {
		h.sentAcks[s.Ack] = now
	}
}

func (h *retransHook) Segment(s *Segment) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.Dir == Inbound {
		if s.Dst.String() == h.local && s.Flags&FlagACK != 0 {
			if t, ok := h.sentAcks[s.Ack]; ok {
				h.transit = max(h.transit, now.Sub(t))
				delete(h.sentAcks, s.Ack)
			}
			if !h.lastAck.IsZero() && h.haveMax {
				h.ackGapMax = max(h.ackGapMax, now.Sub(h.lastAck))
			}
			h.lastAck = now
		}
		return
	}
	if s.Src.String() != h.local || len(s.Payload) == 0 {
		return
	}
	end := s.Seq + uint32(len(s.Payload))
	if h.haveMax && int32(end-h.maxEnd) <= 0 {
		h.events = append(h.events, retransEvent{
			tail:    end == h.maxEnd,
			sinceA:  now.Sub(h.lastAck),
			inPipe:  h.lastPeerA.After(h.lastAck),
			sinceSA: now.Sub(h.lastPeerA),
		})
		return
	}
	h.maxEnd, h.haveMax = end, true
}

// TestLosslessPipeRetransmissions moves 16 MiB one way over a lossless Pipe
// as fast as WriteAligned goes and accounts for every retransmission: the
// Pipe must neither drop (QueueFull) nor lose anything; what gVisor
// retransmits anyway is logged with its cause.
func TestLosslessPipeRetransmissions(t *testing.T) {
	if testing.Short() {
		t.Skip("saturating transfer")
	}
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprint(mtu), func(t *testing.T) {
			h := &retransHook{sentAcks: make(map[uint32]time.Time)}
			a, b := newPair(t, pairOpts{mtu: mtu, hookA: h, hookB: peerHook{h}})
			ca, cb := connect(t, a, b, addrB4.Addr())
			h.mu.Lock()
			h.local, h.peer = ca.LocalAddr().String(), cb.LocalAddr().String()
			h.mu.Unlock()
			const n = 16 << 20
			errc := make(chan error, 1)
			start := time.Now()
			go func() { errc <- sendPattern(ca, n, ca.MSS()) }()
			v, err := receivePattern(cb)
			if err != nil || v.off != n || v.mismatches != 0 {
				t.Fatalf("transfer: %v, %d bytes, %d mismatches", err, v.off, v.mismatches)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			el := time.Since(start)
			var info tcpip.TCPInfoOption
			if terr := ca.ep.GetSockOpt(&info); terr != nil {
				t.Fatal(terr)
			}
			ls := a.link.Stats()
			st := a.s.Stats().TCP
			h.mu.Lock()
			defer h.mu.Unlock()
			tails, inPipe := 0, 0
			var sinceMin, sinceMax time.Duration
			for i, e := range h.events {
				if e.tail {
					tails++
				}
				if e.inPipe {
					inPipe++
				}
				t.Logf("retransmission %d: tail %v, %v after the last ACK arrived, %v after the receiver last sent one, an ACK in the Pipe: %v",
					i, e.tail, e.sinceA, e.sinceSA, e.inPipe)
				if i == 0 || e.sinceA < sinceMin {
					sinceMin = e.sinceA
				}
				sinceMax = max(sinceMax, e.sinceA)
			}
			t.Logf("MTU %d: %d MiB in %v (%.0f MB/s); link a→b sent %d delivered %d queueFull %d dropped %d; b→a queueFull %d",
				mtu, n>>20, el.Round(time.Millisecond), n/el.Seconds()/1e6, ls.Tx.Sent, ls.Tx.Delivered, ls.Tx.QueueFull, ls.Tx.Dropped, ls.Rx.QueueFull)
			t.Logf("TCP a: retransmits %d (at the link: %d, %d of them the tail segment), timeouts %d, fast retransmits %d, SACK recoveries %d, TLP recoveries %d, spurious recoveries %d, DSACK-acked %d; SRTT %v RTO %v; retransmitted %v–%v after the last ACK (%d with an ACK still in the Pipe), longest ACK gap %v, longest ACK transit through the Pipe %v",
				st.Retransmits.Value(), len(h.events), tails, st.Timeouts.Value(), st.FastRetransmit.Value(), st.SACKRecovery.Value(),
				st.TLPRecovery.Value(), st.SpuriousRecovery.Value(), st.SegmentsAckedWithDSACK.Value(), info.RTT, info.RTO, sinceMin, sinceMax, inPipe, h.ackGapMax, h.transit)
			if ls.Tx.QueueFull != 0 || ls.Tx.Dropped != 0 || ls.Rx.QueueFull != 0 || ls.Rx.Dropped != 0 {
				t.Errorf("lossless Pipe dropped packets: %+v", ls)
			}
			if ls.Tx.Sent != ls.Tx.Delivered {
				t.Errorf("a→b: %d sent, %d delivered", ls.Tx.Sent, ls.Tx.Delivered)
			}
		})
	}
}
