package offload

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// countCQ counts the completions pushed into it.
type countCQ struct{ n int }

func (c *countCQ) Push(*ibv.WorkCompletion, bool) { c.n++ }

// rxStream builds n chunks of a stream, each an RDMA Write of wlen bytes to
// stag at to and a Send of slen bytes (MSN i+1; none if slen < 0), as the
// peer's engine sends them.
func rxStream(crc, markers bool, n int, stag uint32, to uint64, wlen, slen int) [][]byte {
	var s mpa.Sender
	s.Init(crc, markers)
	payload := make([]byte, max(wlen, slen))
	out := make([][]byte, 0, n)
	for i := range n {
		var chunk []byte
		for _, h := range []ddp.Header{
			{Tagged: true, Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpWrite), STag: stag, TO: to},
			{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSend), QN: ddp.QNSend, MSN: uint32(i + 1)},
		} {
			var hdr [ddp.UntaggedHeaderLen]byte
			hl := h.Marshal(hdr[:])
			plen := slen
			if h.Tagged {
				plen = wlen
			} else if slen < 0 {
				continue
			}
			s.Begin(chunk, hl+plen)
			s.Write(hdr[:hl])
			s.Write(payload[:plen])
			chunk = s.Finish()
		}
		out = append(out, chunk)
	}
	return out
}

// rxQP is a QP in INIT on a device without a stack, its receive engine
// started as a connection would (crc, markers), and a region of n bytes at
// rxAddr that remote Writes and local receives may use.
func rxQP(tb testing.TB, crc, markers bool, n int) (*QP, *Region, *countCQ) {
	tb.Helper()
	dev, err := NewDevice(nil, DefaultConfig("siwtun0"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { dev.Close() })
	cq := &countCQ{}
	qp, err := dev.CreateQP(1, cq, cq, QPAttr{MaxSendWR: 4, MaxRecvWR: 4})
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
	qp.rx.init(qp, &mpa.Params{CRC: crc, MarkersRx: markers, Ext: mpa.ExtImmediate}, 0, nil)
	return qp, reg, cq
}

// rxAddr is where rxQP's region sits.
const rxAddr = 0x10000

// TestReceiveNoAllocs: the receive engine takes RDMA Writes and Sends
// through its header phases, the opcode table, placement, scatter and the
// receive's completion without allocating: it runs inside the TCP Read,
// once per segment.
func TestReceiveNoAllocs(t *testing.T) {
	const runs, wlen, slen = 50, 1400, 1000
	for _, crc := range []bool{false, true} {
		for _, markers := range []bool{false, true} {
			t.Run(fmt.Sprintf("crc=%v/markers=%v", crc, markers), func(t *testing.T) {
				qp, reg, cq := rxQP(t, crc, markers, wlen+slen)
				recv := []ibv.RecvWR{{ID: 7, SGL: []ibv.SGE{{Addr: rxAddr + wlen, Length: slen, LKey: reg.STag()}}}}
				stream := rxStream(crc, markers, runs+1, reg.STag(), rxAddr, wlen, slen)
				i := 0
				allocs := testing.AllocsPerRun(runs, func() {
					if _, err := qp.PostRecv(recv); err != nil {
						t.Fatal(err)
					}
					if _, err := qp.rx.mpa.Write(stream[i]); err != nil {
						t.Fatal(err)
					}
					i++
				})
				if allocs != 0 {
					t.Errorf("%.1f allocations per Write and Send received, want 0", allocs)
				}
				if cq.n != runs+1 || qp.stats.WritesRx.Load() != runs+1 {
					t.Errorf("%d receives completed, %d Writes placed; want %d of each", cq.n, qp.stats.WritesRx.Load(), runs+1)
				}
			})
		}
	}
}

// BenchmarkRecvEngine: the receive engine alone, from MPA receiver to
// placement: 64 KiB of 1400-byte RDMA Writes per op, as one TCP Read hands
// them over (no TCP, no copy into the stream).
func BenchmarkRecvEngine(b *testing.B) {
	const wlen, fpdus = 1400, 46
	for _, crc := range []bool{false, true} {
		b.Run(fmt.Sprintf("crc=%v", crc), func(b *testing.B) {
			qp, reg, _ := rxQP(b, crc, false, wlen)
			// Without Markers an FPDU does not depend on its stream
			// position: the same Writes can be received again and again.
			var chunk []byte
			for _, c := range rxStream(crc, false, fpdus, reg.STag(), rxAddr, wlen, -1) {
				chunk = append(chunk, c...)
			}
			b.SetBytes(fpdus * wlen)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := qp.rx.mpa.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestHeaderErrorCutThrough: a Send whose DDP header announces 65,517
// octets toward a 16-octet receive is refused with DDP untagged error 0x05
// when its header arrives, as a cut-through RNIC refuses it: with CRC off
// at once; with CRC on at the end of the read that brought the header when
// the FPDU's CRC did not come with it (counted in ErrorsBeforeCRC), and
// after the CRC when it did, which then decides (a bad one is the MPA CRC
// error: the header may have been damaged on the wire).
func TestHeaderErrorCutThrough(t *testing.T) {
	const hdrLen, payload = ddp.UntaggedHeaderLen, 65517
	tests := []struct {
		name     string
		crc      bool
		reads    []int // octets of the FPDU each read hands over (0: the rest)
		badCRC   bool
		code     rdmap.Code
		early    uint64 // ErrorsBeforeCRC
		wantRead int    // the read that ends in the Terminate (from 0)
	}{
		{name: "crc off, header only", reads: []int{2 + hdrLen + 16}, code: rdmap.TermDDPTooLong},
		{name: "crc off, header in two reads", reads: []int{2 + 10, hdrLen - 10}, code: rdmap.TermDDPTooLong, wantRead: 1},
		{name: "crc on, header only", crc: true, reads: []int{2 + hdrLen + 16}, code: rdmap.TermDDPTooLong, early: 1},
		{name: "crc on, header in two reads", crc: true, reads: []int{2 + 10, hdrLen - 10}, code: rdmap.TermDDPTooLong, early: 1, wantRead: 1},
		{name: "crc on, whole FPDU in one read", crc: true, reads: []int{0}, code: rdmap.TermDDPTooLong},
		{name: "crc on, whole FPDU with a bad CRC", crc: true, reads: []int{0}, badCRC: true, code: rdmap.TermLLPCRC},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			qp, reg, _ := rxQP(t, tt.crc, false, 64)
			if _, err := qp.PostRecv([]ibv.RecvWR{{ID: 7, SGL: []ibv.SGE{{Addr: rxAddr, Length: 16, LKey: reg.STag()}}}}); err != nil {
				t.Fatal(err)
			}
			var s mpa.Sender
			s.Init(tt.crc, false)
			h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSend), QN: ddp.QNSend, MSN: 1}
			var hdr [hdrLen]byte
			h.Marshal(hdr[:])
			s.Begin(nil, hdrLen+payload)
			s.Write(hdr[:])
			s.Write(make([]byte, payload))
			stream := s.Finish()
			if tt.badCRC {
				stream[len(stream)-1] ^= 0x10
			}
			var err error
			read := 0
			for ; read < len(tt.reads) && err == nil; read++ {
				n := tt.reads[read]
				if n == 0 {
					n = len(stream)
				}
				if _, err = qp.rx.mpa.Write(stream[:n]); err == nil {
					err = qp.rx.readDone()
				}
				stream = stream[n:]
			}
			var te *terminateError
			if !errors.As(err, &te) || read-1 != tt.wantRead {
				t.Fatalf("after read %d: %v, want a Terminate at read %d", read-1, err, tt.wantRead)
			}
			qp.mu.Lock()
			term := qp.term
			close(qp.termDone) // no TX goroutine sends it here: Close need not wait
			qp.termDone = nil
			qp.mu.Unlock()
			if term.Code != tt.code {
				t.Fatalf("Terminate %v, want %v", term.Code, tt.code)
			}
			if got := qp.stats.ErrorsBeforeCRC.Load(); got != tt.early {
				t.Fatalf("ErrorsBeforeCRC %d, want %d", got, tt.early)
			}
			if tt.code == rdmap.TermDDPTooLong {
				// Golden: DDP / untagged 0x05, M and D, the segment's
				// length (65,535) and its DDP header (L, DV 1, RV 1,
				// Send, QN 0, MSN 1, MO 0) copied.
				want := testkit.Hex(t, "1205c000 ffff 4143 00000000 00000000 00000001 00000000")
				got := make([]byte, term.Len())
				term.Marshal(got)
				if !bytes.Equal(got, want) {
					t.Fatalf("Terminate header %x, want %x", got, want)
				}
			}
			for i, b := range reg.Bytes() {
				if b != 0 {
					t.Fatalf("byte %d of the region written", i)
				}
			}
		})
	}
}
