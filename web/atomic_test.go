package web

import (
	"testing"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// TestByteMapAtomic: the byte map names the Atomic Request and Atomic
// Response headers (RFC 7306), and the ladder draws them as a Read's
// request and response.
func TestByteMapAtomic(t *testing.T) {
	for _, tc := range []struct {
		op     rdmap.Opcode
		n      int
		f      Field
		class  string
		header int
	}{
		{rdmap.OpAtomicRequest, rdmap.AtomicRequestLen, FieldAtomicReq, "rreq", ddp.UntaggedHeaderLen},
		{rdmap.OpAtomicResponse, rdmap.AtomicResponseLen, FieldAtomicResp, "rresp", ddp.UntaggedHeaderLen},
	} {
		ulpdu := tc.header + tc.n
		fp := &inspect.FPDU{Len: 2 + ulpdu + 4, ULPDULen: ulpdu, Header: &inspect.Header{Op: tc.op.String(), Last: true}}
		var fields []Field
		for _, p := range fpduPieces(fp) {
			fields = append(fields, p.f)
		}
		if len(fields) < 4 || fields[len(fields)-2] != tc.f {
			t.Errorf("%v: pieces %v, want the %v before the CRC", tc.op, fields, tc.f)
		}
		if c, ok := opClass[tc.op.String()]; !ok || c[0] != tc.class {
			t.Errorf("%v's ladder class %v, want %s", tc.op, c, tc.class)
		}
		if tc.f.String() != "Atomic Request" && tc.f.String() != "Atomic Response" {
			t.Errorf("field name %q", tc.f)
		}
	}
}
