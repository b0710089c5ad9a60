package test

import (
	"strings"
	"testing"
	"time"
)

// TestHostileTerminateBeforeClose: a hostile
// initiator, over the namespace kernel's TCP, connects to `siwtun ping -s
// -P` through the daemon again and again and sends one bad message per
// connection: a Send with a wrong CRC, a Send with Invalidate naming an
// STag never advertised, a Send longer than the posted receive, and a
// Send whose header announces 65,517 octets toward it of which 16 come
// (answered as the header shows it, at once). Every connection must end
// with the right Terminate before the FIN, whatever the server
// application does on its error completion (before the fix about one
// connection in ten got the FIN alone).
func TestHostileTerminateBeforeClose(t *testing.T) {
	reps := "1000"
	if testing.Short() {
		reps = "50"
	}
	r := newTwoRNICs(t, 1500)
	hostile := buildHostile(t)
	srv := startPingProc(t, r, "-s", "-P", "-a", r.a1.String(), "-d", "--dev", "siwtun1", "--socket-dir", r.d1.socketDir)
	srv.waitListening(t)
	for _, c := range []string{"bad-crc", "send-inv-unknown", "send-too-long", "send-announces-too-much"} {
		t.Run(c, func(t *testing.T) {
			start := time.Now()
			out, err := r.ns.command(hostile, "repeat", reps, c, r.a1.String()+":7174").CombinedOutput()
			if err != nil {
				t.Fatalf("hostile repeat %s %s: %v\n%s", reps, c, err, out)
			}
			if !strings.Contains(string(out), "runs: "+reps+"\nmisses: 0\n") {
				t.Fatalf("hostile output:\n%s", out)
			}
			t.Logf("%s: %s connections, 0 without the Terminate, in %v", c, reps, time.Since(start).Round(time.Millisecond))
		})
	}
	select {
	case <-srv.exited:
		t.Fatalf("persistent server exited: %v\n%s", srv.err, srv.stderr)
	default:
	}
}
