package perftest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// runLatency is ib_write_lat / ib_read_lat / ib_send_lat after the banner
// (one queue pair). Write and Send are ping-pongs that both sides time;
// Read is timed by the client alone while the server waits.
func (s *session) runLatency() error {
	c := &s.cfg
	if c.Verb == Send {
		if err := s.exchangeDests(false); err != nil {
			return err
		}
		if err := s.sync("after the queue pair exchange"); err != nil {
			return err
		}
	} else {
		if err := s.exchangeFirst(); err != nil {
			return err
		}
		if err := s.exchangeDests(false); err != nil {
			return err
		}
	}
	s.printLocal()
	if err := s.exchangeDests(true); err != nil {
		return err
	}
	if c.Verb != Send {
		if err := s.sync("after the queue pair exchange"); err != nil {
			return err
		}
	}
	if c.Verb == Read && !s.client {
		if err := s.sync("waiting for the client's test"); err != nil {
			return err
		}
		fmt.Fprint(s.out, resultLine)
		return nil
	}
	printLatHeader(s.out, c)
	var last *latRun
	for _, size := range c.sizes() {
		if c.recvs() {
			if err := s.postReceives(size); err != nil {
				return err
			}
			if err := s.sync("before the run"); err != nil {
				return err
			}
		}
		l := &latRun{s: s, c: c, size: size}
		last = l
		res, err := l.run()
		if err != nil {
			return err
		}
		printLatRow(s.out, res)
		s.report.Lat = append(s.report.Lat, res)
	}
	switch {
	case c.Verb == Write && !c.Imm:
		// ib_write_lat ends without a closing handshake.
		fmt.Fprint(s.out, resultLine)
		return nil
	case c.Verb == Read:
		if err := s.closeSync(); err != nil {
			return err
		}
		fmt.Fprint(s.out, resultLine)
		return nil
	}
	fmt.Fprint(s.out, resultLine)
	if c.Duration > 0 && !s.client {
		// The client may still wait for the answer to its last ping.
		return s.closeSyncServing(last.serve)
	}
	return s.closeSync()
}

// exchangeFirst is the lone handshake ib_write_lat and ib_read_lat make
// before the per-QP ones (it carries queue pair 0's information).
func (s *session) exchangeFirst() error {
	d, err := s.ctl.handshake(s.ctx, &s.my[0])
	if err != nil {
		return err
	}
	s.rem[0] = d
	return nil
}

// latRun is one latency run of one message size.
type latRun struct {
	s    *session
	c    *Config
	size int

	base       time.Time
	posted     []int64
	sampleFrom int64
	sampleTo   int64
	endNs      int64
	sampled    uint64
	spins      int
	answered   uint64 // Sends posted by pingPongSend and serve
	got        int    // receives completed but not yet answered

	wr  [1]verbs.SendWR
	sge [1]verbs.SGE
	rwr [1]verbs.RecvWR
	rsg [1]verbs.SGE
	wcs [4]verbs.WorkCompletion
}

func (l *latRun) now() int64 { return int64(time.Since(l.base)) }

func (l *latRun) timed() bool { return l.c.Duration > 0 }

func (l *latRun) ended() bool { return l.timed() && l.now() >= l.endNs }

// idle is one turn of a busy-poll (perftest spins on the CQ and on
// memory). After a short spin it yields the processor every few turns: on
// a machine with fewer cores than spinning processes (two applications,
// two daemons), pure spinning starves the RNICs it waits for. It notices
// cancellation.
func (l *latRun) idle() error {
	l.spins++
	if l.spins%256 == 0 {
		if err := l.s.ctx.Err(); err != nil {
			return err
		}
		if err := l.s.checkQPs(); err != nil {
			return err
		}
	}
	if l.spins > spinTurns && l.spins%8 == 0 {
		yieldCPU()
	} else {
		runtime.Gosched()
	}
	return nil
}

// spinTurns is how many turns a wait spins before it starts sleeping.
const spinTurns = 64

// beginWait starts a new wait's spin count.
func (l *latRun) beginWait() { l.spins = 0 }

func (l *latRun) run() (LatResult, error) {
	c := l.c
	if !l.timed() {
		l.posted = make([]int64, 0, c.Iters)
	}
	l.base = time.Now()
	if l.timed() {
		m := int64(c.margin())
		l.sampleFrom, l.sampleTo, l.endNs = m, int64(c.Duration)-m, int64(c.Duration)
	}
	l.prepare()
	var err error
	if st := c.Stamps; st != nil {
		n := c.Iters
		if l.timed() {
			n = 1 << 16
		}
		if err := st.begin(l.s.qps[0], n); err != nil {
			return LatResult{}, err
		}
	}
	switch {
	case c.Verb == Write && !c.Imm:
		if err = l.pingPongWrite(); errors.Is(err, errPeerDone) {
			err = nil
		}
	case c.recvs():
		// Send, and Write with Immediate Data: the peer's receive
		// completion is the ping.
		err = l.pingPongSend()
	default:
		err = l.readLoop()
	}
	if err != nil {
		return LatResult{}, err
	}
	rtt := 2
	if c.Verb == Read {
		rtt = 1
	}
	if l.timed() {
		return latDurationResult(l.size, l.sampled, time.Duration(l.sampleTo-l.sampleFrom), rtt), nil
	}
	return latResult(l.size, l.posted, rtt), nil
}

// prepare builds the one work request every iteration posts.
func (l *latRun) prepare() {
	s, c := l.s, l.c
	wr := verbs.SendWR{Flags: verbs.FlagSignaled, RemoteAddr: s.rem[0].VAddr, RKey: s.rem[0].RKey}
	switch c.Verb {
	case Write:
		wr.Opcode = verbs.WRWrite
		if c.Imm {
			wr.Opcode = verbs.WRWriteWithImm
		}
	case Read:
		wr.Opcode = verbs.WRRead
	default:
		wr.Opcode = verbs.WRSend
	}
	if c.Verb != Read && l.size <= c.Inline {
		wr.Flags |= verbs.FlagInline
		wr.Inline = s.mem.buf[s.sendOff(0) : s.sendOff(0)+l.size]
	} else {
		l.sge[0] = s.mem.mr.SGE(s.sendOff(0), l.size)
		wr.SGL = l.sge[:]
	}
	l.wr[0] = wr
	l.rsg[0] = s.mem.mr.SGE(s.recvOff(0), l.size)
	l.rwr[0] = verbs.RecvWR{ID: 0, SGL: l.rsg[:]}
}

func (l *latRun) postOne(seq uint64) error {
	if !l.timed() {
		l.posted = append(l.posted, l.now())
	}
	l.wr[0].ID = seq
	if st := l.c.Stamps; st != nil {
		st.Posts = append(st.Posts, st.Clock())
	}
	if _, err := l.s.qps[0].PostSend(l.wr[:]); err != nil {
		return fmt.Errorf("posting %v %d: %w", l.c.Verb, seq, err)
	}
	return nil
}

// errPeerDone ends a ping-pong whose peer has finished and closed.
var errPeerDone = errors.New("the peer finished")

// waitSend busy-polls for the completion of the request just posted;
// receives seen meanwhile are handed to onRecv. A Write flushed after the
// peer can have finished (the last iteration, or a timed run's end) means
// the peer closed first: ib_write_lat has no closing handshake, so the
// side that sees the other's last message first tears down, and a Write
// not yet all with TCP when the connection ends is flushed.
func (l *latRun) waitSend(onRecv func(*verbs.WorkCompletion) error) error {
	l.beginWait()
	for {
		n, err := l.s.cq.Poll(l.wcs[:])
		if err != nil {
			return fmt.Errorf("polling the test CQ: %w", err)
		}
		sent := false
		for k := range l.wcs[:n] {
			wc := &l.wcs[k]
			if wc.Opcode.Recv() {
				if onRecv == nil {
					return fmt.Errorf("unexpected receive completion in a %v test", l.c.Verb)
				}
				if err := onRecv(wc); err != nil {
					return err
				}
				continue
			}
			if wc.Status == verbs.WCFlushErr && l.c.Verb == Write && l.peerMayBeDone(wc.ID) {
				return errPeerDone
			}
			if wc.Status != verbs.WCSuccess {
				return fmt.Errorf("%v %d: %v: %w", l.c.Verb, wc.ID, wc.Status, errIncomplete)
			}
			sent = true
		}
		if sent {
			return nil
		}
		if n == 0 {
			if err := l.idle(); err != nil {
				return err
			}
		}
	}
}

// peerMayBeDone reports whether the peer may have finished before the
// completion of request seq.
func (l *latRun) peerMayBeDone(seq uint64) bool {
	if l.timed() {
		return l.now() >= l.sampleTo
	}
	return seq == uint64(l.c.Iters)
}

func (l *latRun) countSample() {
	if l.timed() {
		if t := l.now(); t >= l.sampleFrom && t < l.sampleTo {
			l.sampled++
		}
	}
}

// waitByte waits until the byte at off of the test memory is v, or the
// timed run ended. With Spin it is ib_write_lat's pure busy loop: no
// yield, only a look at cancellation and the queue pair every 2^16 turns.
func (l *latRun) waitByte(off int, v byte) error {
	l.beginWait()
	for l.s.mem.loadByte(off) != v {
		if l.ended() {
			return nil
		}
		if !l.c.Spin {
			if err := l.idle(); err != nil {
				return err
			}
			continue
		}
		if l.spins++; l.spins%(1<<16) == 0 {
			if err := l.s.ctx.Err(); err != nil {
				return err
			}
			if err := l.s.checkQPs(); err != nil {
				return err
			}
		}
	}
	return nil
}

// pingPongWrite is run_iter_lat_write: each side RDMA-Writes its counter
// into the last byte of the peer's buffer and spins on its own buffer's
// last byte for the peer's; the server writes first.
func (l *latRun) pingPongWrite() error {
	s := l.s
	iters := uint64(l.c.Iters)
	pollOff := s.recvOff(0) + l.size - 1
	postOff := s.sendOff(0) + l.size - 1
	var scnt, rcnt uint64
	for l.timed() || scnt < iters || rcnt < iters {
		if l.ended() {
			return nil
		}
		if (l.timed() || rcnt < iters) && !(scnt == 0 && !s.client) {
			rcnt++
			if err := l.waitByte(pollOff, byte(rcnt)); err != nil || l.ended() {
				return err
			}
			if st := l.c.Stamps; st != nil {
				st.Seen = append(st.Seen, st.Clock())
			}
		}
		if l.timed() || scnt < iters {
			scnt++
			s.mem.storeByte(postOff, byte(scnt))
			if err := l.postOne(scnt); err != nil {
				return err
			}
			if err := l.waitSend(nil); err != nil {
				return err
			}
			l.countSample()
		}
	}
	return nil
}

// pingPongSend is run_iter_lat_send: the client sends first; each side
// answers a receive with a Send, posting its receive again while more are
// to come (the receives were posted before the run started). A timed run
// ends on the client with the answer to its last ping (waiting for it at
// most drainTimeout after the end): a ping left on its way could reach the
// server after it tore its queue pair down. The server answers every ping
// it gets, in its run and after it (serve) until the client's closing
// message.
func (l *latRun) pingPongSend() error {
	s := l.s
	iters := uint64(l.c.Iters)
	rx := uint64(l.c.RxDepth)
	var scnt, rcnt uint64
	onRecv := func(wc *verbs.WorkCompletion) error {
		if wc.Status != verbs.WCSuccess {
			return fmt.Errorf("receive %d: %v: %w", rcnt+uint64(l.got)+1, wc.Status, errIncomplete)
		}
		l.got++
		return nil
	}
	for l.timed() || scnt < iters || rcnt < iters {
		if l.ended() && !(s.client && scnt > rcnt) {
			return nil
		}
		if (l.timed() || rcnt < iters) && !(scnt == 0 && s.client) {
			l.beginWait()
			for l.got == 0 {
				n, err := s.cq.Poll(l.wcs[:1])
				if err != nil {
					return fmt.Errorf("polling the test CQ: %w", err)
				}
				if n == 0 {
					if l.ended() && (!s.client || l.now() >= l.endNs+int64(drainTimeout)) {
						return nil
					}
					if err := l.idle(); err != nil {
						return err
					}
					continue
				}
				if !l.wcs[0].Opcode.Recv() {
					return fmt.Errorf("unexpected %v completion while waiting for a receive", l.wcs[0].Opcode)
				}
				if err := onRecv(&l.wcs[0]); err != nil {
					return err
				}
			}
			l.got--
			rcnt++
			l.countSample()
			if l.timed() || rcnt+rx <= iters {
				if _, err := s.qps[0].PostRecv(l.rwr[:]); err != nil {
					return fmt.Errorf("posting a receive: %w", err)
				}
			}
		}
		if s.client && l.ended() {
			return nil
		}
		if l.timed() || scnt < iters {
			scnt++
			l.answered = scnt
			if err := l.postOne(scnt); err != nil {
				return err
			}
			if err := l.waitSend(onRecv); err != nil {
				return err
			}
		}
	}
	return nil
}

// serve is one turn of the server's closeSyncServing after a timed Send
// latency run: it answers the pings that come (waiting at most serveWait
// for one) and takes its answers' completions.
func (l *latRun) serve(ctx context.Context) error {
	for ; l.got > 0; l.got-- {
		if err := l.answer(); err != nil {
			return err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, serveWait)
	defer cancel()
	n, err := l.s.cq.Wait(wctx, l.wcs[:])
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil
		}
		return fmt.Errorf("waiting for the test CQ: %w", err)
	}
	for k := range l.wcs[:n] {
		wc := &l.wcs[k]
		switch {
		case wc.Status == verbs.WCFlushErr:
			return errServeFlushed
		case wc.Status != verbs.WCSuccess:
			return fmt.Errorf("%v %d after the run: %v: %w", wc.Opcode, wc.ID, wc.Status, errIncomplete)
		case wc.Opcode.Recv():
			if err := l.answer(); err != nil {
				return err
			}
		}
	}
	return nil
}

// answer posts the receive a ping took again and answers it.
func (l *latRun) answer() error {
	if _, err := l.s.qps[0].PostRecv(l.rwr[:]); err != nil {
		return fmt.Errorf("posting a receive: %w", err)
	}
	l.answered++
	return l.postOne(l.answered)
}

// readLoop is run_iter_lat: the client reads size bytes from the server's
// buffer, one at a time.
func (l *latRun) readLoop() error {
	iters := uint64(l.c.Iters)
	for scnt := uint64(0); l.timed() || scnt < iters; scnt++ {
		if l.ended() {
			return nil
		}
		if err := l.postOne(scnt); err != nil {
			return err
		}
		if err := l.waitSend(nil); err != nil {
			return err
		}
		l.countSample()
	}
	return nil
}
