package verbs_test

import (
	"testing"
	"time"

	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// TestFINDelay: a QP whose peer is not known to be siwtun holds its FIN
// back for Config.FINDelay after the application disconnects (Linux siw
// fails a Send it has already sent when the FIN comes before its send
// call returned); a QP whose peer said it is siwtun (the Reply's
// mpa.ExtReady, the Request's extension block) closes at once, however
// long the delay.
// Each device counts the FINs it held (mpaFinDelays).
func TestFINDelay(t *testing.T) {
	const delay = time.Second
	for _, tc := range []struct {
		name      string
		cli, srv  func(*offload.Config)
		serverEnd bool // the server disconnects, else the client
		held      bool
	}{
		// The client's Request has no extension block: to the server,
		// it could be siw.
		{"responder, initiator unknown", func(c *offload.Config) { c.RDMAPExt = false },
			func(c *offload.Config) { c.FINDelay = delay }, true, true},
		{"responder, initiator siwtun", nil,
			func(c *offload.Config) { c.FINDelay = time.Hour }, true, false},
		// A siwtun responder's Reply to a Request with an extension
		// block says it is siwtun (mpa.ExtReady), extensions or not.
		{"initiator, responder siwtun", func(c *offload.Config) { c.FINDelay = time.Hour },
			func(c *offload.Config) { c.RDMAPExt = false }, false, false},
		// Without a block in the Request (the initiator's extensions
		// off: exactly the application's private data) the initiator
		// cannot learn it: the FIN waits.
		{"initiator without extensions, responder siwtun", func(c *offload.Config) { c.FINDelay = delay; c.RDMAPExt = false },
			nil, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, srv := newPair(t, pairOpts{cli: tc.cli, srv: tc.srv, depth: 4})
			ender, other := cli, srv
			if tc.serverEnd {
				ender, other = srv, cli
			}
			start := time.Now()
			ender.qp.Disconnect()
			ended := time.Since(start)
			other.waitEvent(verbs.EventDisconnected)
			seen := time.Since(start)
			n := ender.eng.Stats().FINDelays.Load()
			switch {
			case tc.held && (seen < delay || n != 1):
				t.Errorf("peer saw the end %v after Disconnect, mpaFinDelays %d; want at least %v and 1", seen, n, delay)
			case !tc.held && n != 0:
				t.Errorf("mpaFinDelays = %d, want 0", n)
			}
			if tc.held && ended >= delay {
				t.Errorf("Disconnect took %v: the application waited for the held FIN (%v)", ended, delay)
			}
		})
	}
}
