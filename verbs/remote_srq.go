package verbs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// remoteSRQ posts into the SRQ ring the daemon reads when a Send needs a
// receive (no doorbell: see uabi.CreateSRQReply).
type remoteSRQ struct {
	dev    *remoteDevice
	h      uint32
	events chan Event

	mu    sync.Mutex
	ring  *uabi.Ring
	mem   []byte
	prod  uint32
	maxWR int
	// posted counts receives posted, done (by the CQs' polls, which
	// see the completions of the SRQ's QPs) those completed: posted-done
	// are outstanding, at most maxWR.
	posted uint64
	done   atomic.Uint64
	dead   bool
}

func (pd *remotePD) CreateSRQ(attr SRQAttr) (ProviderSRQ, error) {
	d := pd.dev
	var rep uabi.CreateSRQReply
	r, err := d.call(context.Background(), uabi.OpCreateSRQ, &uabi.CreateSRQ{PD: pd.h, MaxWR: uint32(attr.MaxWR), Limit: uint32(attr.Limit)}, &rep)
	if err != nil {
		return nil, err
	}
	mapping, ring, err := mapSRQRing(r.fds[0], rep.Count, rep.Size)
	if err != nil {
		d.call(context.Background(), uabi.OpDestroySRQ, &uabi.Ref{Handle: rep.Handle}, nil)
		return nil, err
	}
	s := &remoteSRQ{dev: d, h: rep.Handle, events: make(chan Event, 8), ring: ring, mem: mapping, maxWR: attr.MaxWR}
	d.mu.Lock()
	d.srqs[s.h] = s
	d.mu.Unlock()
	return s, nil
}

// mapSRQRing maps the ring memfd fd (and closes it).
func mapSRQRing(fd int, count, size uint32) ([]byte, *uabi.Ring, error) {
	mapping, mem, err := uabi.MapShared(fd, 0, uint64(size))
	uabi.Close(fd)
	if err != nil {
		return nil, nil, err
	}
	ring, err := uabi.OpenRing(mem, count, uabi.RQESize)
	if err != nil {
		uabi.Unmap(mapping)
		return nil, nil, err
	}
	return mapping, ring, nil
}

func (s *remoteSRQ) emit(e Event) {
	select {
	case s.events <- e:
	default:
	}
}

func (s *remoteSRQ) Events() <-chan Event { return s.events }

var errSRQDead = fmt.Errorf("post SRQ receive: %w", ErrDestroyed)

// PostRecv writes the requests into the SRQ's ring.
func (s *remoteSRQ) PostRecv(wrs []RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return 0, errSRQDead
	}
	select {
	case <-s.dev.removed:
		return 0, errPostRemove
	default:
	}
	for i := range wrs {
		wr := &wrs[i]
		if err := ibv.CheckRecvWR(wr); err != nil {
			return i, fmt.Errorf("SRQ recv WR %d (id %d): %w", i, wr.ID, err)
		}
		if s.posted-s.done.Load() >= uint64(s.maxWR) || !s.ring.WaitFree(s.prod, ringFreeWait) {
			return i, fmt.Errorf("SRQ: %w (%d entries)", ibv.ErrQueueFull, s.maxWR)
		}
		uabi.EncodeRQE(s.ring.Entry(s.prod), wr)
		s.ring.Publish(s.prod, 0)
		s.prod++
		s.posted++
	}
	return len(wrs), nil
}

func (s *remoteSRQ) Modify(attr SRQAttr, mask SRQAttrMask) error {
	s.mu.Lock() // no posts while the ring may change
	defer s.mu.Unlock()
	if s.dead {
		return fmt.Errorf("modify SRQ: %w", ErrDestroyed)
	}
	var rep uabi.ModifySRQReply
	r, err := s.dev.call(context.Background(), uabi.OpModifySRQ,
		&uabi.ModifySRQ{Handle: s.h, Mask: uint32(mask), MaxWR: uint32(attr.MaxWR), Limit: uint32(attr.Limit)}, &rep)
	if err != nil {
		return err
	}
	if rep.New {
		mapping, ring, err := mapSRQRing(r.fds[0], rep.Count, rep.Size)
		if err != nil {
			return err
		}
		uabi.Unmap(s.mem)
		s.mem, s.ring, s.prod = mapping, ring, 0
	} else {
		uabi.CloseFDs(r.fds)
	}
	if mask&SRQMaxWR != 0 {
		s.maxWR = attr.MaxWR
	}
	return nil
}

func (s *remoteSRQ) Query() (SRQAttr, error) {
	var rep uabi.QuerySRQReply
	if _, err := s.dev.call(context.Background(), uabi.OpQuerySRQ, &uabi.Ref{Handle: s.h}, &rep); err != nil {
		return SRQAttr{}, fmt.Errorf("query SRQ: %w", err)
	}
	return SRQAttr{MaxWR: int(rep.MaxWR), MaxSGE: int(rep.MaxSGE), Limit: int(rep.Limit)}, nil
}

func (s *remoteSRQ) Destroy() error {
	_, err := s.dev.call(context.Background(), uabi.OpDestroySRQ, &uabi.Ref{Handle: s.h}, nil)
	if errors.Is(err, ErrDeviceRemoved) {
		err = nil
	}
	if err != nil {
		return err
	}
	s.dev.mu.Lock()
	delete(s.dev.srqs, s.h)
	s.dev.mu.Unlock()
	s.release()
	return nil
}

// release unmaps the ring.
func (s *remoteSRQ) release() {
	s.mu.Lock()
	if !s.dead {
		s.dead = true
		uabi.Unmap(s.mem)
	}
	s.mu.Unlock()
}
