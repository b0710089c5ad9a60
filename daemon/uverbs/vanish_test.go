package uverbs

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/internal/uabi"
	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// TestClientVanishesMidRequest: a client that dies (its socket closed, as
// the kernel closes a SIGKILLed process's) with one request in flight,
// at every step of a client's life: setting up (its CreateCQ, CreateQP or
// RegMR reply, with descriptors, not read yet), connecting, and with RDMA
// Writes posted and running. Each time the server ends the session and
// releases what the client had: no session, no QP, no region, and the
// process's memfd and eventfd descriptors and memfd mappings back where
// they were (make soak's TestSoakClientKilled asks this of a daemon 100
// times at random moments).
func TestClientVanishesMidRequest(t *testing.T) {
	r := newRig(t)
	// A first client's QP makes what the server keeps (its doorbell
	// sleepers) before the baseline.
	warm := r.raw(t)
	warm.must(uabi.OpHello, &uabi.Hello{Version: uabi.Version}, nil)
	var pdRep uabi.AllocPDReply
	warm.must(uabi.OpAllocPD, nil, &pdRep)
	wcq := warm.createCQ(16)
	warm.createQP(pdRep.Handle, wcq.h, 8).close()
	wcq.close()
	warm.c.C.Close()
	testkit.Eventually(t, testTimeout, "the first client's session ends", func() bool { return r.srv.Sessions() == 0 })
	baseFDs, baseMaps := resources(t)
	qps0, mrs0 := len(r.daemon.QPs()), r.daemon.Regions().Len()

	const size = 1 << 20
	dst := newGuarded(t, newEnd(t, r.peer, 16), size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	steps := []string{"CreateCQ", "CreateQP", "RegMR", "Connect", "Writes"}
	for i, step := range steps {
		t.Run(step, func(t *testing.T) {
			rc := r.raw(t)
			var held []func() // the client's own mappings and descriptors
			defer func() {
				for _, f := range held {
					f()
				}
			}()
			rc.must(uabi.OpHello, &uabi.Hello{Version: uabi.Version}, nil)
			var pd uabi.AllocPDReply
			rc.must(uabi.OpAllocPD, nil, &pd)
			vanish := func(op uint16, m uabi.Msg, fds ...int) {
				rc.post(op, m, fds...)
				rc.c.C.Close() // the reply, and its descriptors, never read
			}
			if step == "CreateCQ" {
				vanish(uabi.OpCreateCQ, &uabi.CreateCQ{Depth: 64})
				return
			}
			cq := rc.createCQ(64)
			held = append(held, cq.close)
			if step == "CreateQP" {
				vanish(uabi.OpCreateQP, &uabi.CreateQP{PD: pd.Handle, SendCQ: cq.h, RecvCQ: cq.h, MaxSendWR: 16, MaxRecvWR: 4})
				return
			}
			q := rc.createQP(pd.Handle, cq.h, 16)
			held = append(held, q.close)
			memfd, mem, err := uabi.NewShared("siwtun-mr", size, false)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, func() { uabi.Unmap(mem); uabi.Close(memfd) })
			reg := &uabi.RegMR{PD: pd.Handle, Length: size, IOVA: 0x10000, Access: uint32(ibv.AccessLocalWrite)}
			if step == "RegMR" {
				vanish(uabi.OpRegMR, reg, memfd)
				return
			}
			var mr uabi.RegMRReply
			rc.must(uabi.OpRegMR, reg, &mr, memfd)
			rc.must(uabi.OpModifyQP, &uabi.ModifyQP{Handle: q.h, State: uint32(ibv.QPInit)}, nil)
			port := uint16(7400 + i)
			if step == "Connect" {
				q.peer = newEnd(t, r.peer, 16)
				l, err := r.peer.Listen(netip.AddrPortFrom(peerAddr.Addr(), port), 4)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				vanish(uabi.OpConnect, &uabi.Connect{Handle: q.h, Remote: netip.AddrPortFrom(peerAddr.Addr(), port)})
				return
			}
			rc.connectTo(r, q, port)
			for pos := range uint32(8) {
				q.postSend(pos, ibv.SendWR{ID: uint64(pos), Opcode: ibv.WRWrite, Flags: ibv.FlagSignaled,
					SGL: []ibv.SGE{{Addr: 0x10000, Length: size, LKey: mr.STag}}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}, nil)
			}
			rc.c.C.Close() // with the Writes on the wire
		})
		testkit.Eventually(t, testTimeout, fmt.Sprintf("%s: the session ends and releases the client's objects", step), func() bool {
			return r.srv.Sessions() == 0 && len(r.daemon.QPs()) == qps0 && r.daemon.Regions().Len() == mrs0
		})
		testkit.Eventually(t, testTimeout, fmt.Sprintf("%s: memfd and eventfd descriptors and memfd mappings back at %d and %d", step, baseFDs, baseMaps), func() bool {
			fds, maps := resources(t)
			return fds <= baseFDs && maps <= baseMaps
		})
	}
	dst.intact(t, "the peer's region")
}
