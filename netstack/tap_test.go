package netstack

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// tapRecorder keeps copies of what a tap saw.
type tapRecorder struct {
	mu   sync.Mutex
	segs []Segment
}

func (r *tapRecorder) Segment(s *Segment) {
	c := *s
	c.Payload = bytes.Clone(s.Payload)
	r.mu.Lock()
	r.segs = append(r.segs, c)
	r.mu.Unlock()
}

func (r *tapRecorder) take() []Segment {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.segs
	r.segs = nil
	return s
}

// TestSetTap: a tap installed while the stack runs sees the SYNs (with
// their MSS) and every payload octet both ways; once removed it sees
// nothing more; a per-connection HeaderHook keeps working beside it.
func TestSetTap(t *testing.T) {
	a, b := newPair(t, pairOpts{mtu: 1500})
	var tap tapRecorder
	a.SetTap(&tap)
	ca, cb := connect(t, a, b, addrB4.Addr())
	var hdrSegs int
	var mu sync.Mutex
	ca.SetSegmentHook(HeaderHookFunc(func(s *Segment) {
		if s.Payload != nil {
			t.Error("HeaderHook got a payload")
		}
		mu.Lock()
		hdrSegs++
		mu.Unlock()
	}))
	msg := bytes.Repeat([]byte("siwtun tap "), 500)
	if _, err := ca.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := readFull(cb, got); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	if _, err := readFull(ca, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the last ACKs
	segs := tap.take()
	// Each direction's payload, laid out by sequence number from the
	// SYN's: a retransmission under load overlays its first copy.
	var out, in []byte
	var issOut, issIn uint32
	var syn, synAck bool
	for _, s := range segs {
		switch {
		case s.Flags&FlagSYN != 0 && s.Flags&FlagACK == 0:
			syn = s.Dir == Outbound && s.MSS != 0
			issOut = s.Seq
		case s.Flags&FlagSYN != 0:
			synAck = s.Dir == Inbound && s.MSS != 0
			issIn = s.Seq
		}
		if s.Len != len(s.Payload) {
			t.Fatalf("segment Len %d with %d payload octets", s.Len, len(s.Payload))
		}
		if s.Len == 0 {
			continue
		}
		if s.Dir == Outbound {
			out = overlay(out, int(s.Seq-issOut-1), s.Payload)
		} else {
			in = overlay(in, int(s.Seq-issIn-1), s.Payload)
		}
	}
	if !syn || !synAck {
		t.Errorf("tap saw SYN %v, SYN-ACK %v", syn, synAck)
	}
	if !bytes.Equal(out, msg) || string(in) != "reply" {
		t.Errorf("tap saw %d octets out, %q in", len(out), in)
	}
	mu.Lock()
	if hdrSegs == 0 {
		t.Error("the per-connection hook saw nothing")
	}
	mu.Unlock()

	a.SetTap(nil)
	if _, err := ca.Write(msg[:100]); err != nil {
		t.Fatal(err)
	}
	if _, err := readFull(cb, got[:100]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if segs := tap.take(); len(segs) != 0 {
		t.Errorf("removed tap still saw %d segments", len(segs))
	}
}

// readFull reads exactly len(p) octets.
func readFull(c *Conn, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := c.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// overlay writes p into buf at off, growing buf as needed.
func overlay(buf []byte, off int, p []byte) []byte {
	if end := off + len(p); end > len(buf) {
		buf = append(buf, make([]byte, end-len(buf))...)
	}
	copy(buf[off:], p)
	return buf
}

// TestTapGSOPureSegments: on a link with segmentation offload, where
// gVisor marks every TCP packet for offload, the tap sees the outbound
// segments without payload (pure ACKs, the FIN) as well as the data: every
// segment one end's tap saw arrive, the other end's tap saw leave.
func TestTapGSOPureSegments(t *testing.T) {
	da, db := devicePair(1500)
	la := NewDeviceLink(&frameDevice{superDevice: &superDevice{chanDevice: da}})
	lb := NewDeviceLink(&frameDevice{superDevice: &superDevice{chanDevice: db}})
	a, b := newPair(t, pairOpts{linkA: la, linkB: lb})
	if !a.gso || !b.gso {
		t.Fatal("the stacks did not take up segmentation offload")
	}
	var tapA, tapB tapRecorder
	a.SetTap(&tapA)
	b.SetTap(&tapB)
	ca, cb := connect(t, a, b, addrB4.Addr())
	msg := bytes.Repeat([]byte("pure "), 20000)
	if _, err := ca.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := readFull(cb, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	if err := ca.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the last ACKs
	type key struct {
		seq, ack uint32
		flags    uint8
		n        int
	}
	sent := map[key]bool{}
	var pureOut, finOut int
	for _, s := range tapA.take() {
		if s.Dir != Outbound {
			continue
		}
		sent[key{s.Seq, s.Ack, s.Flags, s.Len}] = true
		if s.Len == 0 && s.Flags&FlagSYN == 0 {
			pureOut++
		}
		if s.Flags&FlagFIN != 0 {
			finOut++
		}
	}
	missing := 0
	for _, s := range tapB.take() {
		if s.Dir == Inbound && !sent[key{s.Seq, s.Ack, s.Flags, s.Len}] {
			if missing < 5 {
				t.Errorf("b received seq %d ack %d flags %#x len %d, which a's tap never saw leave", s.Seq, s.Ack, s.Flags, s.Len)
			}
			missing++
		}
	}
	if pureOut == 0 || finOut == 0 {
		t.Errorf("a's tap saw %d outbound segments without payload, %d FINs", pureOut, finOut)
	}
	t.Logf("a's tap: %d outbound segments, %d without payload; %d arrivals at b not seen leaving a", len(sent), pureOut, missing)
}
