package inspect

import (
	"testing"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// TestImmediateDataHeader: the checker names RFC 7306's Immediate Data
// messages and shows their Immediate Data, as siwtun check and trace print
// them.
func TestImmediateDataHeader(t *testing.T) {
	tests := []struct {
		op   rdmap.Opcode
		m    rdmap.Immediate
		want string
	}{
		{rdmap.OpImmediate, rdmap.Immediate{Data: 0x2a}, "FPDU 1 Immediate Data L qn 0 msn 3 mo 0 payload 0 [immediate data 0x0000002a], len 32"},
		{rdmap.OpImmediateSE, rdmap.Immediate{Data: 7}, "FPDU 1 Immediate Data with SE L qn 0 msn 3 mo 0 payload 0 [immediate data 0x00000007], len 32"},
		{rdmap.OpImmediate, rdmap.Immediate{Data: 1, Flags: rdmap.ImmSendFollows}, "FPDU 1 Immediate Data L qn 0 msn 3 mo 0 payload 0 [immediate data 0x00000001 (send follows)], len 32"},
	}
	for _, tt := range tests {
		h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(tt.op), QN: ddp.QNSend, MSN: 3}
		b := make([]byte, ddp.UntaggedHeaderLen+rdmap.ImmediateDataLen)
		n := h.Marshal(b)
		tt.m.Marshal(b[n:])
		f := FPDU{Index: 1, Len: 32, Header: parseHeader(b, len(b)), Begins: true, Ends: true}
		if got := f.String(); got != tt.want {
			t.Errorf("got  %q\nwant %q", got, tt.want)
		}
	}
}
