package perftest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// runRDMABW is ib_write_bw / ib_read_bw after the banner: two rounds of
// per-QP handshakes (the second printed), one more, then the runs. Without
// -b the server only waits for the client's report and prints it.
func (s *session) runRDMABW() error {
	c := &s.cfg
	if err := s.exchangeDests(false); err != nil {
		return err
	}
	s.printLocal()
	if err := s.exchangeDests(true); err != nil {
		return err
	}
	if err := s.sync("after the queue pair exchange"); err != nil {
		return err
	}
	printBWHeader(s.out, c)
	if !s.client && !c.Bidirectional {
		if err := s.sync("waiting for the client's test"); err != nil {
			return err
		}
		theirs, err := s.xchgReports(BWResult{})
		if err != nil {
			return err
		}
		printBWRow(s.out, c, theirs)
		s.report.BW = append(s.report.BW, theirs)
		if err := s.closeSync(); err != nil {
			return err
		}
		fmt.Fprint(s.out, resultLine)
		return nil
	}
	var last BWResult
	for _, size := range c.sizes() {
		if c.Bidirectional {
			if err := s.sync("before the run"); err != nil {
				return err
			}
		}
		r, err := s.bwRun(size, true, false)
		if err != nil {
			return err
		}
		res := r.result()
		if c.Bidirectional && c.All {
			if err := s.sync("after the run"); err != nil {
				return err
			}
		}
		last = res
		if c.Bidirectional {
			theirs, err := s.xchgReports(res)
			if err != nil {
				return err
			}
			res = res.add(theirs)
		}
		printBWRow(s.out, c, res)
		s.report.BW = append(s.report.BW, res)
	}
	fmt.Fprint(s.out, resultLine)
	if s.client && !c.Bidirectional {
		if err := s.sync("before the report"); err != nil {
			return err
		}
		if _, err := s.xchgReports(last); err != nil {
			return err
		}
	}
	return s.closeSync()
}

// runSendBW is ib_send_bw after the banner. Both sides give the peer the
// address and rkey of their credit slots in the first handshakes; per size
// the receiving side posts its receives before the handshake that starts
// the run, and each side prints what it measured.
func (s *session) runSendBW() error {
	c := &s.cfg
	if c.Imm {
		if err := s.exchangeDataDests(); err != nil {
			return err
		}
	} else if err := s.exchangeDests(false); err != nil {
		return err
	}
	if err := s.sync("after the credit exchange"); err != nil {
		return err
	}
	s.printLocal()
	if err := s.exchangeDests(true); err != nil {
		return err
	}
	printBWHeader(s.out, c)
	sends := s.client || c.Bidirectional
	recvs := !s.client || c.Bidirectional
	var last *bwRun
	for _, size := range c.sizes() {
		if recvs {
			if err := s.postReceives(size); err != nil {
				return err
			}
		}
		if err := s.sync("before the run"); err != nil {
			return err
		}
		if sends {
			for i := range s.qps {
				s.credit.storeCredit(creditSlot(c.QPs, i), 0)
			}
		}
		r, err := s.bwRun(size, sends, recvs)
		if err != nil {
			return err
		}
		last = r
		res := r.result()
		if c.Bidirectional && c.Duration == 0 {
			theirs, err := s.xchgReports(res)
			if err != nil {
				return err
			}
			res = res.add(theirs)
		}
		printBWRow(s.out, c, res)
		s.report.BW = append(s.report.BW, res)
		if c.All {
			if err := s.sync("after the run"); err != nil {
				return err
			}
		}
	}
	fmt.Fprint(s.out, resultLine)
	if c.Duration > 0 {
		// A timed run (one size) ends by each side's clock: the peer may
		// still be finishing (see finishTimed).
		return s.closeSyncServing(last.serve)
	}
	return s.closeSync()
}

// postReceives posts RxDepth receives of size bytes on every queue pair
// (ctx_set_recv_wqes), before the peer may send.
func (s *session) postReceives(size int) error {
	for i, qp := range s.qps {
		wrs := make([]verbs.RecvWR, s.cfg.RxDepth)
		for j := range wrs {
			wrs[j] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{s.mem.mr.SGE(s.recvOff(i), size)}}
		}
		if _, err := qp.PostRecv(wrs); err != nil {
			return fmt.Errorf("posting receives on test QP %d: %w", i, err)
		}
	}
	return nil
}

// Work request IDs of the data path: queue pair index and sequence number;
// credit writes have creditID set.
const (
	seqBits  = 40
	creditID = 1 << 63
)

func dataID(qp int, seq uint64) uint64 { return uint64(qp)<<seqBits | seq }

// bwRun is one bandwidth run of one message size on this side: posting
// Writes, Reads or Sends (send), taking Sends in (recv), or both (-b).
type bwRun struct {
	s         *session
	c         *Config
	size      int
	send      bool
	recv      bool
	credits   bool // send verb: Sends need the receiver's credit
	noPeak    bool
	iters     uint64 // per queue pair; 0 in a timed run
	mod       uint64
	creditCnt uint64 // the receiver writes a credit every creditCnt receives

	scnt, ccnt   []uint64 // per queue pair: posted, completed
	rcnt, posted []uint64 // per queue pair: received, receives posted
	scredit      []int    // credit writes outstanding
	credPending  []uint64 // a credit to write once the send queue has room
	totS, totC   uint64
	totR         uint64

	times     bwTimes
	base      time.Time
	started   bool // the clock runs (a receiver starts it at its first message)
	startNs   int64
	firstRxNs int64
	lastRxNs  int64
	// timed runs: the sample window and the count in it
	sampleFrom, sampleTo, endNs int64
	sampled                     uint64
	lastCNs                     int64 // the last data completion
	// the end of a timed Send run (finishTimed): per queue pair the
	// Sends to post in all, and when to stop waiting for their credit
	stop    []uint64
	drainBy int64

	wcs   []verbs.WorkCompletion
	rwr   [1]verbs.RecvWR
	rsge  [1]verbs.SGE
	batch []verbs.SendWR
	sges  []verbs.SGE
	cwr   [1]verbs.SendWR
	cred  [creditLen]byte
}

// bwRun runs one size on this side.
func (s *session) bwRun(size int, send, recv bool) (*bwRun, error) {
	c := &s.cfg
	nq := len(s.qps)
	r := &bwRun{s: s, c: c, size: size, send: send, recv: recv, credits: c.recvs(),
		noPeak: c.noPeak(!s.client) || !send, iters: uint64(c.Iters), mod: uint64(c.cqMod()),
		creditCnt: uint64(max(c.RxDepth/3, 1)),
		scnt:      make([]uint64, nq), ccnt: make([]uint64, nq), rcnt: make([]uint64, nq),
		posted: make([]uint64, nq), scredit: make([]int, nq), credPending: make([]uint64, nq),
		wcs: make([]verbs.WorkCompletion, 64), batch: make([]verbs.SendWR, 0, c.TxDepth),
		sges: make([]verbs.SGE, c.TxDepth)}
	if c.Duration > 0 {
		r.iters = 0
	}
	for i := range r.posted {
		r.posted[i] = uint64(c.RxDepth)
	}
	if send && !r.noPeak {
		n := int(r.iters) * nq
		r.times.posted = make([]int64, n)
		r.times.completed = make([]int64, n)
		for i := range r.times.completed {
			r.times.completed[i] = -1
		}
	}
	r.base = time.Now()
	// A sender starts the clock now; a receiver at its first message
	// (perftest's set_on_first_rx_packet), and in a bidirectional Send
	// test the server sends only once the client's traffic has begun.
	if send && !(recv && !s.client) {
		r.startClock(0)
	}
	if err := r.loop(); err != nil {
		return nil, err
	}
	if send && r.credits {
		r.waitFinalCredits()
	}
	return r, nil
}

func (r *bwRun) now() int64 { return int64(time.Since(r.base)) }

func (r *bwRun) startClock(at int64) {
	r.started = true
	r.startNs = at
	if d := r.c.Duration; d > 0 {
		m := int64(r.c.margin())
		r.sampleFrom = at + m
		r.sampleTo = at + int64(d) - m
		r.endNs = at + int64(d)
	}
}

// timed reports whether this is a -D run.
func (r *bwRun) timed() bool { return r.c.Duration > 0 }

// ended reports whether a timed run is over.
func (r *bwRun) ended(now int64) bool { return r.timed() && r.started && now >= r.endNs }

func (r *bwRun) inSample(t int64) bool { return t >= r.sampleFrom && t < r.sampleTo }

// done reports whether an iterations run has finished its traffic.
func (r *bwRun) done() bool {
	if r.timed() {
		now := r.now()
		if !r.ended(now) {
			return false
		}
		return !r.send || !r.credits || r.sendsReceived(now)
	}
	for i := range r.scnt {
		if r.send && r.ccnt[i] < r.iters {
			return false
		}
		if r.recv && r.rcnt[i] < r.iters {
			return false
		}
	}
	return true
}

// loop posts, polls and waits until the run is over, then lets the credit
// writes of this side drain.
func (r *bwRun) loop() error {
	spins := 0
	for !r.done() {
		if err := r.s.ctx.Err(); err != nil {
			return err
		}
		posted, creditBlocked, err := r.post()
		if err != nil {
			return err
		}
		n, err := r.s.cq.Poll(r.wcs)
		if err != nil {
			return fmt.Errorf("polling the test CQ: %w", err)
		}
		if n > 0 {
			if err := r.complete(r.wcs[:n]); err != nil {
				return err
			}
		}
		if posted || n > 0 {
			spins = 0
			continue
		}
		if creditBlocked || r.stop != nil || !r.expectCompletion() {
			// Waiting for a credit the peer writes into our memory (no
			// completion tells us, also at the end of a timed run), or
			// for the clock: poll.
			spins++
			if spins%64 == 0 {
				if err := r.s.checkQPs(); err != nil {
					return err
				}
				time.Sleep(time.Microsecond)
			} else {
				runtime.Gosched()
			}
			continue
		}
		if err := r.waitCQ(); err != nil {
			return err
		}
	}
	return r.drainCredits()
}

// expectCompletion reports whether a completion is sure to come: a
// signaled request or a credit write is outstanding, or Sends are expected.
func (r *bwRun) expectCompletion() bool {
	for i := range r.scnt {
		if r.scredit[i] > 0 {
			return true
		}
		if r.send {
			if last, ok := r.lastSignaled(i); ok && last >= r.ccnt[i] {
				return true
			}
		}
		if r.recv && (r.timed() || r.rcnt[i] < r.iters) {
			return true
		}
	}
	return false
}

// lastSignaled is the sequence number of the last signaled request posted
// on queue pair i, if any.
func (r *bwRun) lastSignaled(i int) (uint64, bool) {
	n := r.scnt[i]
	if n == 0 {
		return 0, false
	}
	if !r.timed() && n == r.iters {
		return n - 1, true
	}
	if n < r.mod {
		return 0, false
	}
	return n/r.mod*r.mod - 1, true
}

// waitCQ blocks for a completion (until the end of a timed run).
func (r *bwRun) waitCQ() error {
	ctx := r.s.ctx
	if r.timed() && r.started {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, r.base.Add(time.Duration(r.endNs)))
		defer cancel()
	}
	n, err := r.s.cq.Wait(ctx, r.wcs)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && r.s.ctx.Err() == nil {
			return nil
		}
		return fmt.Errorf("waiting for the test CQ: %w", err)
	}
	return r.complete(r.wcs[:n])
}

// signaled says whether request seq is signaled: every mod-th, and the last.
func (r *bwRun) signaled(seq uint64) bool {
	return seq%r.mod == r.mod-1 || (!r.timed() && seq == r.iters-1)
}

// post posts what the send queues and credits allow; it reports whether it
// posted anything and whether a queue pair waits for a credit only.
func (r *bwRun) post() (posted, creditBlocked bool, err error) {
	s, c := r.s, r.c
	now := r.now()
	for i, qp := range s.qps {
		if r.credPending[i] != 0 && r.sqUse(i) < c.TxDepth+2 {
			if err := r.postCredit(i, r.credPending[i]); err != nil {
				return posted, false, err
			}
			r.credPending[i] = 0
			posted = true
		}
		if !r.send || !r.started {
			continue
		}
		r.batch = r.batch[:0]
		for r.mayPost(i, now) && r.sqUse(i) < c.TxDepth {
			if r.credits {
				credit := s.credit.loadCredit(creditSlot(c.QPs, i))
				if int64(r.scnt[i]+1)-int64(credit) >= int64(c.RxDepth) {
					creditBlocked = true
					break
				}
			}
			seq := r.scnt[i]
			k := len(r.batch)
			wr := verbs.SendWR{ID: dataID(i, seq)}
			if r.signaled(seq) {
				wr.Flags = verbs.FlagSignaled
			}
			switch c.Verb {
			case Write:
				wr.Opcode, wr.RemoteAddr, wr.RKey = verbs.WRWrite, s.rem[i].VAddr, s.rem[i].RKey
				if c.Imm {
					wr.Opcode, wr.ImmData = verbs.WRWriteWithImm, uint32(seq)
					wr.RemoteAddr, wr.RKey = s.remData[i].VAddr, s.remData[i].RKey
				}
			case Read:
				wr.Opcode, wr.RemoteAddr, wr.RKey = verbs.WRRead, s.rem[i].VAddr, s.rem[i].RKey
			case Atomic:
				// One word of the peer's buffer, 8-byte aligned.
				wr.Opcode, wr.RemoteAddr, wr.RKey = verbs.WRAtomicFetchAdd, s.rem[i].VAddr&^7, s.rem[i].RKey
				wr.CompareAdd = atomicAddValue
				if c.AtomicType == CmpAndSwap {
					wr.Opcode, wr.CompareAdd, wr.Swap = verbs.WRAtomicCmpSwap, 0, atomicSwapValue
				}
			default:
				wr.Opcode = verbs.WRSend
			}
			if !c.readsOut() && r.size <= c.Inline {
				wr.Flags |= verbs.FlagInline
				wr.Inline = s.mem.buf[s.sendOff(i) : s.sendOff(i)+r.size]
			} else {
				r.sges[k] = s.mem.mr.SGE(s.sendOff(i), r.size)
				wr.SGL = r.sges[k : k+1]
			}
			r.batch = append(r.batch, wr)
			if r.times.posted != nil {
				r.times.posted[r.totS] = now
			}
			r.scnt[i]++
			r.totS++
		}
		if len(r.batch) > 0 {
			if n, err := qp.PostSend(r.batch); err != nil {
				return posted, false, fmt.Errorf("posting on test QP %d (%d of %d posted): %w", i, n, len(r.batch), err)
			}
			posted = true
		}
	}
	return posted, creditBlocked, nil
}

// mayPost reports whether queue pair i is to post another request: in an
// iterations run until it has posted them all, in a timed run until the
// end, and Sends after it up to the count finishTimed set.
func (r *bwRun) mayPost(i int, now int64) bool {
	switch {
	case !r.timed():
		return r.scnt[i] < r.iters
	case !r.ended(now):
		return true
	case r.credits:
		r.finishTimed(now)
		return r.scnt[i] < r.stop[i] && now < r.drainBy
	}
	return false
}

// finishTimed fixes, at the end of a timed Send run, how many Sends each
// queue pair posts in all: the next count at which the receiver writes a
// credit. The sender then waits for that credit (sendsReceived), so it
// knows that every Send it posted has been received before it goes to the
// closing handshake, after which the receiver tears its queue pairs down:
// a Send still on its way would then meet an empty receive queue. The
// receiver takes Sends and writes credits until the sender's closing
// message (closeSyncServing); a perftest receiver does until the end of
// its run, which starts at its first receive, after the sender's, so the
// Sends after the sender's end are few and do not count in any figure.
func (r *bwRun) finishTimed(now int64) {
	if r.stop != nil {
		return
	}
	r.stop = make([]uint64, len(r.scnt))
	for i, n := range r.scnt {
		r.stop[i] = nextCredit(n, uint64(r.c.RxDepth), r.creditCnt)
	}
	r.drainBy = now + int64(drainTimeout)
}

// sendsReceived reports whether, after the end of a timed run, every
// queue pair has posted its last Send and the receiver's credit for it
// has come, or the wait is over (drainTimeout).
func (r *bwRun) sendsReceived(now int64) bool {
	r.finishTimed(now)
	if now >= r.drainBy {
		return true
	}
	for i := range r.scnt {
		if r.scnt[i] < r.stop[i] || uint64(r.s.credit.loadCredit(creditSlot(r.c.QPs, i))) < r.stop[i] {
			return false
		}
	}
	return true
}

// sqUse is an upper bound of queue pair i's occupied send queue entries.
func (r *bwRun) sqUse(i int) int { return int(r.scnt[i]-r.ccnt[i]) + r.scredit[i] }

// postCredit RDMA-Writes the credit v to the peer's slot for queue pair i.
func (r *bwRun) postCredit(i int, v uint64) error {
	marshalCredit(r.cred[:], uint32(v))
	r.cwr[0] = verbs.SendWR{ID: creditID | uint64(i), Opcode: verbs.WRWrite,
		Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: r.cred[:],
		RemoteAddr: r.s.rem[i].VAddr, RKey: r.s.rem[i].RKey}
	if _, err := r.s.qps[i].PostSend(r.cwr[:]); err != nil {
		return fmt.Errorf("posting a credit on test QP %d: %w", i, err)
	}
	r.scredit[i]++
	return nil
}

// complete handles completions.
func (r *bwRun) complete(wcs []verbs.WorkCompletion) error {
	now := r.now()
	for k := range wcs {
		wc := &wcs[k]
		switch {
		case wc.Opcode.Recv():
			if err := r.received(wc, now); err != nil {
				return err
			}
		case wc.ID&creditID != 0:
			i := int(wc.ID &^ creditID)
			if wc.Status != verbs.WCSuccess {
				return fmt.Errorf("credit write on test QP %d: %v: %w", i, wc.Status, errIncomplete)
			}
			r.scredit[i]--
		default:
			i, seq := int(wc.ID>>seqBits), wc.ID&(1<<seqBits-1)
			if wc.Status != verbs.WCSuccess {
				return fmt.Errorf("%v on test QP %d: %v (posted %d, completed %d): %w",
					r.c.Verb, i, wc.Status, r.scnt[i], r.ccnt[i], errIncomplete)
			}
			n := seq + 1 - r.ccnt[i]
			r.ccnt[i] = seq + 1
			r.totC += n
			r.lastCNs = now
			if r.times.completed != nil {
				r.times.completed[r.totC-1] = now
			}
			if r.timed() && r.inSample(now) {
				r.sampled += n
			}
		}
	}
	return nil
}

// received takes one receive completion: counts it, posts the receive
// again while more are to come, and writes a credit every creditCnt
// receives (run_iter_bw_server, run_iter_bi).
func (r *bwRun) received(wc *verbs.WorkCompletion, now int64) error {
	i := int(wc.ID)
	if wc.Status != verbs.WCSuccess {
		return fmt.Errorf("receive on test QP %d: %v (received %d): %w", i, wc.Status, r.rcnt[i], errIncomplete)
	}
	if !r.started {
		r.startClock(now)
	}
	if r.totR == 0 {
		r.firstRxNs = now
	}
	r.lastRxNs = now
	r.rcnt[i]++
	r.totR++
	if r.timed() && r.inSample(now) && !r.send {
		r.sampled++
	}
	if r.timed() || r.posted[i]+1 <= r.iters {
		r.rsge[0] = r.s.mem.mr.SGE(r.s.recvOff(i), r.size)
		r.rwr[0] = verbs.RecvWR{ID: uint64(i), SGL: r.rsge[:]}
		if _, err := r.s.qps[i].PostRecv(r.rwr[:]); err != nil {
			return fmt.Errorf("posting a receive on test QP %d: %w", i, err)
		}
		r.posted[i]++
	}
	if (r.rcnt[i]%uint64(r.c.RxDepth))%r.creditCnt == 0 {
		if r.sqUse(i) < r.c.TxDepth+2 {
			return r.postCredit(i, r.rcnt[i])
		}
		r.credPending[i] = r.rcnt[i]
	}
	return nil
}

// drainCredits waits until every credit write of this side has completed
// (clean_scq_credit), posting one still pending.
func (r *bwRun) drainCredits() error {
	for {
		busy := false
		for i := range r.scredit {
			if r.credPending[i] != 0 && r.sqUse(i) < r.c.TxDepth+2 {
				if err := r.postCredit(i, r.credPending[i]); err != nil {
					return err
				}
				r.credPending[i] = 0
			}
			busy = busy || r.scredit[i] > 0 || r.credPending[i] != 0
		}
		if !busy {
			return nil
		}
		n, err := r.s.cq.Wait(r.s.ctx, r.wcs)
		if err != nil {
			return fmt.Errorf("waiting for credit writes: %w", err)
		}
		// Data completions still arriving after a timed run are counted
		// out of the sample.
		if err := r.complete(r.wcs[:n]); err != nil {
			return err
		}
	}
}

// finalCredit is the last credit a receiver writes after n receives.
func finalCredit(n, rx, every uint64) uint64 {
	for v := n; v > 0; v-- {
		if (v%rx)%every == 0 {
			return v
		}
	}
	return 0
}

// nextCredit is the first count from n on after which a receiver writes a
// credit (n itself if it does after n receives).
func nextCredit(n, rx, every uint64) uint64 {
	for (n%rx)%every != 0 {
		n++
	}
	return n
}

// serve is one turn of closeSyncServing after a timed run: it takes the
// completions of the test CQ (receives are posted again and credited, so
// that a sender that is still finishing gets its last credits), waiting
// at most serveWait for them.
func (r *bwRun) serve(ctx context.Context) error {
	for i := range r.credPending {
		if r.credPending[i] != 0 && r.sqUse(i) < r.c.TxDepth+2 {
			if err := r.postCredit(i, r.credPending[i]); err != nil {
				return err
			}
			r.credPending[i] = 0
		}
	}
	wctx, cancel := context.WithTimeout(ctx, serveWait)
	defer cancel()
	n, err := r.s.cq.Wait(wctx, r.wcs)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil
		}
		return fmt.Errorf("waiting for the test CQ: %w", err)
	}
	for k := range r.wcs[:n] {
		if r.wcs[k].Status == verbs.WCFlushErr {
			return errServeFlushed
		}
	}
	return r.complete(r.wcs[:n])
}

// waitFinalCredits waits (briefly) until the peer's last credit of an
// iterations run has landed, so that it cannot arrive after the slots are
// reset for the next size and pass for fresh credit.
func (r *bwRun) waitFinalCredits() {
	if r.timed() {
		return
	}
	deadline := time.Now().Add(2 * time.Second)
	for i := range r.s.qps {
		want := finalCredit(r.iters, uint64(r.c.RxDepth), r.creditCnt)
		for r.s.credit.loadCredit(creditSlot(r.c.QPs, i)) < uint32(want) && time.Now().Before(deadline) &&
			r.s.ctx.Err() == nil && r.s.checkQPs() == nil {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// result computes this side's figures.
func (r *bwRun) result() BWResult {
	nq := uint64(len(r.s.qps))
	switch {
	case r.timed():
		return bwResult(r.c, r.size, r.sampled, nil, r.sampleFrom, r.sampleTo, true)
	case r.send:
		first := r.startNs
		if len(r.times.posted) > 0 {
			first = r.times.posted[0]
		}
		return bwResult(r.c, r.size, r.iters*nq, &r.times, first, r.lastCNs, r.noPeak)
	default:
		return bwResult(r.c, r.size, r.iters*nq, nil, r.firstRxNs, r.lastRxNs, true)
	}
}

// exchangeDests' first handshake for a Write test with immediate data:
// it carries the data buffers the Writes target (kept in remData), while
// the printed exchange after it carries the receive credits' slots, as in
// a Send test.
func (s *session) exchangeDataDests() error {
	credits := append([]Dest(nil), s.my...)
	for i := range s.my {
		s.my[i].RKey, s.my[i].VAddr = s.mem.mr.RKey(), s.mem.addr(s.recvOff(i))
	}
	err := s.exchangeDests(false)
	copy(s.my, credits)
	s.remData = append(s.remData[:0], s.rem...)
	return err
}
