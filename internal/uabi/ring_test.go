package uabi

import (
	"errors"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs/ibv"
)

func newTestRing(t testing.TB, n int, esz int) *Ring {
	t.Helper()
	count := RingCount(n)
	fd, mem, err := NewShared("test", RingBytes(count, esz), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmap(mem); Close(fd) })
	r, err := InitRing(mem, count, esz)
	if err != nil {
		t.Fatal(err)
	}
	// The other side maps the same memfd.
	mapping, b, err := MapShared(fd, 0, uint64(len(mem)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmap(mapping) })
	if _, err := OpenRing(b, count, esz); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRingCount(t *testing.T) {
	for _, tt := range []struct{ n, want int }{{0, 1}, {1, 1}, {2, 2}, {3, 4}, {64, 64}, {65, 128}, {16384, 16384}} {
		if got := RingCount(tt.n); int(got) != tt.want {
			t.Errorf("RingCount(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}

func TestOpenRingRejects(t *testing.T) {
	r := newTestRing(t, 4, CQESize)
	tests := []struct {
		name  string
		mem   []byte
		count uint32
		esz   int
	}{
		{"short", r.mem[:10], 4, CQESize},
		{"count", r.mem, 8, CQESize},
		{"entry size", r.mem, 4, SQESize},
		{"truncated", r.mem[:HeaderSize+CQESize], 4, CQESize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := OpenRing(tt.mem, tt.count, tt.esz); !errors.Is(err, ErrRing) {
				t.Fatalf("OpenRing = %v, want ErrRing", err)
			}
		})
	}
}

func TestSQERoundTrip(t *testing.T) {
	tests := []struct {
		name string
		wr   ibv.SendWR
	}{
		{"write-sgl", ibv.SendWR{ID: 7, Opcode: ibv.WRWrite, Flags: ibv.FlagSignaled | ibv.FlagFence,
			SGL: []ibv.SGE{{Addr: 1, Length: 2, LKey: 3}, {Addr: 1 << 60, Length: 5, LKey: 6}}, RemoteAddr: 0xdead0000, RKey: 0x200}},
		{"send-inline", ibv.SendWR{ID: 1<<64 - 1, Opcode: ibv.WRSend, Flags: ibv.FlagInline | ibv.FlagSolicited, Inline: []byte("hello")}},
		{"send-inv", ibv.SendWR{ID: 9, Opcode: ibv.WRSendWithInv, InvalidateRKey: 0x301, SGL: make([]ibv.SGE, ibv.MaxSGE)}},
		{"read", ibv.SendWR{ID: 3, Opcode: ibv.WRRead, SGL: []ibv.SGE{{Addr: 8, Length: 4096, LKey: 0x100}}, RemoteAddr: 4, RKey: 5}},
		{"inline-max", ibv.SendWR{Opcode: ibv.WRWrite, Flags: ibv.FlagInline, Inline: make([]byte, ibv.MaxInline)}},
		{"fetch-add", ibv.SendWR{ID: 4, Opcode: ibv.WRAtomicFetchAdd, SGL: []ibv.SGE{{Addr: 16, Length: 8, LKey: 7}}, RemoteAddr: 0x1008, RKey: 9,
			CompareAdd: 0xfffffffffffffffe}},
		{"cmp-swap", ibv.SendWR{ID: 5, Opcode: ibv.WRAtomicCmpSwap, Flags: ibv.FlagSignaled, SGL: []ibv.SGE{{Addr: 24, Length: 8, LKey: 7}},
			RemoteAddr: 0x2000, RKey: 10, CompareAdd: 0x0102030405060708, Swap: 0x1112131415161718}},
		{"bind-mw", ibv.SendWR{ID: 6, Opcode: ibv.WRBindMW, Flags: ibv.FlagSignaled | ibv.FlagFence, Bind: ibv.MWBind{
			MW: 0xabcd01, RKey: 0xabcd02, MRKey: 0x1234, Addr: 0x7f0000001000, Length: 1 << 33, Access: ibv.AccessRemoteWrite, Type1: true}}},
		{"bind-mw-type2", ibv.SendWR{ID: 7, Opcode: ibv.WRBindMW, Bind: ibv.MWBind{MW: 0x77, RKey: 0x78, MRKey: 1, Access: ibv.AccessRemoteRead}}},
		{"local-inv", ibv.SendWR{ID: 8, Opcode: ibv.WRLocalInv, Flags: ibv.FlagSignaled, InvalidateRKey: 0xabcd03}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := make([]byte, SQESize)
			EncodeSQE(e, &tt.wr)
			var got ibv.SendWR
			var buf SQEBuf
			if err := DecodeSQE(e, &got, &buf); err != nil {
				t.Fatal(err)
			}
			w := tt.wr
			if got.ID != w.ID || got.Opcode != w.Opcode || got.Flags != w.Flags || got.RemoteAddr != w.RemoteAddr ||
				got.RKey != w.RKey || got.InvalidateRKey != w.InvalidateRKey || string(got.Inline) != string(w.Inline) ||
				got.CompareAdd != w.CompareAdd || got.Swap != w.Swap || got.Bind != w.Bind ||
				len(got.SGL) != len(w.SGL) && w.Flags&ibv.FlagInline == 0 {
				t.Fatalf("got %+v, want %+v", got, w)
			}
			for i := range got.SGL {
				if got.SGL[i] != w.SGL[i] {
					t.Fatalf("SGE %d = %+v, want %+v", i, got.SGL[i], w.SGL[i])
				}
			}
		})
	}
}

func TestDecodeSQERejects(t *testing.T) {
	var wr ibv.SendWR
	var buf SQEBuf
	e := make([]byte, SQESize)
	e[5] = ibv.MaxSGE + 1
	if err := DecodeSQE(e, &wr, &buf); !errors.Is(err, ErrEntry) {
		t.Fatalf("7 SGEs: %v", err)
	}
	e[5] = 0
	e[6], e[7] = 0x01, 0x01 // 257 inline bytes
	if err := DecodeSQE(e, &wr, &buf); !errors.Is(err, ErrEntry) {
		t.Fatalf("257 inline: %v", err)
	}
	e[6], e[7] = 0, 0
	e[8] = 0x80
	if err := DecodeSQE(e, &wr, &buf); !errors.Is(err, ErrEntry) {
		t.Fatalf("bad flags: %v", err)
	}
	if err := DecodeSQE(e[:10], &wr, &buf); !errors.Is(err, ErrEntry) {
		t.Fatalf("short: %v", err)
	}
}

func TestRQEAndCQERoundTrip(t *testing.T) {
	rq := ibv.RecvWR{ID: 42, SGL: []ibv.SGE{{Addr: 1, Length: 2, LKey: 3}}}
	e := make([]byte, RQESize)
	EncodeRQE(e, &rq)
	var got ibv.RecvWR
	var sgl [ibv.MaxSGE]ibv.SGE
	if err := DecodeRQE(e, &got, &sgl); err != nil || got.ID != 42 || len(got.SGL) != 1 || got.SGL[0] != rq.SGL[0] {
		t.Fatalf("RQE: %+v %v", got, err)
	}
	wc := ibv.WorkCompletion{ID: 1, Status: ibv.WCRemAccessErr, Opcode: ibv.WCRecv, VendorErr: 2, ByteLen: 3, QPNum: 4, Flags: ibv.WCWithInv, InvalidatedRKey: 5}
	c := make([]byte, CQESize)
	EncodeCQE(c, &wc)
	var gwc ibv.WorkCompletion
	if err := DecodeCQE(c, &gwc); err != nil || gwc != wc {
		t.Fatalf("CQE: %+v %v", gwc, err)
	}
}

func TestRingOwnership(t *testing.T) {
	r := newTestRing(t, 4, CQESize)
	var prod, cons uint32
	for i := 0; i < 10; i++ {
		for k := 0; k < 4; k++ {
			if !r.Free(prod) {
				t.Fatalf("slot %d not free", prod)
			}
			EncodeCQE(r.Entry(prod), &ibv.WorkCompletion{ID: uint64(prod)})
			r.Publish(prod, Solicited)
			prod++
		}
		if r.Free(prod) {
			t.Fatal("full ring has a free slot")
		}
		for k := 0; k < 4; k++ {
			bits, ok := r.Ready(cons)
			if !ok || bits&Solicited == 0 {
				t.Fatalf("slot %d not ready: %x", cons, bits)
			}
			var wc ibv.WorkCompletion
			DecodeCQE(r.Entry(cons), &wc)
			if wc.ID != uint64(cons) {
				t.Fatalf("slot %d has id %d", cons, wc.ID)
			}
			r.Release(cons)
			cons++
		}
		if _, ok := r.Ready(cons); ok {
			t.Fatal("empty ring has a ready slot")
		}
	}
}

func TestMapSharedRejectsUnsealed(t *testing.T) {
	fd, err := NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	defer Close(fd)
	if _, _, err := MapShared(fd, 0, 4096); err == nil {
		t.Fatal("mapped an eventfd")
	}
	sfd, mem, err := NewShared("x", 4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(sfd)
	defer Unmap(mem)
	if _, _, err := MapShared(sfd, 4000, 200); err == nil {
		t.Fatal("mapped past the end")
	}
	if _, _, err := MapShared(sfd, 1<<63, 1<<63); err == nil {
		t.Fatal("mapped a wrapping range")
	}
}

func FuzzDecodeEntries(f *testing.F) {
	e := make([]byte, SQESize)
	EncodeSQE(e, &ibv.SendWR{ID: 1, Opcode: ibv.WRWrite, SGL: []ibv.SGE{{Addr: 1, Length: 2, LKey: 3}}})
	f.Add(e)
	EncodeSQE(e, &ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.FlagInline, Inline: []byte("x")})
	f.Add(e)
	EncodeSQE(e, &ibv.SendWR{ID: 2, Opcode: ibv.WRBindMW, Bind: ibv.MWBind{MW: 0x100, RKey: 0x101, MRKey: 3, Addr: 4, Length: 5, Access: ibv.AccessRemoteRead}})
	f.Add(e)
	f.Add(make([]byte, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		var wr ibv.SendWR
		var buf SQEBuf
		if DecodeSQE(b, &wr, &buf) == nil {
			if len(wr.SGL) > ibv.MaxSGE || len(wr.Inline) > ibv.MaxInline {
				t.Fatalf("decoded %d SGEs, %d inline", len(wr.SGL), len(wr.Inline))
			}
		}
		var rwr ibv.RecvWR
		var sgl [ibv.MaxSGE]ibv.SGE
		if DecodeRQE(b, &rwr, &sgl) == nil && len(rwr.SGL) > ibv.MaxSGE {
			t.Fatal("too many SGEs")
		}
		var wc ibv.WorkCompletion
		DecodeCQE(b, &wc)
	})
}

// BenchmarkRingSQE is one send request through a ring: encode and publish
// (client), then decode and release (daemon).
func BenchmarkRingSQE(b *testing.B) {
	r := newTestRing(b, 64, SQESize)
	wr := ibv.SendWR{ID: 1, Opcode: ibv.WRWrite, Flags: ibv.FlagInline | ibv.FlagSignaled, Inline: make([]byte, 64), RKey: 2}
	var out ibv.SendWR
	var buf SQEBuf
	var pos uint32
	b.ReportAllocs()
	for b.Loop() {
		EncodeSQE(r.Entry(pos), &wr)
		r.Publish(pos, 0)
		if _, ok := r.Ready(pos); !ok {
			b.Fatal("not ready")
		}
		if err := DecodeSQE(r.Entry(pos), &out, &buf); err != nil {
			b.Fatal(err)
		}
		r.Release(pos)
		pos++
	}
}

// BenchmarkRingCQE is one completion through a ring.
func BenchmarkRingCQE(b *testing.B) {
	r := newTestRing(b, 64, CQESize)
	wc := ibv.WorkCompletion{ID: 1, Opcode: ibv.WCWrite, ByteLen: 64, QPNum: 1}
	var out ibv.WorkCompletion
	var pos uint32
	b.ReportAllocs()
	for b.Loop() {
		EncodeCQE(r.Entry(pos), &wc)
		r.Publish(pos, 0)
		if _, ok := r.Ready(pos); !ok {
			b.Fatal("not ready")
		}
		DecodeCQE(r.Entry(pos), &out)
		r.Release(pos)
		pos++
	}
}

// TestWaitFree: an entry the consumer hands back a little later is waited
// for; one it keeps is given up on after the timeout.
func TestWaitFree(t *testing.T) {
	mem := make([]byte, HeaderSize+4*CQESize)
	r, err := InitRing(mem, 4, CQESize)
	if err != nil {
		t.Fatal(err)
	}
	if !r.WaitFree(0, time.Millisecond) {
		t.Fatal("a free entry: WaitFree false")
	}
	r.Publish(0, 0)
	go func() {
		time.Sleep(5 * time.Millisecond)
		r.Release(0)
	}()
	if !r.WaitFree(0, 5*time.Second) {
		t.Fatal("an entry released after 5 ms: WaitFree false")
	}
	r.Publish(1, 0)
	start := time.Now()
	if r.WaitFree(1, 20*time.Millisecond) {
		t.Fatal("an entry never released: WaitFree true")
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("gave up after %v, before the timeout", d)
	}
}

// TestRingSpanPacksQP: a queue pair's SQ and RQ, one after the other at
// cache-line boundaries, take one page at depth 1 (an idle connection's
// rings) and open from the other side's mapping at the same offsets.
func TestRingSpanPacksQP(t *testing.T) {
	sqb := RingSpan(RingCount(1), SQESize)
	total := sqb + RingSpan(RingCount(1), RQESize)
	if sqb%64 != 0 || total%64 != 0 || PageRound(total) != pageSize {
		t.Fatalf("depth 1: SQ %d bytes, SQ+RQ %d: want cache lines within one page of %d", sqb, total, pageSize)
	}
	for _, depth := range []int{1, 16, 1024} {
		sqc, rqc := RingCount(depth), RingCount(depth)
		sqb := RingSpan(sqc, SQESize)
		total := sqb + RingSpan(rqc, RQESize)
		fd, mem, err := NewShared("test", total, true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := InitRing(mem[:sqb], sqc, SQESize); err != nil {
			t.Fatal(err)
		}
		if _, err := InitRing(mem[sqb:], rqc, RQESize); err != nil {
			t.Fatal(err)
		}
		mapping, b, err := MapShared(fd, 0, uint64(total))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := OpenRing(b[:sqb], sqc, SQESize); err != nil {
			t.Errorf("depth %d: SQ: %v", depth, err)
		}
		if _, err := OpenRing(b[sqb:], rqc, RQESize); err != nil {
			t.Errorf("depth %d: RQ: %v", depth, err)
		}
		Unmap(mapping)
		Unmap(mem)
		Close(fd)
	}
}
