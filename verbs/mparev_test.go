package verbs_test

import (
	"context"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/netstack"
)

// TestMPARequestRevisionTooHigh (RFC 5044 §7.1): a Request of a revision
// above 2 gets no Reply; the listener closes the connection, counts it,
// and keeps accepting well-formed requests.
func TestMPARequestRevisionTooHigh(t *testing.T) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cs := newStack(t, la, cliAddr, 1500)
	srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", nil, 8)
	l, err := srv.dev.Listen(netipPort(srvPort), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, rev := range []uint8{3, 4, 255} {
		conn, err := cs.Dial(ctx, netip.Addr{}, netipPort(srvPort))
		if err != nil {
			t.Fatal(err)
		}
		cfg := mpa.Config{Rev: 2, CRC: true, IRD: 1, ORD: 1}
		req, err := cfg.Request()
		if err != nil {
			t.Fatal(err)
		}
		req.Rev = rev
		b, err := req.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(testTimeout))
		got, err := io.ReadAll(conn)
		if err != nil || len(got) != 0 {
			t.Fatalf("rev %d: read %d bytes (%x), %v; want a close without a Reply", rev, len(got), got, err)
		}
		conn.Close()
	}
	if n := srv.eng.Stats().BadRevisions.Load(); n != 3 {
		t.Fatalf("mpaBadRevisions = %d, want 3", n)
	}
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	if r, err := l.Accept(short); err == nil {
		t.Fatalf("a Request of a bad revision reached the application: %v", r.Remote)
	}
}
