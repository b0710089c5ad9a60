package verbs_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// TestRFC7306OnTheWire checks, octet for octet, the RFC 7306 messages the
// engine sends for the verbs' requests, as a raw peer receives them
// (the ULPDU: untagged DDP header, then the RDMAP header):
//
//   - an Atomic Request on QN 1 with the next Read Request MSN, its
//     Reserved bits zero (§5.2, §5.2.1 item 5);
//   - a FetchAdd with Add Mask 0, Compare Data zero and Compare Mask all
//     ones; a Compare-and-Swap with both masks all ones (§5.2.1);
//   - an RDMA Write with Immediate Data as the RDMA Write followed by an
//     Immediate Data message on QN 0 with the next Send MSN, eight octets
//     of data, Invalidate STag zero (§4.1, §6, §6.3);
//   - Immediate Data with SE (opcode 0x9) for a solicited one (§4.1);
//   - the Atomic Response to a peer's FetchAdd on QN 3 with its own MSN,
//     the Original Request Identifier and the word's original value
//     (§5.2.2).
func TestRFC7306OnTheWire(t *testing.T) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cs := newStack(t, la, cliAddr, 1500)
	srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", func(c *offload.Config) { c.FPDUTimeout = -1 }, 8)
	sink := srv.region(64, verbs.AccessLocalWrite)
	src := srv.region(64, verbs.AccessLocalWrite)
	copy(src.buf(), "abcd")
	tgt := srv.region(64, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	binary.NativeEndian.PutUint64(tgt.buf()[8:], 40)
	if err := srv.qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	p := dialRaw(t, cs, srv, mpa.Config{Rev: 2, CRC: true, IRD: 8, ORD: 8, Ext: mpa.ExtAll})
	e := &tcEnv{t: t, crc: true, srv: srv, p: p, dst: sink}
	e.firstFPDU()
	const rkey, raddr = 0x4321, 0x10000
	srv.post(
		verbs.SendWR{ID: 1, Opcode: verbs.WRAtomicFetchAdd, SGL: []verbs.SGE{sink.mr.SGE(0, 8)}, RemoteAddr: raddr, RKey: rkey, CompareAdd: 5},
		verbs.SendWR{ID: 2, Opcode: verbs.WRAtomicCmpSwap, SGL: []verbs.SGE{sink.mr.SGE(8, 8)}, RemoteAddr: raddr + 8, RKey: rkey, CompareAdd: 7, Swap: 9},
		verbs.SendWR{ID: 3, Opcode: verbs.WRWriteWithImm, SGL: []verbs.SGE{src.mr.SGE(0, 4)}, RemoteAddr: raddr + 16, RKey: rkey, ImmData: 0x2a},
		verbs.SendWR{ID: 4, Opcode: verbs.WRWriteWithImm, Flags: verbs.FlagSolicited, SGL: []verbs.SGE{src.mr.SGE(0, 4)}, RemoteAddr: raddr + 16, RKey: rkey, ImmData: 0x2b},
	)
	want := []string{
		// FetchAdd: control 41 4a, QN 1, MSN 1, MO 0; AOpCode 0, request 1.
		"414a 00000000 00000001 00000001 00000000 " +
			"00000000 00000001 00004321 0000000000010000 0000000000000005 0000000000000000 0000000000000000 ffffffffffffffff",
		// CmpSwap: QN 1, MSN 2; AOpCode 2, request 2.
		"414a 00000000 00000001 00000002 00000000 " +
			"00000002 00000002 00004321 0000000000010008 0000000000000009 ffffffffffffffff 0000000000000007 ffffffffffffffff",
		// The RDMA Write (tagged, last) ...
		"c140 00004321 0000000000010010 61626364",
		// ... then its Immediate Data: QN 0, MSN 1, the value in the first
		// four octets.
		"4148 00000000 00000000 00000001 00000000 0000002a 00000000",
		"c140 00004321 0000000000010010 61626364",
		// Immediate Data with SE: opcode 0x9, QN 0, MSN 2.
		"4149 00000000 00000000 00000002 00000000 0000002b 00000000",
	}
	for i, w := range want {
		h, _, body := p.next()
		got := append(make([]byte, 0, h.Len()+len(body)), make([]byte, h.Len())...)
		h.Marshal(got)
		got = append(got, body...)
		if wb := testkit.Hex(t, w); !bytes.Equal(got, wb) {
			t.Fatalf("ULPDU %d:\n got %x\nwant %x", i, got, wb)
		}
	}
	e.send(atomicReqMsg(1, rdmap.FetchAdd(9, tgt.mr.RKey(), tgt.mr.Addr()+8, 2, 0)))
	h, _, body := p.next()
	got := make([]byte, h.Len())
	h.Marshal(got)
	got = append(got, body...)
	// Atomic Response: control 41 4b, QN 3, MSN 1; request 9, value 40.
	if wb := testkit.Hex(t, "414b 00000000 00000003 00000001 00000000 00000009 0000000000000028"); !bytes.Equal(got, wb) {
		t.Fatalf("Atomic Response:\n got %x\nwant %x", got, wb)
	}
	if v := binary.NativeEndian.Uint64(tgt.buf()[8:]); v != 42 {
		t.Fatalf("word %d after the FetchAdd of 2, want 42", v)
	}
}
