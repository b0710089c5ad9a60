package netstack

import (
	"encoding/binary"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// superDevice is a chanDevice whose reads merge runs of consecutive
// full-sized TCP data segments already queued into one super-segment (one
// IPv4 and TCP header, the payloads back to back, gso the segment size), as
// a TUN device with segmentation offload hands over what the kernel did not
// cut. The merged packet's TCP checksum is left stale: the link advertises
// receive checksum offload, so the stack must not check it.
type superDevice struct {
	*chanDevice
	held   []byte       // a packet taken from the channel that did not join the run (the one reader's)
	supers atomic.Int64 // super-segments handed over
	wire   atomic.Int64 // wire segments inside them
}

func (d *superDevice) SupportsSuper() bool { return true }

func (d *superDevice) next() ([]byte, error) {
	if d.held != nil {
		b := d.held
		d.held = nil
		return b, nil
	}
	select {
	case b := <-d.in:
		return b, nil
	case <-d.done:
		return nil, os.ErrClosed
	}
}

// tcpData returns the header length and payload length of an IPv4 TCP
// packet without options in its IP header, or ok false.
func tcpData(b []byte) (hlen, plen int, seq uint32, ok bool) {
	if len(b) < 40 || b[0] != 0x45 || b[9] != protoTCP {
		return 0, 0, 0, false
	}
	hlen = 20 + int(b[32]>>4)*4
	if hlen > len(b) || b[33]&(FlagSYN|FlagFIN|FlagRST) != 0 {
		return 0, 0, 0, false
	}
	return hlen, len(b) - hlen, binary.BigEndian.Uint32(b[24:]), true
}

func (d *superDevice) ReadSuper(p []byte) (int, int, error) {
	first, err := d.next()
	if err != nil {
		return 0, 0, err
	}
	hlen, mss, seq, ok := tcpData(first)
	if !ok || mss == 0 {
		return copy(p, first), 0, nil
	}
	n := copy(p, first)
	count := 1
	for count < 8 && n+mss <= len(p) {
		var b []byte
		select {
		case b = <-d.in:
		default:
		}
		if b == nil {
			break
		}
		h2, pl, s2, ok := tcpData(b)
		if !ok || h2 != hlen || pl > mss || s2 != seq+uint32(count*mss) || string(b[12:20]) != string(first[12:20]) || string(b[20:24]) != string(first[20:24]) {
			d.held = b
			break
		}
		n += copy(p[n:], b[hlen:])
		count++
		// As Linux's GRO does (tcp_gro_receive), the super-segment
		// carries a merged segment's PSH, and a PSH ends it.
		p[33] |= b[33] & FlagPSH
		if pl < mss || b[33]&FlagPSH != 0 {
			break
		}
	}
	if count == 1 {
		return n, 0, nil
	}
	binary.BigEndian.PutUint16(p[2:], uint16(n))
	d.supers.Add(1)
	d.wire.Add(int64(count))
	return n, mss, nil
}

// wireRecorder records the inbound data segments a hook sees.
type wireRecorder struct {
	mu     sync.Mutex
	maxLen int
	bytes  int
	segs   int
}

func (w *wireRecorder) Segment(s *Segment) {
	if s.Dir != Inbound || s.Len == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.segs++
	w.bytes += s.Len
	w.maxLen = max(w.maxLen, s.Len)
	if len(s.Payload) != s.Len {
		w.maxLen = 1 << 30 // a payload that is not the wire segment's
	}
}

// TestSuperSegmentsWhole: a device link over a SuperReader gives gVisor
// each super-segment as one packet (its stale checksum unchecked), the
// data arrives intact and in order, and the segment hooks see the wire
// segments inside (none longer than the MSS, every byte once).
func TestSuperSegmentsWhole(t *testing.T) {
	da, db := devicePair(1500)
	sb := &superDevice{chanDevice: db}
	rec := &wireRecorder{}
	a, b := newPair(t, pairOpts{linkA: NewDeviceLink(da), linkB: NewDeviceLink(sb), hookB: rec})
	ca, cb := connect(t, a, b, addrB4.Addr())
	mss := ca.MSS()
	const total = 4 << 20
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ca, total, 16*mss) }()
	start := time.Now()
	v, err := receivePattern(cb)
	t.Logf("received in %v", time.Since(start))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if v.off != total || v.mismatches != 0 {
		t.Fatalf("received %d bytes, %d wrong (first at %d), want %d intact", v.off, v.mismatches, v.firstBad, int64(total))
	}
	supers, wire := sb.supers.Load(), sb.wire.Load()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	t.Logf("%d super-segments of %d wire segments; hook saw %d data segments, %d bytes, longest %d (MSS %d)", supers, wire, rec.segs, rec.bytes, rec.maxLen, mss)
	if supers == 0 {
		t.Fatal("the device never merged segments: the test did not exercise super-segments")
	}
	if rec.maxLen > mss {
		t.Errorf("the hook saw a %d-octet segment (or a payload not its own); wire segments are at most the MSS, %d", rec.maxLen, mss)
	}
	if rec.bytes < total || rec.segs < total/mss {
		t.Errorf("the hook saw %d bytes in %d segments, want at least %d in %d", rec.bytes, rec.segs, total, total/mss)
	}
}

// TestImpairSplitsSuperSegments: an impaired link reads wire segments
// (loss and corruption act on segments) and so checks checksums itself.
func TestImpairSplitsSuperSegments(t *testing.T) {
	_, db := devicePair(1500)
	l := NewDeviceLink(&superDevice{chanDevice: db})
	ep := l.ep.(*deviceEndpoint)
	if !ep.whole.Load() || ep.Capabilities() == 0 {
		t.Fatal("a device link over a SuperReader does not read super-segments whole with receive checksum offload")
	}
	il := Impair(l, Impairments{Loss: 0.01})
	defer il.Close()
	if ep.whole.Load() || ep.Capabilities() != 0 {
		t.Fatal("an impaired device link still reads super-segments whole (or offloads checksums)")
	}
}
