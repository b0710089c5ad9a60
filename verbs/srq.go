package verbs

import (
	"fmt"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// SRQAttr sizes and arms a shared receive queue (ibv_srq_attr):
//
//	MaxWR  int // depth: receives posted and not yet taken
//	MaxSGE int // SGEs per receive (reported by Query)
//	Limit  int // not 0: the limit event is armed at this count
type SRQAttr = ibv.SRQAttr

// SRQAttrMask says which fields of an SRQAttr SRQ.Modify changes.
type SRQAttrMask = ibv.SRQAttrMask

// SRQ attribute mask bits (IBV_SRQ_MAX_WR, IBV_SRQ_LIMIT).
const (
	SRQMaxWR = ibv.SRQMaxWR
	SRQLimit = ibv.SRQLimit
)

// EventSRQLimitReached is an SRQ's limit event (SRQ.Events).
const EventSRQLimitReached = ibv.EventSRQLimitReached

// SRQ is a shared receive queue (ibv_srq): receives posted once and taken
// by whichever of its queue pairs (QPInitAttr.SRQ) a Send arrives on,
// completing into that QP's receive CQ with that QP's number.
type SRQ struct {
	pd        *PD
	be        ProviderSRQ
	users     int  // QPs attached; guarded by pd.dev.mu
	destroyed bool // guarded by pd.dev.mu
}

// CreateSRQ creates a shared receive queue of attr.MaxWR receives
// (ibv_create_srq); attr.Limit, if not 0, arms the limit event.
func (pd *PD) CreateSRQ(attr SRQAttr) (*SRQ, error) {
	if attr.MaxWR <= 0 || attr.MaxWR > MaxQPWR {
		return nil, fmt.Errorf("create SRQ: depth %d: want 1..%d", attr.MaxWR, MaxQPWR)
	}
	if attr.Limit < 0 || attr.Limit > attr.MaxWR {
		return nil, fmt.Errorf("create SRQ: limit %d: want 0..%d", attr.Limit, attr.MaxWR)
	}
	if err := pd.attach(func() {}); err != nil {
		return nil, fmt.Errorf("create SRQ: %w", err)
	}
	be, err := pd.be.CreateSRQ(attr)
	if err != nil {
		return nil, fmt.Errorf("create SRQ: %w", err)
	}
	s := &SRQ{pd: pd, be: be}
	if err := pd.attach(func() { pd.srqs[s] = struct{}{} }); err != nil {
		be.Destroy()
		return nil, fmt.Errorf("create SRQ: %w", err)
	}
	return s, nil
}

// PostRecv posts receives to the SRQ (ibv_post_srq_recv): it returns how
// many were queued, stopping at the first malformed one (ErrInvalidWR) or
// when the SRQ is full (ErrQueueFull). Over the verbs socket they are
// written into the SRQ's ring shared with the daemon, which takes them
// when a Send needs one.
func (s *SRQ) PostRecv(wrs []RecvWR) (int, error) { return s.be.PostRecv(wrs) }

// Modify changes what mask names (ibv_modify_srq): SRQMaxWR resizes the
// SRQ (not below the receives it holds), SRQLimit arms the limit event (0
// disarms it).
func (s *SRQ) Modify(attr SRQAttr, mask SRQAttrMask) error {
	if err := s.be.Modify(attr, mask); err != nil {
		return fmt.Errorf("modify SRQ: %w", err)
	}
	return nil
}

// Query returns the SRQ's depth, SGEs per receive and armed limit (0 once
// the limit event fired).
func (s *SRQ) Query() (SRQAttr, error) { return s.be.Query() }

// Events delivers the SRQ's limit events (EventSRQLimitReached).
func (s *SRQ) Events() <-chan Event { return s.be.Events() }

// Provider is the SRQ's backend.
func (s *SRQ) Provider() ProviderSRQ { return s.be }

// Destroy frees the SRQ (ibv_destroy_srq); it fails with ErrBusy while
// queue pairs use it.
func (s *SRQ) Destroy() error {
	d := s.pd.dev
	d.mu.Lock()
	switch {
	case s.destroyed:
		d.mu.Unlock()
		return fmt.Errorf("destroy SRQ: %w", ErrDestroyed)
	case s.users > 0:
		n := s.users
		d.mu.Unlock()
		return fmt.Errorf("destroy SRQ: %w (%d QPs use it)", ErrBusy, n)
	}
	s.destroyed = true
	d.mu.Unlock()
	err := s.be.Destroy()
	d.mu.Lock()
	if err != nil {
		s.destroyed = false
	} else {
		delete(s.pd.srqs, s)
	}
	d.mu.Unlock()
	if err != nil {
		return fmt.Errorf("destroy SRQ: %w", err)
	}
	return nil
}
