package netstack

import (
	"errors"
	"io"

	"gvisor.dev/gvisor/pkg/buffer"
)

// payloadReader is the tcpip.Payloader gVisor reads a write from: either a
// byte slice (buf, when src is nil) or a caller's Payload, limited to the
// left bytes still to be queued. Errors from src are kept in err, because
// gVisor reports them only as ErrBadBuffer.
type payloadReader struct {
	buf   []byte
	src   io.Reader
	left  int
	empty int // consecutive (0, nil) reads from src
	err   error
	// whole makes Read refuse a gVisor write that would take only part of
	// the bytes (see errShortRoom); started is set by the first non-empty
	// Read.
	whole, started bool
}

// errShortRoom is what payloadReader.Read returns, before reading anything,
// when gVisor offers less room than a whole aligned write: gVisor then
// queues nothing, and writeLocked tries again once it has room.
var errShortRoom = errors.New("netstack: send buffer room short of a whole aligned write")

// maxEmptyReads bounds how many times in a row a Payload may return (0, nil)
// before the write fails with io.ErrNoProgress (gVisor would loop forever).
const maxEmptyReads = 100

func (r *payloadReader) reset() { *r = payloadReader{} }

// Len implements tcpip.Payloader.
func (r *payloadReader) Len() int { return r.left }

// Read implements io.Reader for gVisor.
func (r *payloadReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if len(p) > r.left {
		p = p[:r.left]
	}
	if len(p) == 0 {
		// View.ReadFrom probes for EOF with an empty read first.
		if r.left == 0 {
			return 0, io.EOF
		}
		return 0, nil
	}
	if r.whole && !r.started && len(p) < r.left && len(p) < buffer.MaxChunkSize {
		// gVisor reads a write in views of up to MaxChunkSize, the first
		// as large as it will take: a smaller one means its send buffer
		// has room for only part of the write.
		r.err = errShortRoom
		return 0, r.err
	}
	r.started = true
	if r.src == nil {
		n := copy(p, r.buf)
		r.buf = r.buf[n:]
		r.left -= n
		return n, nil
	}
	n, err := r.src.Read(p)
	if n < 0 || n > len(p) {
		n, err = 0, errors.New("netstack: payload Read returned an invalid count")
	}
	r.left -= n
	switch {
	case err == io.EOF && r.left == 0:
		err = nil
	case err == io.EOF:
		// gVisor would loop: it does not stop on an early EOF.
		err = io.ErrUnexpectedEOF
	case err == nil && n == 0:
		if r.empty++; r.empty >= maxEmptyReads {
			err = io.ErrNoProgress
		}
	case n > 0:
		r.empty = 0
	}
	if err != nil {
		r.err = err
	}
	return n, err
}
