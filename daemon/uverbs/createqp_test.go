package uverbs

import (
	"testing"

	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// TestCreateQPUnwinds: a QP whose creation fails at its last step (the
// engine at its maximum of QPs, after the rings, their memory and the
// doorbell were made) gives everything back: no descriptor or mapping
// stays behind, the session's charge is returned (its QP limit is not
// used up by the failures), and its PD and CQ are held no more, so they
// can be destroyed.
func TestCreateQPUnwinds(t *testing.T) {
	r := newRigMods(t, func(c *offload.Config) { c.MaxQP = 1 }, nil)
	r.srv.SetLimits(Limits{QPs: 2, CQs: 4, MRs: 4, PDs: 2, Listeners: 1, MRBytes: 64 << 10, WRs: 64, CQEs: 128})
	d := r.dial()
	pd := must[*verbs.PD](t)(d.AllocPD())
	cq := must[*verbs.CQ](t)(d.CreateCQ(16))
	attr := verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4}
	first := must[*verbs.QP](t)(pd.CreateQP(attr))
	fds, maps := resources(t)
	for i := range 5 {
		if _, err := pd.CreateQP(attr); err == nil {
			t.Fatalf("attempt %d: a second QP on an engine of one", i)
		}
	}
	if f, m := resources(t); f != fds || m != maps {
		t.Errorf("after 5 failed creations: %d memfd/eventfd descriptors and %d mappings, want %d and %d", f, m, fds, maps)
	}
	if err := first.Destroy(); err != nil {
		t.Fatal(err)
	}
	// Only the PD and the CQ are charged to the session now.
	r.srv.mu.Lock()
	for ss := range r.srv.sessions {
		ss.mu.Lock()
		if u := ss.used; u.qps != 0 || u.wrs != 0 || u.pds != 1 || u.cqs != 1 {
			t.Errorf("session charged %+v after the failures, want the PD and the CQ only", u)
		}
		ss.mu.Unlock()
	}
	r.srv.mu.Unlock()
	q := must[*verbs.QP](t)(pd.CreateQP(attr))
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := cq.Destroy(); err != nil {
		t.Errorf("destroy CQ after the failures: %v", err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Errorf("dealloc PD after the failures: %v", err)
	}
}
