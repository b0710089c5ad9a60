package netstack

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// TestGateHoldAndReceiveWindow holds the first data segment a→b (and its
// retransmissions) while the rest pass: b's ReceiveWindow keeps
// acknowledging up to the held segment, the later segments lie inside the
// window it advertised, nothing is readable; after Release every octet
// arrives in order.
func TestGateHoldAndReceiveWindow(t *testing.T) {
	la, lb := Pipe(1500, Impairments{})
	lb, gate := NewGate(lb)
	a, b := newPair(t, pairOpts{linkA: la, linkB: lb})
	ca, cb := connect(t, a, b, addrB4.Addr())
	cb.SetSegmentHook(HeaderHookFunc(func(*Segment) {})) // our own segments are tracked with a hook
	_, recvSeq, ok := cb.StreamSeqs()
	if !ok {
		t.Fatal("StreamSeqs not known")
	}
	var mu sync.Mutex
	var heldSeq uint32
	var holding bool
	var later []Segment // the data segments after the held one
	gate.SetRule(func(s *Segment) GateVerdict {
		if s.Len == 0 {
			return GatePass
		}
		mu.Lock()
		defer mu.Unlock()
		if !holding {
			heldSeq, holding = s.Seq, true
		}
		if s.Seq == heldSeq {
			return GateHold
		}
		later = append(later, Segment{Seq: s.Seq, Len: s.Len})
		return GatePass
	})
	msg := make([]byte, 8*1460)
	fillPattern(msg, 0)
	if _, err := ca.Write(msg); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(later)
		mu.Unlock()
		if n >= 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d later segments passed the gate", n)
		}
		time.Sleep(time.Millisecond)
	}
	if heldSeq != recvSeq {
		t.Fatalf("held segment at %d, the stream's next octet is %d", heldSeq, recvSeq)
	}
	if gate.Held() == 0 {
		t.Fatal("nothing held")
	}
	time.Sleep(20 * time.Millisecond) // b's ACKs for the later segments
	ack, edge, ok := cb.ReceiveWindow()
	if !ok {
		t.Fatal("ReceiveWindow not known")
	}
	if ack != heldSeq {
		t.Errorf("ReceiveWindow ack %d, want the held segment's %d", ack, heldSeq)
	}
	mu.Lock()
	for _, s := range later {
		if end := s.Seq + uint32(s.Len); int32(end-edge) > 0 || int32(s.Seq-ack) <= 0 {
			t.Errorf("segment [%d, %d) not inside the advertised window [%d, %d)", s.Seq, end, ack, edge)
		}
	}
	mu.Unlock()
	cb.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if n, err := cb.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("read %d octets (%v) while the first segment is held", n, err)
	}
	cb.SetReadDeadline(time.Time{})
	if n := gate.Release(); n == 0 {
		t.Fatal("Release delivered nothing")
	}
	got := make([]byte, len(msg))
	if _, err := readFull(cb, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("data differs after Release")
	}
	time.Sleep(20 * time.Millisecond)
	if ack, _, _ := cb.ReceiveWindow(); ack != recvSeq+uint32(len(msg)) {
		t.Errorf("ReceiveWindow ack %d after the transfer, want %d", ack, recvSeq+uint32(len(msg)))
	}
}

// TestGateCorrupt damages one data segment: TCP accepts it (the checksum
// was fixed) and exactly the middle octet of that segment differs.
func TestGateCorrupt(t *testing.T) {
	la, lb := Pipe(1500, Impairments{})
	lb, gate := NewGate(lb)
	a, b := newPair(t, pairOpts{linkA: la, linkB: lb})
	ca, cb := connect(t, a, b, addrB4.Addr())
	_, base, _ := cb.StreamSeqs()
	var once sync.Once
	var at int
	gate.SetRule(func(s *Segment) GateVerdict {
		v := GatePass
		if s.Len > 0 {
			once.Do(func() {
				at = int(s.Seq-base) + s.Len/2
				v = GateCorrupt
			})
		}
		return v
	})
	msg := bytes.Repeat([]byte{0x11}, 3000)
	if _, err := ca.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := readFull(cb, got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		want := byte(0x11)
		if i == at {
			want = 0x11 ^ 0xff
		}
		if got[i] != want {
			t.Fatalf("octet %d = %#x, want %#x (corrupted octet at %d)", i, got[i], want, at)
		}
	}
}
