package netstack

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// SetReadDeadline sets the deadline for ReadTo and Read: once it passes, a
// blocked or future read returns an error wrapping os.ErrDeadlineExceeded.
// The zero time clears it.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.dlMu.Lock()
	defer c.dlMu.Unlock()
	if c.dlTimer != nil && !c.dlTimer.Stop() {
		c.dlFired = true // the timer closed (or is closing) dlCh
	}
	c.dlTimer = nil
	if c.dlFired {
		c.dlCh = make(chan struct{})
		c.dlFired = false
	}
	if t.IsZero() {
		return nil
	}
	ch := c.dlCh
	d := time.Until(t)
	if d <= 0 {
		close(ch)
		c.dlFired = true
		return nil
	}
	c.dlTimer = time.AfterFunc(d, func() { close(ch) })
	return nil
}

func (c *Conn) readDeadline() <-chan struct{} {
	c.dlMu.Lock()
	defer c.dlMu.Unlock()
	return c.dlCh
}

// readWriter adapts the caller's io.Writer to gVisor's Read contract: gVisor
// panics when a Write returns n != len(p) without an error and drops the
// writer's error (returning the count, or ErrBadBuffer when nothing was
// read), so the error is recorded here and short writes become
// io.ErrShortWrite.
type readWriter struct {
	w   io.Writer
	err error
	// c and done serve the Handover stamps: the connection, and the
	// octets handed over so far in this read.
	c    *Conn
	done uint32
}

func (r *readWriter) Write(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.c.s.hops.On() {
		r.c.stampHandover(p, r.done)
		r.done += uint32(len(p))
	}
	n, err := r.w.Write(p)
	if n < 0 {
		n = 0
	}
	if n > len(p) {
		n = len(p)
		if err == nil {
			err = errors.New("netstack: writer reported more bytes than given")
		}
	}
	if err == nil && n != len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		r.err = err
	}
	return n, err
}

// ReadTo is the zero-copy receive path. It blocks until at least one byte is
// readable (or the connection ends, or the read deadline passes), then hands
// every in-order byte currently queued to w, one Write call per buffer view
// (a segment's payload, or part of it; the slice is valid only during the
// call). It returns the number of bytes consumed.
//
// If w returns an error, ReadTo stops, counts the bytes w accepted (a short
// count with an error is honoured; the rest stays queued) and returns that
// error unwrapped, so errors.As works. A short count without an error is
// treated as io.ErrShortWrite. After the peer's FIN, once everything was
// consumed, it returns io.EOF.
func (c *Conn) ReadTo(w io.Writer) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.rw = readWriter{w: w, c: c}
	defer func() { c.rw = readWriter{} }()
	n, err := c.read(&c.rw)
	if c.rw.err != nil {
		return n, c.rw.err
	}
	return n, err
}

// Read is the ordinary copying read (for the MPA startup phase and tests).
// It returns io.EOF after the peer's FIN once everything was read.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.sw = tcpip.SliceWriter(p)
	defer func() { c.sw = nil }()
	return c.read(&c.sw)
}

// read runs one gVisor Read into dst, waiting while nothing is readable.
// c.readMu is held.
func (c *Conn) read(dst io.Writer) (int, error) {
	dl := c.readDeadline()
	registered := false
	defer func() {
		if registered {
			c.wq.EventUnregister(&c.rEntry)
		}
	}()
	for {
		if c.isClosed() {
			return 0, fmt.Errorf("netstack: read %v: %w", c.remote, net.ErrClosed)
		}
		select {
		case <-dl:
			return 0, fmt.Errorf("netstack: read %v: %w", c.remote, os.ErrDeadlineExceeded)
		default:
		}
		res, terr := c.ep.Read(dst, tcpip.ReadOptions{})
		switch terr.(type) {
		case nil:
			if res.Count > 0 {
				c.readN += uint64(res.Count)
				c.ep.ModerateRecvBuf(res.Count)
			}
			return res.Count, nil
		case *tcpip.ErrWouldBlock:
		case *tcpip.ErrClosedForReceive:
			return 0, io.EOF
		case *tcpip.ErrBadBuffer:
			// The writer failed before accepting a byte; ReadTo reports
			// its error.
			return 0, fmt.Errorf("netstack: read %v: writer failed", c.remote)
		default:
			return 0, c.opError("read", terr)
		}
		if !registered {
			drain(c.rNotify)
			c.wq.EventRegister(&c.rEntry)
			registered = true
			continue // re-check: data may have arrived before registration
		}
		select {
		case <-c.rNotify:
		case <-dl:
		case <-c.closed:
		}
	}
}
