package netstack

import (
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// TestTailKeeper: which kept packets a rescue writes again, and when: none
// while the connection has sent or been acknowledged within the wait,
// those the peer has not acknowledged once it has not, then not again
// before twice the wait; an ACK drops what it covers and resets the wait.
func TestTailKeeper(t *testing.T) {
	pkt := func(n int) *stack.PacketBuffer {
		return stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(make([]byte, n))})
	}
	var k tailKeeper
	defer k.release()
	for i := range uint32(tailKeep + 2) { // the two oldest fall out of the ring
		p := pkt(100)
		k.keep(1000+100*i, 1100+100*i, p)
		p.DecRef() // the keeper holds its own clone
	}
	if n := k.n.Load(); n != tailKeep {
		t.Fatalf("%d packets kept, want %d", n, tailKeep)
	}
	now := time.Now()
	sent := uint32(1000 + 100*(tailKeep+2))
	ranges := func(ps []*stack.PacketBuffer) []int {
		var out []int
		for _, p := range ps {
			out = append(out, p.Data().Size())
			p.DecRef()
		}
		return out
	}
	if got := k.due(now, 1000, sent); got != nil {
		t.Fatalf("rescue right after the last send: %v", ranges(got))
	}
	k.acked(1000 + 100*7) // covers the first seven packets sent
	if got := k.due(time.Now(), 1700, sent); got != nil {
		t.Fatalf("rescue right after an ACK advanced: %v", ranges(got))
	}
	later := time.Now().Add(rescueAfter + time.Millisecond)
	if got := ranges(k.due(later, 1700, sent)); len(got) != 3 {
		t.Fatalf("rescue of the 3 unacknowledged packets: got %d packets", len(got))
	}
	if got := k.due(later.Add(rescueAfter+time.Millisecond), 1700, sent); got != nil {
		t.Fatalf("a second rescue before twice the wait: %v", ranges(got))
	}
	if got := ranges(k.due(later.Add(2*rescueAfter+time.Millisecond), 1700, sent)); len(got) != 3 {
		t.Fatalf("the second rescue after twice the wait: got %d packets", len(got))
	}
	if got := k.due(later.Add(time.Hour), sent, sent); got != nil {
		t.Fatalf("rescue with everything acknowledged: %v", ranges(got))
	}
	k.acked(sent)
	if n := k.n.Load(); n != 0 {
		t.Fatalf("%d packets kept after the last ACK", n)
	}
}
