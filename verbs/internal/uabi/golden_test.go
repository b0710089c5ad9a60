package uabi

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

// The messages of testdata/messages.golden were captured from the
// field-by-field encoders of the client (verbs/remote.go,
// verbs/remote_rings.go) and the daemon (verbs/uverbs) before the messages
// had one definition here: the sample values below, written the way those
// encoders wrote them. The message structs must keep producing these bytes.
var (
	sampleV4    = netip.MustParseAddrPort("198.18.0.2:7174")
	sampleV6    = netip.MustParseAddrPort("[2001:db8::1]:4791")
	samplePData = []byte("pdata")
)

const sampleSeq = 7

type goldenMsg struct {
	name string
	op   uint16
	nfds int
	body func(*Enc)
}

func oldConnParam(e *Enc) {
	e.Bytes(samplePData)
	e.U16(16)
	e.U16(4)
}

func oldStatus(st uint32, msg string, extra []byte) func(*Enc) {
	return func(e *Enc) {
		e.U32(st)
		if st != StOK {
			e.String(msg)
		}
		if extra != nil {
			e.Bytes(extra)
		}
	}
}

func oldReply(body func(*Enc)) func(*Enc) {
	return func(e *Enc) {
		e.U32(StOK)
		if body != nil {
			body(e)
		}
	}
}

func oldMessages() []goldenMsg {
	h := func(e *Enc) { e.U32(0x11) }
	return []goldenMsg{
		{"hello", OpHello, 0, func(e *Enc) { e.U32(Version) }},
		{"hello reply", OpHello | ReplyBit, 0, oldReply(func(e *Enc) {
			e.U32(Version)
			e.String("siwtun0")
			e.String("0.1.0")
			e.U64(0x0123456789abcdef)
			for i, v := range []int{0x736977, 1, 1024, 4096, 6, 1, 256, 65536, 4096, 512, 16, 16, 256, 1500} {
				e.U32(uint32(v + i<<24))
			}
		})},
		{"alloc pd", OpAllocPD, 0, nil},
		{"alloc pd reply", OpAllocPD | ReplyBit, 0, oldReply(func(e *Enc) { e.U32(0x11); e.U32(3) })},
		{"dealloc pd", OpDeallocPD, 0, h},
		{"dealloc pd reply", OpDeallocPD | ReplyBit, 0, oldReply(nil)},
		{"reg mr", OpRegMR, 1, func(e *Enc) {
			e.U32(0x11)
			e.U64(0x1000)
			e.U64(0x20000)
			e.U64(0x7f0000001000)
			e.U32(7)
		}},
		{"reg mr reply", OpRegMR | ReplyBit, 0, oldReply(func(e *Enc) { e.U32(0x12); e.U32(0x100) })},
		{"dereg mr", OpDeregMR, 0, h},
		{"dereg mr reply", OpDeregMR | ReplyBit, 0, oldReply(nil)},
		{"create cq", OpCreateCQ, 0, func(e *Enc) { e.U32(64) }},
		{"create cq reply", OpCreateCQ | ReplyBit, 2, oldReply(func(e *Enc) { e.U32(0x13); e.U32(64); e.U32(8192) })},
		{"destroy cq", OpDestroyCQ, 0, h},
		{"destroy cq reply", OpDestroyCQ | ReplyBit, 0, oldReply(nil)},
		{"create qp", OpCreateQP, 0, func(e *Enc) {
			e.U32(0x11)
			e.U32(0x13)
			e.U32(0x14)
			e.U32(16)
			e.U32(32)
			e.U8(1)
		}},
		{"create qp reply", OpCreateQP | ReplyBit, 2, oldReply(func(e *Enc) {
			e.U32(0x15)
			e.U32(2)
			e.U32(16)
			e.U32(32)
			e.U32(16384)
			e.U32(24576)
		})},
		{"destroy qp", OpDestroyQP, 0, h},
		{"destroy qp reply", OpDestroyQP | ReplyBit, 0, oldReply(nil)},
		{"modify qp", OpModifyQP, 0, func(e *Enc) { e.U32(0x15); e.U32(6) }},
		{"modify qp reply", OpModifyQP | ReplyBit, 0, oldReply(nil)},
		{"query qp", OpQueryQP, 0, h},
		{"query qp reply", OpQueryQP | ReplyBit, 0, oldReply(func(e *Enc) {
			e.U32(3)
			e.AddrPort(sampleV4)
			e.AddrPort(sampleV6)
			e.U8(2)
			e.U8(1)
			e.U8(0)
			e.U8(1)
			for _, v := range []int{16, 4, 32, 3, 64, 5, 1420} {
				e.U32(uint32(v))
			}
		})},
		{"connect", OpConnect, 0, func(e *Enc) { e.U32(0x15); e.AddrPort(sampleV4); oldConnParam(e) }},
		{"connect reply", OpConnect | ReplyBit, 0, oldReply(nil)},
		{"disconnect", OpDisconnect, 0, h},
		{"disconnect reply", OpDisconnect | ReplyBit, 0, oldReply(nil)},
		{"listen", OpListen, 0, func(e *Enc) { e.AddrPort(sampleV6); e.U32(8) }},
		{"listen reply", OpListen | ReplyBit, 0, oldReply(func(e *Enc) { e.U32(0x16); e.AddrPort(sampleV6) })},
		{"listen any", OpListen, 0, func(e *Enc) { e.AddrPort(netip.AddrPort{}); e.U32(0) }},
		{"close listener", OpCloseListener, 0, h},
		{"close listener reply", OpCloseListener | ReplyBit, 0, oldReply(nil)},
		{"get request", OpGetRequest, 0, h},
		{"get request reply", OpGetRequest | ReplyBit, 0, oldReply(func(e *Enc) {
			e.U32(0x17)
			e.AddrPort(sampleV4)
			e.Bytes(samplePData)
			e.U16(16)
			e.U16(4)
		})},
		{"accept", OpAccept, 0, func(e *Enc) { e.U32(0x17); e.U32(0x15); oldConnParam(e) }},
		{"accept reply", OpAccept | ReplyBit, 0, oldReply(nil)},
		{"reject", OpReject, 0, func(e *Enc) { e.U32(0x17); e.Bytes(samplePData) }},
		{"reject reply", OpReject | ReplyBit, 0, oldReply(nil)},
		{"cancel", OpCancel, 0, func(e *Enc) { e.U32(5) }},
		{"error reply", OpConnect | ReplyBit, 0, oldStatus(StBadHandle, "no QP with handle 17", nil)},
		{"errno reply", OpConnect | ReplyBit, 0, oldStatus(StError, "connection refused", binary.BigEndian.AppendUint32(nil, 111))},
		{"rejected reply", OpConnect | ReplyBit, 0, oldStatus(StRejected, "MPA markers rejected", samplePData)},
		{"qp event", OpEvent, 0, func(e *Enc) {
			e.U32(EvQP)
			e.U32(0x15)
			e.U32(2)
			e.U16(0x0102)
			e.String("peer reset")
		}},
		{"device removed event", OpEvent, 0, func(e *Enc) { e.U32(EvDeviceRemoved); e.String("daemon shutting down") }},
	}
}

// packet returns m as a whole packet (events have sequence number 0).
func packet(op uint16, nfds int, body func(*Enc)) []byte {
	var e Enc
	seq := uint32(sampleSeq)
	if op == OpEvent {
		seq = 0
	}
	e.Begin(op, seq)
	if body != nil {
		body(&e)
	}
	return e.Finish(nfds)
}

func goldenText(msgs []goldenMsg) []byte {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "%-22s %x\n", m.name+":", packet(m.op, m.nfds, m.body))
	}
	return []byte(b.String())
}

func TestMessagesGolden(t *testing.T) {
	testkit.Golden(t, "testdata/messages.golden", goldenText(oldMessages()))
}
