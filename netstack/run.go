package netstack

import "gvisor.dev/gvisor/pkg/buffer"

// BatchHook is a SegmentHook that also observes, in one call, the wire
// segments a super-segment stands for (segmentation offload outbound, a
// whole device read inbound). A hook that keeps state per segment (locks,
// counters) pays for it once per super-segment instead of once per wire
// segment. The stack uses Segments when the BatchHook is the only hook on
// the packet's path (no stack-wide hook, no tap), and Segment otherwise;
// both see the same wire segments.
type BatchHook interface {
	SegmentHook
	// Segments observes the wire segments of one super-segment in order:
	// each run.Next returns the next one. Like Segment, it must not retain
	// the run or its segments after it returns; nor may it change a
	// segment's fields (Next sets only what differs from one wire segment
	// to the next).
	Segments(run *SegmentRun)
}

// SegmentRun steps through the wire segments of one super-segment: TCP
// payloads of mss octets each but the last, behind one header. Each is
// the segment a wire carries, with the sequence number and flags the
// kernel gives it when cutting the super-segment (FIN and PSH only on the
// last, CWR only on the first).
type SegmentRun struct {
	seg      Segment
	dir      Direction
	whole    tcpHeader
	payload  []byte // nil for a HeaderHook
	views    *buffer.View
	viewOff  int
	mss, off int
}

// Next returns the next wire segment, or nil after the last. The segment
// is valid until the next call of Next, and only during the hook call.
func (r *SegmentRun) Next() *Segment {
	if r.off >= r.whole.plen {
		return nil
	}
	n := min(r.mss, r.whole.plen-r.off)
	var p []byte
	if r.payload != nil {
		p = r.payload[r.off : r.off+n]
	}
	s := &r.seg
	if r.off == 0 {
		// The header's fields are the same for every wire segment: set
		// them once, then only what differs.
		s.fill(r.dir, &r.whole, nil, r.views, r.viewOff)
	}
	s.Seq = r.whole.seq + uint32(r.off)
	s.Len = n
	s.Flags = wireFlags(r.whole.flags, r.off, n, r.whole.plen)
	s.Payload = p
	s.viewOff = r.viewOff + r.off
	r.off += n
	return s
}

// wireSegment returns the header of the wire segment at payload offset
// off of the super-segment whole, cut every mss octets.
func wireSegment(whole *tcpHeader, off, mss int) tcpHeader {
	h := *whole
	h.seq = whole.seq + uint32(off)
	h.plen = min(mss, whole.plen-off)
	h.flags = wireFlags(whole.flags, off, h.plen, whole.plen)
	return h
}

// wireFlags returns the flags of the n-octet wire segment at payload
// offset off of a super-segment of plen octets with flags f: FIN and PSH
// only on the last, CWR only on the first, as the kernel cuts it.
func wireFlags(f uint8, off, n, plen int) uint8 {
	if off+n < plen {
		f &^= FlagFIN | FlagPSH
	}
	if off > 0 {
		f &^= FlagCWR
	}
	return f
}

// fill sets s to the segment of header h, with payload p (nil for a
// HeaderHook) found at viewOff in the packet's buffer views.
func (s *Segment) fill(dir Direction, h *tcpHeader, p []byte, views *buffer.View, viewOff int) {
	*s = Segment{
		Dir:     dir,
		Src:     h.src,
		Dst:     h.dst,
		Seq:     h.seq,
		Ack:     h.ack,
		Flags:   h.flags,
		Window:  h.window,
		Len:     h.plen,
		Payload: p,
		views:   views,
		viewOff: viewOff,
	}
	if h.flags&FlagSYN != 0 {
		s.MSS = mssOption(h.options)
	}
}
