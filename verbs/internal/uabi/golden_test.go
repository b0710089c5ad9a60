package uabi

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

// The messages of testdata/messages.golden were captured from the
// field-by-field encoders of the client (verbs/remote.go,
// verbs/remote_rings.go) and the daemon (verbs/uverbs) before the messages
// had one definition here (commit 3f21fd3): the sample values below,
// written the way those encoders wrote them. The message types must keep
// producing these bytes.
var (
	sampleV4    = netip.MustParseAddrPort("198.18.0.2:7174")
	sampleV6    = netip.MustParseAddrPort("[2001:db8::1]:4791")
	samplePData = []byte("pdata")
)

const sampleSeq = 7

// sample is one message of the golden file: a request (st nil), a reply
// (st its status) or an event (op OpEvent, kind its kind).
type sample struct {
	name string
	op   uint16
	st   *Status
	kind uint32
	m    Msg
	nfds int
}

var (
	sampleParam = ConnParam{PrivateData: samplePData, ResponderResources: 16, InitiatorDepth: 4}
	sampleRef   = &Ref{Handle: 0x11}
	ok          = &Status{}
)

func samples() []sample {
	return []sample{
		{name: "hello", op: OpHello, m: &Hello{Version: Version}},
		{name: "hello reply", op: OpHello, st: ok, m: &HelloReply{Version: Version, Name: "siwtun0", FWVersion: "0.1.0",
			NodeGUID: 0x0123456789abcdef, VendorID: 0x736977, VendorPartID: 1 + 1<<24, MaxQP: 1024 + 2<<24,
			MaxQPWR: 4096 + 3<<24, MaxSGE: 6 + 4<<24, MaxSGERead: 1 + 5<<24, MaxCQ: 256 + 6<<24,
			MaxCQE: 65536 + 7<<24, MaxMR: 4096 + 8<<24, MaxPD: 512 + 9<<24, MaxQPRdAtom: 16 + 10<<24,
			MaxQPInitRdAtom: 16 + 11<<24, MaxInline: 256 + 12<<24, MTU: 1500 + 13<<24,
			MaxSRQ: 1024 + 14<<24, MaxSRQWR: 16384 + 15<<24, MaxSRQSGE: 6 + 16<<24,
			AtomicCap: 1 + 17<<24, MaxMW: 4096 + 18<<24}},
		{name: "alloc pd", op: OpAllocPD, m: &Empty{}},
		{name: "alloc pd reply", op: OpAllocPD, st: ok, m: &AllocPDReply{Handle: 0x11, PDNum: 3}},
		{name: "dealloc pd", op: OpDeallocPD, m: sampleRef},
		{name: "dealloc pd reply", op: OpDeallocPD, st: ok, m: &Empty{}},
		{name: "reg mr", op: OpRegMR, nfds: 1, m: &RegMR{PD: 0x11, Offset: 0x1000, Length: 0x20000, IOVA: 0x7f0000001000, Access: 7}},
		{name: "reg mr reply", op: OpRegMR, st: ok, m: &RegMRReply{Handle: 0x12, STag: 0x100}},
		{name: "dereg mr", op: OpDeregMR, m: sampleRef},
		{name: "dereg mr reply", op: OpDeregMR, st: ok, m: &Empty{}},
		{name: "create cq", op: OpCreateCQ, m: &CreateCQ{Depth: 64}},
		{name: "create cq reply", op: OpCreateCQ, st: ok, nfds: 2, m: &CreateCQReply{Handle: 0x13, Count: 64, Size: 8192}},
		{name: "destroy cq", op: OpDestroyCQ, m: sampleRef},
		{name: "destroy cq reply", op: OpDestroyCQ, st: ok, m: &Empty{}},
		{name: "create qp", op: OpCreateQP, m: &CreateQP{PD: 0x11, SendCQ: 0x13, RecvCQ: 0x14, MaxSendWR: 16, MaxRecvWR: 32, SignalAll: true}},
		{name: "create qp srq", op: OpCreateQP, m: &CreateQP{PD: 0x11, SendCQ: 0x13, RecvCQ: 0x14, MaxSendWR: 16, MaxRecvWR: 1, SRQ: 0x18}},
		{name: "create qp reply", op: OpCreateQP, st: ok, nfds: 2, m: &CreateQPReply{Handle: 0x15, Num: 2, SQCount: 16, RQCount: 32,
			SQBytes: 16384, Total: 24576}},
		{name: "destroy qp", op: OpDestroyQP, m: sampleRef},
		{name: "destroy qp reply", op: OpDestroyQP, st: ok, m: &Empty{}},
		{name: "modify qp", op: OpModifyQP, m: &ModifyQP{Handle: 0x15, State: 6}},
		{name: "modify qp reply", op: OpModifyQP, st: ok, m: &Empty{}},
		{name: "query qp", op: OpQueryQP, m: sampleRef},
		{name: "query qp reply", op: OpQueryQP, st: ok, m: &QueryQPReply{State: 3, Local: sampleV4, Remote: sampleV6,
			Rev: 2, CRC: true, MarkersRx: true, IRD: 16, ORD: 4, SQDepth: 32, SQUse: 3, RQDepth: 64, RQUse: 5, EMSS: 1420, Ext: 1}},
		{name: "connect", op: OpConnect, m: &Connect{Handle: 0x15, Remote: sampleV4, Param: sampleParam}},
		{name: "connect reply", op: OpConnect, st: ok, m: &Established{Ext: 1}},
		{name: "disconnect", op: OpDisconnect, m: sampleRef},
		{name: "disconnect reply", op: OpDisconnect, st: ok, m: &Empty{}},
		{name: "listen", op: OpListen, m: &Listen{Addr: sampleV6, Backlog: 8}},
		{name: "listen reply", op: OpListen, st: ok, m: &ListenReply{Handle: 0x16, Addr: sampleV6}},
		{name: "listen any", op: OpListen, m: &Listen{}},
		{name: "close listener", op: OpCloseListener, m: sampleRef},
		{name: "close listener reply", op: OpCloseListener, st: ok, m: &Empty{}},
		{name: "get request", op: OpGetRequest, m: sampleRef},
		{name: "get request reply", op: OpGetRequest, st: ok, m: &ConnRequest{Handle: 0x17, Remote: sampleV4,
			PrivateData: samplePData, IRD: 16, ORD: 4}},
		{name: "accept", op: OpAccept, m: &Accept{Request: 0x17, QP: 0x15, Param: sampleParam}},
		{name: "accept reply", op: OpAccept, st: ok, m: &Established{Ext: 1}},
		{name: "reject", op: OpReject, m: &Reject{Request: 0x17, PrivateData: samplePData}},
		{name: "reject reply", op: OpReject, st: ok, m: &Empty{}},
		{name: "cancel", op: OpCancel, m: &Cancel{Seq: 5}},
		{name: "create srq", op: OpCreateSRQ, m: &CreateSRQ{PD: 0x11, MaxWR: 100, Limit: 10}},
		{name: "create srq reply", op: OpCreateSRQ, st: ok, nfds: 1, m: &CreateSRQReply{Handle: 0x18, Count: 128, Size: 16384}},
		{name: "destroy srq", op: OpDestroySRQ, m: sampleRef},
		{name: "destroy srq reply", op: OpDestroySRQ, st: ok, m: &Empty{}},
		{name: "modify srq", op: OpModifySRQ, m: &ModifySRQ{Handle: 0x18, Mask: 3, MaxWR: 200, Limit: 20}},
		{name: "modify srq reply", op: OpModifySRQ, st: ok, nfds: 1, m: &ModifySRQReply{New: true, Count: 256, Size: 32768}},
		{name: "query srq", op: OpQuerySRQ, m: sampleRef},
		{name: "query srq reply", op: OpQuerySRQ, st: ok, m: &QuerySRQReply{MaxWR: 200, MaxSGE: 6, Limit: 20}},
		{name: "rereg mr", op: OpReregMR, nfds: 1, m: &ReregMR{Handle: 0x12, PD: 0x11, Offset: 0x3000, Length: 0x1000, IOVA: 0x7f0000003000, Access: 1}},
		{name: "rereg mr reply", op: OpReregMR, st: ok, m: &Empty{}},
		{name: "alloc mw", op: OpAllocMW, m: &AllocMW{PD: 0x11, Type: 2}},
		{name: "alloc mw reply", op: OpAllocMW, st: ok, m: &AllocMWReply{Handle: 0x19, RKey: 0x00abcd5a}},
		{name: "dealloc mw", op: OpDeallocMW, m: sampleRef},
		{name: "dealloc mw reply", op: OpDeallocMW, st: ok, m: &Empty{}},
		{name: "reserve port", op: OpReservePort, m: &ReservePort{Addr: netip.AddrPortFrom(sampleV4.Addr(), 0)}},
		{name: "reserve port reply", op: OpReservePort, st: ok, m: &ReservePortReply{Handle: 0x1a, Addr: sampleV4}},
		{name: "release port", op: OpReleasePort, m: sampleRef},
		{name: "release port reply", op: OpReleasePort, st: ok, m: &Empty{}},
		{name: "error reply", op: OpConnect, st: &Status{Code: StBadHandle, Msg: "no QP with handle 17"}},
		{name: "errno reply", op: OpConnect, st: &Status{Code: StError, Msg: "connection refused", Detail: ErrnoDetail(111)}},
		{name: "rejected reply", op: OpConnect, st: &Status{Code: StRejected, Msg: "MPA markers rejected", Detail: samplePData}},
		{name: "qp event", op: OpEvent, kind: EvQP, m: &QPEvent{QP: 0x15, Type: 2, Code: 0x0102, Err: "peer reset"}},
		{name: "established event", op: OpEvent, kind: EvQP, m: &QPEvent{QP: 0x15, Type: 1, PrivateData: []byte("pd"), Ext: 1}},
		{name: "device removed event", op: OpEvent, kind: EvDeviceRemoved, m: &DeviceRemoved{Reason: "daemon shutting down"}},
		{name: "srq event", op: OpEvent, kind: EvSRQ, m: &SRQEvent{SRQ: 0x18, Type: 5}},
	}
}

// packet encodes s as a whole packet.
func (s sample) packet() []byte {
	var e Enc
	switch {
	case s.op == OpEvent:
		return e.Event(s.kind, s.m)
	case s.st != nil:
		return e.Reply(s.op, sampleSeq, *s.st, s.m, s.nfds)
	}
	return e.Message(s.op, sampleSeq, s.m, s.nfds)
}

func goldenText(msgs []sample) []byte {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "%-22s %x\n", m.name+":", m.packet())
	}
	return []byte(b.String())
}

func TestMessagesGolden(t *testing.T) {
	testkit.Golden(t, "testdata/messages.golden", goldenText(samples()))
}
