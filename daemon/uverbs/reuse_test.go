package uverbs

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// TestQPReuseOverSocket: a daemon client's QP moved to ERR by hand (its
// posted receive flushed, Info saying ERR), back to RESET (Info: RESET; a
// receive posted then is refused) and INIT, connects again to a new peer
// QP, and a Send lands in a receive posted after the reset.
func TestQPReuseOverSocket(t *testing.T) {
	r := newRig(t)
	client := r.dial()
	cli := newEnd(t, client, 4)
	buf := cli.region(t, 64, verbs.AccessLocalWrite)
	if err := cli.qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		peer := newEnd(t, r.peer, 4)
		if _, err := cli.qp.PostRecv([]verbs.RecvWR{{ID: uint64(10 + round), SGL: []verbs.SGE{buf.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
		connectAt(t, cli, peer, netip.AddrPortFrom(peerAddr.Addr(), uint16(7300+round)), verbs.ConnParam{})
		waitEvent(t, cli.qp, verbs.EventEstablished)
		if s := cli.qp.Info().State; s != verbs.QPRTS {
			t.Fatalf("round %d: %v after connecting", round, s)
		}
		msg := []byte{'r', byte('0' + round)}
		if _, err := peer.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: msg}}); err != nil {
			t.Fatal(err)
		}
		wc := poll(t, cli.rcq, 1)[0]
		if wc.Status != verbs.WCSuccess || wc.ID != uint64(10+round) || string(buf.Bytes()[:2]) != string(msg) {
			t.Fatalf("round %d: %+v, %q", round, wc, buf.Bytes()[:2])
		}
		// ERR by hand, a receive posted before it flushed.
		if _, err := cli.qp.PostRecv([]verbs.RecvWR{{ID: 20, SGL: []verbs.SGE{buf.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
		if err := cli.qp.Modify(verbs.QPErr); err != nil {
			t.Fatal(err)
		}
		if s := cli.qp.Info().State; s != verbs.QPErr {
			t.Fatalf("round %d: %v after Modify(ERR)", round, s)
		}
		if wc := poll(t, cli.rcq, 1)[0]; wc.ID != 20 || wc.Status != verbs.WCFlushErr {
			t.Fatalf("round %d: %+v, want the receive flushed", round, wc)
		}
		waitEvent(t, peer.qp, verbs.EventDisconnected)
		if err := cli.qp.Modify(verbs.QPReset); err != nil {
			t.Fatal(err)
		}
		if in := cli.qp.Info(); in.State != verbs.QPReset || in.RQUse != 0 || in.SQUse != 0 {
			t.Fatalf("round %d: %+v after Modify(RESET)", round, in)
		}
		if _, err := cli.qp.PostRecv([]verbs.RecvWR{{ID: 30}}); !errors.Is(err, verbs.ErrQPState) {
			t.Fatalf("round %d: receive posted in RESET: %v", round, err)
		}
		if err := cli.qp.Modify(verbs.QPInit); err != nil {
			t.Fatal(err)
		}
		if s := cli.qp.Info().State; s != verbs.QPInit {
			t.Fatalf("round %d: %v after Modify(INIT)", round, s)
		}
	}
}
