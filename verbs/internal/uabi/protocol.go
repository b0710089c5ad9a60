package uabi

import (
	"fmt"
	"net/netip"
	"reflect"
	"sync"
)

// OpInfo describes one op of the verbs socket: its request, its reply
// (after the reply's Status) and the descriptors each carries.
type OpInfo struct {
	Op         uint16
	Name       string
	Request    Msg
	RequestFDs int
	// Reply is nil for an op without a reply of its own (Cancel).
	Reply    Msg
	ReplyFDs int
}

// Ops is the verbs socket's protocol, every op with its request and reply
// type: the single source of truth for both ends. The Go client (package
// verbs) and the daemon (package verbs/uverbs) encode and decode with these
// types only, and a client in another language (the C library) is checked
// against this table: Fields lists each message's fields in wire order
// with their kinds and sizes, so a test or a generator can turn the table
// into a C header (CHeader does: testdata/siwtun_uabi.h).
// testdata/messages.golden holds sample bytes of every message.
//
//	op  name           request        fds  reply           fds
//	 1  Hello          Hello          0    HelloReply      0
//	 2  AllocPD        Empty          0    AllocPDReply    0
//	 3  DeallocPD      Ref            0    Empty           0
//	 4  RegMR          RegMR          1    RegMRReply      0
//	 5  DeregMR        Ref            0    Empty           0
//	 6  CreateCQ       CreateCQ       0    CreateCQReply   2
//	 7  DestroyCQ      Ref            0    Empty           0
//	 8  CreateQP       CreateQP       0    CreateQPReply   2
//	 9  DestroyQP      Ref            0    Empty           0
//	10  ModifyQP       ModifyQP       0    Empty           0
//	11  QueryQP        Ref            0    QueryQPReply    0
//	12  Connect        Connect        0    Established     0
//	13  Disconnect     Ref            0    Empty           0
//	14  Listen         Listen         0    ListenReply     0
//	15  CloseListener  Ref            0    Empty           0
//	16  GetRequest     Ref            0    ConnRequest     0
//	17  Accept         Accept         0    Established     0
//	18  Reject         Reject         0    Empty           0
//	19  Cancel         Cancel         0    none            -
//	20  CreateSRQ      CreateSRQ      0    CreateSRQReply  1
//	21  DestroySRQ     Ref            0    Empty           0
//	22  ModifySRQ      ModifySRQ      0    ModifySRQReply  1
//	23  QuerySRQ       Ref            0    QuerySRQReply   0
//	24  ReregMR        ReregMR        1    Empty           0
//	25  AllocMW        AllocMW        0    AllocMWReply    0
//	26  DeallocMW      Ref            0    Empty           0
//	27  ReservePort    ReservePort    0    ReservePortReply 0
//	28  ReleasePort    Ref            0    Empty           0
//
// RegMR's and ReregMR's requests carry the region's memfd; CreateCQ's reply the ring's
// memfd and the notification eventfd, CreateQP's the rings' memfd and the
// doorbell eventfd; CreateSRQ's and ModifySRQ's the SRQ ring's memfd.
// Connect's StRejected reply has the peer's private data
// as its Status detail. Cancel has no reply: the request it cancels
// replies StCanceled.
//
// Events (op OpEvent, sequence number 0) are a u32 kind and its body: see
// Events.
var Ops = []OpInfo{
	{Op: OpHello, Name: "Hello", Request: &Hello{}, Reply: &HelloReply{}},
	{Op: OpAllocPD, Name: "AllocPD", Request: &Empty{}, Reply: &AllocPDReply{}},
	{Op: OpDeallocPD, Name: "DeallocPD", Request: &Ref{}, Reply: &Empty{}},
	{Op: OpRegMR, Name: "RegMR", Request: &RegMR{}, RequestFDs: 1, Reply: &RegMRReply{}},
	{Op: OpDeregMR, Name: "DeregMR", Request: &Ref{}, Reply: &Empty{}},
	{Op: OpCreateCQ, Name: "CreateCQ", Request: &CreateCQ{}, Reply: &CreateCQReply{}, ReplyFDs: 2},
	{Op: OpDestroyCQ, Name: "DestroyCQ", Request: &Ref{}, Reply: &Empty{}},
	{Op: OpCreateQP, Name: "CreateQP", Request: &CreateQP{}, Reply: &CreateQPReply{}, ReplyFDs: 2},
	{Op: OpDestroyQP, Name: "DestroyQP", Request: &Ref{}, Reply: &Empty{}},
	{Op: OpModifyQP, Name: "ModifyQP", Request: &ModifyQP{}, Reply: &Empty{}},
	{Op: OpQueryQP, Name: "QueryQP", Request: &Ref{}, Reply: &QueryQPReply{}},
	{Op: OpConnect, Name: "Connect", Request: &Connect{}, Reply: &Established{}},
	{Op: OpDisconnect, Name: "Disconnect", Request: &Ref{}, Reply: &Empty{}},
	{Op: OpListen, Name: "Listen", Request: &Listen{}, Reply: &ListenReply{}},
	{Op: OpCloseListener, Name: "CloseListener", Request: &Ref{}, Reply: &Empty{}},
	{Op: OpGetRequest, Name: "GetRequest", Request: &Ref{}, Reply: &ConnRequest{}},
	{Op: OpAccept, Name: "Accept", Request: &Accept{}, Reply: &Established{}},
	{Op: OpReject, Name: "Reject", Request: &Reject{}, Reply: &Empty{}},
	{Op: OpCancel, Name: "Cancel", Request: &Cancel{}},
	{Op: OpCreateSRQ, Name: "CreateSRQ", Request: &CreateSRQ{}, Reply: &CreateSRQReply{}, ReplyFDs: 1},
	{Op: OpDestroySRQ, Name: "DestroySRQ", Request: &Ref{}, Reply: &Empty{}},
	{Op: OpModifySRQ, Name: "ModifySRQ", Request: &ModifySRQ{}, Reply: &ModifySRQReply{}, ReplyFDs: 1},
	{Op: OpQuerySRQ, Name: "QuerySRQ", Request: &Ref{}, Reply: &QuerySRQReply{}},
	{Op: OpReregMR, Name: "ReregMR", Request: &ReregMR{}, RequestFDs: 1, Reply: &Empty{}},
	{Op: OpAllocMW, Name: "AllocMW", Request: &AllocMW{}, Reply: &AllocMWReply{}},
	{Op: OpDeallocMW, Name: "DeallocMW", Request: &Ref{}, Reply: &Empty{}},
	{Op: OpReservePort, Name: "ReservePort", Request: &ReservePort{}, Reply: &ReservePortReply{}},
	{Op: OpReleasePort, Name: "ReleasePort", Request: &Ref{}, Reply: &Empty{}},
}

// EventInfo describes one kind of event.
type EventInfo struct {
	Kind uint32
	Name string
	Body Msg
}

// Events are the kinds of OpEvent messages with their bodies (after the
// u32 kind).
var Events = []EventInfo{
	{Kind: EvQP, Name: "QP", Body: &QPEvent{}},
	{Kind: EvDeviceRemoved, Name: "DeviceRemoved", Body: &DeviceRemoved{}},
	{Kind: EvSRQ, Name: "SRQ", Body: &SRQEvent{}},
}

// Lookup returns the description of op.
func Lookup(op uint16) (OpInfo, bool) {
	if op == 0 || int(op) > len(Ops) {
		return OpInfo{}, false
	}
	return Ops[op-1], true
}

// OpName is op's name, or "op N" for an unknown one.
func OpName(op uint16) string {
	if in, ok := Lookup(op &^ ReplyBit); ok {
		return in.Name
	}
	return fmt.Sprintf("op %d", op)
}

// NewRequest returns a fresh request of op to decode into.
func NewRequest(op uint16) (Msg, bool) {
	in, ok := Lookup(op)
	if !ok {
		return nil, false
	}
	return newMsg(in.Request), true
}

func newMsg(m Msg) Msg { return reflect.New(reflect.TypeOf(m).Elem()).Interface().(Msg) }

// Kind is how a field travels; a message struct's field types map to
// kinds: bool and uint8 u8, uint16 u16, uint32 u32, uint64 u64, string and
// []byte bytes, netip.AddrPort addr, and a nested struct is its fields.
type Kind string

// Field kinds, little-endian.
const (
	KindU8    Kind = "u8"    // 1 byte; a bool is 0 or 1
	KindU16   Kind = "u16"   // 2 bytes
	KindU32   Kind = "u32"   // 4 bytes
	KindU64   Kind = "u64"   // 8 bytes
	KindBytes Kind = "bytes" // u16 length, then at most 1024 bytes (strings too)
	KindAddr  Kind = "addr"  // u8 family (0 none, 4, 6), 16 bytes (IPv4-mapped for 4), u16 port
)

// AddrSize is the size of a KindAddr field.
const AddrSize = 1 + 16 + 2

// Field is one field of a message on the wire.
type Field struct {
	// Name is the Go field's name; a field of a nested struct is
	// Outer.Inner (Param.InitiatorDepth).
	Name string
	Kind Kind
	// Size is the field's size in bytes, 0 for KindBytes (2 + its length).
	Size int
}

var (
	addrPortType = reflect.TypeFor[netip.AddrPort]()
	bytesType    = reflect.TypeFor[[]byte]()
	plans        sync.Map // reflect.Type → []planField
)

// codec moves one field of a Go type: its kind, its encoder and decoder.
type codec struct {
	kind Kind
	size int
	enc  func(*Enc, reflect.Value)
	dec  func(*Dec, reflect.Value)
}

// codecs by Go type kind; netip.AddrPort and []byte are checked first.
var (
	addrCodec = codec{KindAddr, AddrSize,
		func(e *Enc, v reflect.Value) { e.AddrPort(v.Interface().(netip.AddrPort)) },
		func(d *Dec, v reflect.Value) { v.Set(reflect.ValueOf(d.AddrPort())) }}
	bytesCodec = codec{KindBytes, 0,
		func(e *Enc, v reflect.Value) { e.Bytes(v.Bytes()) },
		func(d *Dec, v reflect.Value) { v.SetBytes(d.Bytes()) }}
	codecs = map[reflect.Kind]codec{
		reflect.Bool: {KindU8, 1,
			func(e *Enc, v reflect.Value) { e.Bool(v.Bool()) },
			func(d *Dec, v reflect.Value) { v.SetBool(d.Bool()) }},
		reflect.Uint8: {KindU8, 1,
			func(e *Enc, v reflect.Value) { e.U8(uint8(v.Uint())) },
			func(d *Dec, v reflect.Value) { v.SetUint(uint64(d.U8())) }},
		reflect.Uint16: {KindU16, 2,
			func(e *Enc, v reflect.Value) { e.U16(uint16(v.Uint())) },
			func(d *Dec, v reflect.Value) { v.SetUint(uint64(d.U16())) }},
		reflect.Uint32: {KindU32, 4,
			func(e *Enc, v reflect.Value) { e.U32(uint32(v.Uint())) },
			func(d *Dec, v reflect.Value) { v.SetUint(uint64(d.U32())) }},
		reflect.Uint64: {KindU64, 8,
			func(e *Enc, v reflect.Value) { e.U64(v.Uint()) },
			func(d *Dec, v reflect.Value) { v.SetUint(d.U64()) }},
		reflect.String: {KindBytes, 0,
			func(e *Enc, v reflect.Value) { e.String(v.String()) },
			func(d *Dec, v reflect.Value) { v.SetString(d.String()) }},
	}
)

// planField is a Field with where it is in its struct and how it moves.
type planField struct {
	Field
	index []int
	codec codec
}

// Fields lists m's fields in wire order: its struct's fields, nested
// structs flattened.
func Fields(m Msg) []Field {
	p := plan(reflect.TypeOf(m).Elem())
	out := make([]Field, len(p))
	for i, f := range p {
		out[i] = f.Field
	}
	return out
}

// plan returns the fields of struct type t, computed once.
func plan(t reflect.Type) []planField {
	if p, ok := plans.Load(t); ok {
		return p.([]planField)
	}
	p, _ := plans.LoadOrStore(t, appendPlan(nil, "", nil, t))
	return p.([]planField)
}

func appendPlan(out []planField, prefix string, index []int, t reflect.Type) []planField {
	for f := range t.Fields() {
		name, idx := prefix+f.Name, append(index[:len(index):len(index)], f.Index...)
		c, ok := codecs[f.Type.Kind()]
		switch {
		case f.Type == addrPortType:
			c, ok = addrCodec, true
		case f.Type == bytesType:
			c, ok = bytesCodec, true
		case f.Type.Kind() == reflect.Struct:
			out = appendPlan(out, name+".", idx, f.Type)
			continue
		}
		if !ok {
			panic(fmt.Sprintf("uabi: field %s of %v: no wire kind for %v", name, t, f.Type))
		}
		out = append(out, planField{Field: Field{Name: name, Kind: c.kind, Size: c.size}, index: idx, codec: c})
	}
	return out
}

// Msg appends m's fields, in order.
func (e *Enc) Msg(m Msg) {
	v := reflect.ValueOf(m).Elem()
	for _, f := range plan(v.Type()) {
		f.codec.enc(e, v.FieldByIndex(f.index))
	}
}

// Msg reads m's fields, in order, and fails (ErrBadMessage) on a short body
// or trailing bytes.
func (d *Dec) Msg(m Msg) error {
	v := reflect.ValueOf(m).Elem()
	for _, f := range plan(v.Type()) {
		f.codec.dec(d, v.FieldByIndex(f.index))
	}
	return d.End()
}

// Message encodes a whole message of op with body m (nil: empty).
func (e *Enc) Message(op uint16, seq uint32, m Msg, nfds int) []byte {
	e.Begin(op, seq)
	if m != nil {
		e.Msg(m)
	}
	return e.Finish(nfds)
}

// Reply encodes a whole reply to op: st, then, if st is StOK, body m.
func (e *Enc) Reply(op uint16, seq uint32, st Status, m Msg, nfds int) []byte {
	e.Begin(op|ReplyBit, seq)
	st.Encode(e)
	if m != nil && st.Code == StOK {
		e.Msg(m)
	}
	return e.Finish(nfds)
}

// Event encodes a whole event of kind with body m.
func (e *Enc) Event(kind uint32, m Msg) []byte {
	e.Begin(OpEvent, 0)
	e.U32(kind)
	e.Msg(m)
	return e.Finish(0)
}

// Decode decodes body, a whole message body, into m.
func Decode(body []byte, m Msg) error {
	return (&Dec{B: body}).Msg(m)
}

// DecodeEvent decodes an event's body: its kind and a fresh body of that
// kind (nil on an error).
func DecodeEvent(body []byte) (uint32, Msg, error) {
	d := &Dec{B: body}
	kind := d.U32()
	for _, ev := range Events {
		if ev.Kind == kind {
			m := newMsg(ev.Body)
			if err := d.Msg(m); err != nil {
				return kind, nil, fmt.Errorf("%s event: %w", ev.Name, err)
			}
			return kind, m, nil
		}
	}
	if d.Err != nil {
		return 0, nil, d.Err
	}
	return kind, nil, fmt.Errorf("%w: unknown event kind %d", ErrBadMessage, kind)
}

// Bool appends b as a u8 (0 or 1).
func (e *Enc) Bool(b bool) {
	if b {
		e.U8(1)
	} else {
		e.U8(0)
	}
}

// Bool reads a u8; any value but 0 is true.
func (d *Dec) Bool() bool { return d.U8() != 0 }
