package offload

import (
	"encoding/binary"
	"testing"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// TestRxRFC7306IgnoredFields: the fields RFC 7306 has a sender set to zero
// and a receiver ignore do not change what the engine does with a peer's
// message — the Invalidate STag of all four new messages (§4.1) and the 28
// Reserved bits before an Atomic Request's AOpCode (§5.2.1): an Immediate
// Data message carrying them completes its receive with its value, an
// Atomic Request carrying them is performed and answered.
func TestRxRFC7306IgnoredFields(t *testing.T) {
	qp, _, rcq := immQP(t, true, false, mpa.ExtAll, 8)
	reg, err := qp.dev.Regions().Register(1, make([]byte, 64), rxAddr+0x1000, ibv.AccessLocalWrite|ibv.AccessRemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	qp.mu.Lock()
	qp.ird = 4
	qp.mu.Unlock()
	binary.NativeEndian.PutUint64(reg.Bytes()[8:], 40)
	if _, err := qp.PostRecv([]ibv.RecvWR{{ID: 9}}); err != nil {
		t.Fatal(err)
	}
	p := newPeerStream(true, false)
	var imm [rdmap.ImmediateDataLen]byte
	(&rdmap.Immediate{Data: 0x2a}).Marshal(imm[:])
	p.fpdu(ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpImmediate), ULPData: 0xdeadbeef, QN: ddp.QNSend, MSN: 1}, imm[:])
	m := rdmap.FetchAdd(5, reg.STag(), rxAddr+0x1000+8, 2, 0)
	m.Reserved = 0xabcdef1
	var req [rdmap.AtomicRequestLen]byte
	m.Marshal(req[:])
	p.fpdu(ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpAtomicRequest), ULPData: 0x01020304, QN: ddp.QNReadRequest, MSN: 1}, req[:])
	if err := feed(qp, p.out, len(p.out)); err != nil {
		t.Fatal(err)
	}
	if len(rcq.wcs) != 1 || rcq.wcs[0].ID != 9 || rcq.wcs[0].Status != ibv.WCSuccess || rcq.wcs[0].ImmData != 0x2a {
		t.Fatalf("receive completions %+v, want id 9 with immediate 0x2a", rcq.wcs)
	}
	if len(qp.irq) != 1 || !qp.irq[0].atomic || qp.irq[0].reqID != 5 || qp.irq[0].value != 40 {
		t.Fatalf("responses queued %+v, want request 5 with value 40", qp.irq)
	}
	if got := binary.NativeEndian.Uint64(reg.Bytes()[8:]); got != 42 {
		t.Fatalf("word %d, want 42", got)
	}
}
