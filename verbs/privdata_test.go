package verbs_test

import (
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// TestAcceptPrivateDataReachesInitiator: the private data the listener
// gives its accept reaches the connecting side in its EventEstablished,
// as librdmacm's ESTABLISHED event carries it, so a program can hand over
// its rkey without a Send; the listener's own EventEstablished has none.
func TestAcceptPrivateDataReachesInitiator(t *testing.T) {
	pd := []byte("rkey and address of the listener")
	cli, srv := newPair(t, pairOpts{srvParam: verbs.ConnParam{PrivateData: pd}, cliParam: verbs.ConnParam{PrivateData: []byte("req")}})
	if got := cli.waitEvent(verbs.EventEstablished).PrivateData; string(got) != string(pd) {
		t.Errorf("initiator's EventEstablished private data %q, want %q", got, pd)
	}
	if got := srv.waitEvent(verbs.EventEstablished).PrivateData; got != nil {
		t.Errorf("listener's EventEstablished private data %q, want none", got)
	}
}
