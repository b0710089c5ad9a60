package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var (
	addrA4 = netip.MustParsePrefix("10.9.0.1/24")
	addrB4 = netip.MustParsePrefix("10.9.0.2/24")
	addrA6 = netip.MustParsePrefix("fd00:5157::1/64")
	addrB6 = netip.MustParsePrefix("fd00:5157::2/64")
)

type pairOpts struct {
	mtu        int
	mtuB       int // stack b's MTU if non-zero (below the link MTU)
	imp        Impairments
	hookA      SegmentHook
	hookB      SegmentHook
	sndBuf     int
	rcvBuf     int
	linkA      *Link
	linkB      *Link
	addrsA     []netip.Prefix
	addrsB     []netip.Prefix
	noCleanups bool
}

// newPair builds two stacks over a Pipe, each with an IPv4 and an IPv6
// address.
func newPair(t testing.TB, o pairOpts) (a, b *Stack) {
	t.Helper()
	la, lb := o.linkA, o.linkB
	if la == nil {
		la, lb = Pipe(o.mtu, o.imp)
	}
	if o.addrsA == nil {
		o.addrsA = []netip.Prefix{addrA4, addrA6}
		o.addrsB = []netip.Prefix{addrB4, addrB6}
	}
	a, err := New(la, Options{Addrs: o.addrsA, Hook: o.hookA, SendBufferSize: o.sndBuf, ReceiveBufferSize: o.rcvBuf})
	if err != nil {
		t.Fatalf("New(a): %v", err)
	}
	b, err = New(lb, Options{Addrs: o.addrsB, MTU: o.mtuB, Hook: o.hookB, SendBufferSize: o.sndBuf, ReceiveBufferSize: o.rcvBuf})
	if err != nil {
		a.Close()
		t.Fatalf("New(b): %v", err)
	}
	if !o.noCleanups {
		t.Cleanup(func() {
			a.Close()
			b.Close()
		})
	}
	return a, b
}

// connect dials from a to b and returns both ends.
func connect(t testing.TB, a, b *Stack, remote netip.Addr) (ca, cb *Conn) {
	t.Helper()
	l, err := b.Listen(netip.AddrPortFrom(netip.Addr{}, 0))
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept(ctx)
		ch <- res{c, err}
	}()
	ca, err = a.Dial(ctx, netip.Addr{}, netip.AddrPortFrom(remote, l.Addr().Port()))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("Accept: %v", r.err)
	}
	t.Cleanup(func() {
		ca.Close()
		r.c.Close()
	})
	return ca, r.c
}

// pattern is the byte at stream offset off.
func pattern(off int64) byte { return byte(off*131 + off>>9) }

func fillPattern(p []byte, off int64) {
	for i := range p {
		p[i] = pattern(off + int64(i))
	}
}

// verifier is a ReadTo sink checking the pattern.
type verifier struct {
	off        int64
	mismatches int64
	firstBad   int64
	calls      int64
}

func (v *verifier) Write(p []byte) (int, error) {
	v.calls++
	for i, c := range p {
		if c != pattern(v.off+int64(i)) {
			if v.mismatches == 0 {
				v.firstBad = v.off + int64(i)
			}
			v.mismatches++
		}
	}
	v.off += int64(len(p))
	return len(p), nil
}

// sendPattern writes n pattern bytes in chunks of size chunk with
// WriteAligned, then CloseWrite.
func sendPattern(c *Conn, n int64, chunk int) error {
	buf := make([]byte, chunk)
	for off := int64(0); off < n; {
		k := min(int64(chunk), n-off)
		fillPattern(buf[:k], off)
		if _, err := c.WriteAligned(buf[:k]); err != nil {
			return fmt.Errorf("WriteAligned at %d: %w", off, err)
		}
		off += k
	}
	return c.CloseWrite()
}

// receivePattern reads with ReadTo until EOF and checks the pattern.
func receivePattern(c *Conn) (*verifier, error) {
	v := &verifier{}
	for {
		_, err := c.ReadTo(v)
		if errors.Is(err, io.EOF) {
			return v, nil
		}
		if err != nil {
			return v, err
		}
	}
}

// bulk moves n bytes each way at once and checks them byte for byte.
func bulk(t *testing.T, ca, cb *Conn, n int64) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	results := make([]*verifier, 2)
	for i, pair := range [][2]*Conn{{ca, cb}, {cb, ca}} {
		src, dst := pair[0], pair[1]
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := sendPattern(src, n, src.MSS()); err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			v, err := receivePattern(dst)
			results[i] = v
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, v := range results {
		if v.off != n || v.mismatches != 0 {
			t.Fatalf("direction %d: got %d bytes, %d mismatches (first at %d), want %d exact", i, v.off, v.mismatches, v.firstBad, n)
		}
	}
}

func TestBulkExact(t *testing.T) {
	const n = 16 << 20
	for _, tc := range []struct {
		name   string
		mtu    int
		remote netip.Addr
	}{
		{"ipv4-1500", 1500, addrB4.Addr()},
		{"ipv6-1500", 1500, addrB6.Addr()},
		{"ipv4-9000", 9000, addrB4.Addr()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newPair(t, pairOpts{mtu: tc.mtu})
			ca, cb := connect(t, a, b, tc.remote)
			if got := ca.RemoteAddr().Addr(); got != tc.remote {
				t.Errorf("RemoteAddr = %v, want %v", got, tc.remote)
			}
			if ca.LocalAddr() != cb.RemoteAddr() || cb.LocalAddr() != ca.RemoteAddr() {
				t.Errorf("addresses disagree: a %v→%v, b %v→%v", ca.LocalAddr(), ca.RemoteAddr(), cb.LocalAddr(), cb.RemoteAddr())
			}
			bulk(t, ca, cb, n)
			sa, sb := a.Stats(), b.Stats()
			if sa.ActiveOpens != 1 || sb.PassiveOpens != 1 {
				t.Errorf("ActiveOpens=%d PassiveOpens=%d, want 1 and 1", sa.ActiveOpens, sb.PassiveOpens)
			}
			if sa.OutSegs < n/uint64(ca.MSS()) || sb.InSegs < n/uint64(ca.MSS()) {
				t.Errorf("segment counters too small: a.OutSegs=%d b.InSegs=%d", sa.OutSegs, sb.InSegs)
			}
			t.Logf("a: %+v\nlink a: %+v", sa, a.link.Stats())
		})
	}
}

// TestBulkImpaired runs in real time, not in a testing/synctest bubble. Tried
// (tailscale's throughput_test does it with its gVisor): with this gVisor the
// handshake never completes inside a bubble. gVisor's TCP processor
// goroutines park in pkg/sleep via a linknamed gopark with waitReasonSelect
// (gvisor/pkg/sync.Gopark(..., WaitReasonSelect, ...)); synctest only counts
// goroutines blocked on bubbled channels, timers, sync.Cond etc. as durably
// blocked (runtime isIdleInSynctest), so the bubble never looks idle, the
// fake clock never advances and the first delayed packet never leaves.
func TestBulkImpaired(t *testing.T) {
	const n = 16 << 20
	imp, err := ParseImpairments("loss=0.5%,reorder=2%,dup=0.5%,delay=200us,jitter=50us,seed=7")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("impairments: %v", imp)
	a, b := newPair(t, pairOpts{mtu: 1500, imp: imp})
	ca, cb := connect(t, a, b, addrB4.Addr())
	bulk(t, ca, cb, n)
	ls := a.link.Stats()
	t.Logf("link a: %+v", ls)
	t.Logf("tcp a: %+v", a.Stats())
	if ls.Tx.Dropped == 0 || ls.Tx.Reordered == 0 || ls.Tx.Duplicated == 0 {
		t.Errorf("impairments not applied: %+v", ls.Tx)
	}
	if a.Stats().RetransSegs == 0 {
		t.Errorf("no retransmissions despite loss")
	}
}

func TestCorruptReachesApplication(t *testing.T) {
	const n = 2 << 20
	imp := Impairments{Seed: 3, Corrupt: 0.01}
	a, b := newPair(t, pairOpts{mtu: 1500, imp: imp})
	ca, cb := connect(t, a, b, addrB4.Addr())
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ca, n, ca.MSS()) }()
	v, err := receivePattern(cb)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	corrupted := a.link.Stats().Tx.Corrupted
	t.Logf("corrupted segments: %d, mismatched bytes at the application: %d (first at %d)", corrupted, v.mismatches, v.firstBad)
	if v.off != n {
		t.Fatalf("got %d bytes, want %d", v.off, n)
	}
	if corrupted == 0 || v.mismatches == 0 {
		t.Fatalf("corruption did not reach the application: corrupted=%d mismatches=%d", corrupted, v.mismatches)
	}
	if uint64(v.mismatches) > corrupted {
		t.Errorf("%d mismatched bytes for %d corrupted segments (one byte each)", v.mismatches, corrupted)
	}
	if cs := b.Stats().InCsumErrors; cs != 0 {
		t.Errorf("TCP saw %d checksum errors: the checksum was not fixed", cs)
	}
}

func TestOrderlyClose(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB4.Addr())
	if _, err := ca.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := ca.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(cb)
	if err != nil || string(got) != "hello" {
		t.Fatalf("ReadAll = %q, %v; want hello, nil", got, err)
	}
	// Half-close: b can still answer.
	if _, err := cb.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	cb.Close()
	got, err = io.ReadAll(ca)
	if err != nil || string(got) != "bye" {
		t.Fatalf("ReadAll = %q, %v; want bye, nil", got, err)
	}
	if _, err := ca.ReadTo(io.Discard); !errors.Is(err, io.EOF) {
		t.Errorf("ReadTo after EOF: %v, want io.EOF", err)
	}
	ca.Close()
	if _, err := ca.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v, want net.ErrClosed", err)
	}
	if _, err := ca.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v, want net.ErrClosed", err)
	}
}

func TestAbort(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB4.Addr())
	errc := make(chan error, 1)
	go func() {
		_, err := cb.ReadTo(io.Discard)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if err := ca.Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("ReadTo after peer abort: %v, want ECONNRESET", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ReadTo not unblocked by RST")
	}
	if _, err := cb.Write([]byte("x")); err == nil {
		t.Errorf("Write after RST succeeded")
	}
	if a.Stats().OutRsts == 0 || b.Stats().InRsts == 0 {
		t.Errorf("OutRsts=%d InRsts=%d, want > 0", a.Stats().OutRsts, b.Stats().InRsts)
	}
}

func TestDialRefused(t *testing.T) {
	a, _ := newPair(t, pairOpts{})
	_, err := a.Dial(context.Background(), netip.Addr{}, netip.AddrPortFrom(addrB4.Addr(), 9))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Dial to closed port: %v, want ECONNREFUSED", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Dial(ctx, netip.Addr{}, netip.AddrPortFrom(addrB4.Addr(), 9)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial with cancelled ctx: %v", err)
	}
}

func TestReadDeadline(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB6.Addr())
	start := time.Now()
	cb.SetReadDeadline(start.Add(50 * time.Millisecond))
	_, err := cb.ReadTo(io.Discard)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadTo: %v, want os.ErrDeadlineExceeded", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 5*time.Second {
		t.Errorf("deadline fired after %v", d)
	}
	if _, err := cb.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read after deadline: %v", err)
	}
	cb.SetReadDeadline(time.Time{})
	if _, err := ca.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 1)
	if n, err := cb.Read(p); n != 1 || err != nil {
		t.Fatalf("Read after clearing deadline: %d, %v", n, err)
	}
	// A deadline in the past fails at once; a later one can be re-armed.
	cb.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := cb.Read(p); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with past deadline: %v", err)
	}
	cb.SetReadDeadline(time.Now().Add(time.Hour))
	ca.Write([]byte("y"))
	if n, err := cb.Read(p); n != 1 || err != nil || p[0] != 'y' {
		t.Fatalf("Read with future deadline: %d, %v", n, err)
	}
}

func TestListenerCloseUnblocksAccept(t *testing.T) {
	_, b := newPair(t, pairOpts{})
	l, err := b.Listen(netip.AddrPortFrom(addrB4.Addr(), 4791))
	if err != nil {
		t.Fatal(err)
	}
	if l.Addr() != netip.AddrPortFrom(addrB4.Addr(), 4791) {
		t.Errorf("Addr = %v", l.Addr())
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept(context.Background())
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	l.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept not unblocked by Close")
	}
	if _, err := b.Listen(netip.AddrPortFrom(addrB4.Addr(), 4791)); err != nil {
		t.Errorf("re-Listen after Close: %v", err)
	}
}

func TestBlockedReadUnblockedByClose(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	_, cb := connect(t, a, b, addrB4.Addr())
	errc := make(chan error, 1)
	go func() {
		_, err := cb.ReadTo(io.Discard)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	cb.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("ReadTo: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ReadTo not unblocked by Close")
	}
}

// shortWriter accepts limit bytes, then fails.
type shortWriter struct {
	limit int
	got   []byte
	err   error
}

func (w *shortWriter) Write(p []byte) (int, error) {
	n := min(len(p), w.limit-len(w.got))
	w.got = append(w.got, p[:n]...)
	if n < len(p) {
		return n, w.err
	}
	return n, nil
}

// lyingWriter returns a short count without an error.
type lyingWriter struct{}

func (lyingWriter) Write(p []byte) (int, error) { return len(p) / 2, nil }

type sentinelError struct{}

func (sentinelError) Error() string { return "sentinel" }

func TestReadToWriterErrors(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	ca, cb := connect(t, a, b, addrB4.Addr())
	msg := []byte("0123456789")
	if _, err := ca.Write(msg); err != nil {
		t.Fatal(err)
	}
	w := &shortWriter{limit: 4, err: sentinelError{}}
	n, err := waitReadTo(cb, w)
	var se sentinelError
	if n != 4 || !errors.As(err, &se) {
		t.Fatalf("ReadTo = %d, %v; want 4, sentinel", n, err)
	}
	// The rest is still queued; a short count without error is an error.
	n, err = cb.ReadTo(lyingWriter{})
	if !errors.Is(err, io.ErrShortWrite) || n != 3 {
		t.Fatalf("ReadTo(lying) = %d, %v; want 3, io.ErrShortWrite", n, err)
	}
	rest := make([]byte, 16)
	n, err = cb.Read(rest)
	if err != nil || string(rest[:n]) != "789" {
		t.Fatalf("Read rest = %q, %v; want 789", rest[:n], err)
	}
}

// waitReadTo retries ReadTo until it returns something (the data may still be
// in flight).
func waitReadTo(c *Conn, w io.Writer) (int, error) {
	for {
		n, err := c.ReadTo(w)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

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

// chanDevice is an in-memory PacketDevice; two of them form a wire.
type chanDevice struct {
	in, out chan []byte
	done    chan struct{}
	once    sync.Once
	mtu     int
}

func devicePair(mtu int) (a, b *chanDevice) {
	ab, ba := make(chan []byte, 1024), make(chan []byte, 1024)
	return &chanDevice{in: ba, out: ab, done: make(chan struct{}), mtu: mtu},
		&chanDevice{in: ab, out: ba, done: make(chan struct{}), mtu: mtu}
}

func (d *chanDevice) ReadPacket(p []byte) (int, error) {
	select {
	case b := <-d.in:
		return copy(p, b), nil
	case <-d.done:
		return 0, os.ErrClosed
	}
}

func (d *chanDevice) WritePacket(p []byte) error {
	select {
	case d.out <- append([]byte(nil), p...):
	case <-d.done:
		return os.ErrClosed
	default: // full: drop, like a TUN
	}
	return nil
}

func (d *chanDevice) MTU() int { return d.mtu }

func (d *chanDevice) Close() error {
	d.once.Do(func() { close(d.done) })
	return nil
}

// segCounter counts ReadTo Write calls and their sizes.
type segCounter struct {
	calls, bytes int
	sizes        map[int]int
}

func (s *segCounter) Write(p []byte) (int, error) {
	s.calls++
	s.bytes += len(p)
	s.sizes[len(p)]++
	return len(p), nil
}

func TestDeviceLink(t *testing.T) {
	da, db := devicePair(1500)
	a, b := newPair(t, pairOpts{linkA: NewDeviceLink(da), linkB: NewDeviceLink(db)})
	ca, cb := connect(t, a, b, addrB4.Addr())
	mss := ca.MSS()
	if mss != 1420 {
		t.Errorf("MSS = %d, want 1420", mss)
	}
	const writes = 2000
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ca, int64(writes*mss), mss) }()
	sc := &segCounter{sizes: map[int]int{}}
	for {
		_, err := cb.ReadTo(sc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if sc.bytes != writes*mss {
		t.Fatalf("got %d bytes, want %d", sc.bytes, writes*mss)
	}
	// One view per packet: ReadTo sees one slice per segment, mostly
	// exactly MSS bytes.
	t.Logf("ReadTo: %d calls, %d of them %d bytes; link a %+v", sc.calls, sc.sizes[mss], mss, a.link.Stats().Tx)
	if sc.sizes[mss] < writes*9/10 {
		t.Errorf("only %d of %d slices were one full segment", sc.sizes[mss], writes)
	}
}

func TestNewErrors(t *testing.T) {
	la, lb := Pipe(1500, Impairments{})
	defer la.Close()
	defer lb.Close()
	if _, err := New(la, Options{}); err == nil {
		t.Error("New without addresses succeeded")
	}
	if _, err := New(la, Options{Addrs: []netip.Prefix{addrA4}, MTU: 9000}); err == nil {
		t.Error("New with MTU above the link's succeeded")
	}
	s, err := New(la, Options{Addrs: []netip.Prefix{addrA4}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := New(la, Options{Addrs: []netip.Prefix{addrA4}}); !errors.Is(err, ErrLinkInUse) {
		t.Errorf("second New on the same link: %v, want ErrLinkInUse", err)
	}
	if s.MTU() != 1500 || len(s.Addrs()) != 1 || s.Addrs()[0] != addrA4 {
		t.Errorf("MTU %d Addrs %v", s.MTU(), s.Addrs())
	}
	s.Close()
	if _, err := s.Listen(netip.AddrPort{}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Listen after Close: %v", err)
	}
	if _, err := s.Dial(context.Background(), netip.Addr{}, netip.AddrPortFrom(addrB4.Addr(), 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Dial after Close: %v", err)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		a, b := newPair(t, pairOpts{imp: Impairments{Delay: time.Millisecond, Loss: 0.01, Seed: 1}, noCleanups: true})
		ca, cb := connect(t, a, b, addrB4.Addr())
		var done atomic.Bool
		go func() {
			buf := make([]byte, 64<<10)
			for !done.Load() {
				if _, err := ca.Write(buf); err != nil {
					return
				}
			}
		}()
		go io.Copy(io.Discard, cb)
		time.Sleep(50 * time.Millisecond)
		done.Store(true)
		a.Close()
		b.Close()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		after := runtime.NumGoroutine()
		if after <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines: %d before, %d after Stack.Close\n%s", before, after, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStackCloseResetsPeers(t *testing.T) {
	a, b := newPair(t, pairOpts{})
	_, cb := connect(t, a, b, addrB4.Addr())
	errc := make(chan error, 1)
	go func() {
		_, err := cb.ReadTo(io.Discard)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	a.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("peer read after Stack.Close: %v, want ECONNRESET", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("peer not reset by Stack.Close")
	}
}

func BenchmarkPipeThroughput(b *testing.B) {
	for _, mtu := range []int{1500, 9000} {
		b.Run(fmt.Sprintf("mtu=%d", mtu), func(b *testing.B) {
			sa, sb := newPair(b, pairOpts{mtu: mtu})
			ca, cb := connect(b, sa, sb, addrB4.Addr())
			mss := ca.MSS()
			buf := make([]byte, mss)
			fillPattern(buf, 0)
			b.SetBytes(int64(mss))
			b.ReportAllocs()
			done := make(chan int64, 1)
			go func() {
				var total int64
				for {
					n, err := cb.ReadTo(io.Discard)
					total += int64(n)
					if err != nil {
						done <- total
						return
					}
				}
			}()
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				if _, err := ca.WriteAligned(buf); err != nil {
					b.Fatal(err)
				}
			}
			ca.CloseWrite()
			total := <-done
			el := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(total)/el.Seconds()/1e6, "MB/s")
		})
	}
}
