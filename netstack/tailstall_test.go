package netstack

import (
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// sendWatch notes, per local port, when a stack last sent a data segment
// (a retransmission included).
type sendWatch struct {
	mu   sync.Mutex
	last map[uint16]time.Time
}

func (w *sendWatch) Segment(s *Segment) {
	if s.Dir != Outbound || len(s.Payload) == 0 {
		return
	}
	w.mu.Lock()
	w.last[s.Src.Port()] = time.Now()
	w.mu.Unlock()
}

func (w *sendWatch) since(port uint16) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Since(w.last[port])
}

// TestLossyBurstsRetransmitted: bursts of aligned writes as the engine
// makes them (an RDMA message of MSS-sized FPDUs, a short last one, a tiny
// Send), each followed by silence until the peer has acknowledged it, on 8
// connections over a Pipe that loses 8 % of the packets (both ways) and
// reorders and duplicates some, for 20 s. While a burst is
// unacknowledged its sender must keep retransmitting: a data segment at
// least every two retransmission timeouts (plus 2 s), or have it
// acknowledged, the tail rescue's rewrites included. make soak's silent
// stalls were senders that had stopped: gVisor's RACK tail loss probe,
// which replaces the retransmission timer, armed no timer again once its
// count of segments in flight had dropped to zero (it does after a
// timeout) with a burst's tail still unacknowledged and lost; nothing left
// the sender again. Without RACK (Stack's TCPRecovery 0) the timer runs
// whenever anything is unacknowledged.
func TestLossyBurstsRetransmitted(t *testing.T) {
	if testing.Short() {
		t.Skip("lossy transfer")
	}
	const conns = 8
	w := &sendWatch{last: make(map[uint16]time.Time)}
	a, b := newPair(t, pairOpts{mtu: 1500, imp: Impairments{Seed: 15, Loss: 0.08, Reorder: 0.02, Duplicate: 0.005}})
	stop := time.Now().Add(20 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		ca, cb := connect(t, a, b, addrB4.Addr())
		ca.SetSegmentHook(w) // as the engine watches its connections
		go io.Copy(io.Discard, readerOf{cb})
		port := ca.LocalAddr().Port()
		wg.Go(func() {
			mss := ca.MSS()
			big, tail, tiny := make([]byte, mss), make([]byte, 364), make([]byte, 32)
			for n := 0; time.Now().Before(stop); n++ {
				for range 64 + (n+i)%64 {
					if _, err := ca.WriteAligned(big); err != nil {
						errs <- err
						return
					}
				}
				for _, p := range [][]byte{tail, tiny} {
					if _, err := ca.WriteAligned(p); err != nil {
						errs <- err
						return
					}
				}
				for !ca.WaitAcked(100 * time.Millisecond) {
					var info tcpip.TCPInfoOption
					if terr := ca.ep.GetSockOpt(&info); terr != nil {
						errs <- fmt.Errorf("connection %d: TCP info: %v", i, terr)
						return
					}
					if quiet := w.since(port); quiet > 2*info.RTO+2*time.Second {
						errs <- fmt.Errorf("connection %d, burst %d: unacknowledged, and nothing sent for %v (RTO %v): the sender stopped; send side: %s",
							i, n, quiet.Round(time.Millisecond), info.RTO, ca.SendState())
						return
					}
				}
			}
		})
	}
	wg.Wait()
	t.Logf("tail rescues: %d packets written again", a.TailRescues())
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// readerOf reads a Conn with Read.
type readerOf struct{ c *Conn }

func (r readerOf) Read(p []byte) (int, error) { return r.c.Read(p) }
