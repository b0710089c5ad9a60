// Package verbs is siwtun's application API, shaped like libibverbs and
// librdmacm: a Device has protection domains (PD) with memory regions (MR)
// and queue pairs (QP); completion queues (CQ) report finished work; a QP
// connects with Connect or through a Listener, as rdma_cm does for iWARP.
//
// Numeric enums and statuses equal libibverbs' (IBV_WR_*, IBV_SEND_*,
// IBV_ACCESS_*, IBV_WC_*, IBV_QPS_*), so users of rdma-core read them
// without a table.
//
// Work requests are posted in batches and return at once; their results
// arrive as WorkCompletions, polled into a caller-owned slice without
// allocation. A failed work request is a completion with an error status; a
// failed call is a Go error.
package verbs

import (
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// Access is a set of memory-region access rights (ibv_access_flags).
type Access = ibv.Access

// Access rights.
const (
	AccessLocalWrite  = ibv.AccessLocalWrite
	AccessRemoteWrite = ibv.AccessRemoteWrite
	AccessRemoteRead  = ibv.AccessRemoteRead
	// AccessRemoteAtomic lets the peer's atomics operate on the region.
	AccessRemoteAtomic = ibv.AccessRemoteAtomic
	// AccessMWBind lets memory windows be bound to the region.
	AccessMWBind = ibv.AccessMWBind
)

// MWType is a memory window's type (ibv_mw_type): MWType1 is bound with
// MW.Bind and usable from any QP of its PD; MWType2 is bound by posting
// WRBindMW and tied to the QP that bound it.
type MWType = ibv.MWType

// Memory window types.
const (
	MWType1 = ibv.MWType1
	MWType2 = ibv.MWType2
)

// MWBind is the binding of a WRBindMW (SendWR.Bind; libibverbs'
// wr.bind_mw):
//
//	MW     uint32 // the window's rkey (MW.RKey(), or any later one: its index names it)
//	RKey   uint32 // the window's rkey once bound: its index and the consumer's 8-bit key (IncRKey)
//	MRKey  uint32 // the lkey of the region (registered with AccessMWBind) the window lies in
//	Addr   uint64 // the window's first byte, inside the region ...
//	Length uint64 // ... and its size (0: a zero-length window)
//	Access Access // AccessRemoteRead, AccessRemoteWrite, AccessRemoteAtomic
//	Type1  bool   // a type 1 window's bind (MW.Bind sets it)
type MWBind = ibv.MWBind

// IncRKey returns rkey with its 8-bit key incremented (ibv_inc_rkey).
func IncRKey(rkey uint32) uint32 { return ibv.IncRKey(rkey) }

// AtomicCap is how a device performs atomics (ibv_atomic_cap).
type AtomicCap = ibv.AtomicCap

// Atomic capabilities.
const (
	AtomicNone = ibv.AtomicNone
	AtomicHCA  = ibv.AtomicHCA
)

// WROpcode is a send work request's operation (ibv_wr_opcode).
type WROpcode = ibv.WROpcode

// Send work request opcodes. WRWriteWithImm and WRSendWithImm (RFC 7306
// Immediate Data) need a peer that negotiated them (Info().Params.Ext has
// mpa.ExtImmediate: another siwtun); toward any other peer PostSend
// refuses them with ErrNotSupportedByPeer. The same holds for the RFC 7306
// atomics WRAtomicFetchAdd and WRAtomicCmpSwap (mpa.ExtAtomic): SendWR's
// RemoteAddr and RKey name the peer's 8-byte aligned word, CompareAdd and
// Swap are the operands, and the word's original value lands in the one
// 8-byte SGE.
const (
	WRWrite          = ibv.WRWrite
	WRWriteWithImm   = ibv.WRWriteWithImm
	WRSend           = ibv.WRSend
	WRSendWithImm    = ibv.WRSendWithImm
	WRRead           = ibv.WRRead
	WRAtomicCmpSwap  = ibv.WRAtomicCmpSwap
	WRAtomicFetchAdd = ibv.WRAtomicFetchAdd
	WRSendWithInv    = ibv.WRSendWithInv
	// WRLocalInv invalidates the local STag InvalidateRKey (a memory
	// region's, or a type 2 window's bound by this QP), in send-queue
	// order; it completes as WCLocalInv.
	WRLocalInv = ibv.WRLocalInv
	// WRBindMW binds the memory window SendWR.Bind names, in send-queue
	// order; it completes as WCBindMW.
	WRBindMW = ibv.WRBindMW
)

// SendFlags modify a send work request (ibv_send_flags).
type SendFlags = ibv.SendFlags

// Send flags.
const (
	FlagFence     = ibv.FlagFence
	FlagSignaled  = ibv.FlagSignaled
	FlagSolicited = ibv.FlagSolicited
	FlagInline    = ibv.FlagInline
)

// WCOpcode says what a completion completes (ibv_wc_opcode).
type WCOpcode = ibv.WCOpcode

// Completion opcodes. A receive completes as WCRecv (a Send, with or
// without immediate data) or WCRecvRDMAWithImm (the Immediate Data of an
// RDMA Write with Immediate Data: ByteLen is the Write's length, the data
// is in the region the Write named, none in the receive's buffers);
// WCOpcode.Recv is true for both.
const (
	WCSend            = ibv.WCSend
	WCWrite           = ibv.WCWrite
	WCRead            = ibv.WCRead
	WCCompSwap        = ibv.WCCompSwap
	WCFetchAdd        = ibv.WCFetchAdd
	WCBindMW          = ibv.WCBindMW
	WCLocalInv        = ibv.WCLocalInv
	WCRecv            = ibv.WCRecv
	WCRecvRDMAWithImm = ibv.WCRecvRDMAWithImm
)

// WCStatus is a work request's result (ibv_wc_status).
type WCStatus = ibv.WCStatus

// Completion statuses.
const (
	WCSuccess    = ibv.WCSuccess
	WCLocLenErr  = ibv.WCLocLenErr
	WCLocQPOpErr = ibv.WCLocQPOpErr
	WCLocProtErr = ibv.WCLocProtErr
	WCFlushErr   = ibv.WCFlushErr
	// WCMWBindErr: a WRBindMW or WRLocalInv broke a memory window rule
	// (the QP goes to ERR).
	WCMWBindErr    = ibv.WCMWBindErr
	WCLocAccessErr = ibv.WCLocAccessErr
	WCRemInvReqErr = ibv.WCRemInvReqErr
	WCRemAccessErr = ibv.WCRemAccessErr
	WCRemOpErr     = ibv.WCRemOpErr
	WCRemAbortErr  = ibv.WCRemAbortErr
	WCFatalErr     = ibv.WCFatalErr
	WCGeneralErr   = ibv.WCGeneralErr
)

// WCFlags qualify a completion (ibv_wc_flags).
type WCFlags = ibv.WCFlags

// Completion flags.
const (
	// WCWithImm marks a receive completed with immediate data (in
	// WorkCompletion.ImmData).
	WCWithImm = ibv.WCWithImm
	// WCWithInv marks a receive completed by a Send with Invalidate.
	WCWithInv = ibv.WCWithInv
)

// QPState is a queue pair state (ibv_qp_state).
type QPState = ibv.QPState

// Queue pair states.
const (
	QPReset = ibv.QPReset
	QPInit  = ibv.QPInit
	QPRTR   = ibv.QPRTR
	QPRTS   = ibv.QPRTS
	QPErr   = ibv.QPErr
)

// The types below are defined in package verbs/ibv, which the engine
// shares; their fields are listed here so that go doc shows them
// (TestAliasDocsListFields keeps the lists complete).

// SGE is a scatter/gather element (ibv_sge): Length bytes at Addr of the
// region with LKey. MR.SGE(off, n) makes one.
//
//	Addr   uint64 // the address in the region (MR.Addr() + offset)
//	Length uint32
//	LKey   uint32 // MR.LKey()
type SGE = ibv.SGE

// SendWR is a send work request (ibv_send_wr):
//
//	ID             uint64    // returned in the work completion
//	Opcode         WROpcode  // WRSend, WRSendWithInv, WRWrite, WRRead, WRWriteWithImm, WRSendWithImm, WRAtomicFetchAdd, WRAtomicCmpSwap, WRLocalInv, WRBindMW
//	Flags          SendFlags // FlagSignaled (a completion), FlagInline, FlagSolicited, FlagFence
//	SGL            []SGE     // the local data: source of a Send or Write, sink of a Read (one element), an atomic's 8-byte result
//	Inline         []byte    // the payload of a Send or Write posted with FlagInline (copied at post)
//	RemoteAddr     uint64    // the peer's memory for Write, Read and atomics (8-byte aligned): its address ...
//	RKey           uint32    // ... and its region's rkey (the peer's MR.RKey())
//	InvalidateRKey uint32    // the peer's STag a WRSendWithInv invalidates, the local one a WRLocalInv does
//	Bind           MWBind    // the window binding of a WRBindMW
//	ImmData        uint32    // the immediate value of WRWriteWithImm, WRSendWithImm (libibverbs' imm_data is htonl of it)
//	CompareAdd     uint64    // what WRAtomicFetchAdd adds, what WRAtomicCmpSwap compares with (compare_add)
//	Swap           uint64    // what WRAtomicCmpSwap stores when the word equals CompareAdd
type SendWR = ibv.SendWR

// RecvWR is a receive work request (ibv_recv_wr), posted before the peer's
// Send arrives (after QP.Modify(QPInit)):
//
//	ID  uint64 // returned in the work completion
//	SGL []SGE  // where an incoming Send is placed, in order
type RecvWR = ibv.RecvWR

// WorkCompletion is one completion (ibv_wc):
//
//	ID              uint64   // the work request's ID
//	Status          WCStatus // WCSuccess, or why it failed (WCFlushErr, WCRemAccessErr, ...)
//	Opcode          WCOpcode // WCSend, WCWrite, WCRead, WCBindMW, WCLocalInv, WCRecv, WCRecvRDMAWithImm
//	VendorErr       uint32
//	ByteLen         uint32   // bytes received (WCRecv), written (WCRecvRDMAWithImm) or moved
//	QPNum           uint32   // the queue pair
//	Flags           WCFlags  // WCWithImm, WCWithInv
//	InvalidatedRKey uint32   // with WCWithInv
//	ImmData         uint32   // with WCWithImm: the sender's SendWR.ImmData
type WorkCompletion = ibv.WorkCompletion

// ConnParam are connection parameters (rdma_conn_param) of QP.Connect and
// ConnRequest.Accept:
//
//	PrivateData        []byte // in the MPA Request (Connect) or Reply (Accept); at most 252 bytes
//	ResponderResources uint16 // IRD: inbound RDMA Reads served at once; 0: the device default
//	InitiatorDepth     uint16 // ORD: outbound RDMA Reads outstanding at once; 0: the device default
//
// The listener sees the Request's private data in ConnRequest.PrivateData;
// the connecting side sees the Reply's in its EventEstablished.
type ConnParam = ibv.ConnParam

// Event is a connection event of a queue pair (rdma_cm_event), read from
// QP.Events():
//
//	Type        EventType  // EventEstablished, EventDisconnected, EventTerminateSent/Received
//	Code        rdmap.Code // the Terminate's error
//	Err         error      // the event in words (TerminateSent, Disconnected)
//	PrivateData []byte     // EventEstablished on the connecting side: the listener's accept private data
type Event = ibv.Event

// EventType says what happened.
type EventType = ibv.EventType

// Connection events.
const (
	EventEstablished       = ibv.EventEstablished
	EventDisconnected      = ibv.EventDisconnected
	EventTerminateSent     = ibv.EventTerminateSent
	EventTerminateReceived = ibv.EventTerminateReceived
)

// Device limits.
const (
	MaxSGE     = ibv.MaxSGE
	MaxSGERead = ibv.MaxSGERead
	MaxInline  = ibv.MaxInline
	MaxIRDORD  = ibv.MaxIRDORD
	MaxQPWR    = ibv.MaxQPWR
)

// Info is a snapshot of a queue pair (QP.Info).
type Info = ibv.Info

// CompletionQueue is what the in-process engine completes into; a CQ of an
// in-process device implements it (CQ.Push).
type CompletionQueue = ibv.CompletionQueue

// RejectedError is returned by Connect when the peer rejected the
// connection (an MPA Reply with the Reject flag); errors.As finds it.
type RejectedError = ibv.RejectedError

// Errors of queue-pair calls (not completions).
var (
	// ErrQPState: the QP's state forbids the call.
	ErrQPState = ibv.ErrQPState
	// ErrQueueFull: a work queue has no free slot.
	ErrQueueFull = ibv.ErrQueueFull
	// ErrInvalidWR: a malformed work request (see CheckSendWR).
	ErrInvalidWR = ibv.ErrInvalidWR
	// ErrNotSupportedByPeer: a work request the connection's peer did
	// not negotiate (immediate data toward Linux siw); nothing was sent.
	ErrNotSupportedByPeer = ibv.ErrNotSupportedByPeer
	// ErrMarkersRejected: the peer would not use the MPA markers this side
	// required (RejectedError.Err).
	ErrMarkersRejected = ibv.ErrMarkersRejected
)

// CheckSendWR reports whether a send work request is well formed; PostSend
// applies it, in-process and over the verbs socket alike.
func CheckSendWR(wr *SendWR) error { return ibv.CheckSendWR(wr) }

// CheckRecvWR reports whether a receive work request is well formed.
func CheckRecvWR(wr *RecvWR) error { return ibv.CheckRecvWR(wr) }

// MTUEnum is the verbs MTU enum (IBV_MTU_256 = 1 … IBV_MTU_4096 = 5) of a
// link MTU: the largest verbs MTU that fits.
func MTUEnum(mtu int) int { return ibv.MTUEnum(mtu) }

// MTUEnumBytes is the size in bytes of a verbs MTU enum (1 → 256).
func MTUEnumBytes(e int) int { return ibv.MTUEnumBytes(e) }

// MPAError is an MPA failure of a connection (a bad Request or Reply, a
// negotiation that cannot succeed); errors.As finds it in Connect's error.
type MPAError = mpa.Error
