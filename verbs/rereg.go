package verbs

import (
	"fmt"
	"unsafe"
)

// ReregFlags says what MR.Rereg changes (ibv_rereg_mr's flags).
type ReregFlags int

// Rereg flags, libibverbs' values.
const (
	// ReregTranslation: the region covers new memory (IBV_REREG_MR_CHANGE_TRANSLATION).
	ReregTranslation ReregFlags = 1 << 0
	// ReregPD: the region moves to another protection domain (IBV_REREG_MR_CHANGE_PD).
	ReregPD ReregFlags = 1 << 1
	// ReregAccess: the region's access rights change (IBV_REREG_MR_CHANGE_ACCESS).
	ReregAccess ReregFlags = 1 << 2
)

// Rereg changes the region in place (ibv_rereg_mr), keeping its keys:
// with ReregTranslation it covers buf (tagged offset: buf's address, as
// RegMR), with ReregPD it belongs to pd, with ReregAccess its rights are
// access; the arguments a flag does not name are ignored. From the call's
// return the STag names the region as changed, for local requests and for
// peers (an RDMA Write the peer sent before may still land in the old
// memory, as one racing a deregistration); a region a Send with
// Invalidate invalidated is valid again. On an error the region is
// unchanged. Over the verbs socket buf must lie in memory from
// Device.AllocBuffer.
func (mr *MR) Rereg(flags ReregFlags, pd *PD, buf []byte, access Access) error {
	if flags == 0 || flags&^(ReregTranslation|ReregPD|ReregAccess) != 0 {
		return fmt.Errorf("rereg MR: %w: flags 0x%x", ErrInvalidWR, int(flags))
	}
	d := mr.pd.dev
	d.mu.Lock()
	npd, nbuf, naddr, nacc := mr.pd, mr.buf, mr.addr, mr.access
	d.mu.Unlock()
	if flags&ReregPD != 0 {
		if pd == nil || pd.dev != d {
			return fmt.Errorf("rereg MR: %w: no PD of this device", ErrInvalidWR)
		}
		npd = pd
	}
	if flags&ReregTranslation != 0 {
		if len(buf) == 0 {
			return fmt.Errorf("rereg MR: %w: empty buffer", ErrInvalidWR)
		}
		nbuf, naddr = buf, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	}
	if flags&ReregAccess != 0 {
		nacc = access
	}
	if err := npd.attach(func() {}); err != nil {
		return fmt.Errorf("rereg MR: %w", err)
	}
	if err := mr.be.Rereg(npd.be, npd.handle, nbuf, naddr, nacc); err != nil {
		return fmt.Errorf("rereg MR: %w", err)
	}
	d.mu.Lock()
	if npd != mr.pd {
		delete(mr.pd.mrs, mr)
		npd.mrs[mr] = struct{}{}
	}
	mr.pd, mr.buf, mr.addr, mr.access = npd, nbuf, naddr, nacc
	d.mu.Unlock()
	return nil
}
