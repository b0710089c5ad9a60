package rping_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/tools/rping"
	"github.com/siwtun/siwtun/verbs"
)

// rawPeer is a hand-driven rping peer written with plain verbs, to check
// the package against a second reading of the protocol and to misbehave.
type rawPeer struct {
	t                    testing.TB
	ctx                  context.Context
	cq                   *verbs.CQ
	qp                   *verbs.QP
	msg                  []byte // receive buffer
	out                  []byte // send buffer
	data                 []byte
	msgMR, outMR, dataMR *verbs.MR
}

func newRawPeer(t testing.TB, ctx context.Context, dev *verbs.Device) *rawPeer {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(32)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	mem, err := dev.AllocBuffer(rping.MaxSize + 128)
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{t: t, ctx: ctx, cq: cq, qp: qp, msg: mem[:16], out: mem[64:80], data: mem[128 : 128+rping.MaxSize]}
	all := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	for _, r := range []struct {
		mr  **verbs.MR
		b   []byte
		acc verbs.Access
	}{{&p.msgMR, p.msg, verbs.AccessLocalWrite}, {&p.outMR, p.out, 0}, {&p.dataMR, p.data, all}} {
		if *r.mr, err = pd.RegMR(r.b, r.acc); err != nil {
			t.Fatal(err)
		}
	}
	p.postRecv()
	return p
}

func (p *rawPeer) postRecv() {
	p.t.Helper()
	if _, err := p.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{p.msgMR.SGE(0, 16)}}}); err != nil {
		p.t.Fatalf("PostRecv: %v", err)
	}
}

func (p *rawPeer) post(wr verbs.SendWR) {
	p.t.Helper()
	wr.Flags = verbs.FlagSignaled
	if _, err := p.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		p.t.Fatalf("PostSend: %v", err)
	}
}

// next waits for the next completion other than a Send's and fails the
// test unless it is op and succeeded; a flushed receive (the peer went)
// returns false.
func (p *rawPeer) next(op verbs.WCOpcode) (verbs.WorkCompletion, bool) {
	p.t.Helper()
	wcs := make([]verbs.WorkCompletion, 1)
	for {
		if _, err := p.cq.Wait(p.ctx, wcs); err != nil {
			p.t.Fatalf("waiting for %v: %v", op, err)
		}
		wc := wcs[0]
		if wc.Status == verbs.WCFlushErr {
			return wc, false
		}
		if wc.Status != verbs.WCSuccess {
			p.t.Fatalf("completion %+v, want %v", wc, op)
		}
		if wc.Opcode == verbs.WCSend && op != verbs.WCSend {
			continue
		}
		if wc.Opcode != op {
			p.t.Fatalf("completion %v, want %v", wc.Opcode, op)
		}
		return wc, true
	}
}

// advert takes a received 16-byte message.
func (p *rawPeer) advert(wc verbs.WorkCompletion) rping.Advert {
	p.t.Helper()
	a, err := rping.ParseAdvert(p.msg[:wc.ByteLen])
	if err != nil {
		p.t.Fatal(err)
	}
	p.postRecv()
	return a
}

func (p *rawPeer) sendMsg(b []byte) {
	copy(p.out, b)
	p.post(verbs.SendWR{Opcode: verbs.WRSend, SGL: []verbs.SGE{p.outMR.SGE(0, 16)}})
}

// TestValidateCatchesCorruption: a server that flips one byte of the data
// before writing it back. The client with -V says "data mismatch!", names
// the byte, and fails with rping's status; the server saw the protocol as
// rping sends it (IRD 1 / ORD 1, two adverts per ping of the -S size).
func TestValidateCatchesCorruption(t *testing.T) {
	for _, size := range []int{64, 4096, rping.MaxSize} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			const bad = 2 // the ping whose data comes back corrupted
			flip := size / 2
			p := newPair(t, 1500)
			ctx := testCtx(t)
			l, err := p.srv.Listen(srvAddr, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			served := make(chan error, 1)
			go func() {
				defer close(served)
				req, err := l.Accept(ctx)
				if err != nil {
					served <- err
					return
				}
				if req.IRD != 1 || req.ORD != 1 {
					served <- fmt.Errorf("MPA Request IRD %d ORD %d, want rping's 1 and 1", req.IRD, req.ORD)
				}
				peer := newRawPeer(t, ctx, p.srv)
				if err := req.Accept(peer.qp, verbs.ConnParam{ResponderResources: req.ORD, InitiatorDepth: req.IRD}); err != nil {
					served <- err
					return
				}
				for i := 0; ; i++ {
					wc, ok := peer.next(verbs.WCRecv)
					if !ok {
						return // the client went
					}
					src := peer.advert(wc)
					peer.post(verbs.SendWR{Opcode: verbs.WRRead, SGL: []verbs.SGE{peer.dataMR.SGE(0, int(src.Size))}, RemoteAddr: src.Addr, RKey: src.RKey})
					peer.next(verbs.WCRead)
					if i == bad {
						peer.data[flip] ^= 0x20
					}
					peer.sendMsg(make([]byte, 16))
					wc, ok = peer.next(verbs.WCRecv)
					if !ok {
						served <- fmt.Errorf("ping %d: client went before its sink advert", i)
						return
					}
					sink := peer.advert(wc)
					if src.Size != uint32(size) || sink.Size != uint32(size) || src.RKey == sink.RKey {
						served <- fmt.Errorf("ping %d: adverts %+v and %+v, want two buffers of %d bytes", i, src, sink, size)
					}
					peer.post(verbs.SendWR{Opcode: verbs.WRWrite, SGL: []verbs.SGE{peer.dataMR.SGE(0, int(src.Size))}, RemoteAddr: sink.Addr, RKey: sink.RKey})
					peer.next(verbs.WCWrite)
					peer.sendMsg(make([]byte, 16))
				}
			}()
			c := ping(ctx, p.cli, rping.Options{Size: size, Count: 5, Validate: true, Verbose: true})
			for err := range served {
				t.Error(err)
			}
			wantExit(t, "client", c.err, rping.StatusFailed)
			wantOutput(t, "client stdout", c.stdout.String(), pingLines("ping data: ", size, bad))
			b := make([]byte, size)
			rping.Fill(b, bad)
			want := fmt.Sprintf("data mismatch!\nsiwtun ping: ping %d: byte %d of %d came back as 0x%02x, was sent as 0x%02x\nrping client failed: -1\n",
				bad, flip, size, b[flip]^0x20, b[flip])
			if got := c.stderr.String(); !strings.HasPrefix(got, want) {
				t.Fatalf("client stderr:\n got: %q\nwant prefix: %q", got, want)
			}
		})
	}
}

// TestServerValidate: with -V the server checks the data it read against
// rping's pattern; a client sending anything else is cut off.
func TestServerValidate(t *testing.T) {
	p := newPair(t, 1500)
	ctx := testCtx(t)
	s, wait := startServer(t, ctx, p.srv, rping.Options{Validate: true})
	peer := newRawPeer(t, ctx, p.cli)
	if err := peer.qp.Connect(ctx, srvAddr, verbs.ConnParam{ResponderResources: 1, InitiatorDepth: 1}); err != nil {
		t.Fatal(err)
	}
	src := peer.data[:64]
	rping.Fill(src, 0)
	src[20] = '#'
	peer.sendMsg(rping.Advert{Addr: peer.dataMR.Addr(), RKey: peer.dataMR.RKey(), Size: 64}.Append(nil))
	if _, ok := peer.next(verbs.WCRecv); ok {
		t.Fatal("the server answered a ping with the wrong data")
	}
	wait()
	wantExit(t, "server", s.err, rping.StatusFailed)
	want := "data mismatch!\nsiwtun ping: ping 0: byte 20 of the 64 read is 0x23, rping's pattern has 0x48\nrping server failed: -1\n"
	wantOutput(t, "server stderr", s.stderr.String(), want)
}

// TestBogusMessage: a message of other than 16 bytes ends the server's run
// with rping's "Received bogus data".
func TestBogusMessage(t *testing.T) {
	p := newPair(t, 1500)
	ctx := testCtx(t)
	s, wait := startServer(t, ctx, p.srv, rping.Options{})
	peer := newRawPeer(t, ctx, p.cli)
	if err := peer.qp.Connect(ctx, srvAddr, verbs.ConnParam{ResponderResources: 1, InitiatorDepth: 1}); err != nil {
		t.Fatal(err)
	}
	peer.post(verbs.SendWR{Opcode: verbs.WRSend, SGL: []verbs.SGE{peer.outMR.SGE(0, 8)}})
	peer.next(verbs.WCRecv) // flushed when the server disconnects
	wait()
	wantExit(t, "server", s.err, rping.StatusFailed)
	want := "Received bogus data, size 8\nrecv wc error: -1\nwait for RDMA_READ_ADV state 11\nrping server failed: -1\n"
	if got := s.stderr.String(); !bytes.HasPrefix([]byte(got), []byte(want)) {
		t.Fatalf("server stderr:\n got: %q\nwant prefix: %q", got, want)
	}
}
