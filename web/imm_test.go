package web

import (
	"testing"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// TestByteMapImmediate: the byte map names siwtun's extension block in an
// MPA frame's private data and the Immediate Data of an Immediate Data
// message (RFC 7306).
func TestByteMapImmediate(t *testing.T) {
	f := mpa.Frame{Rev: 2, CRC: true, Enhanced: true, IRD: 4, ORD: 4, PrivateData: []byte("hello"), Ext: mpa.ExtImmediate}
	b, err := f.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []Field
	for _, sp := range frameSpans(b, len(b)) {
		got = append(got, sp.Field)
	}
	want := []Field{FieldFrameKey, FieldFrameFlags, FieldFramePDLen, FieldFrameIRDORD, FieldFramePD, FieldFrameExt}
	if len(got) != len(want) {
		t.Fatalf("frame fields %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("frame fields %v, want %v", got, want)
		}
	}
	for _, op := range []rdmap.Opcode{rdmap.OpImmediate, rdmap.OpImmediateSE} {
		fp := &inspect.FPDU{Len: 32, ULPDULen: 26, Header: &inspect.Header{Op: op.String(), Last: true}}
		var fields []Field
		for _, p := range fpduPieces(fp) {
			fields = append(fields, p.f)
		}
		if len(fields) < 4 || fields[len(fields)-2] != FieldImmData {
			t.Errorf("%v: pieces %v, want the Immediate Data before the CRC", op, fields)
		}
	}
	if c, ok := opClass[rdmap.OpImmediate.String()]; !ok || c[0] != "send" {
		t.Errorf("Immediate Data's ladder class %v", c)
	}
}
