package ibv

import (
	"errors"
	"fmt"

	"github.com/siwtun/siwtun/iwarp/mpa"
)

// Device limits (what a device reports in its attributes).
const (
	// MaxSGE is the most scatter/gather elements of a Send, Write or receive.
	MaxSGE = 6
	// MaxSGERead is the most elements of an RDMA Read sink: one, an iWARP
	// limitation (a Read Response targets one STag).
	MaxSGERead = 1
	// MaxInline is the most payload bytes of a request posted with FlagInline.
	MaxInline = 256
	// MaxIRDORD is the most outstanding RDMA Reads per direction of a QP.
	MaxIRDORD = 128
	// MaxQPWR is the largest send or receive queue.
	MaxQPWR = 16384
	// AtomicLen is the size of the word an atomic operates on and of its
	// local result buffer (the request's one SGE): 8 bytes, aligned.
	AtomicLen = 8
)

// Errors returned by queue-pair calls (not completions: a failed work
// request is reported as a completion).
var (
	// ErrQPState is returned when the QP's state forbids the call.
	ErrQPState = errors.New("verbs: invalid queue pair state")
	// ErrQueueFull is returned when a work queue has no free slot.
	ErrQueueFull = errors.New("verbs: work queue full")
	// ErrInvalidWR is returned for a malformed work request.
	ErrInvalidWR = errors.New("verbs: invalid work request")
	// ErrNotSupportedByPeer is returned for a work request the
	// connection's peer did not say it supports: RDMA Write or Send with
	// Immediate Data (RFC 7306) toward a peer without siwtun's extension
	// block in its MPA frame (Linux siw, or a siwtun with extensions off).
	// The same for an atomic (RFC 7306) toward a peer that did not
	// announce atomics. The request goes nowhere: the opcode never
	// reaches the wire.
	ErrNotSupportedByPeer = errors.New("verbs: operation not supported by the connection's peer")
	// ErrBusy is returned when destroying an object still in use (EBUSY):
	// a shared receive queue that queue pairs are attached to.
	ErrBusy = errors.New("verbs: object in use")
)

// sendFlags are the send flags an iWARP RNIC implements.
const sendFlags = FlagFence | FlagSignaled | FlagSolicited | FlagInline

// CheckSendWR reports whether a send work request is well formed: a
// supported opcode, known flags, inline data within MaxInline, at most
// MaxSGE elements (MaxSGERead for an RDMA Read sink, which cannot be
// inline). Every backend applies it before the request is queued, so the
// in-process engine and the verbs socket give the same answer. The error
// wraps ErrInvalidWR.
func CheckSendWR(wr *SendWR) error {
	if wr.Flags&^sendFlags != 0 {
		return fmt.Errorf("%w: send flags 0x%x", ErrInvalidWR, uint32(wr.Flags))
	}
	switch wr.Opcode {
	case WRSend, WRSendWithInv, WRWrite, WRSendWithImm, WRWriteWithImm:
		if wr.Flags&FlagInline != 0 {
			if len(wr.Inline) > MaxInline {
				return fmt.Errorf("%w: %d inline bytes, at most %d", ErrInvalidWR, len(wr.Inline), MaxInline)
			}
			return nil
		}
		if len(wr.SGL) > MaxSGE {
			return fmt.Errorf("%w: %d SGEs, at most %d", ErrInvalidWR, len(wr.SGL), MaxSGE)
		}
	case WRRead:
		if wr.Flags&FlagInline != 0 {
			return fmt.Errorf("%w: RDMA Read cannot be inline", ErrInvalidWR)
		}
		if len(wr.SGL) > MaxSGERead {
			return fmt.Errorf("%w: RDMA Read sink has %d SGEs, iWARP allows %d", ErrInvalidWR, len(wr.SGL), MaxSGERead)
		}
	case WRAtomicCmpSwap, WRAtomicFetchAdd:
		if wr.Flags&FlagInline != 0 {
			return fmt.Errorf("%w: %v cannot be inline", ErrInvalidWR, wr.Opcode)
		}
		if len(wr.SGL) != 1 || wr.SGL[0].Length != AtomicLen {
			return fmt.Errorf("%w: %v needs one SGE of %d bytes for the result", ErrInvalidWR, wr.Opcode, AtomicLen)
		}
	case WRLocalInv, WRBindMW:
		if wr.Flags&(FlagInline|FlagSolicited) != 0 {
			return fmt.Errorf("%w: %v cannot be inline or solicited", ErrInvalidWR, wr.Opcode)
		}
		if len(wr.SGL) != 0 {
			return fmt.Errorf("%w: %v takes no SGEs", ErrInvalidWR, wr.Opcode)
		}
		// STag index 0 is never handed out: a request naming it names
		// nothing.
		if wr.Opcode == WRLocalInv && wr.InvalidateRKey>>8 == 0 {
			return fmt.Errorf("%w: LOCAL_INV of STag 0x%08x names nothing", ErrInvalidWR, wr.InvalidateRKey)
		}
		if wr.Opcode == WRBindMW {
			if wr.Bind.MW>>8 == 0 {
				return fmt.Errorf("%w: BIND_MW of window 0x%08x names no window", ErrInvalidWR, wr.Bind.MW)
			}
			if wr.Bind.RKey>>8 != wr.Bind.MW>>8 {
				return fmt.Errorf("%w: bind gives window 0x%08x the rkey 0x%08x of another index", ErrInvalidWR, wr.Bind.MW, wr.Bind.RKey)
			}
			if wr.Bind.Access&^(AccessRemoteRead|AccessRemoteWrite|AccessRemoteAtomic) != 0 {
				return fmt.Errorf("%w: window access %v: only REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC", ErrInvalidWR, wr.Bind.Access)
			}
		}
	default:
		return fmt.Errorf("%w: opcode %v not supported", ErrInvalidWR, wr.Opcode)
	}
	return nil
}

// CheckRecvWR reports whether a receive work request is well formed (at
// most MaxSGE elements). The error wraps ErrInvalidWR.
func CheckRecvWR(wr *RecvWR) error {
	if len(wr.SGL) > MaxSGE {
		return fmt.Errorf("%w: %d SGEs, at most %d", ErrInvalidWR, len(wr.SGL), MaxSGE)
	}
	return nil
}

// CheckPostSend is CheckSendWR for request i of a PostSend on QP qpn; the
// error names the QP, the request's index and its id. Every backend's
// PostSend reports a malformed request with it, so the in-process engine
// and the verbs socket give the same error.
func CheckPostSend(qpn uint32, i int, wr *SendWR) error {
	if err := CheckSendWR(wr); err != nil {
		return fmt.Errorf("QP %d send WR %d (id %d): %w", qpn, i, wr.ID, err)
	}
	return nil
}

// CheckPostRecv is CheckRecvWR for request i of a PostRecv on QP qpn, with
// the same context as CheckPostSend.
func CheckPostRecv(qpn uint32, i int, wr *RecvWR) error {
	if err := CheckRecvWR(wr); err != nil {
		return fmt.Errorf("QP %d recv WR %d (id %d): %w", qpn, i, wr.ID, err)
	}
	return nil
}

// CheckPostPeer is, for request i of a PostSend on QP qpn, the check of
// what the connection's peer supports: ext is the RDMAP extensions the
// connection negotiated (mpa.Params.Ext). A request with immediate data
// toward a peer without mpa.ExtImmediate, and an atomic toward a peer
// without mpa.ExtAtomic, fail, wrapping ErrNotSupportedByPeer, before
// anything is queued: the opcode never reaches the wire. Every backend
// applies it after CheckPostSend.
func CheckPostPeer(qpn uint32, i int, wr *SendWR, ext mpa.Ext) error {
	if wr.Opcode.WithImm() && ext&mpa.ExtImmediate == 0 {
		return fmt.Errorf("QP %d send WR %d (id %d): %v: %w: RFC 7306 Immediate Data was not negotiated (the peer's MPA frame had no siwtun extension block: Linux siw, or siwtun with --rdmap-ext off)",
			qpn, i, wr.ID, wr.Opcode, ErrNotSupportedByPeer)
	}
	if wr.Opcode.Atomic() && ext&mpa.ExtAtomic == 0 {
		return fmt.Errorf("QP %d send WR %d (id %d): %v: %w: RFC 7306 atomics were not negotiated (the peer's MPA frame announced no atomics: Linux siw, an older siwtun, or siwtun with --rdmap-ext off)",
			qpn, i, wr.ID, wr.Opcode, ErrNotSupportedByPeer)
	}
	return nil
}
