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
