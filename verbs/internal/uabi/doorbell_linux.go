package uabi

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Doorbell is the daemon's end of a queue pair's doorbell, a non-blocking
// eventfd the client signals: the QP's ring goroutine sleeps on it.
//
// A sleeper takes one of two ways. A thread parked in poll(2) is woken by
// the kernel directly, which spares Go's network poller its hand-off (one
// more thread wake-up and a run-queue trip) on every doorbell, and counts
// on a request/response round trip; but the thread is held for as long as
// the sleep lasts, and a daemon with thousands of idle queue pairs would
// hold thousands of threads (Go stops the program at 10,000), each with
// its own stacks in the daemon's memory. So Wait sleeps in poll(2) only
// for a while, then parks the goroutine in Go's network poller, which
// holds no thread.
type Doorbell struct {
	fd int
	f  *os.File // fd, registered with Go's network poller
	rc syscall.RawConn
}

// NewDoorbell takes over fd, a non-blocking eventfd; Close closes it.
func NewDoorbell(fd int) (*Doorbell, error) {
	f := os.NewFile(uintptr(fd), "siwtun-doorbell")
	if f == nil {
		return nil, fmt.Errorf("doorbell: bad descriptor %d", fd)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("doorbell: %w", err)
	}
	return &Doorbell{fd: fd, f: f, rc: rc}, nil
}

// Signal rings the doorbell (wakes the sleeper, or the next one).
func (d *Doorbell) Signal() error { return Signal(d.fd) }

// Close closes the eventfd; a Wait in the network poller returns an error.
func (d *Doorbell) Close() error { return d.f.Close() }

// clear takes a pending signal: it reports whether there was one.
func (d *Doorbell) clear() (bool, error) {
	var buf [8]byte
	for {
		_, err := unix.Read(d.fd, buf[:])
		switch err {
		case nil:
			return true, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false, nil
		}
		return false, fmt.Errorf("eventfd read: %w", err)
	}
}

// Wait blocks until the doorbell has been signalled, and clears it: for up
// to hold in poll(2) on the calling thread, then in Go's network poller
// (hold < 0: poll(2) only; 0: the network poller at once).
func (d *Doorbell) Wait(hold time.Duration) error {
	if ok, err := d.clear(); ok || err != nil {
		return err
	}
	if hold != 0 {
		pfd := []unix.PollFd{{Fd: int32(d.fd), Events: unix.POLLIN}}
		var ts *unix.Timespec
		if hold > 0 {
			t := unix.NsecToTimespec(int64(hold))
			ts = &t
		}
		for {
			n, err := unix.Ppoll(pfd, ts, nil)
			if err != nil && err != unix.EINTR {
				return fmt.Errorf("eventfd poll: %w", err)
			}
			if ok, err := d.clear(); ok || err != nil {
				return err
			}
			if n == 0 && err == nil {
				break // held the thread long enough
			}
		}
	}
	var rerr error
	err := d.rc.Read(func(uintptr) bool {
		ok, err := d.clear()
		rerr = err
		return ok || err != nil
	})
	if err != nil {
		if errors.Is(err, os.ErrClosed) {
			return fmt.Errorf("doorbell closed: %w", err)
		}
		return fmt.Errorf("eventfd wait: %w", err)
	}
	return rerr
}
