package mpa

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/rdmap"
)

// Golden vectors from `make interop` (test/interop): Linux siw (kernel
// 6.12.95, rdma-core 44 rping) talking to siwtun over the peer VM's tap
// link, captured with tcpdump on siwtun0. Unlike the siw-to-siw captures,
// CRC is on because siwtun asks for it, and siw's peer-to-peer RTR is in.

// TestSiwtunSiwFrames: MPA Requests and Replies of both sides parse, say
// what they carry, and rebuild octet for octet.
func TestSiwtunSiwFrames(t *testing.T) {
	tests := []struct {
		name, wire, want string
	}{
		{
			// siw initiator with peer_to_peer=1: enhanced, IRD 1 with the
			// P2P bit, ORD 1 offering the Write and the Read RTR; no CRC.
			name: "siw request p2p",
			wire: "4d504120494420526571204672616d65 1002 0004 8001c001",
			want: "mpa req rev 2 enhanced ird 1 ord 1 p2p rtr=write|read pd 0",
		},
		{
			// siwtun's answer (--p2p write, CRC asked): C, Write RTR picked.
			name: "siwtun reply p2p",
			wire: "4d504120494420526570204672616d65 5002 0004 80018001",
			want: "mpa rep rev 2 C enhanced ird 1 ord 1 p2p rtr=write pd 0",
		},
		{
			// siw responder (rping -s) answering siwtun's CRC Request.
			name: "siw reply crc",
			wire: "4d504120494420526570204672616d65 5002 0004 00010001",
			want: "mpa rep rev 2 C enhanced ird 1 ord 1 pd 0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := testkit.Hex(t, tt.wire)
			f, err := ParseFrame(wire)
			if err != nil {
				t.Fatalf("ParseFrame: %v", err)
			}
			if got := f.String(); got != tt.want {
				t.Errorf("frame = %q, want %q", got, tt.want)
			}
			b, err := f.Append(nil)
			if err != nil || !bytes.Equal(b, wire) {
				t.Errorf("Append = %x, %v; want %x", b, err, wire)
			}
		})
	}
}

// TestSiwtunSiwFPDUs: FPDUs siw sent to siwtun with CRC on. The trailer is
// the CRC32c of the FPDU, least-significant octet first; the receiver
// checks it and hands over the ULPDU; the sender rebuilds the FPDU; the
// DDP and RDMAP headers decode to what siw meant.
func TestSiwtunSiwFPDUs(t *testing.T) {
	tests := []struct {
		name    string
		wire    string
		hdr     ddp.Header
		op      rdmap.Opcode
		payload string // hex, or "" for none
	}{
		{
			// The peer-to-peer RTR: zero-length RDMA Write, STag 1, TO 0.
			name: "rtr write",
			wire: "000e c140 00000001 0000000000000000 ebd34c5f",
			hdr:  ddp.Header{Tagged: true, Last: true, Version: 1, ULPCtrl: 0x40, STag: 1},
			op:   rdmap.OpWrite,
		},
		{
			// rping -c's first Send: the advert of its source buffer (address,
			// rkey, size 64).
			name:    "send",
			wire:    "0022 4143 00000000 00000000 00000001 00000000 0000562a889dcc00 72689800 00000040 f4965553",
			hdr:     ddp.Header{Last: true, Version: 1, ULPCtrl: 0x43, QN: 0, MSN: 1, MO: 0},
			op:      rdmap.OpSend,
			payload: "0000562a889dcc007268980000000040",
		},
		{
			// rping -s's RDMA Read of the client's 64-byte buffer.
			name: "read request",
			wire: "002e 4141 00000000 00000001 00000001 00000000 faebce00 0000564f2c51a5b0 00000040 00000400 00007fc5b1c34040 9a3d4823",
			hdr:  ddp.Header{Last: true, Version: 1, ULPCtrl: 0x41, QN: 1, MSN: 1, MO: 0},
			op:   rdmap.OpReadRequest,
		},
		{
			// rping -s writing the ping data back: 64 octets, "rdma-ping-0: ABC...".
			name:    "rdma write",
			wire:    "004e c140 00000300 00007fc5b1c34000 72646d612d70696e672d303a204142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717200 7507c79c",
			hdr:     ddp.Header{Tagged: true, Last: true, Version: 1, ULPCtrl: 0x40, STag: 0x300, TO: 0x7fc5b1c34000},
			op:      rdmap.OpWrite,
			payload: "72646d612d70696e672d303a204142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717200",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := testkit.Hex(t, tt.wire)
			ulpdu := int(binary.BigEndian.Uint16(wire))
			if n := 2 + ulpdu + padLen(ulpdu) + crcLen; n != len(wire) {
				t.Fatalf("FPDU of %d octets, ULPDU_Length %d gives %d", len(wire), ulpdu, n)
			}
			body, trailer := wire[:len(wire)-crcLen], wire[len(wire)-crcLen:]
			if got, want := binary.LittleEndian.Uint32(trailer), crc32.Checksum(body, castagnoli); got != want {
				t.Fatalf("trailer %x: LE %#x, CRC32c of the FPDU %#x", trailer, got, want)
			}
			rec := &recorder{t: t}
			var r Receiver
			r.Init(true, false, rec)
			for i := range wire { // one octet at a time: the worst segmentation
				if n, err := r.Write(wire[i : i+1]); err != nil || n != 1 {
					t.Fatalf("Write octet %d = %d, %v", i, n, err)
				}
			}
			if len(rec.ulpdus) != 1 || !rec.crcOK[0] || !bytes.Equal(rec.ulpdus[0], wire[2:2+ulpdu]) {
				t.Fatalf("receiver: ULPDUs %x, CRC ok %v", rec.ulpdus, rec.crcOK)
			}
			var s Sender
			s.Init(true, false)
			s.Begin(nil, ulpdu)
			s.Write(wire[2 : 2+ulpdu])
			if got := s.Finish(); !bytes.Equal(got, wire) {
				t.Errorf("Sender = %x, want %x", got, wire)
			}
			var h ddp.Header
			n, err := h.Unmarshal(rec.ulpdus[0])
			if err != nil {
				t.Fatal(err)
			}
			if h != tt.hdr {
				t.Errorf("DDP header %+v, want %+v", h, tt.hdr)
			}
			if v, op := rdmap.ParseCtrl(h.ULPCtrl); v != rdmap.Version || op != tt.op {
				t.Errorf("RDMAP v%d %v, want v1 %v", v, op, tt.op)
			}
			rest := rec.ulpdus[0][n:]
			if tt.op == rdmap.OpReadRequest {
				var rr rdmap.ReadRequest
				if err := rr.Unmarshal(rest); err != nil {
					t.Fatal(err)
				}
				want := rdmap.ReadRequest{SinkSTag: 0xfaebce00, SinkTO: 0x564f2c51a5b0, Size: 64, SrcSTag: 0x400, SrcTO: 0x7fc5b1c34040}
				if rr != want {
					t.Errorf("Read Request %+v, want %+v", rr, want)
				}
				return
			}
			if !bytes.Equal(rest, testkit.Hex(t, tt.payload)) {
				t.Errorf("payload %x, want %s", rest, tt.payload)
			}
		})
	}
}

// TestSiwRepliesNotReady: no Reply of Linux siw announces ExtReady, so a
// siwtun initiator keeps holding its first FPDU back for siw (the
// engine's Config.FirstFPDUDelay). siw's Reply carries its application's
// private data, never a siwtun extension block of its own: the Replies
// siw sent to siwtun (make interop) and to siw (rping in the peer VM, CRC
// on and off) complete with PeerReady false, and so does a Reply whose
// application echoes the Request's private data, block included (a
// Request never announces ExtReady). A siwtun responder's Reply to the
// same Request completes with PeerReady true, its flags octet's reserved
// bits all zero.
func TestSiwRepliesNotReady(t *testing.T) {
	replies := map[string][]byte{
		"siw reply to siwtun, crc": testkit.Hex(t, "4d504120494420526570204672616d65 5002 0004 00010001"),
	}
	for _, path := range []string{pcapCRC, pcapNoCRC} {
		s := readPcap(t, path)
		rep, _ := splitFrame(t, s.resp)
		replies["siw reply to siw, "+path] = rep
	}
	for name, wire := range replies {
		t.Run(name, func(t *testing.T) {
			rep, err := ParseFrame(wire)
			if err != nil {
				t.Fatal(err)
			}
			c := Config{Rev: 2, CRC: rep.CRC, IRD: 1, ORD: 1, Ext: ExtAll}
			req, err := c.Request()
			if err != nil {
				t.Fatal(err)
			}
			p, err := Complete(&c, req, rep)
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if rep.Ext != 0 || p.PeerReady {
				t.Errorf("siw's Reply %x says ready", wire)
			}
			// An application that echoes the Request's private data.
			echo := rep
			echo.Ext = req.Ext
			if p, err := Complete(&c, req, echo); err != nil || p.PeerReady {
				t.Errorf("a Reply echoing the Request's block: PeerReady %v, %v; want false", p.PeerReady, err)
			}
			// A siwtun responder answering the same Request says ready.
			own, _, err := Respond(&Config{Rev: 2, CRC: rep.CRC, IRD: 1, ORD: 1, Ready: true}, req)
			if err != nil {
				t.Fatal(err)
			}
			b, err := own.Append(nil)
			if err != nil {
				t.Fatal(err)
			}
			if b[16]&0x0f != 0 {
				t.Errorf("siwtun's Reply %x sets reserved bits", b)
			}
			back, err := ParseFrame(b)
			if err != nil {
				t.Fatal(err)
			}
			if p, err := Complete(&c, req, back); err != nil || !p.PeerReady || p.Ext != 0 {
				t.Errorf("siwtun's Reply %x: PeerReady %v, Ext %v, %v; want true, none", b, p.PeerReady, p.Ext, err)
			}
		})
	}
}
