package perftest

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/siwtun/siwtun/verbs"
)

// region is registered memory outside the Go heap: the verbs socket's
// shared memory, or an anonymous mapping in-process. The RNIC writes it
// while the test reads it (the latency test watches for the last byte of a
// peer's RDMA Write, the sender watches its receive credits), the way an
// application watches memory a NIC places into; mapped memory keeps the Go
// race detector out of what is, by design, a concurrent device write.
type region struct {
	buf   []byte
	mr    *verbs.MR
	unmap bool // an anonymous mapping of ours
}

// newRegion allocates and registers n bytes (rounded up to whole pages)
// with every access right the tests need.
func newRegion(dev *verbs.Device, pd *verbs.PD, n int) (*region, error) {
	page := os.Getpagesize()
	n = (n + page - 1) / page * page
	r := &region{}
	if dev.Remote() {
		b, err := dev.AllocBuffer(n)
		if err != nil {
			return nil, fmt.Errorf("allocate %d bytes: %w", n, err)
		}
		r.buf = b[:n]
	} else {
		b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, fmt.Errorf("map %d bytes: %w", n, err)
		}
		r.buf, r.unmap = b, true
	}
	mr, err := pd.RegMR(r.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic)
	if err != nil {
		r.free()
		return nil, fmt.Errorf("register %d bytes: %w", n, err)
	}
	r.mr = mr
	return r, nil
}

// free deregisters the region and unmaps it. Its queue pairs must be gone.
func (r *region) free() {
	if r.mr != nil {
		r.mr.Dereg()
		r.mr = nil
	}
	if r.unmap && r.buf != nil {
		unix.Munmap(r.buf)
	}
	r.buf = nil
}

// addr is the tagged offset (the address a peer uses) of byte off.
func (r *region) addr(off int) uint64 { return r.mr.Addr() + uint64(off) }

// word returns the aligned 32-bit word holding byte off, for atomic loads.
func (r *region) word(off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&r.buf[off&^3]))
}

// loadByte reads byte off with an atomic load of its word: the RNIC may be
// writing it.
func (r *region) loadByte(off int) byte {
	var w [4]byte
	binary.NativeEndian.PutUint32(w[:], atomic.LoadUint32(r.word(off)))
	return w[off&3]
}

// loadCredit reads the little-endian credit at off (4-aligned).
func (r *region) loadCredit(off int) uint32 {
	var w [4]byte
	binary.NativeEndian.PutUint32(w[:], atomic.LoadUint32(r.word(off)))
	return binary.LittleEndian.Uint32(w[:])
}

// storeByte writes byte off with an atomic store of its word (the RNIC may
// be reading the region for an earlier request).
func (r *region) storeByte(off int, v byte) {
	p := r.word(off)
	for {
		old := atomic.LoadUint32(p)
		var w [4]byte
		binary.NativeEndian.PutUint32(w[:], old)
		w[off&3] = v
		if atomic.CompareAndSwapUint32(p, old, binary.NativeEndian.Uint32(w[:])) {
			return
		}
	}
}

// storeCredit writes a little-endian credit at off (4-aligned).
func (r *region) storeCredit(off int, v uint32) {
	var w [4]byte
	marshalCredit(w[:], v)
	atomic.StoreUint32(r.word(off), binary.NativeEndian.Uint32(w[:]))
}
