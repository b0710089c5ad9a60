package verbs

import (
	"errors"
	"fmt"
)

// ErrMWBind is returned by MW.Bind for a binding libibverbs' ibv_bind_mw
// refuses before posting it: a window of type 2 (post WRBindMW instead), an
// address or length without a region (EINVAL), a region of another
// protection domain (EPERM).
var ErrMWBind = errors.New("verbs: invalid memory window bind")

// MW is a memory window (ibv_mw): an STag of its own naming a part of a
// memory region registered with AccessMWBind, with its own remote rights,
// that the application hands to a peer and takes back (invalidates)
// without touching the region. A type 1 window is bound with Bind; a type
// 2 window by posting WRBindMW on the QP whose peer may use it.
type MW struct {
	pd   *PD
	be   ProviderMW
	typ  MWType
	rkey uint32 // guarded by pd.dev.mu
}

// AllocMW allocates a memory window of type typ (ibv_alloc_mw). It names
// no memory until it is bound.
func (pd *PD) AllocMW(typ MWType) (*MW, error) {
	if typ != MWType1 && typ != MWType2 {
		return nil, fmt.Errorf("alloc MW: %w: type %v", ErrInvalidWR, typ)
	}
	if err := pd.attach(func() {}); err != nil {
		return nil, fmt.Errorf("alloc MW: %w", err)
	}
	be, rkey, err := pd.be.AllocMW(typ)
	if err != nil {
		return nil, fmt.Errorf("alloc MW: %w", err)
	}
	mw := &MW{pd: pd, be: be, typ: typ, rkey: rkey}
	if err := pd.attach(func() { pd.mws[mw] = struct{}{} }); err != nil {
		be.Dealloc()
		return nil, fmt.Errorf("alloc MW: %w", err)
	}
	return mw, nil
}

// Type is the window's type.
func (mw *MW) Type() MWType { return mw.typ }

// RKey is the window's rkey: the one AllocMW gave it, or for a type 1
// window the one its last Bind gave it. A type 2 window's rkey is the
// one its WRBindMW chose (MWBind.RKey).
func (mw *MW) RKey() uint32 {
	mw.pd.dev.mu.Lock()
	defer mw.pd.dev.mu.Unlock()
	return mw.rkey
}

// MWBindInfo is what MW.Bind binds (ibv_mw_bind with its bind_info).
type MWBindInfo struct {
	// ID and Flags are the bind work request's (FlagSignaled asks for
	// its WCBindMW completion; FlagFence orders it after earlier Reads).
	ID    uint64
	Flags SendFlags
	// MR is the region the window lies in; nil with Addr and Length 0
	// unbinds the window.
	MR *MR
	// Addr and Length are the window's tagged offset and size.
	Addr, Length uint64
	// Access is the window's rights (AccessRemoteRead, AccessRemoteWrite,
	// AccessRemoteAtomic).
	Access Access
}

// Bind binds a type 1 window (ibv_bind_mw): it posts a WRBindMW on qp
// that gives the window the next key (IncRKey) and, once the QP performs
// it in send-queue order, names b's range with b's rights; RKey returns
// the new rkey from now on (the old one names nothing once the bind is
// performed). A bind that breaks a window rule completes with WCMWBindErr
// and moves the QP to ERR. A type 2 window is bound by posting WRBindMW.
func (mw *MW) Bind(qp *QP, b MWBindInfo) error {
	if mw.typ != MWType1 {
		return fmt.Errorf("bind MW: %w: a %v window is bound by posting WRBindMW", ErrMWBind, mw.typ)
	}
	if b.MR == nil && (b.Addr != 0 || b.Length != 0) {
		return fmt.Errorf("bind MW: %w: an address or length without a region", ErrMWBind)
	}
	d := mw.pd.dev
	d.mu.Lock()
	old := mw.rkey
	var mrPD *PD
	if b.MR != nil {
		mrPD = b.MR.pd
	}
	d.mu.Unlock()
	if b.MR != nil && mrPD != mw.pd {
		return fmt.Errorf("bind MW: %w: the region belongs to another protection domain", ErrMWBind)
	}
	wr := SendWR{ID: b.ID, Opcode: WRBindMW, Flags: b.Flags, Bind: MWBind{
		MW: old, RKey: IncRKey(old), Addr: b.Addr, Length: b.Length, Access: b.Access, Type1: true,
	}}
	if b.MR != nil {
		wr.Bind.MRKey = b.MR.LKey()
	}
	if _, err := qp.PostSend([]SendWR{wr}); err != nil {
		return fmt.Errorf("bind MW: %w", err)
	}
	d.mu.Lock()
	mw.rkey = wr.Bind.RKey
	d.mu.Unlock()
	return nil
}

// Dealloc frees the window (ibv_dealloc_mw): its STag names nothing from
// now on.
func (mw *MW) Dealloc() error {
	if err := mw.be.Dealloc(); err != nil {
		return fmt.Errorf("dealloc MW: %w", err)
	}
	d := mw.pd.dev
	d.mu.Lock()
	delete(mw.pd.mws, mw)
	d.mu.Unlock()
	return nil
}
