package uabi

import (
	"encoding/binary"
	"net/netip"
	"syscall"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// Msg is the body of one verbs-socket message: a request, a reply's body
// after its Status, or an event's body after its kind. Both ends encode
// and decode a message with the same type, so a field exists on both or on
// neither. Fields travel in the order of the struct's fields (Fields
// describes them; the tests check Encode against it).
type Msg interface {
	// Encode appends the message's fields.
	Encode(e *Enc)
	// Decode reads the fields and fails on a short body or trailing bytes.
	Decode(d *Dec) error
}

// Empty is the body of requests and replies that carry nothing.
type Empty struct{}

// Encode appends nothing.
func (*Empty) Encode(*Enc) {}

// Decode checks that the body is empty.
func (*Empty) Decode(d *Dec) error { return d.End() }

// Ref names one object of the session by its handle: the request of
// DeallocPD, DeregMR, DestroyCQ, DestroyQP, QueryQP, Disconnect,
// CloseListener and GetRequest.
type Ref struct {
	Handle uint32
}

// Encode appends the handle.
func (m *Ref) Encode(e *Enc) { e.U32(m.Handle) }

// Decode reads the handle.
func (m *Ref) Decode(d *Dec) error { m.Handle = d.U32(); return d.End() }

// Hello opens a session.
type Hello struct {
	// Version is the client's protocol version (Version).
	Version uint32
}

// Encode appends the version.
func (m *Hello) Encode(e *Enc) { e.U32(m.Version) }

// Decode reads the version.
func (m *Hello) Decode(d *Dec) error { m.Version = d.U32(); return d.End() }

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
}

func (m *HelloReply) caps() []*uint32 {
	return []*uint32{&m.VendorID, &m.VendorPartID, &m.MaxQP, &m.MaxQPWR, &m.MaxSGE, &m.MaxSGERead,
		&m.MaxCQ, &m.MaxCQE, &m.MaxMR, &m.MaxPD, &m.MaxQPRdAtom, &m.MaxQPInitRdAtom, &m.MaxInline, &m.MTU}
}

// Encode appends the fields.
func (m *HelloReply) Encode(e *Enc) {
	e.U32(m.Version)
	e.String(m.Name)
	e.String(m.FWVersion)
	e.U64(m.NodeGUID)
	for _, p := range m.caps() {
		e.U32(*p)
	}
}

// Decode reads the fields.
func (m *HelloReply) Decode(d *Dec) error {
	m.Version, m.Name, m.FWVersion, m.NodeGUID = d.U32(), d.String(), d.String(), d.U64()
	for _, p := range m.caps() {
		*p = d.U32()
	}
	return d.End()
}

// AllocPDReply is a new PD: its handle and its number.
type AllocPDReply struct {
	Handle, PDNum uint32
}

// Encode appends the fields.
func (m *AllocPDReply) Encode(e *Enc) { e.U32(m.Handle); e.U32(m.PDNum) }

// Decode reads the fields.
func (m *AllocPDReply) Decode(d *Dec) error { m.Handle, m.PDNum = d.U32(), d.U32(); return d.End() }

// RegMR registers Length bytes at Offset of the memfd the message carries
// (the client's AllocBuffer memory) in PD, at tagged offset IOVA.
type RegMR struct {
	PD                   uint32
	Offset, Length, IOVA uint64
	Access               uint32 // ibv.Access
}

// Encode appends the fields.
func (m *RegMR) Encode(e *Enc) {
	e.U32(m.PD)
	e.U64(m.Offset)
	e.U64(m.Length)
	e.U64(m.IOVA)
	e.U32(m.Access)
}

// Decode reads the fields.
func (m *RegMR) Decode(d *Dec) error {
	m.PD, m.Offset, m.Length, m.IOVA, m.Access = d.U32(), d.U64(), d.U64(), d.U64(), d.U32()
	return d.End()
}

// RegMRReply is the new region's handle and STag.
type RegMRReply struct {
	Handle, STag uint32
}

// Encode appends the fields.
func (m *RegMRReply) Encode(e *Enc) { e.U32(m.Handle); e.U32(m.STag) }

// Decode reads the fields.
func (m *RegMRReply) Decode(d *Dec) error { m.Handle, m.STag = d.U32(), d.U32(); return d.End() }

// CreateCQ asks for a completion queue of Depth entries.
type CreateCQ struct {
	Depth uint32
}

// Encode appends the depth.
func (m *CreateCQ) Encode(e *Enc) { e.U32(m.Depth) }

// Decode reads the depth.
func (m *CreateCQ) Decode(d *Dec) error { m.Depth = d.U32(); return d.End() }

// CreateCQReply is the new CQ's handle and its ring: Count entries in Size
// bytes of the memfd the reply carries first; the second descriptor is
// the notification eventfd.
type CreateCQReply struct {
	Handle, Count, Size uint32
}

// Encode appends the fields.
func (m *CreateCQReply) Encode(e *Enc) { e.U32(m.Handle); e.U32(m.Count); e.U32(m.Size) }

// Decode reads the fields.
func (m *CreateCQReply) Decode(d *Dec) error {
	m.Handle, m.Count, m.Size = d.U32(), d.U32(), d.U32()
	return d.End()
}

// CreateQP asks for a QP in PD completing into SendCQ and RecvCQ.
type CreateQP struct {
	PD, SendCQ, RecvCQ   uint32
	MaxSendWR, MaxRecvWR uint32
	SignalAll            bool
}

// Encode appends the fields.
func (m *CreateQP) Encode(e *Enc) {
	e.U32(m.PD)
	e.U32(m.SendCQ)
	e.U32(m.RecvCQ)
	e.U32(m.MaxSendWR)
	e.U32(m.MaxRecvWR)
	e.Bool(m.SignalAll)
}

// Decode reads the fields.
func (m *CreateQP) Decode(d *Dec) error {
	m.PD, m.SendCQ, m.RecvCQ, m.MaxSendWR, m.MaxRecvWR, m.SignalAll = d.U32(), d.U32(), d.U32(), d.U32(), d.U32(), d.Bool()
	return d.End()
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

// Encode appends the fields.
func (m *CreateQPReply) Encode(e *Enc) {
	for _, v := range [...]uint32{m.Handle, m.Num, m.SQCount, m.RQCount, m.SQBytes, m.Total} {
		e.U32(v)
	}
}

// Decode reads the fields.
func (m *CreateQPReply) Decode(d *Dec) error {
	m.Handle, m.Num, m.SQCount, m.RQCount, m.SQBytes, m.Total = d.U32(), d.U32(), d.U32(), d.U32(), d.U32(), d.U32()
	return d.End()
}

// ModifyQP moves a QP to State (ibv.QPState).
type ModifyQP struct {
	Handle, State uint32
}

// Encode appends the fields.
func (m *ModifyQP) Encode(e *Enc) { e.U32(m.Handle); e.U32(m.State) }

// Decode reads the fields.
func (m *ModifyQP) Decode(d *Dec) error { m.Handle, m.State = d.U32(), d.U32(); return d.End() }

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
}

func (m *QueryQPReply) depths() []*uint32 {
	return []*uint32{&m.IRD, &m.ORD, &m.SQDepth, &m.SQUse, &m.RQDepth, &m.RQUse, &m.EMSS}
}

// Encode appends the fields.
func (m *QueryQPReply) Encode(e *Enc) {
	e.U32(m.State)
	e.AddrPort(m.Local)
	e.AddrPort(m.Remote)
	e.U8(m.Rev)
	e.Bool(m.CRC)
	e.Bool(m.MarkersTx)
	e.Bool(m.MarkersRx)
	for _, p := range m.depths() {
		e.U32(*p)
	}
}

// Decode reads the fields.
func (m *QueryQPReply) Decode(d *Dec) error {
	m.State, m.Local, m.Remote = d.U32(), d.AddrPort(), d.AddrPort()
	m.Rev, m.CRC, m.MarkersTx, m.MarkersRx = d.U8(), d.Bool(), d.Bool(), d.Bool()
	for _, p := range m.depths() {
		*p = d.U32()
	}
	return d.End()
}

// QueryQPReplyOf is the reply describing in.
func QueryQPReplyOf(in ibv.Info) QueryQPReply {
	return QueryQPReply{State: uint32(in.State), Local: in.Local, Remote: in.Remote,
		Rev: in.Params.Rev, CRC: in.Params.CRC, MarkersTx: in.Params.MarkersTx, MarkersRx: in.Params.MarkersRx,
		IRD: uint32(in.IRD), ORD: uint32(in.ORD), SQDepth: uint32(in.SQDepth), SQUse: uint32(in.SQUse),
		RQDepth: uint32(in.RQDepth), RQUse: uint32(in.RQUse), EMSS: uint32(in.EMSS)}
}

// Info is the QP description of the reply, for QP number num.
func (m *QueryQPReply) Info(num uint32) ibv.Info {
	in := ibv.Info{Num: num, State: ibv.QPState(m.State), Local: m.Local, Remote: m.Remote,
		IRD: int(m.IRD), ORD: int(m.ORD), SQDepth: int(m.SQDepth), SQUse: int(m.SQUse),
		RQDepth: int(m.RQDepth), RQUse: int(m.RQUse), EMSS: int(m.EMSS)}
	in.Params.Rev, in.Params.CRC, in.Params.MarkersTx, in.Params.MarkersRx = m.Rev, m.CRC, m.MarkersTx, m.MarkersRx
	in.Params.IRD, in.Params.ORD = uint16(in.IRD), uint16(in.ORD)
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

func (m *ConnParam) encode(e *Enc) {
	e.Bytes(m.PrivateData)
	e.U16(m.ResponderResources)
	e.U16(m.InitiatorDepth)
}

func (m *ConnParam) decode(d *Dec) {
	m.PrivateData, m.ResponderResources, m.InitiatorDepth = d.Bytes(), d.U16(), d.U16()
}

// Connect connects QP Handle to Remote; the reply comes when the
// connection is established, rejected (StRejected) or failed.
type Connect struct {
	Handle uint32
	Remote netip.AddrPort
	Param  ConnParam
}

// Encode appends the fields.
func (m *Connect) Encode(e *Enc) { e.U32(m.Handle); e.AddrPort(m.Remote); m.Param.encode(e) }

// Decode reads the fields.
func (m *Connect) Decode(d *Dec) error {
	m.Handle, m.Remote = d.U32(), d.AddrPort()
	m.Param.decode(d)
	return d.End()
}

// Listen listens for connection requests on Addr.
type Listen struct {
	Addr    netip.AddrPort
	Backlog uint32
}

// Encode appends the fields.
func (m *Listen) Encode(e *Enc) { e.AddrPort(m.Addr); e.U32(m.Backlog) }

// Decode reads the fields.
func (m *Listen) Decode(d *Dec) error { m.Addr, m.Backlog = d.AddrPort(), d.U32(); return d.End() }

// ListenReply is the new listener's handle and bound address.
type ListenReply struct {
	Handle uint32
	Addr   netip.AddrPort
}

// Encode appends the fields.
func (m *ListenReply) Encode(e *Enc) { e.U32(m.Handle); e.AddrPort(m.Addr) }

// Decode reads the fields.
func (m *ListenReply) Decode(d *Dec) error { m.Handle, m.Addr = d.U32(), d.AddrPort(); return d.End() }

// ConnRequest is GetRequest's reply: a connection request's handle, its
// initiator, the MPA Request's private data and IRD/ORD.
type ConnRequest struct {
	Handle      uint32
	Remote      netip.AddrPort
	PrivateData []byte
	IRD, ORD    uint16
}

// Encode appends the fields.
func (m *ConnRequest) Encode(e *Enc) {
	e.U32(m.Handle)
	e.AddrPort(m.Remote)
	e.Bytes(m.PrivateData)
	e.U16(m.IRD)
	e.U16(m.ORD)
}

// Decode reads the fields.
func (m *ConnRequest) Decode(d *Dec) error {
	m.Handle, m.Remote, m.PrivateData, m.IRD, m.ORD = d.U32(), d.AddrPort(), d.Bytes(), d.U16(), d.U16()
	return d.End()
}

// Accept accepts connection request Request on QP.
type Accept struct {
	Request, QP uint32
	Param       ConnParam
}

// Encode appends the fields.
func (m *Accept) Encode(e *Enc) { e.U32(m.Request); e.U32(m.QP); m.Param.encode(e) }

// Decode reads the fields.
func (m *Accept) Decode(d *Dec) error {
	m.Request, m.QP = d.U32(), d.U32()
	m.Param.decode(d)
	return d.End()
}

// Reject rejects connection request Request with private data.
type Reject struct {
	Request     uint32
	PrivateData []byte
}

// Encode appends the fields.
func (m *Reject) Encode(e *Enc) { e.U32(m.Request); e.Bytes(m.PrivateData) }

// Decode reads the fields.
func (m *Reject) Decode(d *Dec) error { m.Request, m.PrivateData = d.U32(), d.Bytes(); return d.End() }

// Cancel asks the daemon to end the pending request Seq early (a Connect
// or GetRequest whose context ended); it has no reply of its own, the
// canceled request's reply says StCanceled.
type Cancel struct {
	Seq uint32
}

// Encode appends the sequence number.
func (m *Cancel) Encode(e *Enc) { e.U32(m.Seq) }

// Decode reads the sequence number.
func (m *Cancel) Decode(d *Dec) error { m.Seq = d.U32(); return d.End() }

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
}

// Encode appends the fields.
func (m *QPEvent) Encode(e *Enc) { e.U32(m.QP); e.U32(m.Type); e.U16(m.Code); e.String(m.Err) }

// Decode reads the fields.
func (m *QPEvent) Decode(d *Dec) error {
	m.QP, m.Type, m.Code, m.Err = d.U32(), d.U32(), d.U16(), d.String()
	return d.End()
}

// DeviceRemoved (EvDeviceRemoved) says the device is going away, and why;
// the daemon closes the session after it.
type DeviceRemoved struct {
	Reason string
}

// Encode appends the reason.
func (m *DeviceRemoved) Encode(e *Enc) { e.String(m.Reason) }

// Decode reads the reason.
func (m *DeviceRemoved) Decode(d *Dec) error { m.Reason = d.String(); return d.End() }
