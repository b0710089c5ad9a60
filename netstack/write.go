package netstack

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Write writes all of p, blocking while the send buffer is full. gVisor may
// split p into several segments and may queue it in several parts.
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	defer c.pl.reset()
	return c.writeLocked(p, len(p), false)
}

// WriteAligned writes all of p as one unit, for one FPDU per segment: it
// waits (blocking; Close unblocks it) until the send buffer has room for the
// whole of p, then queues it with one gVisor write, so gVisor's sender never
// joins part of p with part of another write (it may still pack several whole
// writes into one segment, and a window-edge split remains possible). If
// gVisor nevertheless accepts only part of p (its buffer usage is estimated
// from the peer's ACKs at the link, which TCP processes a moment later), the
// rest is written right away. p larger than the send buffer is written in
// parts. Returns len(p) or an error. It does not allocate: gVisor copies p
// into its send buffer through a payload reader kept in the Conn.
func (c *Conn) WriteAligned(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.waitRoom(len(p)); err != nil {
		return 0, err
	}
	defer c.pl.reset()
	c.coalesce()
	c.noteWriteEnd(len(p))
	n, err := c.writeLocked(p, len(p), true)
	c.recordWrite()
	return n, err
}

// Payload is the source of an aligned write: Len bytes, produced by Read
// into gVisor's send buffer (tcpip.Payloader's contract: Read may be called
// several times with slices that together take Len bytes).
type Payload interface {
	io.Reader
	Len() int
}

// WriteAlignedPayload is WriteAligned for a Payload: it waits for room for
// all p.Len() bytes, then has gVisor read them from p with one Atomic write,
// so the caller can generate the bytes directly into gVisor's buffer (no
// intermediate copy). Short writes continue reading from p.
//
// Len is called once, at the start; exactly that many bytes are then read.
// Read is only ever called with non-empty slices that together take Len
// bytes: gVisor (buffer.WriteFromReaderAndLimitedReader, called by the TCP
// endpoint's Write) reads into one new buffer view per chunk of up to
// buffer.MaxChunkSize (64 KiB), so for an MSS-sized FPDU Read normally
// receives one slice of the whole length (1420 bytes at MTU 1500, 8920 at
// 9000) and fills it with one call. Read gets more calls, with the rest of
// the chunk, only when it returns fewer bytes than offered, when Len exceeds
// a chunk, or when gVisor accepted only part of the write (the rest is read
// by the next gVisor write, immediately after). Each slice is gVisor's send
// buffer memory and is valid only during the call.
//
// Read runs with the endpoint's locks held (that is what makes the write
// atomic): it must not call into this Conn or its Stack, and should not
// block. If Read returns an error, or io.EOF before Len bytes, the bytes of
// that gVisor write are discarded, the error (io.ErrUnexpectedEOF for an
// early EOF) is returned wrapped along with the number of bytes queued before
// it, and the stream is no longer aligned: the caller should Abort.
func (c *Conn) WriteAlignedPayload(p Payload) (int, error) {
	n := p.Len()
	if n <= 0 {
		return 0, nil
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.waitRoom(n); err != nil {
		return 0, err
	}
	c.pl = payloadReader{src: p, left: n}
	defer c.pl.reset()
	c.coalesce()
	c.noteWriteEnd(n)
	written, err := c.writeLocked(nil, n, true)
	c.recordWrite()
	return written, err
}

// coalesceAfter is how many aligned writes may be unacknowledged before
// coalesce turns Nagle on.
const coalesceAfter = 64

// coalesce decides, before an aligned write, whether gVisor should hold
// small segments back (Nagle) while data is unacknowledged.
//
// With TCP_NODELAY every aligned write leaves as its own segment. A stream of
// tiny FPDUs (a 32-byte inline RDMA Write is a 52-byte FPDU) then puts
// hundreds of tiny segments in flight. The receiving gVisor charges each
// queued segment its whole buffer memory (hundreds of bytes for 52 bytes of
// payload), and when its receive processing falls behind (a starved CPU) it
// drops segments at its queue although they are inside the window it
// advertised. Recovering hundreds of lost tiny segments takes gVisor one
// retransmission timeout per one or two segments, long enough for the peer
// timeout to end a healthy connection.
//
// So, like Linux's autocorking, writes are coalesced while the sender is
// far ahead of the peer's ACKs: when the write coalesceAfter writes ago is
// still unacknowledged, Nagle is on. gVisor then keeps a small segment until
// the ACKs catch up and merges later writes into it whole (it never splits
// a write to merge it), so segments still carry whole FPDUs only and a
// segment of full size is never held. When the ACKs catch up Nagle is turned
// off again, which sends whatever is held. c.writeMu is held.
func (c *Conn) coalesce() {
	if c.oneWritePerSegment {
		return
	}
	oldest := c.recentEnds[c.recentIdx]
	on := oldest != 0 && uint64(c.inFlight()) > c.written-oldest
	if on != c.coalescing {
		c.coalescing = on
		c.ep.SocketOptions().SetDelayOption(on)
	}
	if on {
		c.coalescedWrites.Add(1)
	}
}

// noteWriteEnd records, on a stack with segmentation offload, where the
// aligned write of n bytes about to be queued will end, before gVisor can
// send any of it: super-segments are cut there (gso.go). c.writeMu is held.
func (c *Conn) noteWriteEnd(n int) {
	if !c.s.gso {
		return
	}
	iss, ok := c.flow.ourISS()
	if !ok {
		return
	}
	c.flow.kept.used.Store(true)
	start := iss + 1 + uint32(c.written)
	c.flow.writeEnds.add(start, start+uint32(n))
}

// recordWrite notes the end of an aligned write for coalesce. c.writeMu is
// held.
func (c *Conn) recordWrite() {
	c.recentEnds[c.recentIdx] = c.written
	c.recentIdx = (c.recentIdx + 1) % coalesceAfter
}

// StreamSeqs returns the TCP sequence numbers of the next byte a write will
// queue (send) and of the next byte a read will return (recv), for relating
// the segments a hook sees to the byte streams. ok is false when the
// handshake's SYNs were not seen.
func (c *Conn) StreamSeqs() (send, recv uint32, ok bool) {
	c.writeMu.Lock()
	iss, ok1 := c.flow.ourISS()
	written := c.written
	c.writeMu.Unlock()
	c.readMu.Lock()
	piss, ok2 := c.flow.peerInitialSeq()
	read := c.readN
	c.readMu.Unlock()
	return iss + 1 + uint32(written), piss + 1 + uint32(read), ok1 && ok2
}

// ReceiveWindow returns what this end last told the peer about its receive
// side: the cumulative ACK (every octet before it was received in order)
// and the right edge of the advertised receive window (the first sequence
// number the peer may not send yet); octets in [ack, edge) are inside the
// window. ok is false until both SYNs were seen. The values start as what
// the handshake offered (the peer's ISN+1 and our SYN's window) and then
// follow our segments, which are looked at only while some connection of
// the stack has a segment hook (SetSegmentHook), as the engine's
// connections do: they may lag behind TCP's own, never run ahead of them.
// It is safe to call from a segment hook.
func (c *Conn) ReceiveWindow() (ack, edge uint32, ok bool) {
	return c.flow.advertised()
}

// CoalescedWrites returns how many aligned writes were queued while small
// segments were being coalesced (see WriteAligned).
func (c *Conn) CoalescedWrites() uint64 { return c.coalescedWrites.Load() }

// inFlight estimates gVisor's send-buffer usage (SndBufUsed: bytes written
// and not yet acknowledged). gVisor does not export it
// (GetSockOptInt(SendQueueSizeOption) is not implemented for TCP), so it is
// written minus what the peer's cumulative ACK, seen at the link, covers.
// c.writeMu is held.
func (c *Conn) inFlight() int {
	if !c.issOK {
		c.iss, c.issOK = c.flow.ourISS()
	}
	ack, ok := c.flow.peerAck()
	if !c.issOK || !ok {
		return int(c.written)
	}
	acked := ack - (c.iss + 1)
	n := int32(uint32(c.written) - acked)
	if n < 0 {
		return 0
	}
	return int(n)
}

// waitRoom blocks until the estimated free send-buffer space is at least n
// and, for a write that fits the peer's window at all, until the peer's
// receive window has room for all n bytes (see windowRoom). c.writeMu is
// held.
func (c *Conn) waitRoom(n int) error {
	if c.isClosed() {
		return fmt.Errorf("netstack: write %v: %w", c.remote, net.ErrClosed)
	}
	size := int(c.ep.SocketOptions().GetSendBufferSize())
	if (n > size || size-c.inFlight() >= n) && c.windowRoom(n) && c.previousSent() {
		return nil
	}
	return c.waitRoomSlow(n)
}

// SetOneWritePerSegment makes every aligned write wait until TCP has sent
// all earlier bytes at least once, so gVisor never merges two writes into
// one segment (it merges writes still queued when a segment is built). The
// engine sets it when Markers are sent: then each segment carries exactly one
// FPDU, which is what Wireshark's iWARP dissector needs to follow Markers.
// It costs throughput when TCP is window- or congestion-limited. It needs a
// segment hook on the connection (SetSegmentHook), which sees what is sent.
// It also turns off coalescing (see WriteAligned).
func (c *Conn) SetOneWritePerSegment(on bool) {
	c.writeMu.Lock()
	c.oneWritePerSegment = on
	c.writeMu.Unlock()
}

// previousSent reports whether every byte written so far has been sent (or
// one write per segment is off, or sending cannot be observed). c.writeMu is
// held.
func (c *Conn) previousSent() bool {
	if !c.oneWritePerSegment || !c.issOK {
		return true
	}
	sent, ok := c.flow.sentEdge()
	if !ok {
		return true
	}
	return int32(sent-(c.iss+1+uint32(c.written))) >= 0
}

// maxWindowWait bounds how long an aligned write waits for the peer's
// window: a lost window update must not stall the connection (gVisor's
// zero-window probes need data queued), so after it the write goes to TCP
// and may be cut at the window edge.
const maxWindowWait = 200 * time.Millisecond

// windowRoom reports whether the peer's advertised receive window, as last
// seen at the link, reaches past the end of a write of n bytes queued now.
// gVisor's sender cuts a segment at the window's right edge when nothing is
// in flight and the window is smaller than the segment, which splits an
// FPDU; waiting for the window instead keeps every FPDU whole. Writes that
// could never fit (larger than half the largest window seen) do not wait.
// c.writeMu is held.
func (c *Conn) windowRoom(n int) bool {
	edge, ok := c.flow.peerEdge()
	if !ok || !c.issOK {
		return true
	}
	end := c.iss + 1 + uint32(c.written) + uint32(n)
	room := int32(edge - end)
	if room >= 0 {
		return true
	}
	if c.s.gso {
		// The window as offered now, from the acknowledged point to the
		// edge: a write large for it does not wait. What TCP cuts at the
		// window's edge the link holds until the rest comes (gsohold.go).
		ack, ok := c.flow.peerAck()
		return !ok || int32(edge-ack) < int32(2*n)
	}
	// Without segmentation offload nothing holds a cut: a write that
	// could not fit half the largest window the peer has offered does not
	// wait; any other waits for the window to reopen (a receiver that fell
	// behind shrinks it for a while), at most maxWindowWait.
	return int64(c.flow.maxWnd.Load()) < 2*int64(n)
}

func (c *Conn) waitRoomSlow(n int) error {
	registered, timing := false, false
	defer func() {
		c.flow.waiting.Store(false)
		if registered {
			c.wq.EventUnregister(&c.wEntry)
		}
		if timing {
			c.windowTimer.Stop()
		}
	}()
	var windowDeadline <-chan time.Time
	windowExpired := false
	for {
		if c.isClosed() {
			return fmt.Errorf("netstack: write %v: %w", c.remote, net.ErrClosed)
		}
		size := int(c.ep.SocketOptions().GetSendBufferSize())
		// Announce the wait before the check, so an ACK or window update
		// seen after it signals ackAdvCh.
		c.flow.waiting.Store(true)
		bufOK := n > size || size-c.inFlight() >= n
		if bufOK && (windowExpired || c.windowRoom(n)) && c.previousSent() {
			return nil
		}
		if bufOK && windowDeadline == nil {
			if c.windowTimer == nil {
				c.windowTimer = time.NewTimer(maxWindowWait)
			} else {
				c.windowTimer.Reset(maxWindowWait)
			}
			timing = true
			windowDeadline = c.windowTimer.C
		}
		if !registered {
			drain(c.wNotify)
			c.wq.EventRegister(&c.wEntry)
			registered = true
		}
		// An error on the endpoint (reset) shows as HUp/Err readiness.
		if c.ep.Readiness(waiter.EventHUp|waiter.EventErr) != 0 {
			return nil // let the write report it
		}
		select {
		case <-c.flow.ackAdvCh:
		case <-c.wNotify:
		case <-c.closed:
		case <-windowDeadline:
			windowExpired = true
		}
		c.flow.waiting.Store(false)
	}
}

// writeLocked queues total bytes: p when it is non-nil, else the Payload
// already set in c.pl. atomicWrite makes gVisor keep its locks while reading
// the payload, so no concurrent writer can shrink the space between its check
// and the copy, and no byte read is ever discarded. Without it gVisor may
// read more than it keeps (it truncates to the space left after the copy),
// so a byte slice is re-seated at the first unqueued byte before every
// gVisor write. c.writeMu is held.
func (c *Conn) writeLocked(p []byte, total int, atomicWrite bool) (int, error) {
	done := 0
	registered := false
	defer func() {
		if registered {
			c.wq.EventUnregister(&c.wEntry)
		}
	}()
	// An aligned write goes to gVisor whole or not at all: a write it took
	// only in part would leave a segment ending inside an FPDU, and every
	// later segment of the write would start inside one (TCP cuts the rest
	// at MSS offsets from the cut). gVisor takes part of a write when its
	// send buffer is fuller than waitRoom estimated (waitRoom counts the
	// peer's ACKs as the link sees them, a moment before gVisor processes
	// them), so a write refused for short room is tried again; once
	// maxShortRoomWait has passed since the first refusal it is written
	// in parts (a write never stalls).
	whole := atomicWrite && total <= int(c.ep.SocketOptions().GetSendBufferSize())
	refusals := 0
	var refusedAt time.Time
	for done < total {
		if c.isClosed() {
			return done, fmt.Errorf("netstack: write %v: %w", c.remote, net.ErrClosed)
		}
		if p != nil {
			c.pl = payloadReader{buf: p[done:], left: total - done}
		}
		c.pl.whole = whole && done == 0 && (refusals == 0 || time.Since(refusedAt) < maxShortRoomWait)
		n, terr := c.ep.Write(&c.pl, tcpip.WriteOptions{Atomic: atomicWrite})
		done += int(n)
		c.written += uint64(n)
		if c.pl.err == errShortRoom && n == 0 {
			c.pl.err, c.pl.started = nil, false
			if refusals == 0 {
				refusedAt = time.Now()
			}
			refusals++
			c.shortRoomRetries.Add(1)
			if err := c.waitShortRoom(refusals); err != nil {
				return done, err
			}
			continue
		}
		if err := c.pl.err; err != nil {
			return done, fmt.Errorf("netstack: write %v: payload: %w", c.remote, err)
		}
		switch terr.(type) {
		case nil:
			if atomicWrite && done < total && n > 0 {
				c.partialWrites.Add(1)
			}
			continue
		case *tcpip.ErrWouldBlock:
		default:
			return done, c.opError("write", terr)
		}
		if !registered {
			drain(c.wNotify)
			c.wq.EventRegister(&c.wEntry)
			registered = true
			continue
		}
		select {
		case <-c.wNotify:
		case <-c.closed:
		}
	}
	return done, nil
}

// maxShortRoomWait bounds how long writeLocked refuses an aligned write
// gVisor would take only in part: the first few tries yield the processor
// (gVisor's processing of the ACK that waitRoom saw is due), the rest wait
// up to shortRoomWait for the next ACK each. The bound is the one an
// aligned write has for the peer's window (200 ms): gVisor's processing
// can lag that long on a loaded machine (tens of milliseconds were seen
// with the race detector beside a busy VM), and cutting the write then
// would put FPDUs off the grid.
const (
	maxShortRoomWait = 200 * time.Millisecond
	shortRoomYields  = 4
	shortRoomWait    = time.Millisecond
)

// waitShortRoom waits before try number refusals+1 of a write gVisor had no
// room for. c.writeMu is held.
func (c *Conn) waitShortRoom(refusals int) error {
	if refusals <= shortRoomYields {
		runtime.Gosched()
		return nil
	}
	if c.retryTimer == nil {
		c.retryTimer = time.NewTimer(shortRoomWait)
	} else {
		c.retryTimer.Reset(shortRoomWait)
	}
	defer c.retryTimer.Stop()
	c.flow.waiting.Store(true)
	defer c.flow.waiting.Store(false)
	select {
	case <-c.flow.ackAdvCh:
	case <-c.retryTimer.C:
	case <-c.closed:
		return fmt.Errorf("netstack: write %v: %w", c.remote, net.ErrClosed)
	}
	return nil
}

// ShortRoomRetries returns how many times an aligned write was refused
// because gVisor had room for only part of it, and tried again.
func (c *Conn) ShortRoomRetries() uint64 { return c.shortRoomRetries.Load() }

// WaitAcked blocks until the peer has acknowledged every byte written so
// far, the connection closes or fails, or timeout passes, and reports
// whether every byte was acknowledged. A close that follows it cannot
// discard those bytes: close(2) with unread received data resets the
// connection, and a reset drops whatever the send queue still holds (the
// engine waits here before closing behind a Terminate, RFC 5040 §7).
func (c *Conn) WaitAcked(timeout time.Duration) bool {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	registered := false
	defer func() {
		c.flow.waiting.Store(false)
		if registered {
			c.wq.EventUnregister(&c.wEntry)
		}
	}()
	for {
		// Announce the wait before the check, so an ACK seen after it
		// signals ackAdvCh.
		c.flow.waiting.Store(true)
		if c.inFlight() == 0 {
			return true
		}
		if c.isClosed() || c.ep.Readiness(waiter.EventHUp|waiter.EventErr) != 0 {
			return false
		}
		if !registered {
			drain(c.wNotify)
			c.wq.EventRegister(&c.wEntry)
			registered = true
		}
		select {
		case <-c.flow.ackAdvCh:
		case <-c.wNotify:
		case <-c.closed:
		case <-t.C:
			return false
		}
	}
}

// SendState describes the send side for diagnosing a connection that went
// quiet: the sequence numbers (relative to our initial one) of the end of
// what was written, of the highest octet seen leaving at the link, and of
// the peer's cumulative ACK seen at the link; whether writes are being
// coalesced (Nagle on); and TCP's own state, congestion state, congestion
// window and retransmission timeout. Written octets not yet sent are held
// by TCP (Nagle, the congestion or the peer's window); sent octets not
// acknowledged wait for the retransmission timer.
func (c *Conn) SendState() string {
	if !c.writeMu.TryLock() {
		return "a write in progress"
	}
	written, coalescing, iss, issOK := c.written, c.coalescing, c.iss, c.issOK
	c.writeMu.Unlock()
	if !issOK {
		iss, issOK = c.flow.ourISS()
	}
	rel := func(v uint32, ok bool) string {
		if !ok || !issOK {
			return "?"
		}
		return fmt.Sprint(v - (iss + 1))
	}
	sent, sok := c.flow.sentEdge()
	ack, aok := c.flow.peerAck()
	var info tcpip.TCPInfoOption
	tcp := "?"
	if err := c.ep.GetSockOpt(&info); err == nil {
		tcp = fmt.Sprintf("state %v, cc %v, cwnd %d, ssthresh %d, rtt %v, rto %v", info.State, info.CcState, info.SndCwnd, info.SndSsthresh, info.RTT, info.RTO)
	}
	return fmt.Sprintf("written %d, sent %s, acked %s, nagle %v; tcp %s", written, rel(sent, sok), rel(ack, aok), coalescing, tcp)
}
