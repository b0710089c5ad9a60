package offload

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// recCQ records the completions pushed into it (up to its capacity).
type recCQ struct {
	wcs []ibv.WorkCompletion
	sol []bool
}

func (c *recCQ) Push(wc *ibv.WorkCompletion, solicited bool) {
	if len(c.wcs) < cap(c.wcs) {
		c.wcs = append(c.wcs, *wc)
		c.sol = append(c.sol, solicited)
	}
}

// peerStream builds the byte stream a peer's engine sends: FPDUs in order,
// with CRC and markers as negotiated.
type peerStream struct {
	s   mpa.Sender
	out []byte
	msn uint32 // next QN 0 MSN
}

func newPeerStream(crc, markers bool) *peerStream {
	p := &peerStream{msn: 1}
	p.s.Init(crc, markers)
	return p
}

func (p *peerStream) fpdu(h ddp.Header, body ...[]byte) {
	var hdr [ddp.UntaggedHeaderLen]byte
	hl := h.Marshal(hdr[:])
	n := hl
	for _, b := range body {
		n += len(b)
	}
	p.s.Begin(p.out, n)
	p.s.Write(hdr[:hl])
	for _, b := range body {
		p.s.Write(b)
	}
	p.out = p.s.Finish()
}

// write sends an RDMA Write of data to stag at to in FPDUs of at most seg
// payload octets (one FPDU for no data).
func (p *peerStream) write(stag uint32, to uint64, data []byte, seg int) {
	for off := 0; off == 0 || off < len(data); {
		n := min(seg, len(data)-off)
		p.fpdu(ddp.Header{Tagged: true, Last: off+n == len(data), Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpWrite), STag: stag, TO: to + uint64(off)}, data[off:off+n])
		off += n
		if len(data) == 0 {
			break
		}
	}
}

// send sends a Send of data in FPDUs of at most seg payload octets.
func (p *peerStream) send(op rdmap.Opcode, data []byte, seg int) {
	for off := 0; off == 0 || off < len(data); {
		n := min(seg, len(data)-off)
		p.fpdu(ddp.Header{Last: off+n == len(data), Version: ddp.Version, ULPCtrl: rdmap.Ctrl(op), QN: ddp.QNSend, MSN: p.msn, MO: uint32(off)}, data[off:off+n])
		off += n
		if len(data) == 0 {
			break
		}
	}
	p.msn++
}

// imm sends an Immediate Data message.
func (p *peerStream) imm(op rdmap.Opcode, m rdmap.Immediate) {
	var b [rdmap.ImmediateDataLen]byte
	m.Marshal(b[:])
	p.fpdu(ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(op), QN: ddp.QNSend, MSN: p.msn}, b[:])
	p.msn++
}

// immQP is a QP in INIT on a device without a stack, its receive engine
// started as a connection that negotiated ext would start it, its receive
// completions recorded (up to 256), and a region of n bytes at rxAddr that
// remote Writes and local receives may use.
func immQP(tb testing.TB, crc, markers bool, ext mpa.Ext, n int) (*QP, *Region, *recCQ) {
	tb.Helper()
	dev, err := NewDevice(nil, DefaultConfig("siwtun0"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { dev.Close() })
	scq, rcq := &countCQ{}, &recCQ{wcs: make([]ibv.WorkCompletion, 0, 256), sol: make([]bool, 0, 256)}
	qp, err := dev.CreateQP(1, scq, rcq, QPAttr{MaxSendWR: 4, MaxRecvWR: 256})
	if err != nil {
		tb.Fatal(err)
	}
	if err := qp.Modify(ibv.QPInit); err != nil {
		tb.Fatal(err)
	}
	reg, err := dev.Regions().Register(1, make([]byte, n), rxAddr, ibv.AccessLocalWrite|ibv.AccessRemoteWrite)
	if err != nil {
		tb.Fatal(err)
	}
	qp.rx.init(qp, &mpa.Params{CRC: crc, MarkersRx: markers, Ext: ext}, 0, nil)
	return qp, reg, rcq
}

// feed hands stream to the receive engine in chunks of the sizes given in
// turn (the TCP Reads, each ending as rxLoop ends one), and returns the
// first error.
func feed(qp *QP, stream []byte, chunks ...int) error {
	for i := 0; len(stream) > 0; i++ {
		n := min(chunks[i%len(chunks)], len(stream))
		if _, err := qp.rx.mpa.Write(stream[:n]); err != nil {
			return err
		}
		if err := qp.rx.readDone(); err != nil {
			return err
		}
		stream = stream[n:]
	}
	return nil
}

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + seed*7 + i>>8)
	}
	return b
}

// TestRxWriteWithImmediate: RDMA Writes with Immediate Data, as the peer's
// engine sends them (the Write in FPDUs, then the Immediate Data message),
// are placed and complete their receives in order with the immediate
// value, IBV_WC_RECV_RDMA_WITH_IMM and the Write's length, solicited for
// Immediate Data with SE, with CRC on and off, markers on and off, the
// stream cut into every kind of chunk.
func TestRxWriteWithImmediate(t *testing.T) {
	lens := []int{0, 1, 4, 1000, 1024, 3001, 8192}
	const slot = 8192
	for _, crc := range []bool{false, true} {
		for _, markers := range []bool{false, true} {
			t.Run(fmt.Sprintf("crc=%v/markers=%v", crc, markers), func(t *testing.T) {
				qp, reg, rcq := immQP(t, crc, markers, mpa.ExtImmediate, slot*len(lens))
				p := newPeerStream(crc, markers)
				var want [][]byte
				for i, n := range lens {
					d := pattern(n, i)
					want = append(want, d)
					p.write(reg.STag(), rxAddr+uint64(i*slot), d, 1024)
					op := rdmap.OpImmediate
					if i%2 == 1 {
						op = rdmap.OpImmediateSE
					}
					p.imm(op, rdmap.Immediate{Data: 0x1000 + uint32(i)})
				}
				for i := range lens {
					if _, err := qp.PostRecv([]ibv.RecvWR{{ID: uint64(100 + i)}}); err != nil {
						t.Fatal(err)
					}
				}
				if err := feed(qp, p.out, 1, 7, 13, 1500, 4096, 3); err != nil {
					t.Fatal(err)
				}
				if len(rcq.wcs) != len(lens) {
					t.Fatalf("%d receives completed, want %d", len(rcq.wcs), len(lens))
				}
				for i, wc := range rcq.wcs {
					want := ibv.WorkCompletion{ID: uint64(100 + i), Opcode: ibv.WCRecvRDMAWithImm, QPNum: qp.num,
						ByteLen: uint32(lens[i]), Flags: ibv.WCWithImm, ImmData: 0x1000 + uint32(i)}
					if wc != want || rcq.sol[i] != (i%2 == 1) {
						t.Fatalf("completion %d = %+v solicited %v, want %+v", i, wc, rcq.sol[i], want)
					}
				}
				for i, d := range want {
					if got := reg.Bytes()[i*slot : i*slot+len(d)]; !bytes.Equal(got, d) {
						t.Fatalf("Write %d: placed bytes differ", i)
					}
				}
				if got := qp.stats.ImmediatesRx.Load(); got != uint64(len(lens)) {
					t.Fatalf("ImmediatesRx %d", got)
				}
			})
		}
	}
}

// TestRxSendWithImmediate: a Send with Immediate Data (the Immediate Data
// message with ImmSendFollows, then the Send) completes the Send's receive
// as IBV_WC_RECV with the immediate value; a plain Send after it has none,
// and a Write with Immediate Data after a plain Write reports its own
// length.
func TestRxSendWithImmediate(t *testing.T) {
	for _, crc := range []bool{false, true} {
		for _, markers := range []bool{false, true} {
			t.Run(fmt.Sprintf("crc=%v/markers=%v", crc, markers), func(t *testing.T) {
				qp, reg, rcq := immQP(t, crc, markers, mpa.ExtImmediate, 24000)
				p := newPeerStream(crc, markers)
				d := pattern(5000, 1)
				p.imm(rdmap.OpImmediate, rdmap.Immediate{Data: 0xfeedf00d, Flags: rdmap.ImmSendFollows})
				p.send(rdmap.OpSendSE, d, 1400)
				p.send(rdmap.OpSend, d[:10], 1400)
				p.write(reg.STag(), rxAddr+12000, d[:300], 1400)
				p.write(reg.STag(), rxAddr+12000, nil, 1400)
				p.imm(rdmap.OpImmediate, rdmap.Immediate{Data: 7})
				p.imm(rdmap.OpImmediate, rdmap.Immediate{Data: 8, Flags: rdmap.ImmSendFollows})
				p.send(rdmap.OpSend, nil, 1400)
				for i := range 4 {
					if _, err := qp.PostRecv([]ibv.RecvWR{{ID: uint64(i), SGL: []ibv.SGE{{Addr: rxAddr + uint64(i)*6000, Length: 6000, LKey: reg.STag()}}}}); err != nil {
						t.Fatal(err)
					}
				}
				if err := feed(qp, p.out, 100, 9, 2000); err != nil {
					t.Fatal(err)
				}
				want := []ibv.WorkCompletion{
					{ID: 0, Opcode: ibv.WCRecv, ByteLen: 5000, Flags: ibv.WCWithImm, ImmData: 0xfeedf00d},
					{ID: 1, Opcode: ibv.WCRecv, ByteLen: 10},
					{ID: 2, Opcode: ibv.WCRecvRDMAWithImm, ByteLen: 0, Flags: ibv.WCWithImm, ImmData: 7},
					{ID: 3, Opcode: ibv.WCRecv, ByteLen: 0, Flags: ibv.WCWithImm, ImmData: 8},
				}
				if len(rcq.wcs) != len(want) {
					t.Fatalf("%d completions, want %d: %+v", len(rcq.wcs), len(want), rcq.wcs)
				}
				for i, w := range want {
					w.QPNum = qp.num
					if rcq.wcs[i] != w {
						t.Fatalf("completion %d = %+v, want %+v", i, rcq.wcs[i], w)
					}
				}
				if !rcq.sol[0] || rcq.sol[1] {
					t.Fatalf("solicited %v", rcq.sol)
				}
				if !bytes.Equal(reg.Bytes()[:5000], d) || !bytes.Equal(reg.Bytes()[6000:6010], d[:10]) {
					t.Fatal("Send data not in the receive buffers")
				}
			})
		}
	}
}

// TestRxImmediateErrors: what a peer may get wrong with Immediate Data and
// the Terminate each earns.
func TestRxImmediateErrors(t *testing.T) {
	imm := rdmap.Immediate{Data: 1}
	body := make([]byte, rdmap.ImmediateDataLen)
	imm.Marshal(body)
	immHdr := func(mut func(*ddp.Header)) ddp.Header {
		h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpImmediate), QN: ddp.QNSend, MSN: 1}
		mut(&h)
		return h
	}
	tests := []struct {
		name  string
		ext   mpa.Ext
		recvs int
		build func(p *peerStream)
		code  rdmap.Code
	}{
		{name: "no receive posted", ext: mpa.ExtImmediate, build: func(p *peerStream) { p.imm(rdmap.OpImmediate, imm) },
			code: rdmap.TermDDPNoBuffer},
		{name: "not negotiated", recvs: 1, build: func(p *peerStream) { p.imm(rdmap.OpImmediate, imm) },
			code: rdmap.TermRDMAPUnexpectedOp},
		{name: "not negotiated, with SE", recvs: 1, build: func(p *peerStream) { p.imm(rdmap.OpImmediateSE, imm) },
			code: rdmap.TermRDMAPUnexpectedOp},
		{name: "wrong queue", ext: mpa.ExtImmediate, recvs: 1,
			build: func(p *peerStream) { p.fpdu(immHdr(func(h *ddp.Header) { h.QN = ddp.QNReadRequest }), body) },
			code:  rdmap.TermDDPInvalidQN},
		{name: "wrong MSN", ext: mpa.ExtImmediate, recvs: 1,
			build: func(p *peerStream) { p.fpdu(immHdr(func(h *ddp.Header) { h.MSN = 2 }), body) },
			code:  rdmap.TermDDPInvalidMSN},
		{name: "not one segment", ext: mpa.ExtImmediate, recvs: 1,
			build: func(p *peerStream) { p.fpdu(immHdr(func(h *ddp.Header) { h.Last = false }), body) },
			code:  rdmap.TermDDPInvalidMO},
		{name: "longer than its immediate data", ext: mpa.ExtImmediate, recvs: 1,
			build: func(p *peerStream) { p.fpdu(immHdr(func(*ddp.Header) {}), body, []byte{1, 2, 3, 4}) },
			code:  rdmap.TermDDPTooLong},
		{name: "shorter than its immediate data", ext: mpa.ExtImmediate, recvs: 1,
			build: func(p *peerStream) { p.fpdu(immHdr(func(*ddp.Header) {}), body[:4]) },
			code:  rdmap.TermDDPLocalCatastrophic},
		{name: "inside a Send", ext: mpa.ExtImmediate, recvs: 1, build: func(p *peerStream) {
			p.fpdu(ddp.Header{Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSend), QN: ddp.QNSend, MSN: 1}, make([]byte, 8))
			p.fpdu(immHdr(func(*ddp.Header) {}), body)
		}, code: rdmap.TermDDPInvalidMO},
		{name: "send with immediate without its Send", ext: mpa.ExtImmediate, recvs: 2, build: func(p *peerStream) {
			p.imm(rdmap.OpImmediate, rdmap.Immediate{Data: 3, Flags: rdmap.ImmSendFollows})
			p.write(7, 0, nil, 64)
		}, code: rdmap.TermRDMAPUnexpectedOp},
		{name: "send with immediate followed by another", ext: mpa.ExtImmediate, recvs: 2, build: func(p *peerStream) {
			p.imm(rdmap.OpImmediate, rdmap.Immediate{Data: 3, Flags: rdmap.ImmSendFollows})
			p.imm(rdmap.OpImmediate, imm)
		}, code: rdmap.TermRDMAPUnexpectedOp},
		{name: "send with immediate and invalidate", ext: mpa.ExtImmediate, recvs: 2, build: func(p *peerStream) {
			p.imm(rdmap.OpImmediate, rdmap.Immediate{Data: 3, Flags: rdmap.ImmSendFollows})
			p.send(rdmap.OpSendInv, nil, 64)
		}, code: rdmap.TermRDMAPUnexpectedOp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			qp, reg, rcq := immQP(t, true, false, tt.ext, 64)
			for i := range tt.recvs {
				if _, err := qp.PostRecv([]ibv.RecvWR{{ID: uint64(i), SGL: []ibv.SGE{{Addr: rxAddr, Length: 64, LKey: reg.STag()}}}}); err != nil {
					t.Fatal(err)
				}
			}
			p := newPeerStream(true, false)
			tt.build(p)
			err := feed(qp, p.out, len(p.out))
			var te *terminateError
			if !errors.As(err, &te) {
				t.Fatalf("stream accepted (%v), want a Terminate", err)
			}
			qp.mu.Lock()
			term := qp.term
			if qp.termDone != nil {
				close(qp.termDone) // no TX goroutine sends it here: Close need not wait
				qp.termDone = nil
			}
			qp.mu.Unlock()
			if term == nil || term.Code != tt.code {
				t.Fatalf("Terminate %v, want %v (%v)", term, tt.code, err)
			}
			for _, wc := range rcq.wcs {
				if wc.Status == ibv.WCSuccess {
					t.Fatalf("a receive completed successfully: %+v", wc)
				}
			}
		})
	}
}

// TestRxImmediateNoAllocs: Writes with Immediate Data and Sends with
// Immediate Data go through the receive engine without allocating.
func TestRxImmediateNoAllocs(t *testing.T) {
	const runs, wlen = 50, 1400
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc=%v", crc), func(t *testing.T) {
			qp, reg, rcq := immQP(t, crc, false, mpa.ExtImmediate, wlen)
			p := newPeerStream(crc, false)
			var chunks [][]byte
			for i := range runs + 1 {
				start := len(p.out)
				p.write(reg.STag(), rxAddr, make([]byte, wlen), wlen)
				p.imm(rdmap.OpImmediate, rdmap.Immediate{Data: uint32(i)})
				p.imm(rdmap.OpImmediate, rdmap.Immediate{Data: uint32(i), Flags: rdmap.ImmSendFollows})
				p.send(rdmap.OpSend, nil, 64)
				chunks = append(chunks, p.out[start:])
			}
			recv := []ibv.RecvWR{{ID: 1}, {ID: 2}}
			i := 0
			allocs := testing.AllocsPerRun(runs, func() {
				rcq.wcs, rcq.sol = rcq.wcs[:0], rcq.sol[:0]
				if _, err := qp.PostRecv(recv); err != nil {
					t.Fatal(err)
				}
				if _, err := qp.rx.mpa.Write(chunks[i]); err != nil {
					t.Fatal(err)
				}
				i++
			})
			if allocs != 0 {
				t.Errorf("%.1f allocations per Write and Send with Immediate Data, want 0", allocs)
			}
			if len(rcq.wcs) != 2 || rcq.wcs[0].Opcode != ibv.WCRecvRDMAWithImm || rcq.wcs[1].Flags != ibv.WCWithImm {
				t.Errorf("completions %+v", rcq.wcs)
			}
		})
	}
}
