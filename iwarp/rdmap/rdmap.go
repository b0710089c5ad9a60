// Package rdmap encodes and decodes the Remote Direct Memory Access Protocol
// (RDMAP, RFC 5040) headers that ride on DDP (package ddp): the RDMAP
// control octet, the RDMA Read Request header, the Terminate header with
// its error codes and the Immediate Data of RFC 7306's Immediate Data
// messages, plus the Error type the engine uses to carry a Terminate code
// out of its receive path.
//
// RDMAP owns octet 1 of the DDP control word (ddp.Header.ULPCtrl):
//
//	RV(0xC0) Rsvd(0x30) Opcode(0x0F)
//
// and, in untagged segments, the rest of DDP's RsvdULP field
// (ddp.Header.ULPData), which carries the Invalidate STag of the
// Send-with-Invalidate variants.
//
// # Files
//
// Every non-test file of the package, with what it holds (maps_test.go at
// the root keeps this list and the folder in step):
//
//	rdmap.go      this overview; the control octet: version and opcodes
//	readreq.go    the RDMA Read Request header
//	terminate.go  the Terminate header and the headers it carries back
//	code.go       Terminate's layers, error types and codes; Error
//	immediate.go  RFC 7306 Immediate Data
//	atomic.go     RFC 7306 atomic operations: requests and responses
package rdmap

import (
	"fmt"

	"github.com/siwtun/siwtun/iwarp/ddp"
)

// Version is the RDMAP version (RV) defined by RFC 5040.
const Version = 1

// constError is an error that can be a constant.
type constError string

// Error implements error.
func (e constError) Error() string { return string(e) }

// Sentinel errors; the errors returned by this package wrap them with
// context. Test with errors.Is.
const (
	// ErrShort reports a buffer shorter than the header it should hold.
	ErrShort = constError("rdmap: buffer too short")
	// ErrMalformed reports a header whose parts are inconsistent, such as
	// octets left over after everything the Terminate hdrct bits announce.
	ErrMalformed = constError("rdmap: malformed header")
)

// Opcode is an RDMAP message opcode (RFC 5040 §4.2, the low 4 bits of the
// RDMAP control octet).
type Opcode uint8

// RDMAP opcodes of RFC 5040, and the four of RFC 7306: the Immediate Data
// pair and the Atomic Request and Response. Linux siw treats every RFC 7306
// opcode as unexpected (Terminate, Unexpected OpCode); see Extended.
const (
	// OpWrite is RDMA Write (tagged).
	OpWrite Opcode = 0x0
	// OpReadRequest is RDMA Read Request (untagged, QN 1).
	OpReadRequest Opcode = 0x1
	// OpReadResponse is RDMA Read Response (tagged).
	OpReadResponse Opcode = 0x2
	// OpSend is Send (untagged, QN 0).
	OpSend Opcode = 0x3
	// OpSendInv is Send with Invalidate (untagged, QN 0).
	OpSendInv Opcode = 0x4
	// OpSendSE is Send with Solicited Event (untagged, QN 0).
	OpSendSE Opcode = 0x5
	// OpSendSEInv is Send with Solicited Event and Invalidate (untagged,
	// QN 0).
	OpSendSEInv Opcode = 0x6
	// OpTerminate is Terminate (untagged, QN 2).
	OpTerminate Opcode = 0x7
	// OpImmediate is Immediate Data (RFC 7306 §4.1, §6.3; untagged, QN 0): eight
	// octets of Immediate Data (ImmediateDataLen) that consume an untagged
	// buffer (a posted receive) at the Data Sink.
	OpImmediate Opcode = 0x8
	// OpImmediateSE is Immediate Data with Solicited Event (RFC 7306
	// §4.1; untagged, QN 0).
	OpImmediateSE Opcode = 0x9
	// OpAtomicRequest is Atomic Request (RFC 7306 §4.1, §5.2; untagged,
	// QN 1, the queue of RDMA Read Requests): an AtomicRequest header.
	OpAtomicRequest Opcode = 0xA
	// OpAtomicResponse is Atomic Response (RFC 7306 §4.1, §5.2; untagged,
	// QN 3): an AtomicResponse header.
	OpAtomicResponse Opcode = 0xB
)

// NoQN is what Opcode.QN returns for opcodes that have no untagged queue
// (tagged or invalid opcodes). It never equals a queue number RDMAP uses.
const NoQN = ^uint32(0)

// Opcode-related masks of the RDMAP control octet.
const (
	ctrlVersionShift = 6
	ctrlOpcodeMask   = 0x0F
)

// String returns the RFC name of the opcode, or "Opcode(0xN)".
func (o Opcode) String() string {
	switch o {
	case OpWrite:
		return "RDMA Write"
	case OpReadRequest:
		return "RDMA Read Request"
	case OpReadResponse:
		return "RDMA Read Response"
	case OpSend:
		return "Send"
	case OpSendInv:
		return "Send with Invalidate"
	case OpSendSE:
		return "Send with SE"
	case OpSendSEInv:
		return "Send with SE and Invalidate"
	case OpTerminate:
		return "Terminate"
	case OpImmediate:
		return "Immediate Data"
	case OpImmediateSE:
		return "Immediate Data with SE"
	case OpAtomicRequest:
		return "Atomic Request"
	case OpAtomicResponse:
		return "Atomic Response"
	}
	return fmt.Sprintf("Opcode(0x%x)", uint8(o))
}

// Valid reports whether o is one of the eight RFC 5040 opcodes or one of
// RFC 7306's four. Whether a stream may carry the latter is negotiated
// (see the engine); Valid only knows the opcode.
func (o Opcode) Valid() bool { return o <= OpAtomicResponse }

// Extended reports whether o is one of RFC 7306's opcodes (Immediate Data,
// Immediate Data with SE, Atomic Request, Atomic Response): a peer without
// RFC 7306, such as Linux siw, must never receive them.
func (o Opcode) Extended() bool { return o >= OpImmediate && o <= OpAtomicResponse }

// Atomic reports whether o is one of RFC 7306's atomic opcodes (Atomic
// Request, Atomic Response).
func (o Opcode) Atomic() bool { return o == OpAtomicRequest || o == OpAtomicResponse }

// Tagged reports whether messages with opcode o use the tagged buffer model
// (RDMA Write and RDMA Read Response).
func (o Opcode) Tagged() bool { return o == OpWrite || o == OpReadResponse }

// QN returns the untagged queue number that carries opcode o: ddp.QNSend for
// the Sends and the Immediate Data pair, ddp.QNReadRequest for RDMA Read
// Request and Atomic Request, ddp.QNTerminate for Terminate,
// ddp.QNAtomicResponse for Atomic Response, and NoQN for tagged and
// invalid opcodes.
func (o Opcode) QN() uint32 {
	switch {
	case o.IsSend(), o == OpImmediate, o == OpImmediateSE:
		return ddp.QNSend
	case o == OpReadRequest, o == OpAtomicRequest:
		return ddp.QNReadRequest
	case o == OpAtomicResponse:
		return ddp.QNAtomicResponse
	case o == OpTerminate:
		return ddp.QNTerminate
	}
	return NoQN
}

// IsSend reports whether o is one of the four Send variants.
func (o Opcode) IsSend() bool { return o >= OpSend && o <= OpSendSEInv }

// Solicited reports whether o asks for a solicited event (Send with SE, Send
// with SE and Invalidate, Immediate Data with SE).
func (o Opcode) Solicited() bool { return o == OpSendSE || o == OpSendSEInv || o == OpImmediateSE }

// Invalidates reports whether o carries an Invalidate STag (Send with
// Invalidate, Send with SE and Invalidate).
func (o Opcode) Invalidates() bool { return o == OpSendInv || o == OpSendSEInv }

// Ctrl returns the RDMAP control octet for op: RV = Version, reserved bits
// zero, and the opcode. It is the value of ddp.Header.ULPCtrl.
func Ctrl(op Opcode) uint8 {
	return Version<<ctrlVersionShift | uint8(op)&ctrlOpcodeMask
}

// ParseCtrl splits an RDMAP control octet into its version (RV) and opcode.
// The two reserved bits are ignored; neither value is validated here.
func ParseCtrl(c uint8) (version uint8, op Opcode) {
	return c >> ctrlVersionShift, Opcode(c & ctrlOpcodeMask)
}
