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

// Region is a registered memory region as the engine sees it. Its fields are
// fixed at registration; only validity changes (deregistration, remote
// invalidation).
type Region struct {
	stag   uint32
	pd     uint32
	addr   uint64
	buf    []byte
	access ibv.Access
	valid  bool // guarded by Regions.mu
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
	if access&^(ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead|ibv.AccessRemoteAtomic) != 0 {
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
	if t.n >= t.max {
		return nil, fmt.Errorf("%w: table full (%d regions)", errRegion, t.max)
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
	r := &Region{stag: t.secret.index(slot)<<8 | uint32(key), pd: pd, addr: addr, buf: buf, access: access, valid: true}
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
	if access&^(ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead) != 0 {
		return nil, fmt.Errorf("%w: unsupported access flags %v", errRegion, access)
	}
	if access&ibv.AccessRemoteWrite != 0 && access&ibv.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: REMOTE_WRITE requires LOCAL_WRITE", errRegion)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.at(stag)
	if old == nil || old.stag != stag {
		return nil, fmt.Errorf("%w 0x%08x", ErrInvalidSTag, stag)
	}
	r := &Region{stag: stag, pd: pd, addr: addr, buf: buf, access: access, valid: true}
	old.valid = false
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

// Deregister removes the region named by stag; the STag is invalid from now
// on, even if it was invalidated before.
func (t *Regions) Deregister(stag uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.at(stag)
	if r == nil || r.stag != stag {
		return fmt.Errorf("%w 0x%08x", ErrInvalidSTag, stag)
	}
	slot := t.secret.slot(stag >> 8)
	r.valid = false
	t.slots[slot] = nil
	t.free = append(t.free, slot)
	t.n--
	return nil
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

// Invalidate marks the region named by stag invalid, as a remote Send with
// Invalidate does; it must belong to protection domain pd.
func (t *Regions) Invalidate(stag, pd uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.at(stag)
	if r == nil || r.stag != stag || !r.valid {
		return fmt.Errorf("%w 0x%08x", ErrInvalidSTag, stag)
	}
	if r.pd != pd {
		return fmt.Errorf("%w: STag 0x%08x belongs to another protection domain", errRegion, stag)
	}
	r.valid = false
	return nil
}

// Len returns the number of registered regions (valid or invalidated).
func (t *Regions) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.n
}
