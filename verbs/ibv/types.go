package ibv

import "fmt"

// The numeric values of every enum in this file equal libibverbs' (rdma-core
// libibverbs/verbs.h), so users of rdma-core read them without a table.

// Access is a set of memory-region access rights (enum ibv_access_flags).
type Access uint32

// Access rights.
const (
	// AccessLocalWrite lets the local RNIC write into the region: receive
	// buffers and RDMA Read sinks need it.
	AccessLocalWrite Access = 1
	// AccessRemoteWrite lets the peer target the region with RDMA Write.
	AccessRemoteWrite Access = 2
	// AccessRemoteRead lets the peer read the region with RDMA Read.
	AccessRemoteRead Access = 4
	// AccessRemoteAtomic lets the peer operate on the region's 64-bit
	// words with RFC 7306 atomics (Fetch-and-Add, Compare-and-Swap).
	AccessRemoteAtomic Access = 8
	// AccessMWBind lets memory windows be bound to the region
	// (IBV_ACCESS_MW_BIND): a window's memory is a part of a region
	// registered with it.
	AccessMWBind Access = 16
)

// MWType is a memory window's type (enum ibv_mw_type).
type MWType uint32

// Memory window types.
const (
	// MWType1 is bound by ibv_bind_mw (MW.Bind), from any queue pair of
	// its protection domain, and unbound by a zero-length bind; it is not
	// invalidated by Local Invalidate or Send with Invalidate.
	MWType1 MWType = 1
	// MWType2 is bound by a WRBindMW work request and tied to the queue
	// pair that bound it (type 2B): only that QP's peer reaches it, and
	// it is invalidated by Local Invalidate or the peer's Send with
	// Invalidate before it is bound again.
	MWType2 MWType = 2
)

// String returns "TYPE_1", "TYPE_2" or "MW_TYPE(n)".
func (t MWType) String() string {
	switch t {
	case MWType1:
		return "TYPE_1"
	case MWType2:
		return "TYPE_2"
	}
	return fmt.Sprintf("MW_TYPE(%d)", uint32(t))
}

// String returns the rights as "LW|RW|RR".
func (a Access) String() string {
	s := ""
	add := func(bit Access, name string) {
		if a&bit != 0 {
			if s != "" {
				s += "|"
			}
			s += name
		}
	}
	add(AccessLocalWrite, "LOCAL_WRITE")
	add(AccessRemoteWrite, "REMOTE_WRITE")
	add(AccessRemoteRead, "REMOTE_READ")
	add(AccessRemoteAtomic, "REMOTE_ATOMIC")
	add(AccessMWBind, "MW_BIND")
	if rest := a &^ (AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessMWBind); rest != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("0x%x", uint32(rest))
	}
	if s == "" {
		return "0"
	}
	return s
}

// AtomicCap is how a device performs atomics (enum ibv_atomic_cap).
type AtomicCap uint32

// Atomic capabilities.
const (
	// AtomicNone: no atomics (IBV_ATOMIC_NONE; Linux siw).
	AtomicNone AtomicCap = 0
	// AtomicHCA: atomics are atomic with respect to the device's own
	// atomics, from every queue pair (IBV_ATOMIC_HCA).
	AtomicHCA AtomicCap = 1
)

// WROpcode is the operation of a send work request (enum ibv_wr_opcode).
type WROpcode uint32

// Send work request opcodes supported by an iWARP RNIC. The two with
// immediate data and the two atomics are RFC 7306's, and only connections
// whose peer negotiated them (mpa.ExtImmediate, mpa.ExtAtomic) take them.
const (
	WRWrite          WROpcode = 0 // IBV_WR_RDMA_WRITE
	WRWriteWithImm   WROpcode = 1 // IBV_WR_RDMA_WRITE_WITH_IMM
	WRSend           WROpcode = 2 // IBV_WR_SEND
	WRSendWithImm    WROpcode = 3 // IBV_WR_SEND_WITH_IMM
	WRRead           WROpcode = 4 // IBV_WR_RDMA_READ
	WRAtomicCmpSwap  WROpcode = 5 // IBV_WR_ATOMIC_CMP_AND_SWP
	WRAtomicFetchAdd WROpcode = 6 // IBV_WR_ATOMIC_FETCH_AND_ADD
	WRLocalInv       WROpcode = 7 // IBV_WR_LOCAL_INV: invalidate an MR's or a type 2 MW's STag (InvalidateRKey)
	WRBindMW         WROpcode = 8 // IBV_WR_BIND_MW: bind a memory window (Bind)
	WRSendWithInv    WROpcode = 9 // IBV_WR_SEND_WITH_INV
)

// String names the opcode as libibverbs does.
func (o WROpcode) String() string {
	switch o {
	case WRWrite:
		return "RDMA_WRITE"
	case WRWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case WRSend:
		return "SEND"
	case WRSendWithImm:
		return "SEND_WITH_IMM"
	case WRRead:
		return "RDMA_READ"
	case WRSendWithInv:
		return "SEND_WITH_INV"
	case WRAtomicCmpSwap:
		return "ATOMIC_CMP_AND_SWP"
	case WRAtomicFetchAdd:
		return "ATOMIC_FETCH_AND_ADD"
	case WRLocalInv:
		return "LOCAL_INV"
	case WRBindMW:
		return "BIND_MW"
	}
	return fmt.Sprintf("WR_OPCODE(%d)", uint32(o))
}

// WithImm reports whether o carries immediate data (RDMA_WRITE_WITH_IMM,
// SEND_WITH_IMM).
func (o WROpcode) WithImm() bool { return o == WRWriteWithImm || o == WRSendWithImm }

// Atomic reports whether o is an atomic operation (ATOMIC_CMP_AND_SWP,
// ATOMIC_FETCH_AND_ADD).
func (o WROpcode) Atomic() bool { return o == WRAtomicCmpSwap || o == WRAtomicFetchAdd }

// Local reports whether o is a memory operation done by the local RNIC in
// send-queue order with nothing on the wire (LOCAL_INV, BIND_MW).
func (o WROpcode) Local() bool { return o == WRLocalInv || o == WRBindMW }

// WC returns the opcode of the completion of a send request with opcode
// o, as libibverbs providers give it: RDMA_WRITE for both Writes,
// RDMA_READ for a Read, COMP_SWAP and FETCH_ADD for the atomics, BIND_MW
// and LOCAL_INV for the memory operations, SEND for every Send.
func (o WROpcode) WC() WCOpcode {
	switch o {
	case WRBindMW:
		return WCBindMW
	case WRLocalInv:
		return WCLocalInv
	case WRWrite, WRWriteWithImm:
		return WCWrite
	case WRRead:
		return WCRead
	case WRAtomicCmpSwap:
		return WCCompSwap
	case WRAtomicFetchAdd:
		return WCFetchAdd
	}
	return WCSend
}

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	// FlagFence makes the request wait until every earlier RDMA Read of the
	// queue pair has completed.
	FlagFence SendFlags = 1
	// FlagSignaled asks for a completion on success (errors always complete).
	FlagSignaled SendFlags = 2
	// FlagSolicited sends a Send as Send with Solicited Event.
	FlagSolicited SendFlags = 4
	// FlagInline takes the payload from SendWR.Inline, copied at post time.
	FlagInline SendFlags = 8
)

// WCOpcode says what a work completion completes (enum ibv_wc_opcode).
type WCOpcode uint32

// Work completion opcodes.
const (
	WCSend  WCOpcode = 0 // IBV_WC_SEND
	WCWrite WCOpcode = 1 // IBV_WC_RDMA_WRITE
	WCRead  WCOpcode = 2 // IBV_WC_RDMA_READ
	// WCCompSwap and WCFetchAdd complete the atomics (RFC 7306): the
	// remote word's original value is in the request's 8-byte SGE.
	WCCompSwap WCOpcode = 3   // IBV_WC_COMP_SWAP
	WCFetchAdd WCOpcode = 4   // IBV_WC_FETCH_ADD
	WCBindMW   WCOpcode = 5   // IBV_WC_BIND_MW
	WCLocalInv WCOpcode = 6   // IBV_WC_LOCAL_INV
	WCRecv     WCOpcode = 128 // IBV_WC_RECV
	// WCRecvRDMAWithImm completes the receive an RDMA Write with
	// Immediate Data consumed (its Immediate Data message, RFC 7306).
	WCRecvRDMAWithImm WCOpcode = 129 // IBV_WC_RECV_RDMA_WITH_IMM
)

// Recv reports whether o completes a receive (libibverbs: IBV_WC_RECV and
// every opcode above it have bit 7 set).
func (o WCOpcode) Recv() bool { return o&WCRecv != 0 }

// String names the opcode as libibverbs does.
func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCWrite:
		return "RDMA_WRITE"
	case WCRead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WC_OPCODE(%d)", uint32(o))
}

// WCStatus is the result of a work request (enum ibv_wc_status).
type WCStatus uint32

// Work completion statuses; the subset an iWARP RNIC produces, with
// libibverbs' values.
const (
	WCSuccess       WCStatus = 0  // IBV_WC_SUCCESS
	WCLocLenErr     WCStatus = 1  // IBV_WC_LOC_LEN_ERR: receive buffer too small
	WCLocQPOpErr    WCStatus = 2  // IBV_WC_LOC_QP_OP_ERR: local protocol error (bad CRC, framing)
	WCLocProtErr    WCStatus = 4  // IBV_WC_LOC_PROT_ERR: bad local key or address
	WCFlushErr      WCStatus = 5  // IBV_WC_WR_FLUSH_ERR: flushed when the QP entered the error state
	WCMWBindErr     WCStatus = 6  // IBV_WC_MW_BIND_ERR: a bind or local invalidate broke a memory window rule
	WCLocAccessErr  WCStatus = 8  // IBV_WC_LOC_ACCESS_ERR: local region lacks the right
	WCRemInvReqErr  WCStatus = 9  // IBV_WC_REM_INV_REQ_ERR: the peer found the request invalid
	WCRemAccessErr  WCStatus = 10 // IBV_WC_REM_ACCESS_ERR: the peer refused access (STag, bounds, rights)
	WCRemOpErr      WCStatus = 11 // IBV_WC_REM_OP_ERR: the peer could not perform the operation
	WCRemAbortErr   WCStatus = 16 // IBV_WC_REM_ABORT_ERR: the peer terminated the stream
	WCFatalErr      WCStatus = 19 // IBV_WC_FATAL_ERR
	WCGeneralErr    WCStatus = 21 // IBV_WC_GENERAL_ERR
	wcStatusNameMax          = 24
)

// String names the status as ibv_wc_status_str does.
func (s WCStatus) String() string {
	names := [wcStatusNameMax]string{
		"success", "local length error", "local QP operation error",
		"local EE context operation error", "local protection error",
		"Work Request Flushed Error", "memory management operation error",
		"bad response error", "local access error", "remote invalid request error",
		"remote access error", "remote operation error", "transport retry counter exceeded",
		"RNR retry counter exceeded", "local RDD violation error",
		"remote invalid RD request", "aborted error", "invalid EE context number",
		"invalid EE context state", "fatal error", "response timeout error",
		"general error", "TM error", "TM rendezvous incomplete",
	}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("WC_STATUS(%d)", uint32(s))
}

// WCFlags qualify a work completion (enum ibv_wc_flags).
type WCFlags uint32

// Work completion flags.
const (
	// WCWithImm marks a receive completed with immediate data (a Send
	// with Immediate Data, or WCRecvRDMAWithImm); the value is in
	// WorkCompletion.ImmData.
	WCWithImm WCFlags = 2
	// WCWithInv marks a receive completed by a Send with Invalidate; the
	// invalidated STag is in WorkCompletion.InvalidatedRKey.
	WCWithInv WCFlags = 8
)

// QPState is a queue pair state (enum ibv_qp_state).
type QPState uint32

// Queue pair states.
const (
	QPReset QPState = 0 // IBV_QPS_RESET
	QPInit  QPState = 1 // IBV_QPS_INIT: receives may be posted
	QPRTR   QPState = 2 // IBV_QPS_RTR: connected, waiting for the peer's RTR
	QPRTS   QPState = 3 // IBV_QPS_RTS: connected, both directions
	QPErr   QPState = 6 // IBV_QPS_ERR: outstanding work is flushed
)

// String names the state as libibverbs does.
func (s QPState) String() string {
	switch s {
	case QPReset:
		return "RESET"
	case QPInit:
		return "INIT"
	case QPRTR:
		return "RTR"
	case QPRTS:
		return "RTS"
	case QPErr:
		return "ERR"
	}
	return fmt.Sprintf("QPS(%d)", uint32(s))
}

// SGE is one scatter/gather element (struct ibv_sge): Length bytes at
// address Addr of the region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send-queue work request (struct ibv_send_wr).
type SendWR struct {
	// ID is returned in the work completion.
	ID uint64
	// Opcode is the operation.
	Opcode WROpcode
	// Flags modify it.
	Flags SendFlags
	// SGL is the local data: the source of a Send or Write, the sink of a
	// Read (one element at most), the 8-byte buffer an atomic returns the
	// remote word's original value into (exactly one element of
	// AtomicLen bytes).
	SGL []SGE
	// Inline is the payload of a Send or Write posted with FlagInline; it is
	// copied at post time, so the caller may reuse it at once.
	Inline []byte
	// RemoteAddr and RKey name the peer's memory for Write and Read, and
	// the peer's 64-bit word of an atomic (libibverbs' wr.atomic), which
	// must be AtomicLen-aligned.
	RemoteAddr uint64
	RKey       uint32
	// CompareAdd is the value WRAtomicFetchAdd adds, or the value
	// WRAtomicCmpSwap compares with (libibverbs' compare_add); Swap is
	// what WRAtomicCmpSwap stores when the word equals CompareAdd.
	CompareAdd, Swap uint64
	// InvalidateRKey is the peer's STag a Send with Invalidate
	// invalidates, or the local STag (an MR's, a type 2 MW's) a
	// WRLocalInv invalidates.
	InvalidateRKey uint32
	// Bind is the binding of a WRBindMW (libibverbs' wr.bind_mw).
	Bind MWBind
	// ImmData is the immediate value of WRWriteWithImm and WRSendWithImm,
	// as a number: libibverbs' imm_data holds it in network byte order
	// (htonl(ImmData)), and the peer's completion carries the same value.
	ImmData uint32
}

// MWBind binds a memory window (libibverbs' wr.bind_mw with its
// bind_info): the window named by MW gets the rkey RKey and covers Length
// bytes at tagged offset Addr of the region whose lkey is MRKey, with the
// remote rights Access. RKey keeps the window's index (its upper 24 bits)
// and takes the 8-bit key the consumer picks (ibv_inc_rkey). A type 1
// window bound with Length 0 and no region (MRKey 0) is unbound.
type MWBind struct {
	// MW is the window's rkey (any key of it: the index names it).
	MW uint32
	// RKey is the window's rkey once bound.
	RKey uint32
	// MRKey is the lkey of the region the window lies in.
	MRKey uint32
	// Addr and Length are the window's tagged offset and size.
	Addr, Length uint64
	// Access is the window's rights: REMOTE_READ, REMOTE_WRITE,
	// REMOTE_ATOMIC.
	Access Access
	// Type1 marks the bind of a type 1 window (ibv_bind_mw posts it).
	Type1 bool
}

// IncRKey returns rkey with its 8-bit key incremented (ibv_inc_rkey):
// the rkey a window's next bind gives it.
func IncRKey(rkey uint32) uint32 { return rkey&^0xff | (rkey+1)&0xff }

// RecvWR is a receive-queue work request (struct ibv_recv_wr).
type RecvWR struct {
	// ID is returned in the work completion.
	ID uint64
	// SGL is where an incoming Send is placed, in order.
	SGL []SGE
}

// WorkCompletion is one completion (struct ibv_wc). It is a flat value, so a
// caller-owned slice is reused across polls without allocation.
type WorkCompletion struct {
	ID              uint64
	Status          WCStatus
	Opcode          WCOpcode
	VendorErr       uint32
	ByteLen         uint32
	QPNum           uint32
	Flags           WCFlags
	InvalidatedRKey uint32
	// ImmData is the immediate value, with WCWithImm (libibverbs'
	// imm_data is htonl(ImmData)).
	ImmData uint32
}

// CompletionQueue receives the completions of a queue pair. Push must not
// block and must not retain wc; solicited tells whether the completion is for
// a Send with Solicited Event (for solicited-only notification).
type CompletionQueue interface {
	Push(wc *WorkCompletion, solicited bool)
}
