package offload

import (
	"errors"
	"fmt"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// Memory windows (RFC 5040 §2.1, the verbs' memory windows): a window is
// an STag of its own naming a part of a memory region registered with
// ibv.AccessMWBind, with remote rights of its own. It lives in the region
// table next to the regions: allocating one takes a slot and its STag
// (index and first key from the table's secret permutations, stag.go),
// and it names nothing until it is bound. A bind is a send-queue work
// request (WRBindMW; ibv_bind_mw posts one for a type 1 window) that the
// QP's transmit goroutine performs in send-queue order, with nothing on
// the wire: the window's STag takes the 8-bit key the consumer picked
// (its index stays) and names the new range; its previous STag names
// nothing from then on. Local Invalidate (WRLocalInv) is performed the
// same way. Invalidation, local or remote, goes through the window's gate
// (Region.placeInto): once it has completed, no byte of a racing RDMA
// Write lands in the window, and the rest of that Write is refused with a
// Terminate.
//
// The rules, checked at bind time (a broken one completes the bind with
// IBV_WC_MW_BIND_ERR and moves the QP to ERR, as on an RNIC):
//   - the window, the region and the QP belong to one protection domain;
//   - the region is valid, a memory region (not a window), registered
//     with MW_BIND, and the window lies inside it;
//   - the window's rights are REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC;
//     REMOTE_WRITE and REMOTE_ATOMIC need the region's LOCAL_WRITE (as
//     registration does);
//   - a type 2 window is bound only while invalid (fresh, or invalidated)
//     and is tied to the binding QP: tagged access from another QP's peer
//     is refused (STag not associated), only that QP's Local Invalidate
//     or its peer's Send with Invalidate invalidates it, and destroying
//     the QP invalidates it;
//   - a type 1 window may be bound again while valid (the old STag dies)
//     and is unbound by a bind of length 0 without a region; it is not
//     invalidated by Local Invalidate or Send with Invalidate;
//   - a zero-length window of a region is valid: it names no byte, so
//     only zero-length access passes its bounds.
//
// A region with windows bound cannot be deregistered or re-registered
// (ErrBusy).

// errMW is the root of the window errors.
var errMW = errors.New("offload: memory window")

// AllocMW allocates a memory window of type typ in protection domain pd:
// a table slot and an STag that names nothing until the window is bound.
func (t *Regions) AllocMW(pd uint32, typ ibv.MWType) (*Region, error) {
	if typ != ibv.MWType1 && typ != ibv.MWType2 {
		return nil, fmt.Errorf("%w: type %v", errMW, typ)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.newLocked(&Region{pd: pd, mw: typ})
}

// mwLocked returns the window whose index stag names (whatever its key).
// t.mu is held.
func (t *Regions) mwLocked(stag uint32) (*Region, error) {
	r := t.at(stag)
	if r == nil || r.mw == 0 {
		return nil, fmt.Errorf("%w: 0x%08x names no window", errMW, stag)
	}
	return r, nil
}

// DeallocMW frees the window whose index stag names (ibv_dealloc_mw): it is
// invalidated and its STag names nothing from now on.
func (t *Regions) DeallocMW(stag uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.mwLocked(stag)
	if err != nil {
		return err
	}
	t.invalidateLocked(r)
	t.freeLocked(r)
	return nil
}

// BindMW performs b for QP qpn of protection domain pd and returns the
// window's new STag (b.RKey). The rules are this file's; an error leaves
// the window as it was.
func (t *Regions) BindMW(b *ibv.MWBind, pd, qpn uint32) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, err := t.mwLocked(b.MW)
	if err != nil {
		return 0, err
	}
	switch {
	case b.RKey>>8 != old.stag>>8:
		return 0, fmt.Errorf("%w: rkey 0x%08x is not one of window 0x%08x", errMW, b.RKey, old.stag)
	case old.pd != pd:
		return 0, fmt.Errorf("%w: window 0x%08x belongs to another protection domain than QP %d", errMW, old.stag, qpn)
	case b.Type1 != (old.mw == ibv.MWType1):
		return 0, fmt.Errorf("%w: window 0x%08x is of %v", errMW, old.stag, old.mw)
	case old.mw == ibv.MWType2 && old.valid:
		return 0, fmt.Errorf("%w: type 2 window 0x%08x is bound (invalidate it first)", errMW, old.stag)
	case b.Access&^(ibv.AccessRemoteRead|ibv.AccessRemoteWrite|ibv.AccessRemoteAtomic) != 0:
		return 0, fmt.Errorf("%w: window rights %v", errMW, b.Access)
	}
	if old.mw == ibv.MWType1 && b.MRKey == 0 && b.Length == 0 {
		// Unbind: the window names nothing under its new key.
		t.invalidateLocked(old)
		t.slots[t.secret.slot(old.stag>>8)] = &Region{stag: b.RKey, pd: pd, mw: old.mw}
		return b.RKey, nil
	}
	mr := t.at(b.MRKey)
	switch {
	case mr == nil || mr.stag != b.MRKey || !mr.valid || mr.mw != 0:
		return 0, fmt.Errorf("%w: lkey 0x%08x names no valid memory region", errMW, b.MRKey)
	case mr.pd != pd:
		return 0, fmt.Errorf("%w: region 0x%08x belongs to another protection domain", errMW, mr.stag)
	case mr.access&ibv.AccessMWBind == 0:
		return 0, fmt.Errorf("%w: region 0x%08x was registered without MW_BIND (%v)", errMW, mr.stag, mr.access)
	case b.Access&(ibv.AccessRemoteWrite|ibv.AccessRemoteAtomic) != 0 && mr.access&ibv.AccessLocalWrite == 0:
		return 0, fmt.Errorf("%w: window rights %v need the region's LOCAL_WRITE (%v)", errMW, b.Access, mr.access)
	}
	buf, ok := mr.slice(b.Addr, b.Length)
	if !ok {
		return 0, fmt.Errorf("%w: [0x%x, +%d) is not inside region 0x%08x [0x%x, +%d)", errMW, b.Addr, b.Length, mr.stag, mr.addr, len(mr.buf))
	}
	w := &Region{stag: b.RKey, pd: pd, addr: b.Addr, buf: buf, access: b.Access, mw: old.mw, parent: mr, valid: true}
	t.invalidateLocked(old)
	if old.mw == ibv.MWType2 {
		w.qpn = qpn
		t.bound2++
	}
	mr.windows++
	t.slots[t.secret.slot(old.stag>>8)] = w
	return w.stag, nil
}

// invalidateQP invalidates the type 2 windows bound to QP qpn, which is
// being destroyed: a window tied to a QP dies with it.
func (t *Regions) invalidateQP(qpn uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := 0; t.bound2 > 0 && i < len(t.slots); i++ {
		if r := t.slots[i]; r != nil && r.mw == ibv.MWType2 && r.valid && r.qpn == qpn {
			t.invalidateLocked(r)
		}
	}
}

// localOp performs the memory operation w (WRBindMW, WRLocalInv) for the
// QP, in send-queue order: the status its completion gets.
func (qp *QP) localOp(w *sendWQE) ibv.WCStatus {
	var err error
	switch w.op {
	case ibv.WRBindMW:
		_, err = qp.dev.regions.BindMW(&w.bind, qp.pd, qp.num)
	case ibv.WRLocalInv:
		err = qp.dev.regions.InvalidateFrom(w.invRKey, qp.pd, qp.num)
	}
	if err != nil {
		qp.dev.logf("QP %d: %v WR %d: %v", qp.num, w.op, w.id, err)
		return ibv.WCMWBindErr
	}
	return ibv.WCSuccess
}
