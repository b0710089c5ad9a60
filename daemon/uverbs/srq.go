package uverbs

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// sSRQ is the daemon side of a shared receive queue: the engine's SRQ and
// the ring of receives the client fills. The ring has no doorbell and no
// goroutine: the engine asks for its receives (drain, the SRQ's refill)
// when a Send on one of the SRQ's QPs finds the SRQ empty, and when the
// SRQ's count drops below its armed limit, so the receives the client
// posted count before the limit event fires.
type sSRQ struct {
	ss  *session
	h   uint32
	pd  *sPD
	srq *offload.SRQ
	// users counts the QPs attached, those being created included
	// (session.hold; guarded by the session's mu).
	users int

	// mu serialises reading the ring (drain) and replacing it (resize).
	mu    sync.Mutex
	memfd int // the ring's memfd, for ModifySRQ's reply
	mem   []byte
	ring  *uabi.Ring
	cons  uint32
	dead  bool
	// bad counts entries that did not decode (a client writing garbage):
	// dropped, the client's own accounting is its problem.
	bad atomic.Uint64
}

// newSRQRing makes the shared memory and ring of count receives.
func newSRQRing(count uint32) (int, []byte, *uabi.Ring, error) {
	size := uabi.RingBytes(count, uabi.RQESize)
	memfd, mem, err := uabi.NewShared("siwtun-srq", size, true)
	if err != nil {
		return -1, nil, nil, err
	}
	ring, err := uabi.InitRing(mem, count, uabi.RQESize)
	if err != nil {
		uabi.Unmap(mem)
		uabi.Close(memfd)
		return -1, nil, nil, err
	}
	return memfd, mem, ring, nil
}

func (ss *session) createSRQ(req *uabi.CreateSRQ) (uabi.Msg, []int, error) {
	pd, err := get[*sPD](ss, req.PD, "PD")
	if err != nil {
		return nil, nil, err
	}
	maxWR := int(req.MaxWR)
	if maxWR <= 0 || maxWR > ibv.MaxQPWR || req.Limit > req.MaxWR {
		return nil, nil, fail(uabi.StError, "SRQ depth %d, limit %d: want 1..%d, limit at most the depth", maxWR, req.Limit, ibv.MaxQPWR)
	}
	count := uabi.RingCount(maxWR)
	cost := usage{srqs: 1, wrs: int(count)}
	if err := ss.charge(cost); err != nil {
		return nil, nil, err
	}
	if err := ss.hold(req.PD, pd); err != nil {
		ss.uncharge(cost)
		return nil, nil, err
	}
	undo := func() {
		ss.mu.Lock()
		ss.unchargeLocked(cost)
		pd.users--
		ss.mu.Unlock()
	}
	esrq, err := ss.srv.eng.CreateSRQ(pd.pd.Handle(), offload.SRQAttr{MaxWR: maxWR, Limit: int(req.Limit)})
	if err != nil {
		undo()
		return nil, nil, err
	}
	memfd, mem, ring, err := newSRQRing(count)
	if err != nil {
		undo()
		esrq.Destroy()
		return nil, nil, err
	}
	s := &sSRQ{ss: ss, pd: pd, srq: esrq, memfd: memfd, mem: mem, ring: ring}
	esrq.SetRecvRefill(s.drain)
	h, err := ss.add(s)
	if err != nil {
		undo()
		s.close()
		return nil, nil, err
	}
	s.h = h
	esrq.SetEventHandler(func(e ibv.Event) { ss.queueMsg(&uabi.SRQEvent{SRQ: h, Type: uint32(e.Type)}) })
	cfd, err := dupFD(memfd)
	if err != nil {
		take[*sSRQ](ss, h, "SRQ")
		ss.mu.Lock()
		pd.users--
		ss.mu.Unlock()
		s.close()
		return nil, nil, err
	}
	return &uabi.CreateSRQReply{Handle: h, Count: count, Size: uint32(len(mem))}, []int{cfd}, nil
}

// drain moves every receive the client published in the ring to the
// engine's SRQ (the SRQ's refill, on a QP's receive goroutine).
func (s *sSRQ) drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainLocked()
}

func (s *sSRQ) drainLocked() {
	if s.dead {
		return
	}
	b := s.ss.srv.rqScratch.Get().(*rqBatch)
	defer s.ss.srv.rqScratch.Put(b)
	for {
		n := 0
		for n < min(len(b.wr), int(s.ring.Count())) { // one lap at most, as sQP.drainRQ
			pos := s.cons + uint32(n)
			if _, ok := s.ring.Ready(pos); !ok {
				break
			}
			if err := uabi.DecodeRQE(s.ring.Entry(pos), &b.wr[n], &b.sgl[n]); err != nil {
				b.wr[n] = ibv.RecvWR{ID: b.wr[n].ID}
			}
			n++
		}
		if n == 0 {
			return
		}
		posted, err := s.srq.PostRecv(b.wr[:n])
		for range posted {
			s.ring.Release(s.cons)
			s.cons++
		}
		switch {
		case errors.Is(err, ibv.ErrQueueFull):
			return // the client posted more than the depth: the rest waits
		case err != nil:
			// A malformed receive (too many SGEs written by hand): it
			// has no QP to complete on; dropped.
			s.bad.Add(1)
			s.ring.Release(s.cons)
			s.cons++
		}
	}
}

func (ss *session) modifySRQ(req *uabi.ModifySRQ) (uabi.Msg, []int, error) {
	s, err := get[*sSRQ](ss, req.Handle, "SRQ")
	if err != nil {
		return nil, nil, err
	}
	mask := ibv.SRQAttrMask(req.Mask)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return nil, nil, fail(uabi.StBadHandle, "SRQ %d destroyed", req.Handle)
	}
	// What the client published counts: a smaller depth must hold it,
	// and a new ring starts empty.
	s.drainLocked()
	grow := mask&ibv.SRQMaxWR != 0 && uabi.RingCount(int(req.MaxWR)) > s.ring.Count() && req.MaxWR <= ibv.MaxQPWR
	var cost usage
	if grow {
		cost = usage{wrs: int(uabi.RingCount(int(req.MaxWR)) - s.ring.Count())}
		if err := ss.charge(cost); err != nil {
			return nil, nil, err
		}
	}
	if err := s.srq.Modify(ibv.SRQAttr{MaxWR: int(req.MaxWR), Limit: int(req.Limit)}, mask); err != nil {
		ss.uncharge(cost)
		return nil, nil, fail(uabi.StError, "%v", err)
	}
	if grow {
		count := uabi.RingCount(int(req.MaxWR))
		memfd, mem, ring, err := newSRQRing(count)
		if err != nil {
			// The engine has the new depth; the client keeps the old
			// ring and its depth, which is smaller: nothing overflows.
			ss.uncharge(cost)
			return nil, nil, err
		}
		uabi.Unmap(s.mem)
		uabi.Close(s.memfd)
		// costOf reads the ring's count: what the session was charged
		// for it is now the new count.
		ss.mu.Lock()
		s.memfd, s.mem, s.ring, s.cons = memfd, mem, ring, 0
		ss.mu.Unlock()
	}
	cfd, err := dupFD(s.memfd)
	if err != nil {
		return nil, nil, err
	}
	return &uabi.ModifySRQReply{New: grow, Count: s.ring.Count(), Size: uint32(len(s.mem))}, []int{cfd}, nil
}

func (ss *session) querySRQ(h uint32) (uabi.Msg, error) {
	s, err := get[*sSRQ](ss, h, "SRQ")
	if err != nil {
		return nil, err
	}
	a := s.srq.Query()
	return &uabi.QuerySRQReply{MaxWR: uint32(a.MaxWR), MaxSGE: uint32(a.MaxSGE), Limit: uint32(a.Limit)}, nil
}

func (ss *session) destroySRQ(h uint32) error {
	s, err := takeIf(ss, h, "SRQ", func(s *sSRQ) error {
		if s.users > 0 {
			return fail(uabi.StBusy, "SRQ %d: %d QPs use it", h, s.users)
		}
		return nil
	})
	if err != nil {
		return err
	}
	ss.mu.Lock()
	s.pd.users--
	ss.mu.Unlock()
	s.close()
	return nil
}

// close destroys the engine's SRQ (no QP uses it any more) and frees the
// ring.
func (s *sSRQ) close() {
	s.srq.Destroy()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return
	}
	s.dead = true
	uabi.Unmap(s.mem)
	uabi.Close(s.memfd)
}
