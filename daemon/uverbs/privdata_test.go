package uverbs

import (
	"net/netip"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// TestSocketAcceptPrivateData: over the verbs socket too, the connecting
// side's EventEstablished carries the listener's accept private data (the
// event now carries it to the client), and a listener reached over the
// socket sends it.
func TestSocketAcceptPrivateData(t *testing.T) {
	r := newRig(t)
	dev := r.dial()
	// The initiator over the socket, the listener in-process; then the
	// other way round.
	for i, tc := range []struct {
		name     string
		cli, srv *side
		at       netip.Addr
	}{
		{"initiator-over-socket", newEnd(t, dev, 8), newEnd(t, r.peer, 8), peerAddr.Addr()},
		{"listener-over-socket", newEnd(t, r.peer, 8), newEnd(t, dev, 8), daemonAddr.Addr()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pd := []byte{0, 0, 0x7f, 1, 2, 3, 4, 5, 0x11, 0x22, 0x33, byte(i)}
			connectAt(t, tc.cli, tc.srv, netip.AddrPortFrom(tc.at, uint16(7300+i)), verbs.ConnParam{PrivateData: pd})
			if got := waitEvent(t, tc.cli.qp, verbs.EventEstablished).PrivateData; string(got) != string(pd) {
				t.Errorf("EventEstablished private data %x, want %x", got, pd)
			}
		})
	}
}
