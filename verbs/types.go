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

import "github.com/siwtun/siwtun/offload"

// Access is a set of memory-region access rights (ibv_access_flags).
type Access = offload.Access

// Access rights.
const (
	AccessLocalWrite  = offload.AccessLocalWrite
	AccessRemoteWrite = offload.AccessRemoteWrite
	AccessRemoteRead  = offload.AccessRemoteRead
)

// WROpcode is a send work request's operation (ibv_wr_opcode).
type WROpcode = offload.WROpcode

// Send work request opcodes.
const (
	WRWrite       = offload.WRWrite
	WRSend        = offload.WRSend
	WRRead        = offload.WRRead
	WRSendWithInv = offload.WRSendWithInv
)

// SendFlags modify a send work request (ibv_send_flags).
type SendFlags = offload.SendFlags

// Send flags.
const (
	FlagFence     = offload.FlagFence
	FlagSignaled  = offload.FlagSignaled
	FlagSolicited = offload.FlagSolicited
	FlagInline    = offload.FlagInline
)

// WCOpcode says what a completion completes (ibv_wc_opcode).
type WCOpcode = offload.WCOpcode

// Completion opcodes.
const (
	WCSend  = offload.WCSend
	WCWrite = offload.WCWrite
	WCRead  = offload.WCRead
	WCRecv  = offload.WCRecv
)

// WCStatus is a work request's result (ibv_wc_status).
type WCStatus = offload.WCStatus

// Completion statuses.
const (
	WCSuccess      = offload.WCSuccess
	WCLocLenErr    = offload.WCLocLenErr
	WCLocQPOpErr   = offload.WCLocQPOpErr
	WCLocProtErr   = offload.WCLocProtErr
	WCFlushErr     = offload.WCFlushErr
	WCLocAccessErr = offload.WCLocAccessErr
	WCRemInvReqErr = offload.WCRemInvReqErr
	WCRemAccessErr = offload.WCRemAccessErr
	WCRemOpErr     = offload.WCRemOpErr
	WCRemAbortErr  = offload.WCRemAbortErr
	WCFatalErr     = offload.WCFatalErr
	WCGeneralErr   = offload.WCGeneralErr
)

// WCFlags qualify a completion (ibv_wc_flags).
type WCFlags = offload.WCFlags

// WCWithInv marks a receive completed by a Send with Invalidate.
const WCWithInv = offload.WCWithInv

// QPState is a queue pair state (ibv_qp_state).
type QPState = offload.QPState

// Queue pair states.
const (
	QPReset = offload.QPReset
	QPInit  = offload.QPInit
	QPRTR   = offload.QPRTR
	QPRTS   = offload.QPRTS
	QPErr   = offload.QPErr
)

// SGE is a scatter/gather element (ibv_sge).
type SGE = offload.SGE

// SendWR is a send work request (ibv_send_wr).
type SendWR = offload.SendWR

// RecvWR is a receive work request (ibv_recv_wr).
type RecvWR = offload.RecvWR

// WorkCompletion is one completion (ibv_wc).
type WorkCompletion = offload.WorkCompletion

// ConnParam are connection parameters (rdma_conn_param).
type ConnParam = offload.ConnParam

// Event is a connection event of a queue pair (rdma_cm_event).
type Event = offload.Event

// EventType says what happened.
type EventType = offload.EventType

// Connection events.
const (
	EventEstablished       = offload.EventEstablished
	EventDisconnected      = offload.EventDisconnected
	EventTerminateSent     = offload.EventTerminateSent
	EventTerminateReceived = offload.EventTerminateReceived
)

// Device limits.
const (
	MaxSGE     = offload.MaxSGE
	MaxSGERead = offload.MaxSGERead
	MaxInline  = offload.MaxInline
	MaxIRDORD  = offload.MaxIRDORD
	MaxQPWR    = offload.MaxQPWR
)
