package uverbs

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs"
)

// TestReregMR: ibv_rereg_mr through the verbs socket and in-process. A
// region the peer RDMA-Writes into is moved to other memory
// (ReregTranslation): the peer's next Write with the same rkey at the new
// address lands there and nothing more in the old memory; it moves to
// another PD and back (ReregPD); its access loses REMOTE_WRITE
// (ReregAccess): the peer's Write then draws the Terminate. A region
// deregistered cannot be changed, and bad flags are refused.
func TestReregMR(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remote bool
	}{{"socket", true}, {"in-process", false}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			client := r.dial()
			tgtDev, peerDev, addr := r.peer, client, peerAddr.Addr()
			if tc.remote {
				tgtDev, peerDev, addr = client, r.peer, daemonAddr.Addr()
			}
			tgt, peer := newEnd(t, tgtDev, 8), newEnd(t, peerDev, 8)
			connectAt(t, peer, tgt, netip.AddrPortFrom(addr, 7200), verbs.ConnParam{})
			waitEvent(t, peer.qp, verbs.EventEstablished)
			waitEvent(t, tgt.qp, verbs.EventEstablished)
			mem, err := tgtDev.AllocBuffer(8192)
			if err != nil {
				t.Fatal(err)
			}
			a, b := mem[:4096], mem[4096:]
			mr, err := tgt.pd.RegMR(a, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			src := peer.region(t, 4096, verbs.AccessLocalWrite)
			rcv := tgt.region(t, 64, verbs.AccessLocalWrite)
			// write RDMA-Writes data at offset 100 of the region, then
			// Sends: the Send's receive completes once the Write is
			// placed (RDMAP keeps order), and write returns it.
			nw := 0
			write := func(data string) verbs.WorkCompletion {
				t.Helper()
				off := nw * 64 // each write from its own source bytes: the last one may still be read
				nw++
				if _, err := tgt.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{rcv.SGE(0, 64)}}}); err != nil {
					t.Fatal(err)
				}
				copy(src.Bytes()[off:], data)
				if _, err := peer.qp.PostSend([]verbs.SendWR{
					{ID: 1, Opcode: verbs.WRWrite, SGL: []verbs.SGE{src.SGE(off, len(data))}, RemoteAddr: mr.Addr() + 100, RKey: mr.RKey()},
					{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("done")}}); err != nil {
					t.Fatal(err)
				}
				return poll(t, tgt.rcq, 1)[0]
			}
			if wc := write("first"); wc.Status != verbs.WCSuccess || string(a[100:105]) != "first" {
				t.Fatalf("first write: %+v, memory %q", wc, a[100:105])
			}
			stag := mr.RKey()
			if err := mr.Rereg(verbs.ReregTranslation, nil, b, 0); err != nil {
				t.Fatal(err)
			}
			if mr.RKey() != stag || mr.Addr() != uint64(uintptr(unsafe.Pointer(&b[0]))) || mr.Len() != len(b) {
				t.Fatalf("after rereg: rkey 0x%x (was 0x%x), addr 0x%x, len %d", mr.RKey(), stag, mr.Addr(), mr.Len())
			}
			if wc := write("second"); wc.Status != verbs.WCSuccess || string(b[100:106]) != "second" || string(a[100:106]) != "first\x00" {
				t.Fatalf("second write: %+v, new memory %q, old %q", wc, b[100:106], a[100:106])
			}
			pd2, err := tgtDev.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			if err := mr.Rereg(verbs.ReregPD, pd2, nil, 0); err != nil {
				t.Fatal(err)
			}
			if err := pd2.Dealloc(); !errors.Is(err, verbs.ErrBusy) {
				t.Fatalf("dealloc of the region's new PD: %v", err)
			}
			if err := mr.Rereg(verbs.ReregPD, tgt.pd, nil, 0); err != nil {
				t.Fatal(err)
			}
			if err := pd2.Dealloc(); err != nil {
				t.Fatalf("dealloc of the PD the region left: %v", err)
			}
			if err := mr.Rereg(0, nil, nil, 0); !errors.Is(err, verbs.ErrInvalidWR) {
				t.Fatalf("no flags: %v", err)
			}
			if err := mr.Rereg(verbs.ReregAccess, nil, nil, verbs.AccessLocalWrite); err != nil {
				t.Fatal(err)
			}
			if wc := write("third"); wc.Status == verbs.WCSuccess || bytes.Contains(b, []byte("third")) {
				t.Fatalf("a write after REMOTE_WRITE was taken away: %+v", wc)
			}
			if e := waitEvent(t, tgt.qp, verbs.EventTerminateSent); e.Code != rdmap.TermRDMAPAccess {
				t.Fatalf("Terminate %v, want %v", e.Code, rdmap.TermRDMAPAccess)
			}
			if err := mr.Dereg(); err != nil {
				t.Fatal(err)
			}
			if err := mr.Rereg(verbs.ReregAccess, nil, nil, verbs.AccessLocalWrite); err == nil {
				t.Fatal("rereg of a deregistered region succeeded")
			}
		})
	}
}
