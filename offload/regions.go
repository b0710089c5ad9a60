package offload

import (
	"errors"
	"fmt"
	"sync"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// errRegion is the root of the region table's errors.
var errRegion = errors.New("offload: memory region")

// ErrInvalidSTag is returned for an STag that names no valid region.
var ErrInvalidSTag = fmt.Errorf("%w: invalid STag", errRegion)

// ErrBusy is returned for a region that memory windows are bound to
// (deregistration, re-registration: EBUSY).
var ErrBusy = fmt.Errorf("%w: %w", errRegion, ibv.ErrBusy)

// errCannotInvalidate is returned for an STag that names a region or
// window the caller may not invalidate (another protection domain, a
// type 1 window, a type 2 window bound to another QP).
var errCannotInvalidate = fmt.Errorf("%w: STag cannot be invalidated", errRegion)

// Region is a registered memory region, or a memory window, as the engine
// sees it. Its fields are fixed when it is made (registration, a window's
// bind: a bind makes a new Region under the window's STag); only validity
// changes (deregistration, invalidation).
type Region struct {
	stag   uint32
	pd     uint32
	addr   uint64
	buf    []byte
	access ibv.Access
	// mw is the window's type; 0 for a memory region.
	mw ibv.MWType
	// qpn is the QP a bound type 2 window is tied to.
	qpn uint32
	// parent is the region a bound window lies in.
	parent *Region
	// windows counts the windows bound to a memory region (Regions.mu).
	windows int
	// gate orders placement into the region against its invalidation:
	// tagged placement copies under gate.RLock, after checking valid;
	// invalidation clears valid under gate.Lock, so once it returns no
	// copy into the region is in progress or starts.
	gate sync.RWMutex
	// valid is written under Regions.mu and gate both, and read under
	// either.
	valid bool
}

// STag is the region's steering tag (its lkey and rkey).
func (r *Region) STag() uint32 { return r.stag }

// PD is the protection domain the region belongs to.
func (r *Region) PD() uint32 { return r.pd }

// Addr is the address (tagged offset) of the region's first byte.
func (r *Region) Addr() uint64 { return r.addr }

// Len is the region's length in bytes.
func (r *Region) Len() int { return len(r.buf) }

// Access is the region's access rights.
func (r *Region) Access() ibv.Access { return r.access }

// Bytes is the memory the region covers.
func (r *Region) Bytes() []byte { return r.buf }

// MW is the type of a memory window, 0 for a memory region.
func (r *Region) MW() ibv.MWType { return r.mw }

// setValid sets the region's validity; Regions.mu is held (for writing).
func (r *Region) setValid(v bool) {
	r.gate.Lock()
	r.valid = v
	r.gate.Unlock()
}

// placeInto copies p to dst, memory of the region, unless the region was
// invalidated: it reports whether it copied. Tagged placement (RDMA
// Write) goes through it, so no byte lands once an invalidation of the
// region has returned.
func (r *Region) placeInto(dst, p []byte) (int, bool) {
	r.gate.RLock()
	defer r.gate.RUnlock()
	if !r.valid {
		return 0, false
	}
	return copy(dst, p), true
}

// slice returns the region's bytes [to, to+n) or false when they are not all
// inside the region (base and bounds check, overflow-safe).
func (r *Region) slice(to uint64, n uint64) ([]byte, bool) {
	if to < r.addr {
		return nil, false
	}
	off := to - r.addr
	size := uint64(len(r.buf))
	if off > size || n > size-off {
		return nil, false
	}
	return r.buf[off : off+n], true
}

// Regions is a device's table of memory regions, indexed by STag. An STag is
// a 24-bit index shifted left by 8 and an 8-bit key (the layout of Linux
// siw's STags); both are unpredictable permutations of the table slot and
// of the slot's generation (stag.go), and the key changes each time a slot
// is reused, so a stale STag never names a newer region.
type Regions struct {
	mu     sync.RWMutex
	secret stagSecret
	slots  []*Region // nil: free, or reserved (a slot whose index is 0)
	gens   []uint8   // next generation per slot
	free   []uint32
	max    int
	n      int // registered regions
	bound2 int // bound type 2 windows
}

// NewRegions returns an empty table holding at most max regions.
func NewRegions(max int) *Regions {
	return &Regions{secret: newSTagSecret(), max: max}
}

// Register adds a region of buf, whose first byte has tagged offset addr,
// in protection domain pd, and returns it with a fresh STag.
func (t *Regions) Register(pd uint32, buf []byte, addr uint64, access ibv.Access) (*Region, error) {
	if addr+uint64(len(buf)) < addr {
		return nil, fmt.Errorf("%w: address 0x%x + length %d wraps", errRegion, addr, len(buf))
	}
	if access&^(ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead|ibv.AccessRemoteAtomic|ibv.AccessMWBind) != 0 {
		return nil, fmt.Errorf("%w: unsupported access flags %v", errRegion, access)
	}
	if access&ibv.AccessRemoteWrite != 0 && access&ibv.AccessLocalWrite == 0 {
		// libibverbs: remote write requires local write (EINVAL).
		return nil, fmt.Errorf("%w: REMOTE_WRITE requires LOCAL_WRITE", errRegion)
	}
	if access&ibv.AccessRemoteAtomic != 0 && access&ibv.AccessLocalWrite == 0 {
		// libibverbs: remote atomic requires local write (EINVAL).
		return nil, fmt.Errorf("%w: REMOTE_ATOMIC requires LOCAL_WRITE", errRegion)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.newLocked(&Region{pd: pd, addr: addr, buf: buf, access: access, valid: true})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// newLocked puts r into a free slot under a fresh STag. t.mu is held.
func (t *Regions) newLocked(r *Region) (*Region, error) {
	if t.n >= t.max {
		return nil, fmt.Errorf("%w: table full (%d regions and windows)", errRegion, t.max)
	}
	var slot uint32
	if n := len(t.free); n > 0 {
		slot = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		for {
			if len(t.slots) >= 1<<24 {
				return nil, fmt.Errorf("%w: table full (%d regions)", errRegion, len(t.slots))
			}
			slot = uint32(len(t.slots))
			t.slots = append(t.slots, nil)
			t.gens = append(t.gens, 0)
			// Index 0 stays unused (STag 0 is special on some
			// hardware): its slot is never handed out.
			if t.secret.index(slot) != 0 {
				break
			}
		}
	}
	key := t.secret.key(slot, t.gens[slot])
	t.gens[slot]++
	r.stag = t.secret.index(slot)<<8 | uint32(key)
	t.slots[slot] = r
	t.n++
	return r, nil
}

// Reregister replaces the region named by stag with one of buf, whose
// first byte has tagged offset addr, in protection domain pd with access,
// under the same STag (ibv_rereg_mr): from now on the STag names the new
// region, valid again if it had been invalidated. A placement that looked
// the old region up just before finishes into the old memory, as one
// racing a deregistration does. The table is unchanged on an error.
func (t *Regions) Reregister(stag, pd uint32, buf []byte, addr uint64, access ibv.Access) (*Region, error) {
	if addr+uint64(len(buf)) < addr {
		return nil, fmt.Errorf("%w: address 0x%x + length %d wraps", errRegion, addr, len(buf))
	}
	if access&^(ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead|ibv.AccessMWBind) != 0 {
		return nil, fmt.Errorf("%w: unsupported access flags %v", errRegion, access)
	}
	if access&ibv.AccessRemoteWrite != 0 && access&ibv.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: REMOTE_WRITE requires LOCAL_WRITE", errRegion)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.at(stag)
	if old == nil || old.stag != stag || old.mw != 0 {
		return nil, fmt.Errorf("%w 0x%08x", ErrInvalidSTag, stag)
	}
	if old.windows > 0 {
		return nil, fmt.Errorf("%w: STag 0x%08x has %d memory windows bound", ErrBusy, stag, old.windows)
	}
	r := &Region{stag: stag, pd: pd, addr: addr, buf: buf, access: access, valid: true}
	old.setValid(false)
	t.slots[t.secret.slot(stag>>8)] = r
	return r, nil
}

// Lookup returns the valid region named by stag.
func (t *Regions) Lookup(stag uint32) (*Region, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	r := t.at(stag)
	if r == nil || r.stag != stag || !r.valid {
		return nil, false
	}
	return r, true
}

// LookupMR returns the valid memory region (not a window) named by stag:
// the region of a local key.
func (t *Regions) LookupMR(stag uint32) (*Region, bool) {
	r, ok := t.Lookup(stag)
	if !ok || r.mw != 0 {
		return nil, false
	}
	return r, true
}

// Deregister removes the region named by stag; the STag is invalid from now
// on, even if it was invalidated before. A region with memory windows
// bound to it stays (ErrBusy), as ibv_dereg_mr refuses it.
func (t *Regions) Deregister(stag uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.at(stag)
	if r == nil || r.stag != stag || r.mw != 0 {
		return fmt.Errorf("%w 0x%08x", ErrInvalidSTag, stag)
	}
	if r.windows > 0 {
		return fmt.Errorf("%w: STag 0x%08x has %d memory windows bound", ErrBusy, stag, r.windows)
	}
	t.freeLocked(r)
	return nil
}

// freeLocked invalidates r and frees its slot. t.mu is held.
func (t *Regions) freeLocked(r *Region) {
	slot := t.secret.slot(r.stag >> 8)
	r.setValid(false)
	t.slots[slot] = nil
	t.free = append(t.free, slot)
	t.n--
}

// at returns the region in the slot stag's index names, if any (its STag
// may differ: the caller compares). t.mu is held.
func (t *Regions) at(stag uint32) *Region {
	idx := stag >> 8
	if idx == 0 {
		return nil
	}
	slot := t.secret.slot(idx)
	if int(slot) >= len(t.slots) {
		return nil
	}
	return t.slots[slot]
}

// Invalidate marks the region or type 2 window named by stag invalid, as
// a remote Send with Invalidate does; it must belong to protection domain
// pd. It is InvalidateFrom without a QP: a type 2 window is invalidated
// whatever QP it is tied to.
func (t *Regions) Invalidate(stag, pd uint32) error { return t.InvalidateFrom(stag, pd, 0) }

// InvalidateFrom invalidates the region or window named by stag for QP
// qpn in protection domain pd: a Send with Invalidate arriving on it, or
// its Local Invalidate (RFC 5040 §6.4; the verbs' rules). A memory region
// and a type 2 window of pd can be invalidated, the window only from the
// QP it is tied to (qpn 0: any); a type 1 window cannot. The error wraps
// ErrInvalidSTag for an STag that names nothing valid, and
// errCannotInvalidate (see CannotInvalidate) for one the QP may not
// invalidate. Once it returns, no RDMA Write places into the region or
// window (Region.gate).
func (t *Regions) InvalidateFrom(stag, pd, qpn uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.at(stag)
	if r == nil || r.stag != stag || !r.valid {
		return fmt.Errorf("%w 0x%08x", ErrInvalidSTag, stag)
	}
	switch {
	case r.pd != pd:
		return fmt.Errorf("%w: STag 0x%08x belongs to another protection domain", errCannotInvalidate, stag)
	case r.mw == ibv.MWType1:
		return fmt.Errorf("%w: STag 0x%08x is a type 1 memory window (unbind it with a zero-length bind)", errCannotInvalidate, stag)
	case r.mw == ibv.MWType2 && qpn != 0 && r.qpn != qpn:
		return fmt.Errorf("%w: STag 0x%08x is a type 2 memory window bound to QP %d, not QP %d", errCannotInvalidate, stag, r.qpn, qpn)
	}
	t.invalidateLocked(r)
	return nil
}

// CannotInvalidate reports whether err is InvalidateFrom's refusal of an
// STag that names a valid region or window the QP may not invalidate (as
// opposed to an invalid STag).
func CannotInvalidate(err error) bool { return errors.Is(err, errCannotInvalidate) }

// invalidateLocked marks r invalid; a window leaves the region it was
// bound to. t.mu is held.
func (t *Regions) invalidateLocked(r *Region) {
	r.setValid(false)
	if r.parent != nil {
		r.parent.windows--
		r.parent = nil
		if r.mw == ibv.MWType2 {
			t.bound2--
		}
	}
}

// Len returns the number of registered regions (valid or invalidated).
func (t *Regions) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.n
}
