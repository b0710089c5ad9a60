package uabi

import (
	"encoding/binary"
	"net/netip"
	"syscall"

	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// Msg is the body of one verbs-socket message: a request, a reply's body
// after its Status, or an event's body after its kind. It is a pointer to
// one of the structs of this file, and the struct is the message's only
// definition: its fields travel in their order, each as its type says
// (Fields, Kind), encoded by Enc.Msg and decoded by Dec.Msg, so both ends
// have a field or neither has it. A field's place in its struct is its
// place on the wire: a field is added at the end, and with a new Version
// (the golden messages of the tests show any change of bytes).
type Msg = any

// Empty is the body of requests and replies that carry nothing.
type Empty struct{}

// Ref names one object of the session by its handle: the request of
// DeallocPD, DeregMR, DestroyCQ, DestroyQP, QueryQP, Disconnect,
// CloseListener and GetRequest.
type Ref struct {
	Handle uint32
}

// Hello opens a session.
type Hello struct {
	// Version is the client's protocol version (Version).
	Version uint32
}

// HelloReply is the daemon's version, device name and capabilities
// (ibv_device_attr).
type HelloReply struct {
	Version                     uint32
	Name, FWVersion             string
	NodeGUID                    uint64
	VendorID, VendorPartID      uint32
	MaxQP, MaxQPWR              uint32
	MaxSGE, MaxSGERead          uint32
	MaxCQ, MaxCQE, MaxMR, MaxPD uint32
	MaxQPRdAtom                 uint32
	MaxQPInitRdAtom             uint32
	MaxInline, MTU              uint32
	// MaxSRQ, MaxSRQWR and MaxSRQSGE are the shared receive queues this
	// client may create, their depth and SGEs per receive (Version 4).
	MaxSRQ, MaxSRQWR, MaxSRQSGE uint32
	AtomicCap                   uint32 // ibv.AtomicCap (from Version 5 on)
	// MaxMW is the memory windows this client may allocate (Version 6);
	// they share the region table, and the client's MR limit, with its
	// memory regions.
	MaxMW uint32
}

// AllocPDReply is a new PD: its handle and its number.
type AllocPDReply struct {
	Handle, PDNum uint32
}

// RegMR registers Length bytes at Offset of the memfd the message carries
// (the client's AllocBuffer memory) in PD, at tagged offset IOVA.
type RegMR struct {
	PD                   uint32
	Offset, Length, IOVA uint64
	Access               uint32 // ibv.Access
}

// ReregMR changes region Handle in place (ibv_rereg_mr), keeping its STag:
// it covers Length bytes at Offset of the memfd the message carries, at
// tagged offset IOVA, in PD (a handle), with Access. The client sends the
// region's current values for what it does not change.
type ReregMR struct {
	Handle, PD           uint32
	Offset, Length, IOVA uint64
	Access               uint32 // ibv.Access
}

// AllocMW allocates a memory window of Type (ibv.MWType) in PD
// (Version 6).
type AllocMW struct {
	PD, Type uint32
}

// AllocMWReply is the new window's handle and its first rkey.
type AllocMWReply struct {
	Handle, RKey uint32
}

// RegMRReply is the new region's handle and STag.
type RegMRReply struct {
	Handle, STag uint32
}

// CreateCQ asks for a completion queue of Depth entries.
type CreateCQ struct {
	Depth uint32
}

// CreateCQReply is the new CQ's handle and its ring: Count entries in Size
// bytes of the memfd the reply carries first; the second descriptor is
// the notification eventfd.
type CreateCQReply struct {
	Handle, Count, Size uint32
}

// CreateQP asks for a QP in PD completing into SendCQ and RecvCQ. A QP
// with SRQ (a handle; 0: none) takes its receives from that shared
// receive queue: MaxRecvWR is ignored and its RQ ring is one entry that
// the daemon never reads (Version 4).
type CreateQP struct {
	PD, SendCQ, RecvCQ   uint32
	MaxSendWR, MaxRecvWR uint32
	SignalAll            bool
	SRQ                  uint32
}

// CreateQPReply is the new QP's handle and number, and its rings in the
// memfd the reply carries first: the SQ (SQCount entries) in its first
// SQBytes bytes, the RQ (RQCount) in the rest of Total. The second
// descriptor is the QP's doorbell eventfd.
type CreateQPReply struct {
	Handle, Num      uint32
	SQCount, RQCount uint32
	SQBytes, Total   uint32
}

// CreateSRQ asks for a shared receive queue in PD of MaxWR receives, its
// limit event armed at Limit (0: disarmed).
type CreateSRQ struct {
	PD, MaxWR, Limit uint32
}

// CreateSRQReply is the new SRQ's handle and its ring of receives: Count
// RQE-sized entries in Size bytes of the memfd the reply carries. The
// client writes receives into it as into a QP's RQ ring (owner word,
// Valid), with no doorbell: the daemon reads the ring when a message
// needs a receive, and after the SRQ's count of receives dropped below
// its armed limit (to count them before the limit event fires). The
// client keeps at most MaxWR receives posted and not completed.
type CreateSRQReply struct {
	Handle, Count, Size uint32
}

// ModifySRQ changes what Mask (ibv.SRQAttrMask) names of SRQ Handle: its
// depth MaxWR (ibv.SRQMaxWR; not below the receives it holds) and its
// limit Limit (ibv.SRQLimit; 0 disarms). The client posts nothing to the
// SRQ until the reply comes.
type ModifySRQ struct {
	Handle, Mask, MaxWR, Limit uint32
}

// ModifySRQReply is the SRQ's ring after the change: New is set when a
// larger depth needed a larger ring, which the reply's memfd holds (Count
// entries in Size bytes; the client posts from its first entry on, the
// daemon has taken what the old ring held); otherwise the memfd is the
// ring the client has, unchanged.
type ModifySRQReply struct {
	New         bool
	Count, Size uint32
}

// QuerySRQReply is an SRQ's depth, SGEs per receive and armed limit (0:
// disarmed, as after the limit event).
type QuerySRQReply struct {
	MaxWR, MaxSGE, Limit uint32
}

// ModifyQP moves a QP to State (ibv.QPState).
type ModifyQP struct {
	Handle, State uint32
}

// QueryQPReply is a QP's state and connection (ibv.Info without the QP
// number, which the client knows).
type QueryQPReply struct {
	State                     uint32 // ibv.QPState
	Local, Remote             netip.AddrPort
	Rev                       uint8
	CRC, MarkersTx, MarkersRx bool
	IRD, ORD                  uint32
	SQDepth, SQUse            uint32
	RQDepth, RQUse            uint32
	EMSS                      uint32
	Ext                       uint8 // mpa.Ext: the RDMAP extensions negotiated (from Version 3 on)
}

// QueryQPReplyOf is the reply describing in.
func QueryQPReplyOf(in ibv.Info) QueryQPReply {
	return QueryQPReply{State: uint32(in.State), Local: in.Local, Remote: in.Remote,
		Rev: in.Params.Rev, CRC: in.Params.CRC, MarkersTx: in.Params.MarkersTx, MarkersRx: in.Params.MarkersRx,
		IRD: uint32(in.IRD), ORD: uint32(in.ORD), SQDepth: uint32(in.SQDepth), SQUse: uint32(in.SQUse),
		RQDepth: uint32(in.RQDepth), RQUse: uint32(in.RQUse), EMSS: uint32(in.EMSS), Ext: uint8(in.Params.Ext)}
}

// Info is the QP description of the reply, for QP number num.
func (m *QueryQPReply) Info(num uint32) ibv.Info {
	in := ibv.Info{Num: num, State: ibv.QPState(m.State), Local: m.Local, Remote: m.Remote,
		IRD: int(m.IRD), ORD: int(m.ORD), SQDepth: int(m.SQDepth), SQUse: int(m.SQUse),
		RQDepth: int(m.RQDepth), RQUse: int(m.RQUse), EMSS: int(m.EMSS)}
	in.Params.Rev, in.Params.CRC, in.Params.MarkersTx, in.Params.MarkersRx = m.Rev, m.CRC, m.MarkersTx, m.MarkersRx
	in.Params.IRD, in.Params.ORD = uint16(in.IRD), uint16(in.ORD)
	in.Params.Ext = mpa.Ext(m.Ext)
	return in
}

// ConnParam is ibv.ConnParam on the wire: the private data and IRD/ORD of
// a Connect or an Accept.
type ConnParam struct {
	PrivateData                        []byte
	ResponderResources, InitiatorDepth uint16
}

// ConnParamOf is p on the wire.
func ConnParamOf(p ibv.ConnParam) ConnParam {
	return ConnParam{PrivateData: p.PrivateData, ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth}
}

// Param is the ibv.ConnParam m carries (no private data: nil).
func (m *ConnParam) Param() ibv.ConnParam {
	return ibv.ConnParam{PrivateData: m.PrivateData, ResponderResources: m.ResponderResources, InitiatorDepth: m.InitiatorDepth}
}

// Connect connects QP Handle to Remote; the reply comes when the
// connection is established, rejected (StRejected) or failed.
type Connect struct {
	Handle uint32
	Remote netip.AddrPort
	Param  ConnParam
}

// Established is the reply of Connect and Accept: what the connection
// negotiated that the client needs at post time.
type Established struct {
	// Ext is the RDMAP extensions (RFC 7306) both ends support (mpa.Ext):
	// without mpa.ExtImmediate the client refuses RDMA Write and Send
	// with Immediate Data when they are posted.
	Ext uint8
}

// Listen listens for connection requests on Addr.
type Listen struct {
	Addr    netip.AddrPort
	Backlog uint32
}

// ReservePort holds a TCP port of the RNIC on Addr (port 0: the daemon
// picks one) without listening on it, as rdma_bind_addr does: the client
// learns the port before it listens (Version 7). No other client may
// listen on or reserve the port until ReleasePort or the session's end;
// this client's own Listen on it succeeds.
type ReservePort struct {
	Addr netip.AddrPort
}

// ReservePortReply is the reservation's handle and the reserved address
// with its port.
type ReservePortReply struct {
	Handle uint32
	Addr   netip.AddrPort
}

// ListenReply is the new listener's handle and bound address.
type ListenReply struct {
	Handle uint32
	Addr   netip.AddrPort
}

// ConnRequest is GetRequest's reply: a connection request's handle, its
// initiator, the MPA Request's private data and IRD/ORD.
type ConnRequest struct {
	Handle      uint32
	Remote      netip.AddrPort
	PrivateData []byte
	IRD, ORD    uint16
}

// Accept accepts connection request Request on QP.
type Accept struct {
	Request, QP uint32
	Param       ConnParam
}

// Reject rejects connection request Request with private data.
type Reject struct {
	Request     uint32
	PrivateData []byte
}

// Cancel asks the daemon to end the pending request Seq early (a Connect
// or GetRequest whose context ended); it has no reply of its own, the
// canceled request's reply says StCanceled.
type Cancel struct {
	Seq uint32
}

// Status starts every reply's body:
//
//	u32   code    StOK or an St* error
//	bytes msg     errors only
//	bytes detail  errors only, and only if set: StError's errno (u32
//	              big-endian), StRejected's private data
//
// An StOK reply's Msg follows it.
type Status struct {
	Code   uint32
	Msg    string
	Detail []byte
}

// Encode appends the status.
func (m *Status) Encode(e *Enc) {
	e.U32(m.Code)
	if m.Code == StOK {
		return
	}
	e.String(m.Msg)
	if m.Detail != nil {
		e.Bytes(m.Detail)
	}
}

// Decode reads the status; for StOK it leaves the reply's body in d.
func (m *Status) Decode(d *Dec) error {
	*m = Status{Code: d.U32()}
	if m.Code == StOK {
		return d.Err
	}
	m.Msg = d.String()
	if d.Err == nil && len(d.B) > 0 {
		m.Detail = d.Bytes()
	}
	return d.End()
}

// ErrnoDetail is the detail of an StError status for a system error:
// errno, u32 big-endian.
func ErrnoDetail(errno syscall.Errno) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(errno))
}

// DetailErrno is the system error of an StError status's detail, or 0.
func DetailErrno(detail []byte) syscall.Errno {
	if len(detail) != 4 {
		return 0
	}
	return syscall.Errno(binary.BigEndian.Uint32(detail))
}

// QPEvent (EvQP) is a QP's connection event (ibv.Event).
type QPEvent struct {
	QP   uint32 // the QP's handle
	Type uint32 // ibv.EventType
	Code uint16 // rdmap.Code of a Terminate
	Err  string // the event's error, "" for none
	// PrivateData is the listener's accept private data, in the
	// connecting side's EventEstablished (from Version 2 on).
	PrivateData []byte
	// Ext is, in EventEstablished, the RDMAP extensions the connection
	// negotiated, as Established has them (from Version 3 on): the event
	// may reach the client before the Connect's reply.
	Ext uint8
}

// DeviceRemoved (EvDeviceRemoved) says the device is going away, and why;
// the daemon closes the session after it.
type DeviceRemoved struct {
	Reason string
}

// SRQEvent (EvSRQ) is a shared receive queue's event: Type is
// ibv.EventSRQLimitReached (IBV_EVENT_SRQ_LIMIT_REACHED).
type SRQEvent struct {
	SRQ  uint32 // the SRQ's handle
	Type uint32 // ibv.EventType
}
