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

// TestFirstFPDUDelay: against a peer that answers as Linux siw does, an
// initiator holds its first FPDU for Config.FirstFPDUDelay after the MPA
// Reply (siw leaves an FPDU that arrives right after its Reply unread,
// its RTR in peer-to-peer mode too), even when the application posts a
// Send the moment Connect returns; the device counts the delay
// (mpaFirstFpduDelays).
//
// The peer is a bare TCP listener that builds its Reply the way siw does
// (siw_proc_mpareq, siw_accept): the Request's own 20-octet header with
// the key changed to the Reply's, and an IRD/ORD block of its own that
// takes a peer-to-peer offer with the Write RTR.
func TestFirstFPDUDelay(t *testing.T) {
	const delay = 150 * time.Millisecond
	for _, tc := range []struct {
		name string
		p2p  mpa.RTR
	}{{"p2p offered (the default)", mpa.RTRWrite | mpa.RTRRead}, {"no p2p", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			la, lb := netstack.Pipe(1500, netstack.Impairments{})
			cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", func(c *offload.Config) {
				c.FirstFPDUDelay = delay
				c.P2P = tc.p2p
			}, 8)
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
				pd := make([]byte, binary.BigEndian.Uint16(hdr[18:]))
				io.ReadFull(c, pd)
				reply := append([]byte("MPA ID Rep Frame"), hdr[16:18]...) // siw: the Request's flags and revision
				reply = binary.BigEndian.AppendUint16(reply, 4)
				if pd[0]&0x80 != 0 {
					reply = append(reply, 0x80, 0x01, 0x80, 0x01) // P2P, IRD 1; Write RTR, ORD 1
				} else {
					reply = append(reply, 0x00, 0x01, 0x00, 0x01) // IRD 1, ORD 1
				}
				c.Write(reply)
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
			if n := cli.eng.Stats().FirstFPDUDelays.Load(); n != 1 {
				t.Errorf("mpaFirstFpduDelays = %d, want 1", n)
			}
		})
	}
}

// TestNoFirstFPDUDelayBetweenRNICs: between two siwtun RNICs the
// initiator's first FPDU goes at once, its RTR too in peer-to-peer mode,
// whatever FirstFPDUDelay says: the responder's Reply says that it reads
// at once (mpa.ExtReady in its extension block). The delay is an hour here, so a connection
// that paid it would never complete; the application's first Send does,
// and nothing counts a delay.
func TestNoFirstFPDUDelayBetweenRNICs(t *testing.T) {
	for _, tc := range []struct {
		name string
		p2p  mpa.RTR
	}{{"plain", 0}, {"p2p write rtr", mpa.RTRWrite}, {"p2p read rtr", mpa.RTRRead}} {
		t.Run(tc.name, func(t *testing.T) {
			la, lb := netstack.Pipe(1500, netstack.Impairments{})
			cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", func(c *offload.Config) {
				c.FirstFPDUDelay = time.Hour
				c.P2P = tc.p2p
			}, 8)
			srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", nil, 8)
			rbuf := srv.region(64, verbs.AccessLocalWrite)
			if err := srv.qp.Modify(verbs.QPInit); err != nil {
				t.Fatal(err)
			}
			srv.recv(verbs.RecvWR{ID: 7, SGL: []verbs.SGE{rbuf.mr.SGE(0, 64)}})
			connect(t, cli, srv, verbs.ConnParam{}, verbs.ConnParam{})
			cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSignaled, Inline: []byte("first")})
			wantWC(t, poll(t, srv.rcq, 1)[0], 7, verbs.WCRecv, verbs.WCSuccess, 5)
			sameBytes(t, "first Send", rbuf.buf()[:5], []byte("first"))
			if n := cli.eng.Stats().FirstFPDUDelays.Load(); n != 0 {
				t.Errorf("mpaFirstFpduDelays = %d, want 0", n)
			}
		})
	}
}
