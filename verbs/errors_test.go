package verbs_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs"
)

// TestRemoteErrors drives each error a peer can cause with a well-behaved
// verbs client posting bad requests: the detector sends the RFC Terminate,
// both QPs end in ERR, outstanding work completes with the right status,
// and no byte lands outside a region.
func TestRemoteErrors(t *testing.T) {
	const n = 4096
	tests := []struct {
		name string
		// run posts the bad request and returns the expected client
		// completion status of it (WCSuccess: completed at TCP handoff).
		run  func(t *testing.T, cli, srv *side, dst, other *guarded) (verbs.WCOpcode, verbs.WCStatus)
		code rdmap.Code
		// srvRecv is the status of the receive srv has posted.
		srvRecv verbs.WCStatus
	}{
		{"write-invalid-stag", func(t *testing.T, cli, srv *side, dst, _ *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			cli.post(writeWR(cli, dst, 0, n, dst.mr.RKey()+1))
			return verbs.WCWrite, verbs.WCSuccess
		}, rdmap.TermDDPTaggedInvalidSTag, verbs.WCFlushErr},
		{"write-other-pd", func(t *testing.T, cli, srv *side, _, other *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			cli.post(writeWR(cli, other, 0, n, other.mr.RKey()))
			return verbs.WCWrite, verbs.WCSuccess
		}, rdmap.TermDDPTaggedStagNotAssoc, verbs.WCFlushErr},
		{"write-no-remote-write", func(t *testing.T, cli, srv *side, _, _ *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			ro := srv.region(n, verbs.AccessRemoteRead)
			t.Cleanup(func() { ro.checkGuards(t) })
			cli.post(writeWR(cli, ro, 0, n, ro.mr.RKey()))
			return verbs.WCWrite, verbs.WCSuccess
		}, rdmap.TermRDMAPAccess, verbs.WCFlushErr},
		{"write-out-of-bounds", func(t *testing.T, cli, srv *side, dst, _ *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			cli.post(writeWR(cli, dst, n-10, 100, dst.mr.RKey()))
			return verbs.WCWrite, verbs.WCSuccess
		}, rdmap.TermDDPTaggedBaseBounds, verbs.WCFlushErr},
		{"write-below-base", func(t *testing.T, cli, srv *side, dst, _ *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			wr := writeWR(cli, dst, 0, 100, dst.mr.RKey())
			wr.RemoteAddr -= 8
			cli.post(wr)
			return verbs.WCWrite, verbs.WCSuccess
		}, rdmap.TermDDPTaggedBaseBounds, verbs.WCFlushErr},
		{"read-invalid-stag", func(t *testing.T, cli, srv *side, dst, _ *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			cli.post(readWR(cli, dst, 0, n, dst.mr.RKey()^0x100))
			return verbs.WCRead, verbs.WCRemAccessErr
		}, rdmap.TermRDMAPInvalidSTag, verbs.WCFlushErr},
		{"read-other-pd", func(t *testing.T, cli, srv *side, _, other *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			cli.post(readWR(cli, other, 0, n, other.mr.RKey()))
			return verbs.WCRead, verbs.WCRemAccessErr
		}, rdmap.TermRDMAPStagNotAssoc, verbs.WCFlushErr},
		{"read-no-remote-read", func(t *testing.T, cli, srv *side, _, _ *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			wo := srv.region(n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			cli.post(readWR(cli, wo, 0, n, wo.mr.RKey()))
			return verbs.WCRead, verbs.WCRemAccessErr
		}, rdmap.TermRDMAPAccess, verbs.WCFlushErr},
		{"read-out-of-bounds", func(t *testing.T, cli, srv *side, dst, _ *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			cli.post(readWR(cli, dst, 8, n, dst.mr.RKey()))
			return verbs.WCRead, verbs.WCRemAccessErr
		}, rdmap.TermRDMAPBaseBounds, verbs.WCFlushErr},
		{"send-no-receive", func(t *testing.T, cli, srv *side, _, _ *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			// srv's single receive takes the first Send; the second finds none.
			cli.post(verbs.SendWR{ID: 8, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("one")})
			wantWC(t, poll(t, srv.rcq, 1)[0], 77, verbs.WCRecv, verbs.WCSuccess, 3)
			cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("two")})
			wantWC(t, poll(t, cli.scq, 1)[0], 8, verbs.WCSend, verbs.WCSuccess, 3)
			return verbs.WCSend, verbs.WCSuccess
		}, rdmap.TermDDPNoBuffer, verbs.WCSuccess},
		{"send-too-long", func(t *testing.T, cli, srv *side, _, _ *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			big := cli.region(3*n, verbs.AccessLocalWrite)
			cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{big.mr.SGE(0, 3*n)}})
			return verbs.WCSend, verbs.WCSuccess
		}, rdmap.TermDDPTooLong, verbs.WCLocLenErr},
		{"send-invalidate-other-pd", func(t *testing.T, cli, srv *side, _, other *guarded) (verbs.WCOpcode, verbs.WCStatus) {
			cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRSendWithInv, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("x"), InvalidateRKey: other.mr.RKey()})
			return verbs.WCSend, verbs.WCSuccess
		}, rdmap.TermRDMAPProtCannotInvalidate, verbs.WCRemInvReqErr}, // as Linux siw: a protection error
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cli, srv := newPair(t, pairOpts{})
			dst := srv.region(n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			pd2, err := srv.dev.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			other := srv.regionPD(pd2, n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			rbuf := srv.region(n, verbs.AccessLocalWrite)
			srv.recv(verbs.RecvWR{ID: 77, SGL: []verbs.SGE{rbuf.mr.SGE(0, n)}})

			op, st := tt.run(t, cli, srv, dst, other)
			terminated(t, srv, cli, tt.code)

			wc := poll(t, cli.scq, 1)[0]
			if wc.ID != 1 || wc.Opcode != op || wc.Status != st {
				t.Fatalf("client completion {id %d %v %v}, want {id 1 %v %v}", wc.ID, wc.Opcode, wc.Status, op, st)
			}
			if tt.srvRecv != verbs.WCSuccess {
				if wc := poll(t, srv.rcq, 1)[0]; wc.ID != 77 || wc.Status != tt.srvRecv {
					t.Fatalf("server receive completion {id %d %v}, want {id 77 %v}", wc.ID, wc.Status, tt.srvRecv)
				}
			}
			// Work posted after the Terminate is flushed.
			cli.post(verbs.SendWR{ID: 99, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("late")})
			if wc := poll(t, cli.scq, 1)[0]; wc.ID != 99 || wc.Status != verbs.WCFlushErr {
				t.Fatalf("late send completion {id %d %v}, want flush error", wc.ID, wc.Status)
			}
			for _, g := range []*guarded{dst, other, rbuf} {
				g.checkGuards(t)
			}
			if c := srv.eng.Stats().TerminatesTx.Load(); c != 1 {
				t.Fatalf("server sent %d Terminates, want 1", c)
			}
		})
	}
}

func writeWR(cli *side, dst *guarded, off, n int, rkey uint32) verbs.SendWR {
	src := cli.region(n, verbs.AccessLocalWrite)
	fill(src.buf(), 9)
	return verbs.SendWR{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{src.mr.SGE(0, n)}, RemoteAddr: dst.mr.Addr() + uint64(off), RKey: rkey}
}

func readWR(cli *side, src *guarded, off, n int, rkey uint32) verbs.SendWR {
	sink := cli.region(n, verbs.AccessLocalWrite)
	return verbs.SendWR{ID: 1, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(0, n)}, RemoteAddr: src.mr.Addr() + uint64(off), RKey: rkey}
}

// rawPeer speaks MPA/DDP/RDMAP by hand over a TCP connection, to send what
// no well-behaved engine sends.
type rawPeer struct {
	t      testing.TB
	conn   *netstack.Conn
	params mpa.Params
	tx     mpa.Sender
	rx     mpa.Receiver
	got    chan []byte // received ULPDUs
	cur    []byte
}

func (p *rawPeer) BeginFPDU(n int) error { p.cur = make([]byte, 0, n); return nil }
func (p *rawPeer) ULPDU(b []byte) error  { p.cur = append(p.cur, b...); return nil }
func (p *rawPeer) EndFPDU(ok bool) error {
	if !ok {
		return errors.New("raw peer: bad CRC received")
	}
	p.got <- p.cur
	return nil
}

// dialRaw connects a raw peer from stack s to srv, which accepts into its QP.
func dialRaw(t testing.TB, s *netstack.Stack, srv *side, cfg mpa.Config) *rawPeer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	l, err := srv.dev.Listen(netipPort(srvPort), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if req, err := l.Accept(ctx); err == nil {
			req.Accept(srv.qp, verbs.ConnParam{})
		}
	}()
	conn, err := s.Dial(ctx, netip.Addr{}, netipPort(srvPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req, err := cfg.Request()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := req.Append(nil)
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, mpa.FrameHeaderLen)
	if _, err := io.ReadFull(conn, hdr); err != nil {
		t.Fatal(err)
	}
	rest := make([]byte, binary.BigEndian.Uint16(hdr[18:]))
	if _, err := io.ReadFull(conn, rest); err != nil {
		t.Fatal(err)
	}
	rep, err := mpa.ParseFrame(append(hdr, rest...))
	if err != nil {
		t.Fatal(err)
	}
	params, err := mpa.Complete(&cfg, req, rep)
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{t: t, conn: conn, params: params, got: make(chan []byte, 64)}
	p.tx.Init(params.CRC, params.MarkersTx)
	p.rx.Init(params.CRC, params.MarkersRx, p)
	go func() {
		for {
			if _, err := conn.ReadTo(&p.rx); err != nil {
				close(p.got)
				return
			}
		}
	}()
	if cfg.P2P == 0 {
		// A peer-to-peer responder is established by the RTR only.
		srv.waitEvent(verbs.EventEstablished)
	}
	return p
}

// send sends one FPDU carrying ulpdu; corrupt flips a CRC bit.
func (p *rawPeer) send(ulpdu []byte, corrupt bool) {
	p.t.Helper()
	p.tx.Begin(nil, len(ulpdu))
	p.tx.Write(ulpdu)
	f := p.tx.Finish()
	if corrupt {
		f[len(f)-1] ^= 0x10
	}
	if _, err := p.conn.Write(f); err != nil {
		p.t.Fatal(err)
	}
}

// terminate waits for the Terminate the peer sends.
func (p *rawPeer) terminate() (ddp.Header, rdmap.Terminate) {
	p.t.Helper()
	timer := time.NewTimer(testTimeout)
	defer timer.Stop()
	for {
		select {
		case u, ok := <-p.got:
			if !ok {
				p.t.Fatal("raw peer: connection closed without a Terminate")
			}
			var h ddp.Header
			n, err := h.Unmarshal(u)
			if err != nil {
				p.t.Fatal(err)
			}
			if _, op := rdmap.ParseCtrl(h.ULPCtrl); op != rdmap.OpTerminate {
				continue
			}
			var term rdmap.Terminate
			if err := term.Unmarshal(u[n:]); err != nil {
				p.t.Fatalf("Terminate: %v", err)
			}
			p.conn.Close() // as a peer does after a Terminate
			return h, term
		case <-timer.C:
			p.t.Fatal("raw peer: no Terminate")
		}
	}
}

func untagged(op rdmap.Opcode, qn, msn, mo uint32, last bool, body []byte) []byte {
	h := ddp.Header{Last: last, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(op), QN: qn, MSN: msn, MO: mo}
	b := make([]byte, h.Len()+len(body))
	h.Marshal(b)
	copy(b[h.Len():], body)
	return b
}
