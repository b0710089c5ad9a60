package netstack

import (
	"net/netip"
	"reflect"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
)

// wireSeg is what a hook saw of one wire segment.
type wireSeg struct {
	Dir      Direction
	Src, Dst netip.AddrPort
	Seq, Ack uint32
	Flags    uint8
	Window   uint16
	Len      int
	Data     string // through ReadPayload
	Payload  bool   // Payload was set
}

func sawSeg(s *Segment) wireSeg {
	b := make([]byte, s.Len)
	b = b[:s.ReadPayload(b, 0)]
	return wireSeg{Dir: s.Dir, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Ack: s.Ack, Flags: s.Flags, Window: s.Window,
		Len: s.Len, Data: string(b), Payload: s.Payload != nil}
}

// runRecorder is a BatchHook that records the runs it is given.
type runRecorder struct {
	runs int
	segs []wireSeg
}

func (r *runRecorder) Segment(s *Segment) { r.segs = append(r.segs, sawSeg(s)) }

func (r *runRecorder) Segments(run *SegmentRun) {
	r.runs++
	for s := run.Next(); s != nil; s = run.Next() {
		r.segs = append(r.segs, sawSeg(s))
	}
}

// TestSegmentRun: a BatchHook gets a super-segment's wire segments in one
// call, and they are the very segments a plain hook gets one call each:
// sequence numbers, lengths, flags (FIN and PSH only on the last, CWR only
// on the first) and payload octets, read in place or handed over; and on
// every one the super-segment's direction, addresses, ACK and window (the
// run sets those once, and only what differs for each wire segment).
func TestSegmentRun(t *testing.T) {
	const mss = 1448
	const ack, cwr, psh, fin = FlagACK, FlagCWR, FlagPSH, FlagFIN
	tests := []struct {
		name  string
		plen  int
		flags uint8
		want  []wireSeg // header fields all segments share and Data left out
	}{
		{"uneven", 4000, ack | cwr | psh | fin, []wireSeg{
			{Seq: 1000, Flags: ack | cwr, Len: 1448},
			{Seq: 2448, Flags: ack, Len: 1448},
			{Seq: 3896, Flags: ack | psh | fin, Len: 1104},
		}},
		{"whole MSSes", 2 * mss, ack | psh, []wireSeg{
			{Seq: 1000, Flags: ack, Len: 1448},
			{Seq: 2448, Flags: ack | psh, Len: 1448},
		}},
	}
	for _, tt := range tests {
		payload := make([]byte, tt.plen)
		for i := range payload {
			payload[i] = byte(i*7 + i>>8)
		}
		// The payload behind 40 octets of headers in the packet's view.
		pkt := append(make([]byte, 40), payload...)
		view := buffer.NewViewWithData(pkt)
		h := tcpHeader{
			src:    netip.MustParseAddrPort("198.18.0.1:4000"),
			dst:    netip.MustParseAddrPort("198.18.0.2:5000"),
			seq:    1000,
			ack:    77,
			window: 512,
			flags:  tt.flags,
			plen:   tt.plen,
		}
		for _, withPayload := range []bool{true, false} {
			var p []byte
			if withPayload {
				p = payload
			}
			var plain []wireSeg
			hook := SegmentHookFunc(func(s *Segment) { plain = append(plain, sawSeg(s)) })
			s := &Stack{}
			hh := h
			s.callHooksWire(hook, withPayload, nil, Outbound, &hh, p, view, 40, mss)
			batch := &runRecorder{}
			s.callHooksWire(batch, withPayload, nil, Outbound, &hh, p, view, 40, mss)
			if batch.runs != 1 {
				t.Errorf("%s: the BatchHook got %d runs, want 1", tt.name, batch.runs)
			}
			if !reflect.DeepEqual(batch.segs, plain) {
				t.Errorf("%s, payload %v: run gave %+v\nplain hook got %+v", tt.name, withPayload, batch.segs, plain)
			}
			off := 0
			for i := range tt.want {
				w := tt.want[i]
				w.Dir, w.Src, w.Dst, w.Ack, w.Window = Outbound, h.src, h.dst, h.ack, h.window
				w.Data, w.Payload = string(payload[off:off+w.Len]), withPayload
				off += w.Len
				if i >= len(batch.segs) || batch.segs[i] != w {
					t.Errorf("%s, payload %v: wire segment %d = %+v, want %+v", tt.name, withPayload, i, batch.segs, w)
					break
				}
			}
			if len(batch.segs) != len(tt.want) {
				t.Errorf("%s: %d wire segments, want %d", tt.name, len(batch.segs), len(tt.want))
			}
		}
	}
}

// TestSegmentRunNotWithOtherHooks: with a stack-wide hook (a trace) on the path,
// a BatchHook gets the wire segments one call each, beside the tap.
func TestSegmentRunNotWithOtherHooks(t *testing.T) {
	s := &Stack{hook: SegmentHookFunc(func(*Segment) {})}
	payload := make([]byte, 3000)
	h := tcpHeader{seq: 1, flags: FlagACK, plen: len(payload)}
	rec := &runRecorder{}
	s.callHooksWire(rec, true, nil, Inbound, &h, payload, buffer.NewViewWithData(payload), 0, 1000)
	if rec.runs != 0 || len(rec.segs) != 3 {
		t.Errorf("with a stack-wide hook: %d runs, %d segments; want 0 runs, 3 segments one by one", rec.runs, len(rec.segs))
	}
}
