package verbs_test

import (
	"context"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/verbs"
)

// TestFirstFPDUDelay: an initiator holds its first FPDU for
// Config.FirstFPDUDelay after the MPA Reply (Linux siw leaves an FPDU that
// arrives right after its Reply unread), even when the application posts
// a Send the moment Connect returns.
func TestFirstFPDUDelay(t *testing.T) {
	const delay = 150 * time.Millisecond
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", func(c *offload.Config) { c.FirstFPDUDelay = delay }, 8)
	ss := newStack(t, lb, srvAddr, 1500)
	l, err := ss.Listen(netipPort(srvPort))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	gap := make(chan time.Duration, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			gap <- -1
			return
		}
		defer c.Close()
		hdr := make([]byte, mpa.FrameHeaderLen)
		io.ReadFull(c, hdr)
		rest := make([]byte, binary.BigEndian.Uint16(hdr[18:]))
		io.ReadFull(c, rest)
		req, _ := mpa.ParseFrame(append(hdr, rest...))
		reply, _, err := mpa.Respond(&mpa.Config{Rev: 2, IRD: 16, ORD: 16}, req)
		if err != nil {
			gap <- -1
			return
		}
		b, _ := reply.Append(nil)
		c.Write(b)
		sent := time.Now()
		one := make([]byte, 1)
		if _, err := io.ReadFull(c, one); err != nil {
			gap <- -1
			return
		}
		gap <- time.Since(sent)
	}()
	if err := cli.qp.Connect(ctx, netipPort(srvPort), verbs.ConnParam{}); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("first")})
	if g := <-gap; g < delay {
		t.Fatalf("first FPDU %v after the Reply, want at least %v", g, delay)
	}
}
