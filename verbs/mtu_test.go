package verbs_test

import (
	"testing"

	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// TestSmallestMTU runs the engine at offload.MinMTU (160), with and
// without markers: the effective MSS is offload.MinEMSS (80), a Send, an
// RDMA Write and an RDMA Read complete, and a Read of an invalid STag
// brings the largest FPDU the engine cannot split — the Terminate that
// copies the DDP and Read Request headers — and still every segment either
// side sent held whole FPDUs.
func TestSmallestMTU(t *testing.T) {
	for _, markers := range []bool{false, true} {
		name := "markers-off"
		if markers {
			name = "markers-on"
		}
		t.Run(name, func(t *testing.T) {
			mod := func(c *offload.Config) { c.Markers = markers }
			cli, srv := newPair(t, pairOpts{mtu: offload.MinMTU(false), cli: mod, srv: mod, depth: 8})
			if got := cli.qp.Info().EMSS; got != offload.MinEMSS() {
				t.Fatalf("EMSS %d at MTU %d, want %d", got, offload.MinMTU(false), offload.MinEMSS())
			}
			const n = 4096
			dst := srv.region(n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			rb := srv.region(64, verbs.AccessLocalWrite)
			srv.recv(verbs.RecvWR{ID: 7, SGL: []verbs.SGE{rb.mr.SGE(0, 64)}})
			cli.post(writeWR(cli, dst, 0, n, dst.mr.RKey()), verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSignaled, Inline: []byte("placed")})
			poll(t, cli.scq, 2)
			poll(t, srv.rcq, 1)
			cli.post(readWR(cli, dst, 0, n, dst.mr.RKey()))
			if wc := poll(t, cli.scq, 1)[0]; wc.Status != verbs.WCSuccess {
				t.Fatalf("Read: %v", wc.Status)
			}
			cli.post(readWR(cli, dst, 0, n, dst.mr.RKey()^0xff))
			terminated(t, srv, cli, rdmap.TermRDMAPInvalidSTag)
			for _, s := range []*side{cli, srv} {
				st := s.eng.Stats()
				if a, sp := st.AlignedSegsTx.Load(), st.SplitSegsTx.Load(); sp != 0 || a == 0 {
					t.Errorf("%s sent %d aligned and %d split segments, want no split one", s.dev.Name(), a, sp)
				}
			}
		})
	}
}
