package netstack

import (
	"sync"
	"testing"

	"github.com/siwtun/siwtun/anatomy"
)

// TestHopsNoAllocs: with both stacks' recorders on, the aligned write and
// the ReadTo receive path stamp TCP's segments leaving (TCPOut), the
// link's writes and deliveries (TUNWrite, TUNRead: here a Pipe's), its
// queueing of received data (Queued) and its hand-over of it (Handover,
// at the right sequence numbers), without allocating per write.
func TestHopsNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("-race: sync.Pool drops items, gVisor's pools allocate")
	}
	a, b := newPair(t, pairOpts{mtu: 9000})
	ca, cb := connect(t, a, b, addrB4.Addr())
	buf := make([]byte, ca.MSS())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		d := &discardWriter{}
		for {
			if _, err := cb.ReadTo(d); err != nil {
				return
			}
		}
	}()
	for range 2000 { // warm gVisor's pools and the buffers' auto-tuning
		if _, err := ca.WriteAligned(buf); err != nil {
			t.Fatal(err)
		}
	}
	ca.WaitAcked(10e9)
	start, _, _ := ca.StreamSeqs()
	a.Anatomy().Start()
	b.Anatomy().Start()
	allocs := testing.AllocsPerRun(5000, func() {
		if _, err := ca.WriteAligned(buf); err != nil {
			t.Fatal(err)
		}
	})
	ca.WaitAcked(10e9)
	ca.CloseWrite()
	wg.Wait()
	t.Logf("allocs per write with the recorders on: %.3f", allocs)
	if allocs > 0.1 {
		t.Errorf("allocs per write with the recorders on: %.3f; want ~0", allocs)
	}
	out, in := a.Anatomy().Snapshot().Records, b.Anatomy().Snapshot().Records
	sport, dport := ca.LocalAddr().Port(), ca.RemoteAddr().Port()
	// 5001 writes (AllocsPerRun's warm-up call included), each one segment.
	checkCover(t, out, anatomy.TCPOut, sport, dport, start, 5001*uint32(len(buf)))
	checkCover(t, in, anatomy.Handover, sport, dport, start, 5001*uint32(len(buf)))
	// The pipe stamps its hand-overs as a device link stamps its writes
	// and reads.
	checkCover(t, out, anatomy.TUNWrite, sport, dport, start, 5001*uint32(len(buf)))
	checkCover(t, in, anatomy.TUNRead, sport, dport, start, 5001*uint32(len(buf)))
	queued := 0
	for _, r := range in {
		if r.Hop == anatomy.Queued && r.SrcPort == sport && r.DstPort == dport {
			queued++
		}
	}
	if queued == 0 {
		t.Error("no stamps of TCP queueing received data")
	}
}

// checkCover checks that the stamps of hop h cover the octets [start,
// start+n) of the flow in order (a retransmission, of octets already
// covered, may come between).
func checkCover(t *testing.T, recs []anatomy.Record, h anatomy.Hop, sport, dport uint16, start, n uint32) {
	t.Helper()
	seq := start
	for _, r := range recs {
		if r.Hop != h {
			continue
		}
		if int32(seq-(r.Seq+r.Len)) >= 0 && r.SrcPort == sport && r.DstPort == dport {
			continue // sent again
		}
		if r.SrcPort != sport || r.DstPort != dport || r.Seq != seq {
			t.Fatalf("%v stamp %+v, want %d -> %d at %d", h, r, sport, dport, seq)
		}
		seq += r.Len
	}
	if seq-start != n {
		t.Errorf("%v stamps cover %d octets, want %d", h, seq-start, n)
	}
}
