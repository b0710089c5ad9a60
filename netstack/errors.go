package netstack

import (
	"errors"
	"io"
	"syscall"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// ErrLinkInUse is returned by New when the Link already belongs to a Stack
// (a Link carries exactly one NIC).
var ErrLinkInUse = errors.New("netstack: link already attached to a stack")

// tcpipError is the fallback for gVisor errors that have no Go equivalent.
// It keeps gVisor's message but hides the gVisor type.
type tcpipError struct{ msg string }

func (e *tcpipError) Error() string { return e.msg }

// convertError maps a gVisor error onto an errors.Is-compatible Go error.
// It returns nil for nil.
func convertError(err tcpip.Error) error {
	switch err.(type) {
	case nil:
		return nil
	case *tcpip.ErrConnectionRefused:
		return syscall.ECONNREFUSED
	case *tcpip.ErrConnectionReset:
		return syscall.ECONNRESET
	case *tcpip.ErrConnectionAborted, *tcpip.ErrAborted:
		return syscall.ECONNABORTED
	case *tcpip.ErrClosedForReceive:
		return io.EOF
	case *tcpip.ErrClosedForSend:
		return syscall.EPIPE
	case *tcpip.ErrNotConnected:
		return syscall.ENOTCONN
	case *tcpip.ErrTimeout:
		return syscall.ETIMEDOUT
	case *tcpip.ErrHostUnreachable, *tcpip.ErrHostDown:
		return syscall.EHOSTUNREACH
	case *tcpip.ErrNetworkUnreachable, *tcpip.ErrNoNet:
		return syscall.ENETUNREACH
	case *tcpip.ErrPortInUse, *tcpip.ErrDuplicateAddress:
		return syscall.EADDRINUSE
	case *tcpip.ErrBadLocalAddress:
		return syscall.EADDRNOTAVAIL
	case *tcpip.ErrInvalidEndpointState, *tcpip.ErrInvalidOptionValue:
		return syscall.EINVAL
	case *tcpip.ErrAlreadyConnected:
		return syscall.EISCONN
	case *tcpip.ErrNoBufferSpace:
		return syscall.ENOBUFS
	case *tcpip.ErrAddressFamilyNotSupported:
		return syscall.EAFNOSUPPORT
	case *tcpip.ErrNotPermitted:
		return syscall.EPERM
	case *tcpip.ErrWouldBlock:
		return syscall.EAGAIN
	default:
		return &tcpipError{msg: err.String()}
	}
}
