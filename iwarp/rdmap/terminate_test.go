package rdmap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

// TestCodeTable pins every named Terminate code to its (layer, etype,
// ecode) triple, i.e. to the IANA RDDP registry (RFC 6580, listing RFC 5040
// §7.1 and RFC 5041 §7.2), to siw's iwarp.h enums and to Wireshark's value
// strings, and checks its String form.
func TestCodeTable(t *testing.T) {
	tests := []struct {
		name         string
		code         Code
		layer        Layer
		etype, ecode uint8
		str          string
	}{
		{"RDMAP local catastrophic", TermRDMAPLocalCatastrophic, LayerRDMAP, 0, 0x00, "RDMAP/local-catastrophic/local catastrophic error (0x00)"},
		{"RDMAP invalid STag", TermRDMAPInvalidSTag, LayerRDMAP, 1, 0x00, "RDMAP/remote-protection/invalid STag (0x00)"},
		{"RDMAP base bounds", TermRDMAPBaseBounds, LayerRDMAP, 1, 0x01, "RDMAP/remote-protection/base or bounds violation (0x01)"},
		{"RDMAP access", TermRDMAPAccess, LayerRDMAP, 1, 0x02, "RDMAP/remote-protection/access rights violation (0x02)"},
		{"RDMAP stag not assoc", TermRDMAPStagNotAssoc, LayerRDMAP, 1, 0x03, "RDMAP/remote-protection/STag not associated with RDMAP stream (0x03)"},
		{"RDMAP TO wrap", TermRDMAPTOWrap, LayerRDMAP, 1, 0x04, "RDMAP/remote-protection/TO wrap (0x04)"},
		{"RDMAP prot cannot invalidate", TermRDMAPProtCannotInvalidate, LayerRDMAP, 1, 0x09, "RDMAP/remote-protection/STag cannot be invalidated (0x09)"},
		{"RDMAP prot unspecified", TermRDMAPProtUnspecified, LayerRDMAP, 1, 0xff, "RDMAP/remote-protection/unspecified error (0xff)"},
		{"RDMAP bad version", TermRDMAPBadVersion, LayerRDMAP, 2, 0x05, "RDMAP/remote-operation/invalid RDMAP version (0x05)"},
		{"RDMAP unexpected op", TermRDMAPUnexpectedOp, LayerRDMAP, 2, 0x06, "RDMAP/remote-operation/unexpected opcode (0x06)"},
		{"RDMAP catastrophic stream", TermRDMAPCatastrophicStream, LayerRDMAP, 2, 0x07, "RDMAP/remote-operation/catastrophic error, localized to RDMAP stream (0x07)"},
		{"RDMAP catastrophic global", TermRDMAPCatastrophicGlobal, LayerRDMAP, 2, 0x08, "RDMAP/remote-operation/catastrophic error, global (0x08)"},
		{"RDMAP cannot invalidate", TermRDMAPCannotInvalidate, LayerRDMAP, 2, 0x09, "RDMAP/remote-operation/STag cannot be invalidated (0x09)"},
		{"RDMAP unspecified", TermRDMAPUnspecified, LayerRDMAP, 2, 0xff, "RDMAP/remote-operation/unspecified error (0xff)"},
		{"DDP local catastrophic", TermDDPLocalCatastrophic, LayerDDP, 0, 0x00, "DDP/local-catastrophic/local catastrophic error (0x00)"},
		{"DDP tagged invalid STag", TermDDPTaggedInvalidSTag, LayerDDP, 1, 0x00, "DDP/tagged-buffer/invalid STag (0x00)"},
		{"DDP tagged base bounds", TermDDPTaggedBaseBounds, LayerDDP, 1, 0x01, "DDP/tagged-buffer/base or bounds violation (0x01)"},
		{"DDP tagged stag not assoc", TermDDPTaggedStagNotAssoc, LayerDDP, 1, 0x02, "DDP/tagged-buffer/STag not associated with DDP stream (0x02)"},
		{"DDP tagged TO wrap", TermDDPTaggedTOWrap, LayerDDP, 1, 0x03, "DDP/tagged-buffer/TO wrap (0x03)"},
		{"DDP tagged bad version", TermDDPTaggedBadVersion, LayerDDP, 1, 0x04, "DDP/tagged-buffer/invalid DDP version (0x04)"},
		{"DDP invalid QN", TermDDPInvalidQN, LayerDDP, 2, 0x01, "DDP/untagged-buffer/invalid QN (0x01)"},
		{"DDP no buffer", TermDDPNoBuffer, LayerDDP, 2, 0x02, "DDP/untagged-buffer/invalid MSN - no buffer available (0x02)"},
		{"DDP invalid MSN", TermDDPInvalidMSN, LayerDDP, 2, 0x03, "DDP/untagged-buffer/invalid MSN - MSN range is not valid (0x03)"},
		{"DDP invalid MO", TermDDPInvalidMO, LayerDDP, 2, 0x04, "DDP/untagged-buffer/invalid MO (0x04)"},
		{"DDP too long", TermDDPTooLong, LayerDDP, 2, 0x05, "DDP/untagged-buffer/DDP message too long for available buffer (0x05)"},
		{"DDP untagged bad version", TermDDPUntaggedBadVersion, LayerDDP, 2, 0x06, "DDP/untagged-buffer/invalid DDP version (0x06)"},
		{"LLP conn lost", TermLLPConnLost, LayerLLP, 0, 0x01, "LLP/MPA/TCP connection closed, terminated or lost (0x01)"},
		{"LLP CRC", TermLLPCRC, LayerLLP, 0, 0x02, "LLP/MPA/MPA CRC error (0x02)"},
		{"LLP marker", TermLLPMarker, LayerLLP, 0, 0x03, "LLP/MPA/marker and ULPDU length mismatch (0x03)"},
		{"LLP bad frame", TermLLPBadFrame, LayerLLP, 0, 0x04, "LLP/MPA/invalid MPA request or reply frame (0x04)"},
		{"LLP local catastrophic", TermLLPLocalCatastrophic, LayerLLP, 0, 0x05, "LLP/MPA/local catastrophic error (0x05)"},
		{"LLP insufficient IRD", TermLLPInsufficientIRD, LayerLLP, 0, 0x06, "LLP/MPA/insufficient IRD resources (0x06)"},
		{"LLP no matching RTR", TermLLPNoMatchingRTR, LayerLLP, 0, 0x07, "LLP/MPA/no matching RTR option (0x07)"},
		{"siw QP to TERMINATE", MakeCode(LayerRDMAP, 0, 0xff), LayerRDMAP, 0, 0xff, "RDMAP/local-catastrophic/local catastrophic error (0xff)"},
		{"unknown ddp untagged code", MakeCode(LayerDDP, 2, 0x00), LayerDDP, 2, 0x00, "DDP/untagged-buffer/unknown error code (0x00)"},
		{"DDP etype reserved for LLP", MakeCode(LayerDDP, 3, 0x01), LayerDDP, 3, 0x01, "DDP/reserved-for-LLP/unknown error code (0x01)"},
		{"unknown layer", MakeCode(5, 7, 0x42), 5, 7, 0x42, "layer(5)/etype-7/unknown error code (0x42)"},
		{"MakeCode truncates", MakeCode(0x12, 0x31, 0x02), LayerLLP, 1, 0x02, "LLP/etype-1/MPA CRC error (0x02)"},
	}
	seen := map[Code]string{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.code
			if c.Layer() != tc.layer || c.EType() != tc.etype || c.ECode() != tc.ecode {
				t.Fatalf("%#04x = %d/%d/%#x, want %d/%d/%#x", uint16(c), c.Layer(), c.EType(), c.ECode(), tc.layer, tc.etype, tc.ecode)
			}
			if c != MakeCode(tc.layer, tc.etype, tc.ecode) && tc.name != "MakeCode truncates" {
				t.Fatalf("MakeCode disagrees: %#04x", uint16(MakeCode(tc.layer, tc.etype, tc.ecode)))
			}
			if s := c.String(); s != tc.str {
				t.Fatalf("String = %q, want %q", s, tc.str)
			}
		})
		if prev, dup := seen[tc.code]; dup {
			t.Errorf("%s and %s share code %#04x", prev, tc.name, uint16(tc.code))
		}
		seen[tc.code] = tc.name
	}
}

func TestError(t *testing.T) {
	inner := io.ErrUnexpectedEOF
	tests := []struct {
		name  string
		err   *Error
		want  string
		wraps error
	}{
		{
			name: "rdmap protection",
			err:  Errorf(TermRDMAPInvalidSTag, "stag 0x%x not registered", 0x1234),
			want: "rdmap: remote protection error: invalid STag: stag 0x1234 not registered",
		},
		{
			name:  "ddp untagged wrapping",
			err:   Errorf(TermDDPNoBuffer, "msn %d: %w", 3, inner),
			want:  "ddp: untagged buffer error: invalid MSN - no buffer available: msn 3: unexpected EOF",
			wraps: inner,
		},
		{
			name:  "two wrapped errors",
			err:   Errorf(TermLLPCRC, "%w and %w", inner, io.ErrShortBuffer),
			want:  "llp: MPA error: MPA CRC error: unexpected EOF and short buffer",
			wraps: io.ErrShortBuffer,
		},
		{
			name: "empty message",
			err:  &Error{Code: TermRDMAPUnexpectedOp},
			want: "rdmap: remote operation error: unexpected opcode",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Fatalf("Error() = %q, want %q", got, tc.want)
			}
			if tc.wraps != nil && !errors.Is(tc.err, tc.wraps) {
				t.Fatalf("errors.Is(%v, %v) = false", tc.err, tc.wraps)
			}
			var outer error = fmt.Errorf("qp 7: %w", tc.err)
			var e *Error
			if !errors.As(outer, &e) || e.Code != tc.err.Code {
				t.Fatalf("errors.As lost the code")
			}
		})
	}
}

// Headers of failed segments used by the Terminate tests.
const (
	failedWrite   = "c1 40 12345678 0000000000001000"                              // tagged Write, last
	failedSend    = "41 43 00000000 00000000 00000005 00000000"                    // Send, MSN 5
	failedRead    = "41 41 00000000 00000001 00000002 00000000"                    // Read Request, MSN 2
	failedReadHdr = "11223344 00007fff00001000 00001000 aabbccdd 0000000000008000" // its RDMAP header
)

func TestTerminateGolden(t *testing.T) {
	tests := []struct {
		name string
		term Terminate
		wire string
		str  string
	}{
		{
			name: "LLP CRC error, nothing copied",
			term: Terminate{Code: TermLLPCRC},
			wire: "20 02 00 00",
			str:  "terminate LLP/MPA/MPA CRC error (0x02)",
		},
		{
			name: "RDMAP local catastrophic as siw sends it",
			term: Terminate{Code: MakeCode(LayerRDMAP, 0, 0xff)},
			wire: "00 ff 00 00",
			str:  "terminate RDMAP/local-catastrophic/local catastrophic error (0xff)",
		},
		{
			name: "DDP tagged invalid STag with tagged header",
			term: Terminate{Code: TermDDPTaggedInvalidSTag, HasSegLen: true, HasDDPHeader: true, DDPSegLen: 1442,
				DDPHeader: testkit.Hex(t, failedWrite)},
			wire: "11 00 c0 00  05a2  " + failedWrite,
			str:  "terminate DDP/tagged-buffer/invalid STag (0x00) hdrct MD seglen 1442 [ddp T L stag 0x12345678 to 0x1000 ulp 0x40] [rdmap v1 RDMA Write]",
		},
		{
			name: "DDP untagged invalid MSN with untagged header",
			term: Terminate{Code: TermDDPInvalidMSN, HasSegLen: true, HasDDPHeader: true, DDPSegLen: 34,
				DDPHeader: testkit.Hex(t, failedSend)},
			wire: "12 03 c0 00  0022  " + failedSend,
			str:  "terminate DDP/untagged-buffer/invalid MSN - MSN range is not valid (0x03) hdrct MD seglen 34 [ddp U L qn 0 msn 5 mo 0 ulp 0x43] [rdmap v1 Send]",
		},
		{
			name: "DDP bad version, nothing copied",
			term: Terminate{Code: TermDDPUntaggedBadVersion},
			wire: "12 06 00 00",
			str:  "terminate DDP/untagged-buffer/invalid DDP version (0x06)",
		},
		{
			name: "RDMAP protection error on read request, M D R",
			term: Terminate{Code: TermRDMAPInvalidSTag, HasSegLen: true, HasDDPHeader: true, HasRDMAPHeader: true, DDPSegLen: 46,
				DDPHeader: testkit.Hex(t, failedRead), RDMAPHeader: testkit.Hex(t, failedReadHdr)},
			wire: "01 00 e0 00  002e  " + failedRead + failedReadHdr,
			str: "terminate RDMAP/remote-protection/invalid STag (0x00) hdrct MDR seglen 46 [ddp U L qn 1 msn 2 mo 0 ulp 0x41] [rdmap v1 RDMA Read Request]" +
				" [read request sink 0x11223344@0x7fff00001000 size 4096 src 0xaabbccdd@0x8000]",
		},
		{
			name: "RDMAP remote operation with DDP header",
			term: Terminate{Code: TermRDMAPCatastrophicStream, HasSegLen: true, HasDDPHeader: true, DDPSegLen: 46,
				DDPHeader: testkit.Hex(t, failedRead)},
			wire: "02 07 c0 00  002e  " + failedRead,
			str:  "terminate RDMAP/remote-operation/catastrophic error, localized to RDMAP stream (0x07) hdrct MD seglen 46 [ddp U L qn 1 msn 2 mo 0 ulp 0x41] [rdmap v1 RDMA Read Request]",
		},
		{
			name: "M without D carries the length only",
			term: Terminate{Code: TermDDPTooLong, HasSegLen: true, DDPSegLen: 0xffff},
			wire: "12 05 80 00  ffff",
			str:  "terminate DDP/untagged-buffer/DDP message too long for available buffer (0x05) hdrct M seglen 65535",
		},
		{
			name: "D without M has a length field that is not valid",
			term: Terminate{Code: TermDDPNoBuffer, HasDDPHeader: true, DDPHeader: testkit.Hex(t, failedSend)},
			wire: "12 02 40 00  0000  " + failedSend,
			str:  "terminate DDP/untagged-buffer/invalid MSN - no buffer available (0x02) hdrct D [ddp U L qn 0 msn 5 mo 0 ulp 0x43] [rdmap v1 Send]",
		},
		{
			name: "R only",
			term: Terminate{Code: TermRDMAPAccess, HasRDMAPHeader: true, RDMAPHeader: testkit.Hex(t, failedReadHdr)},
			wire: "01 02 20 00  " + failedReadHdr,
			str:  "terminate RDMAP/remote-protection/access rights violation (0x02) hdrct R [read request sink 0x11223344@0x7fff00001000 size 4096 src 0xaabbccdd@0x8000]",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := testkit.Hex(t, tc.wire)
			if n := tc.term.Len(); n != len(want) {
				t.Fatalf("Len = %d, want %d", n, len(want))
			}
			buf := bytes.Repeat([]byte{0xAA}, len(want)+2)
			if n := tc.term.Marshal(buf); n != len(want) || !bytes.Equal(buf[:n], want) {
				t.Fatalf("Marshal = %d\n%x\nwant\n%x", n, buf[:n], want)
			}
			if buf[len(want)] != 0xAA {
				t.Fatal("Marshal wrote past its end")
			}
			var got Terminate
			if err := got.Unmarshal(want); err != nil {
				t.Fatal(err)
			}
			if !equalTerm(got, tc.term) {
				t.Fatalf("Unmarshal = %+v, want %+v", got, tc.term)
			}
			if s := got.String(); s != tc.str {
				t.Fatalf("String =\n%q\nwant\n%q", s, tc.str)
			}
		})
	}
}

func equalTerm(a, b Terminate) bool {
	return a.Code == b.Code && a.HasSegLen == b.HasSegLen && a.HasDDPHeader == b.HasDDPHeader &&
		a.HasRDMAPHeader == b.HasRDMAPHeader && a.DDPSegLen == b.DDPSegLen &&
		bytes.Equal(a.DDPHeader, b.DDPHeader) && bytes.Equal(a.RDMAPHeader, b.RDMAPHeader)
}

func TestTerminateMarshalPadsShortSlices(t *testing.T) {
	tests := []struct {
		name string
		term Terminate
		wire string
	}{
		{
			name: "missing DDP header counts as untagged zeros",
			term: Terminate{Code: TermDDPLocalCatastrophic, HasDDPHeader: true},
			wire: "10 00 40 00 0000" + strings.Repeat("00", 18),
		},
		{
			name: "truncated tagged header padded to 14",
			term: Terminate{Code: TermDDPTaggedTOWrap, HasSegLen: true, HasDDPHeader: true, DDPSegLen: 1, DDPHeader: testkit.Hex(t, "c140 1234")},
			wire: "11 03 c0 00 0001 c1401234" + strings.Repeat("00", 10),
		},
		{
			name: "long slices cut to their format length",
			term: Terminate{Code: TermRDMAPTOWrap, HasRDMAPHeader: true, RDMAPHeader: testkit.Hex(t, failedReadHdr+"eeee")},
			wire: "01 04 20 00" + failedReadHdr,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := testkit.Hex(t, tc.wire)
			buf := bytes.Repeat([]byte{0xAA}, tc.term.Len())
			if n := tc.term.Marshal(buf); n != len(want) || !bytes.Equal(buf, want) {
				t.Fatalf("Marshal = %d %x, want %x", n, buf, want)
			}
		})
	}
}

func TestTerminateUnmarshalErrors(t *testing.T) {
	tests := []struct {
		name     string
		wire     string
		sentinel error
		code     Code // decoded despite the error
		m, d, r  bool
	}{
		{name: "empty", wire: "", sentinel: ErrShort},
		{name: "three octets", wire: "200200", sentinel: ErrShort},
		{name: "M without length", wire: "12058000", sentinel: ErrShort, code: TermDDPTooLong, m: true},
		{name: "D without header", wire: "12024000 0022", sentinel: ErrShort, code: TermDDPNoBuffer, d: true},
		{name: "D with short untagged header", wire: "1203c000 0022 " + failedSend[:len(failedSend)-2], sentinel: ErrShort, code: TermDDPInvalidMSN, m: true, d: true},
		{name: "D with short tagged header", wire: "1100c000 05a2 c140 12345678", sentinel: ErrShort, code: TermDDPTaggedInvalidSTag, m: true, d: true},
		{
			// Linux siw, Remote Protection error on a Send: M D R set but
			// only the 20-octet Send image (length + DDP header) attached.
			name: "siw R without RDMAP header", wire: "0100e000 0010 " + failedSend,
			sentinel: ErrShort, code: TermRDMAPInvalidSTag, m: true, d: true, r: true,
		},
		{name: "trailing octets", wire: "20020000 00", sentinel: ErrMalformed, code: TermLLPCRC},
		{name: "trailing after headers", wire: "1203c000 0022 " + failedSend + "00000000", sentinel: ErrMalformed, code: TermDDPInvalidMSN, m: true, d: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var term Terminate
			err := term.Unmarshal(testkit.Hex(t, tc.wire))
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("error %v, want %v", err, tc.sentinel)
			}
			if !strings.HasPrefix(err.Error(), "rdmap: terminate: ") {
				t.Fatalf("error lacks context: %q", err)
			}
			if term.Code != tc.code || term.HasSegLen != tc.m || term.HasDDPHeader != tc.d || term.HasRDMAPHeader != tc.r {
				t.Fatalf("partial decode %+v", term)
			}
		})
	}
}

func TestNewTerminate(t *testing.T) {
	write, send, read, rreq := testkit.Hex(t, failedWrite), testkit.Hex(t, failedSend), testkit.Hex(t, failedRead), testkit.Hex(t, failedReadHdr)
	// A whole failed Read Request ULPDU: DDP header, RDMAP header.
	readULPDU := append(append([]byte{}, read...), rreq...)
	tests := []struct {
		name             string
		code             Code
		segLen           uint16
		ddpHdr, rdmapHdr []byte
		wire             string
	}{
		{name: "LLP copies nothing", code: TermLLPCRC, segLen: 34, ddpHdr: send, wire: "20020000"},
		{name: "RDMAP local catastrophic copies nothing", code: TermRDMAPLocalCatastrophic, segLen: 34, ddpHdr: send, rdmapHdr: rreq, wire: "00000000"},
		{name: "DDP tagged error copies tagged header", code: TermDDPTaggedBaseBounds, segLen: 1442, ddpHdr: write, wire: "1101c000 05a2 " + failedWrite},
		{name: "DDP untagged error copies untagged header", code: TermDDPInvalidMO, segLen: 34, ddpHdr: send, wire: "1204c000 0022 " + failedSend},
		{name: "DDP local catastrophic copies header (siw)", code: TermDDPLocalCatastrophic, segLen: 34, ddpHdr: send, wire: "1000c000 0022 " + failedSend},
		{name: "DDP tagged bad version copies nothing", code: TermDDPTaggedBadVersion, segLen: 1442, ddpHdr: write, wire: "11040000"},
		{name: "DDP untagged bad version copies nothing", code: TermDDPUntaggedBadVersion, segLen: 34, ddpHdr: send, wire: "12060000"},
		{name: "DDP error never copies RDMAP header", code: TermDDPInvalidMSN, segLen: 46, ddpHdr: read, rdmapHdr: rreq, wire: "1203c000 002e " + failedRead},
		{name: "whole ULPDU is cut to the DDP header", code: TermDDPInvalidQN, segLen: 46, ddpHdr: readULPDU, wire: "1201c000 002e " + failedRead},
		{name: "RDMAP protection on read request copies M D R", code: TermRDMAPBaseBounds, segLen: 46, ddpHdr: readULPDU, rdmapHdr: readULPDU[18:], wire: "0101e000 002e " + failedRead + failedReadHdr},
		{name: "RDMAP protection on send copies M D only", code: TermRDMAPProtCannotInvalidate, segLen: 34, ddpHdr: send, rdmapHdr: rreq, wire: "0109c000 0022 " + failedSend},
		{name: "RDMAP protection on write copies M D only", code: TermRDMAPAccess, segLen: 1442, ddpHdr: write, wire: "0102c000 05a2 " + failedWrite},
		{name: "RDMAP protection without DDP header keeps R", code: TermRDMAPInvalidSTag, rdmapHdr: rreq, wire: "01002000 " + failedReadHdr},
		{name: "RDMAP protection with short RDMAP header drops R", code: TermRDMAPInvalidSTag, segLen: 46, ddpHdr: read, rdmapHdr: rreq[:27], wire: "0100c000 002e " + failedRead},
		{name: "RDMAP operation copies M D", code: TermRDMAPCatastrophicStream, segLen: 46, ddpHdr: read, rdmapHdr: rreq, wire: "0207c000 002e " + failedRead},
		{name: "RDMAP cannot invalidate copies M D", code: TermRDMAPCannotInvalidate, segLen: 34, ddpHdr: send, wire: "0209c000 0022 " + failedSend},
		{name: "RDMAP bad version copies nothing", code: TermRDMAPBadVersion, segLen: 34, ddpHdr: send, wire: "02050000"},
		{name: "RDMAP unexpected opcode copies nothing", code: TermRDMAPUnexpectedOp, segLen: 34, ddpHdr: send, wire: "02060000"},
		{name: "no headers given", code: TermDDPNoBuffer, segLen: 34, wire: "12020000"},
		{name: "truncated DDP header dropped", code: TermDDPNoBuffer, segLen: 34, ddpHdr: send[:17], wire: "12020000"},
		{name: "tagged header 14 octets is enough", code: TermDDPTaggedTOWrap, segLen: 14, ddpHdr: write[:14], wire: "1103c000 000e " + failedWrite},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			term := NewTerminate(tc.code, tc.segLen, tc.ddpHdr, tc.rdmapHdr)
			want := testkit.Hex(t, tc.wire)
			buf := make([]byte, term.Len())
			if n := term.Marshal(buf); n != len(want) || !bytes.Equal(buf, want) {
				t.Fatalf("Marshal = %d\n%x\nwant\n%x", n, buf, want)
			}
			var back Terminate
			if err := back.Unmarshal(buf); err != nil || !equalTerm(back, term) {
				t.Fatalf("Unmarshal(Marshal) = %+v, %v; want %+v", back, err, term)
			}
			if cap(term.DDPHeader) != len(term.DDPHeader) || cap(term.RDMAPHeader) != len(term.RDMAPHeader) {
				t.Fatal("aliased headers must be capacity-limited")
			}
		})
	}
}

func BenchmarkTerminate(b *testing.B) {
	term := NewTerminate(TermRDMAPInvalidSTag, 46, testkit.Hex(b, failedRead), testkit.Hex(b, failedReadHdr))
	buf := make([]byte, term.Len())
	b.Run("marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			term.Marshal(buf)
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		term.Marshal(buf)
		var got Terminate
		b.ReportAllocs()
		for b.Loop() {
			if err := got.Unmarshal(buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func FuzzTerminate(f *testing.F) {
	for _, s := range []string{
		"", "20020000", "00ff0000", "1100c000 05a2 " + failedWrite, "1203c000 0022 " + failedSend,
		"0100e000 002e " + failedRead + failedReadHdr, "12058000 ffff", "12024000 0000 " + failedSend,
		"0100e000 0010 " + failedSend, "01022000 " + failedReadHdr, "20020000 00",
	} {
		f.Add(testkit.Hex(f, s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var term Terminate
		if err := term.Unmarshal(b); err != nil {
			if !errors.Is(err, ErrShort) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("unexpected error %v", err)
			}
			_ = term.String()
			// Whatever was decoded must still marshal without panicking.
			term.Marshal(make([]byte, term.Len()))
			return
		}
		_ = term.String()
		if term.Len() != len(b) {
			t.Fatalf("Len %d for %d octets", term.Len(), len(b))
		}
		buf := make([]byte, term.Len())
		if n := term.Marshal(buf); n != len(b) {
			t.Fatalf("Marshal wrote %d of %d", n, len(b))
		}
		// Only the 13 reserved hdrct bits may differ: Marshal zeroes them.
		if b[2]&0xe0 != buf[2] || buf[3] != 0 || !bytes.Equal(buf[:2], b[:2]) || !bytes.Equal(buf[4:], b[4:]) {
			t.Fatalf("Marshal(Unmarshal(%x)) = %x", b, buf)
		}
		var again Terminate
		if err := again.Unmarshal(buf); err != nil || !equalTerm(again, term) {
			t.Fatalf("second round %+v %v, want %+v", again, err, term)
		}
		// NewTerminate on arbitrary input yields a well-formed Terminate.
		nt := NewTerminate(term.Code, term.DDPSegLen, b, b)
		nb := make([]byte, nt.Len())
		nt.Marshal(nb)
		var back Terminate
		if err := back.Unmarshal(nb); err != nil || !equalTerm(back, nt) {
			t.Fatalf("NewTerminate(%v) round trip: %+v %v", term.Code, back, err)
		}
	})
}
