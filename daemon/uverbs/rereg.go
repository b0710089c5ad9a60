package uverbs

import (
	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// reregMR changes a region in place (ibv_rereg_mr): the engine's STag
// names the new memory, PD and access at once. The old mapping is
// unmapped as a deregistered region's is, once no QP of its PD can be in
// the middle of a copy; the region's bytes and PD move in the session's
// accounting.
func (ss *session) reregMR(req *uabi.ReregMR, fd int) error {
	defer uabi.Close(fd) // the mapping keeps the memory
	mr, err := get[*sMR](ss, req.Handle, "MR")
	if err != nil {
		return err
	}
	pd, err := get[*sPD](ss, req.PD, "PD")
	if err != nil {
		return err
	}
	// Hold the new PD (a PD with regions cannot go) and charge the new
	// length; the old ones are given back once the change is made.
	cost := usage{mrBytes: req.Length}
	undo, err := ss.reserve(cost, req.PD, pd)
	if err != nil {
		return err
	}
	mapping, buf, err := uabi.MapShared(fd, req.Offset, req.Length)
	if err != nil {
		undo()
		return fail(uabi.StError, "map region memory: %v", err)
	}
	ss.mu.Lock()
	if ss.objs[req.Handle] != mr {
		ss.mu.Unlock()
		undo()
		uabi.Unmap(mapping)
		return fail(uabi.StBadHandle, "MR %d deregistered meanwhile", req.Handle)
	}
	if _, err := mr.regions.Reregister(mr.stag, pd.pd.Handle(), buf, req.IOVA, ibv.Access(req.Access)); err != nil {
		ss.mu.Unlock()
		undo()
		uabi.Unmap(mapping)
		return err
	}
	oldPD, oldMapping, oldLen := mr.pd, mr.mapping, mr.length
	mr.pd, mr.mapping, mr.length = pd, mapping, req.Length
	ss.unchargeLocked(usage{mrBytes: oldLen})
	oldPD.users--
	ss.mu.Unlock()
	oldPD.retire(oldMapping)
	return nil
}

// retire unmaps a region's old mapping once no QP of the PD can be in
// the middle of a copy from or to it.
func (pd *sPD) retire(mapping []byte) {
	pd.mu.Lock()
	if pd.qps > 0 {
		pd.zombies = append(pd.zombies, mapping)
		pd.mu.Unlock()
		return
	}
	pd.mu.Unlock()
	uabi.Unmap(mapping)
}
