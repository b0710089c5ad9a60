package uabi

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Doorbell is the daemon's end of a queue pair's doorbell, a non-blocking
// eventfd the client signals: the QP's ring goroutine sleeps on it.
//
// A sleeper takes one of two ways. A thread parked in poll(2) is woken by
// the kernel directly, which spares a hand-off to another thread on every
// doorbell, and counts on a request/response round trip; but the thread
// is held for as long as the sleep lasts, and a daemon with thousands of
// idle queue pairs would hold thousands of threads (Go stops the program
// at 10,000), each with its own stacks in the daemon's memory. So Wait
// sleeps in poll(2) only for a while, then arms the doorbell in its
// Sleepers' epoll instance and parks the goroutine, which holds no thread.
// The doorbell is armed there (EPOLLONESHOT) only while its goroutine
// sleeps that way, so the doorbells of busy queue pairs wake no one else.
type Doorbell struct {
	fd   int
	s    *Sleepers
	wake chan struct{} // a token from the Sleepers' goroutine
	gone chan struct{} // closed by Close
	once sync.Once
}

// Sleepers is an epoll instance and the goroutine (one thread) that waits
// on it for the doorbells of long sleepers.
type Sleepers struct {
	epfd   int
	stopfd int // an eventfd: Close signals it
	done   chan struct{}

	mu   sync.Mutex
	wake map[int32]chan struct{} // by doorbell descriptor
}

// NewSleepers creates the epoll instance and starts its goroutine; Close
// stops it.
func NewSleepers() (*Sleepers, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	stopfd, err := NewEventfd()
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(stopfd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, stopfd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(stopfd)
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	s := &Sleepers{epfd: epfd, stopfd: stopfd, done: make(chan struct{}), wake: make(map[int32]chan struct{})}
	go s.run()
	return s, nil
}

func (s *Sleepers) run() {
	defer close(s.done)
	evs := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(s.epfd, evs, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return
		}
		for _, ev := range evs[:n] {
			if int(ev.Fd) == s.stopfd {
				return
			}
			s.mu.Lock()
			ch := s.wake[ev.Fd]
			s.mu.Unlock()
			if ch != nil {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}
}

// Close stops the goroutine and closes the epoll instance. The doorbells
// must be closed first.
func (s *Sleepers) Close() error {
	Signal(s.stopfd)
	<-s.done
	return errors.Join(unix.Close(s.epfd), unix.Close(s.stopfd))
}

// NewDoorbell takes over fd, a non-blocking eventfd; Close closes it.
func (s *Sleepers) NewDoorbell(fd int) (*Doorbell, error) {
	d := &Doorbell{fd: fd, s: s, wake: make(chan struct{}, 1), gone: make(chan struct{})}
	// Registered but disarmed until a sleeper arms it.
	ev := unix.EpollEvent{Events: unix.EPOLLONESHOT, Fd: int32(fd)}
	s.mu.Lock()
	s.wake[int32(fd)] = d.wake
	s.mu.Unlock()
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		s.mu.Lock()
		delete(s.wake, int32(fd))
		s.mu.Unlock()
		unix.Close(fd)
		return nil, fmt.Errorf("doorbell: epoll_ctl: %w", err)
	}
	return d, nil
}

// Signal rings the doorbell (wakes the sleeper, or the next one).
func (d *Doorbell) Signal() error { return Signal(d.fd) }

// Close closes the eventfd; a Wait parked on the Sleepers returns
// ErrDoorbellClosed. No Wait may start after Close.
func (d *Doorbell) Close() error {
	var err error
	d.once.Do(func() {
		close(d.gone)
		unix.EpollCtl(d.s.epfd, unix.EPOLL_CTL_DEL, d.fd, nil)
		d.s.mu.Lock()
		if d.s.wake[int32(d.fd)] == d.wake {
			delete(d.s.wake, int32(d.fd))
		}
		d.s.mu.Unlock()
		err = unix.Close(d.fd)
	})
	return err
}

// ErrDoorbellClosed is Wait's error once the doorbell is closed.
var ErrDoorbellClosed = errors.New("uabi: doorbell closed")

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
// to hold in poll(2) on the calling thread, then parked on the Sleepers
// (hold < 0: poll(2) only; 0: parked at once).
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
	for {
		// Arming reports a signal that came before it at once.
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(d.fd)}
		if err := unix.EpollCtl(d.s.epfd, unix.EPOLL_CTL_MOD, d.fd, &ev); err != nil {
			select {
			case <-d.gone:
				return ErrDoorbellClosed
			default:
			}
			return fmt.Errorf("doorbell: epoll_ctl: %w", err)
		}
		select {
		case <-d.wake:
		case <-d.gone:
			return ErrDoorbellClosed
		}
		if ok, err := d.clear(); ok || err != nil {
			return err
		}
	}
}
