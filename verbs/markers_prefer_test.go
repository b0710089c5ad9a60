package verbs_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/verbs"
)

// siwMarkersReject is Linux siw's answer to an MPA Request with the M
// flag (captured from siw 6.12, the peer VM of ../shared/peer): a Reply
// with R and the enhanced bit set (flags 0x30), M clear, rev 2, private
// data IRD 0 / ORD 0.
var siwMarkersReject = mustHexBytes("4d504120494420526570204672616d65" + "3002" + "0004" + "00000000")

func mustHexBytes(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// siwLikeResponder answers every connection on l as siw does: a Request
// with M gets siwMarkersReject and a close; any other is accepted with
// the Reply of a siwtun responder (rev 2, IRD 16 / ORD 16, CRC if asked,
// the Write RTR picked if peer-to-peer mode is offered) and kept open. The Requests it saw are sent on reqs.
func siwLikeResponder(ctx context.Context, l *netstack.Listener, reqs chan<- mpa.Frame) {
	for {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		hdr := make([]byte, mpa.FrameHeaderLen)
		if _, err := io.ReadFull(c, hdr); err != nil {
			c.Close()
			continue
		}
		rest := make([]byte, binary.BigEndian.Uint16(hdr[18:]))
		io.ReadFull(c, rest)
		req, err := mpa.ParseFrame(append(hdr, rest...))
		if err != nil {
			c.Close()
			continue
		}
		reqs <- req
		if req.Markers {
			c.Write(siwMarkersReject)
			c.Close()
			continue
		}
		// siw takes a peer-to-peer offer whatever its own setting,
		// preferring the Write RTR (siw_proc_mpareq).
		reply, _, err := mpa.Respond(&mpa.Config{Rev: 2, IRD: 16, ORD: 16, P2P: mpa.RTRWrite | mpa.RTRRead}, req)
		if err != nil {
			c.Close()
			continue
		}
		b, _ := reply.Append(nil)
		c.Write(b)
		go func() {
			<-ctx.Done()
			c.Close()
		}()
	}
}

// TestMarkersRejectedByPeer: an initiator asking for markers from a peer
// that has none (siw's reject, byte for byte) fails with an error that
// says the peer rejected markers; with MarkersPrefer it connects again
// without the M flag and gets a connection without markers.
func TestMarkersRejectedByPeer(t *testing.T) {
	for _, prefer := range []bool{false, true} {
		name := "markers=on"
		if prefer {
			name = "markers=prefer"
		}
		t.Run(name, func(t *testing.T) {
			la, lb := netstack.Pipe(1500, netstack.Impairments{})
			cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", func(c *offload.Config) {
				c.Markers, c.MarkersPrefer = true, prefer
			}, 8)
			ss := newStack(t, lb, srvAddr, 1500)
			l, err := ss.Listen(netipPort(srvPort))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			reqs := make(chan mpa.Frame, 4)
			go siwLikeResponder(ctx, l, reqs)

			err = cli.qp.Connect(ctx, netipPort(srvPort), verbs.ConnParam{})
			if first := <-reqs; !first.Markers {
				t.Fatalf("first Request %v: no M flag", first)
			}
			if !prefer {
				var rej *verbs.RejectedError
				if !errors.As(err, &rej) || !errors.Is(err, verbs.ErrMarkersRejected) {
					t.Fatalf("Connect = %v, want a RejectedError for markers", err)
				}
				if !strings.Contains(err.Error(), "peer rejected markers") {
					t.Fatalf("Connect error %q does not say the peer rejected markers", err)
				}
				if st := cli.qp.State(); st != verbs.QPInit {
					t.Fatalf("QP in %v after the reject, want INIT", st)
				}
				select {
				case r := <-reqs:
					t.Fatalf("a second Request %v without MarkersPrefer", r)
				default:
				}
				return
			}
			if err != nil {
				t.Fatalf("Connect with MarkersPrefer: %v", err)
			}
			if second := <-reqs; second.Markers {
				t.Fatalf("second Request %v still asks for markers", second)
			}
			if p := cli.qp.Info().Params; p.MarkersRx || p.MarkersTx {
				t.Fatalf("negotiated %+v, want no markers", p)
			}
			if st := cli.qp.State(); st != verbs.QPRTS {
				t.Fatalf("QP in %v, want RTS", st)
			}
		})
	}
}

// TestMarkersPreferResponder: a responder with MarkersPrefer asks for
// markers only from an initiator that asked for them itself.
func TestMarkersPreferResponder(t *testing.T) {
	for _, cliMarkers := range []bool{false, true} {
		t.Run(map[bool]string{false: "initiator-without", true: "initiator-with"}[cliMarkers], func(t *testing.T) {
			cli, srv := newPair(t, pairOpts{
				cli: func(c *offload.Config) { c.Markers = cliMarkers },
				srv: func(c *offload.Config) { c.Markers, c.MarkersPrefer = true, true },
			})
			p := cli.qp.Info().Params
			if p.MarkersTx != cliMarkers || p.MarkersRx != cliMarkers {
				t.Fatalf("initiator negotiated markers tx %v rx %v, want %v both ways", p.MarkersTx, p.MarkersRx, cliMarkers)
			}
			exerciseSmall(t, cli, srv)
		})
	}
}
