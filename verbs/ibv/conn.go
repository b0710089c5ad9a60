package ibv

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// ConnParam are the per-connection parameters of connect and accept
// (struct rdma_conn_param).
type ConnParam struct {
	// PrivateData goes in the MPA Request or Reply (at most 256 bytes
	// including the 4-byte IRD/ORD block of MPA rev 2).
	PrivateData []byte
	// ResponderResources is the IRD: inbound RDMA Reads this side serves
	// at once. 0 takes the device default.
	ResponderResources uint16
	// InitiatorDepth is the ORD: outbound RDMA Reads this side has
	// outstanding at once. 0 takes the device default.
	InitiatorDepth uint16
}

// RejectedError is returned by Connect when the peer rejected the
// connection (MPA Reply with the R flag).
type RejectedError struct {
	// PrivateData is the peer's private data in the reject.
	PrivateData []byte
	// Err says more (a negotiation failure, or nil for an application reject).
	Err error
}

// Error says that the peer rejected the connection, and why if known.
func (e *RejectedError) Error() string {
	if e.Err != nil {
		return "connection rejected by the peer: " + e.Err.Error()
	}
	return "connection rejected by the peer"
}

// Unwrap returns the negotiation failure, if any.
func (e *RejectedError) Unwrap() error { return e.Err }

// ErrMarkersRejected is the RejectedError.Err of a connection whose peer
// would not use MPA markers that this side required.
var ErrMarkersRejected = errors.New("peer rejected markers (MPA Reply with R set and M clear to a Request with M)")

// EventType says what happened to a queue pair's connection.
type EventType int

// Connection events.
const (
	// EventEstablished: both directions of the iWARP stream are up.
	EventEstablished EventType = iota + 1
	// EventDisconnected: the stream ended (peer closed, local disconnect).
	EventDisconnected
	// EventTerminateSent: the engine detected an error and sent a Terminate.
	EventTerminateSent
	// EventTerminateReceived: the peer sent a Terminate.
	EventTerminateReceived
	// EventSRQLimitReached: a shared receive queue's count of posted
	// receives dropped below its armed limit
	// (IBV_EVENT_SRQ_LIMIT_REACHED); the limit is disarmed. It is an
	// event of the SRQ, not of a connection.
	EventSRQLimitReached
)

// String names the event as rdma_cm does where it can.
func (e EventType) String() string {
	switch e {
	case EventEstablished:
		return "ESTABLISHED"
	case EventDisconnected:
		return "DISCONNECTED"
	case EventTerminateSent:
		return "TERMINATE_SENT"
	case EventTerminateReceived:
		return "TERMINATE_RECEIVED"
	case EventSRQLimitReached:
		return "SRQ_LIMIT_REACHED"
	}
	return fmt.Sprintf("EVENT(%d)", int(e))
}

// Event is one connection event of a queue pair.
type Event struct {
	Type EventType
	// Code is the Terminate's error (TerminateSent/Received).
	Code rdmap.Code
	// Err explains the event in words (for TerminateSent and Disconnected).
	Err error
	// PrivateData is, in EventEstablished on the side that connected, the
	// private data the listener gave its accept (ConnParam.PrivateData of
	// ConnRequest.Accept, carried by the MPA Reply), as librdmacm's
	// RDMA_CM_EVENT_ESTABLISHED carries it; nil otherwise.
	PrivateData []byte
}

// String formats the event for logs.
func (e Event) String() string {
	switch e.Type {
	case EventTerminateSent, EventTerminateReceived:
		if e.Err != nil {
			return fmt.Sprintf("%v %v: %v", e.Type, e.Code, e.Err)
		}
		return fmt.Sprintf("%v %v", e.Type, e.Code)
	}
	if e.Err != nil {
		return fmt.Sprintf("%v: %v", e.Type, e.Err)
	}
	return e.Type.String()
}

// Info is a snapshot of a queue pair, for the control plane and for
// applications (rdma_query_qp-like).
type Info struct {
	// Num is the QP number.
	Num uint32
	// State is the QP's state.
	State QPState
	// Local and Remote are the connection's TCP endpoints.
	Local, Remote netip.AddrPort
	// Params is what MPA negotiated (revision, CRC, markers, IRD/ORD, P2P).
	Params mpa.Params
	// IRD and ORD are the inbound and outbound RDMA Read depths in force.
	IRD, ORD int
	// SQDepth and RQDepth are the queue sizes; SQUse and RQUse how many
	// entries are outstanding.
	SQDepth, SQUse int
	RQDepth, RQUse int
	// EMSS is the connection's effective MSS, the size of a full FPDU.
	EMSS int
}
