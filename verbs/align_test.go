package verbs_test

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// alignCounter classifies outbound data segments: aligned when the payload
// is whole FPDUs (markers off), starting with an FPDU.
type alignCounter struct {
	mu                  sync.Mutex
	aligned, misaligned int
	frames              int
}

func (a *alignCounter) Segment(s *netstack.Segment) {
	if s.Dir != netstack.Outbound || len(s.Payload) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	p := s.Payload
	if len(p) >= 4 && string(p[:4]) == "MPA " {
		a.frames++
		return
	}
	for len(p) >= 2 {
		n := int(binary.BigEndian.Uint16(p))
		total := 2 + n + (4-(2+n)%4)%4 + 4
		if total > len(p) {
			break
		}
		p = p[total:]
	}
	if len(p) == 0 {
		a.aligned++
	} else {
		a.misaligned++
	}
}

// TestSegmentAlignment sends 16 MiB of RDMA Writes and checks that the
// sender's TCP segments start with an FPDU and hold whole FPDUs, with one
// FPDU per write and with batched writes. The rare misaligned segment is a
// window-edge split inside gVisor's sender (netstack-probe.md §1e), more
// frequent on a loaded machine (under -race at MTU 9000: 96.5 %); the bound
// here only catches a broken sender (a misaligned FPDU size gives ~0 %),
// the figures are logged.
func TestSegmentAlignment(t *testing.T) {
	for _, mtu := range []int{1500, 9000} {
		for _, perWrite := range []int{1, 64, -1} {
			markers := perWrite < 0 // markers on, one FPDU per write
			t.Run(fmt.Sprintf("mtu%d/perwrite%d", mtu, perWrite), func(t *testing.T) {
				ac := &alignCounter{}
				la, lb := netstack.Pipe(mtu, netstack.Impairments{})
				cliAt := on(la, cliAddr, mtu)
				cliAt.opts.Hook = ac
				cli := newSide(t, cliAt, "siwtun0", func(c *offload.Config) { c.FPDUsPerWrite = max(perWrite, 1) }, 64)
				srv := newSide(t, on(lb, srvAddr, mtu), "siwtun1", func(c *offload.Config) { c.Markers = markers }, 64)
				connect(t, cli, srv, verbs.ConnParam{}, verbs.ConnParam{})
				const size = 1 << 20
				src := cli.region(size, verbs.AccessLocalWrite)
				dst := srv.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
				for i := 0; i < 16; i++ {
					cli.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, size)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()})
				}
				poll(t, cli.scq, 16)
				srv.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{dst.mr.SGE(0, 8)}})
				cli.post(verbs.SendWR{ID: 99, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("end")})
				poll(t, srv.rcq, 1)
				ac.mu.Lock()
				defer ac.mu.Unlock()
				// The engine's own classification, both ends.
				cst, sst := cli.eng.Stats(), srv.eng.Stats()
				txA, txS := int(cst.AlignedSegsTx.Load()), int(cst.SplitSegsTx.Load())
				rxA, rxS := int(sst.AlignedSegsRx.Load()), int(sst.SplitSegsRx.Load())
				t.Logf("engine: sent %d aligned %d split; received %d aligned %d split", txA, txS, rxA, rxS)
				if rxA != txA || rxS != txS {
					t.Errorf("receiver classified %d/%d, sender %d/%d (lossless link)", rxA, rxS, txA, txS)
				}
				if markers {
					if pct := 100 * float64(txA) / float64(txA+txS); txA+txS < 16*size/9000 || pct < 99 {
						t.Fatalf("markers on: %d of %d segments aligned", txA, txA+txS)
					}
					return
				}
				if txA != ac.aligned || txS != ac.misaligned {
					t.Errorf("engine counted %d aligned %d split, the test's own parse %d and %d", txA, txS, ac.aligned, ac.misaligned)
				}
				total := ac.aligned + ac.misaligned
				pct := 100 * float64(ac.aligned) / float64(total)
				t.Logf("MTU %d, FPDUs per write %d: %d data segments, %d aligned (%.3f%%), %d misaligned", mtu, perWrite, total, ac.aligned, pct, ac.misaligned)
				if total < 16*size/9000 || pct < 90 {
					t.Fatalf("%d of %d segments aligned", ac.aligned, total)
				}
			})
		}
	}
}
