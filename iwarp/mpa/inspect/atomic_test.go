package inspect

import (
	"testing"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// TestAtomicHeaders: the checker names RFC 7306's Atomic Request and
// Atomic Response and shows their headers, as siwtun check and trace print
// them.
func TestAtomicHeaders(t *testing.T) {
	all := ^uint64(0)
	tests := []struct {
		op   rdmap.Opcode
		qn   uint32
		body func([]byte) int
		want string
	}{
		{rdmap.OpAtomicRequest, ddp.QNReadRequest, func(b []byte) int {
			m := rdmap.AtomicRequest{Op: rdmap.AtomicFetchAdd, ReqID: 4, STag: 0x1234, TO: 0x1008, AddSwap: 1}
			return m.Marshal(b)
		}, "FPDU 1 Atomic Request L qn 1 msn 3 mo 0 payload 0 [atomic FetchAdd id 4 stag 0x00001234 to 0x1008 add 0x1], len 76"},
		{rdmap.OpAtomicRequest, ddp.QNReadRequest, func(b []byte) int {
			m := rdmap.AtomicRequest{Op: rdmap.AtomicCmpSwap, ReqID: 5, STag: 0x1234, TO: 0x1008, Compare: 2, CompareMask: all, AddSwap: 3, AddSwapMask: all}
			return m.Marshal(b)
		}, "FPDU 1 Atomic Request L qn 1 msn 3 mo 0 payload 0 [atomic CmpSwap id 5 stag 0x00001234 to 0x1008 compare 0x2 swap 0x3], len 76"},
		// AOpCode 0x1 is Reserved (RFC 7306 §10.1): no Swap, shown by
		// its number and without operands.
		{rdmap.OpAtomicRequest, ddp.QNReadRequest, func(b []byte) int {
			m := rdmap.AtomicRequest{Op: rdmap.AtomicReserved, ReqID: 6, STag: 0x1234, TO: 0x1008, AddSwap: 3, AddSwapMask: all}
			return m.Marshal(b)
		}, "FPDU 1 Atomic Request L qn 1 msn 3 mo 0 payload 0 [atomic AOpCode(0x1) id 6 stag 0x00001234 to 0x1008], len 76"},
		{rdmap.OpAtomicResponse, ddp.QNAtomicResponse, func(b []byte) int {
			m := rdmap.AtomicResponse{ReqID: 5, Value: 42}
			return m.Marshal(b)
		}, "FPDU 1 Atomic Response L qn 3 msn 3 mo 0 payload 0 [atomic response id 5 value 0x2a], len 36"},
	}
	for _, tt := range tests {
		h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(tt.op), QN: tt.qn, MSN: 3}
		b := make([]byte, ddp.UntaggedHeaderLen+rdmap.AtomicRequestLen)
		n := h.Marshal(b)
		n += tt.body(b[n:])
		b = b[:n]
		f := FPDU{Index: 1, Len: 2 + n + 4 + (4-(2+n)%4)%4, Header: parseHeader(b, len(b)), Begins: true, Ends: true}
		if got := f.String(); got != tt.want {
			t.Errorf("got  %q\nwant %q", got, tt.want)
		}
	}
}
