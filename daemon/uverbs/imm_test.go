package uverbs

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// immRound sends n messages with immediate data from a to b (RDMA Writes
// with Immediate Data, every third a Send with Immediate Data) and checks
// each of b's completions, in order, and every byte.
func immRound(t *testing.T, a, b *side, n int, seed byte) {
	t.Helper()
	const slot = 3000
	src := a.region(t, n*slot, verbs.AccessLocalWrite)
	dst := b.region(t, n*slot, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	rbuf := b.region(t, n*slot, verbs.AccessLocalWrite)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i*7) + seed
	}
	size := func(i int) int { return (i * 977) % slot }
	for i := range n {
		if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{rbuf.SGE(i*slot, slot)}}}); err != nil {
			t.Fatal(err)
		}
		wr := verbs.SendWR{ID: uint64(i), Opcode: verbs.WRWriteWithImm, Flags: verbs.FlagSignaled, ImmData: uint32(seed)<<24 | uint32(i),
			SGL: []verbs.SGE{src.SGE(i*slot, size(i))}, RemoteAddr: dst.Addr() + uint64(i*slot), RKey: dst.RKey()}
		if i%3 == 2 {
			wr.Opcode = verbs.WRSendWithImm
		}
		if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatalf("PostSend %d: %v", i, err)
		}
		wc := poll(t, b.rcq, 1)[0]
		want := verbs.WorkCompletion{ID: uint64(i), Opcode: verbs.WCRecvRDMAWithImm, ByteLen: uint32(size(i)), QPNum: b.qp.Num(),
			Flags: verbs.WCWithImm, ImmData: wr.ImmData}
		got := dst.Bytes()[i*slot : i*slot+size(i)]
		if i%3 == 2 {
			want.Opcode, got = verbs.WCRecv, rbuf.Bytes()[i*slot:i*slot+size(i)]
		}
		if wc != want {
			t.Fatalf("message %d: %+v, want %+v", i, wc, want)
		}
		if !bytes.Equal(got, src.Bytes()[i*slot:i*slot+size(i)]) {
			t.Fatalf("message %d: data differs", i)
		}
		if wc := poll(t, a.scq, 1)[0]; wc.ID != uint64(i) || wc.Opcode != wr.Opcode.WC() || wc.Status != verbs.WCSuccess {
			t.Fatalf("sender's completion %+v", wc)
		}
	}
}

// TestImmediateThroughSocket: RDMA Write and Send with Immediate Data from
// and to an application on the verbs socket (the SQE carries the value,
// the CQE brings it back with WITH_IMM), the socket's side connecting and
// accepting.
func TestImmediateThroughSocket(t *testing.T) {
	for _, sockListens := range []bool{false, true} {
		t.Run(fmt.Sprintf("socket-listens=%v", sockListens), func(t *testing.T) {
			r := newRig(t)
			sock, peer := newEnd(t, r.dial(), 16), newEnd(t, r.peer, 16)
			if sockListens {
				connectAt(t, peer, sock, netip.AddrPortFrom(daemonAddr.Addr(), peerPort), verbs.ConnParam{})
			} else {
				connectAt(t, sock, peer, netip.AddrPortFrom(peerAddr.Addr(), peerPort), verbs.ConnParam{})
			}
			if ext := sock.qp.Info().Params.Ext; ext != mpa.ExtAll {
				t.Fatalf("the socket's QP reports extensions %v, want imm|atomic", ext)
			}
			immRound(t, sock, peer, 30, 1)
			immRound(t, peer, sock, 30, 2)
		})
	}
}

// TestImmediateSocketPeerWithout: toward a peer that did not negotiate
// RFC 7306 the socket's client refuses immediate data at post time, before
// the ring: the daemon never sees the request.
func TestImmediateSocketPeerWithout(t *testing.T) {
	r := newRigWith(t, func(c *offload.Config) { c.RDMAPExt = false })
	sock, peer := newEnd(t, r.dial(), 16), newEnd(t, r.peer, 16)
	connect(t, sock, peer)
	dst := peer.region(t, 64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	posted := r.daemon.Stats().SQPosted.Load()
	for _, op := range []verbs.WROpcode{verbs.WRWriteWithImm, verbs.WRSendWithImm} {
		n, err := sock.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: op, Flags: verbs.FlagInline, Inline: []byte("x"), ImmData: 1,
			RemoteAddr: dst.Addr(), RKey: dst.RKey()}})
		if n != 0 || !errors.Is(err, verbs.ErrNotSupportedByPeer) {
			t.Fatalf("PostSend(%v) = %d, %v; want 0, ErrNotSupportedByPeer", op, n, err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if got := r.daemon.Stats().SQPosted.Load(); got != posted {
		t.Fatalf("the daemon took %d requests", got-posted)
	}
	if n := r.peerEng.Stats().ImmediatesRx.Load(); n != 0 {
		t.Fatalf("%d Immediate Data messages reached the peer", n)
	}
}
