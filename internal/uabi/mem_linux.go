package uabi

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

var pageSize = os.Getpagesize()

func pageRound(n int) int { return (n + pageSize - 1) &^ (pageSize - 1) }

// PageRound rounds n up to whole pages.
func PageRound(n int) int { return pageRound(n) }

// Seals the daemon requires on client memory: it cannot shrink (a mapping
// past the end of the file would fault in the daemon).
const requiredSeals = unix.F_SEAL_SHRINK

// NewShared creates a memfd of size bytes (rounded up to pages), seals it
// against shrinking (and, with fixed, against growing and further sealing),
// and maps it shared.
func NewShared(name string, size int, fixed bool) (fd int, mem []byte, err error) {
	size = pageRound(size)
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(what string, e error) (int, []byte, error) {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("%s: %w", what, e)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("ftruncate", err)
	}
	seals := requiredSeals
	if fixed {
		seals |= unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return fail("seal memfd", err)
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	return fd, mem, nil
}

// MapShared maps [off, off+n) of the memfd fd, which the other side created;
// it checks that fd is a memfd sealed against shrinking and large enough.
// It returns the whole mapping (to Unmap) and the requested bytes in it.
func MapShared(fd int, off, n uint64) (mapping, b []byte, err error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("not a sealable memfd: %w", err)
	}
	if seals&requiredSeals != requiredSeals {
		return nil, nil, fmt.Errorf("memfd not sealed against shrinking (seals 0x%x)", seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, fmt.Errorf("fstat: %w", err)
	}
	if n == 0 || off+n < off || off+n > uint64(st.Size) || n > 1<<40 {
		return nil, nil, fmt.Errorf("range [%d, +%d) outside the memfd's %d bytes", off, n, st.Size)
	}
	start := off &^ uint64(pageSize-1)
	length := pageRound(int(off + n - start))
	mapping, err = unix.Mmap(fd, int64(start), length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %w", err)
	}
	b = mapping[off-start : off-start+n : off-start+n]
	return mapping, b, nil
}

// Unmap unmaps a mapping of NewShared or MapShared.
func Unmap(mem []byte) error {
	if mem == nil {
		return nil
	}
	return unix.Munmap(mem)
}

// NewEventfd creates a non-blocking eventfd.
func NewEventfd() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("eventfd: %w", err)
	}
	return fd, nil
}

// Signal adds one to the eventfd fd (a doorbell or a notification).
func Signal(fd int) error {
	one := [8]byte{1}
	for {
		_, err := unix.Write(fd, one[:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return nil // the counter is saturated: the reader wakes anyway
		}
		return err
	}
}

// yieldCPU gives the processor to any other runnable thread on it
// (sched_yield(2)).
func yieldCPU() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// Close closes fd (ignoring -1).
func Close(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
