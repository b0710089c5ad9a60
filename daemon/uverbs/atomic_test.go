package uverbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// loadWord and storeWord access the 8-byte word at the front of b as the
// engine does, with sync/atomic: the word is shared with the RNIC (and the
// race detector sees no order through memory shared with the daemon).
func loadWord(b []byte) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[0]))) }

func storeWord(b []byte, v uint64) { atomic.StoreUint64((*uint64)(unsafe.Pointer(&b[0])), v) }

// atomicRound runs n Fetch-and-Adds then a Compare-and-Swap pair from a on
// a word of b and checks every result, completion and the word: the word
// sits in memory shared with the daemon when b is the socket's end, and
// the result buffer when a is.
func atomicRound(t *testing.T, a, b *side, n int) {
	t.Helper()
	res := a.region(t, 8*n, verbs.AccessLocalWrite)
	dst := b.region(t, 16, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	storeWord(dst.Bytes(), 0)
	storeWord(dst.Bytes()[8:], 5)
	var wcs []verbs.WorkCompletion
	for i := range n { // in batches of 8: the queues hold 16
		wr := verbs.SendWR{ID: uint64(i), Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{res.SGE(8*i, 8)}, RemoteAddr: dst.Addr() + 8, RKey: dst.RKey(), CompareAdd: uint64(i)}
		if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatalf("PostSend %d: %v", i, err)
		}
		if i%8 == 7 || i == n-1 {
			wcs = append(wcs, poll(t, a.scq, i+1-len(wcs))...)
		}
	}
	sum := uint64(5)
	for i, wc := range wcs {
		if wc.ID != uint64(i) || wc.Opcode != verbs.WCFetchAdd || wc.Status != verbs.WCSuccess || wc.ByteLen != 8 {
			t.Fatalf("completion %d: %+v", i, wc)
		}
		if got := binary.NativeEndian.Uint64(res.Bytes()[8*i:]); got != sum {
			t.Fatalf("add %d returned %d, want %d", i, got, sum)
		}
		sum += uint64(i)
	}
	cas := []verbs.SendWR{
		{ID: 100, Opcode: verbs.WRAtomicCmpSwap, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{res.SGE(0, 8)}, RemoteAddr: dst.Addr() + 8, RKey: dst.RKey(), CompareAdd: sum, Swap: 0xabcdef},
		{ID: 101, Opcode: verbs.WRAtomicCmpSwap, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{res.SGE(8, 8)}, RemoteAddr: dst.Addr() + 8, RKey: dst.RKey(), CompareAdd: sum, Swap: 1},
	}
	if _, err := a.qp.PostSend(cas); err != nil {
		t.Fatal(err)
	}
	for i, wc := range poll(t, a.scq, 2) {
		if wc.ID != uint64(100+i) || wc.Opcode != verbs.WCCompSwap || wc.Status != verbs.WCSuccess {
			t.Fatalf("compare-and-swap completion %+v", wc)
		}
	}
	if r0, r1, w := binary.NativeEndian.Uint64(res.Bytes()), binary.NativeEndian.Uint64(res.Bytes()[8:]), loadWord(dst.Bytes()[8:]); r0 != sum || r1 != 0xabcdef || w != 0xabcdef {
		t.Fatalf("compare-and-swap results %#x %#x, word %#x; want %#x, 0xabcdef, 0xabcdef", r0, r1, w, sum)
	}
	if loadWord(dst.Bytes()) != 0 {
		t.Fatal("the word before the target was written")
	}
}

// TestAtomicThroughSocket: Fetch-and-Add and Compare-and-Swap from and to
// an application on the verbs socket: the SQE carries the operands, the
// result lands in the client's memory, and an atomic from the peer
// operates on the client's word the daemon shares.
func TestAtomicThroughSocket(t *testing.T) {
	for _, sockListens := range []bool{false, true} {
		t.Run(fmt.Sprintf("socket-listens=%v", sockListens), func(t *testing.T) {
			r := newRig(t)
			sock, peer := newEnd(t, r.dial(), 16), newEnd(t, r.peer, 16)
			if sockListens {
				connectAt(t, peer, sock, netip.AddrPortFrom(daemonAddr.Addr(), peerPort), verbs.ConnParam{})
			} else {
				connectAt(t, sock, peer, netip.AddrPortFrom(peerAddr.Addr(), peerPort), verbs.ConnParam{})
			}
			atomicRound(t, sock, peer, 40)
			atomicRound(t, peer, sock, 40)
		})
	}
}

// TestAtomicSocketPeerWithout: toward a peer that did not negotiate
// atomics the socket's client refuses them at post time, before the ring.
func TestAtomicSocketPeerWithout(t *testing.T) {
	r := newRigWith(t, func(c *offload.Config) { c.RDMAPExt = false })
	sock, peer := newEnd(t, r.dial(), 16), newEnd(t, r.peer, 16)
	connect(t, sock, peer)
	res := sock.region(t, 8, verbs.AccessLocalWrite)
	dst := peer.region(t, 64, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	posted := r.daemon.Stats().SQPosted.Load()
	for _, op := range []verbs.WROpcode{verbs.WRAtomicFetchAdd, verbs.WRAtomicCmpSwap} {
		n, err := sock.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: op, SGL: []verbs.SGE{res.SGE(0, 8)}, RemoteAddr: dst.Addr(), RKey: dst.RKey(), CompareAdd: 1}})
		if n != 0 || !errors.Is(err, verbs.ErrNotSupportedByPeer) {
			t.Fatalf("PostSend(%v) = %d, %v; want 0, ErrNotSupportedByPeer", op, n, err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if got := r.daemon.Stats().SQPosted.Load(); got != posted {
		t.Fatalf("the daemon took %d requests", got-posted)
	}
	if n := r.peerEng.Stats().AtomicsRx.Load() + r.daemon.Stats().AtomicsTx.Load(); n != 0 {
		t.Fatalf("%d Atomic Requests on the wire", n)
	}
}
