package netstack

// SetTap installs h as the stack's tap, or removes it when h is nil. The
// tap sees every TCP segment in both directions, like Options.Hook, but it
// can come and go while the stack runs (a packet capture, a live trace):
// with none installed it costs one atomic load per packet, and payloads
// are pulled together only while a tap that reads them (not a HeaderHook)
// is in place. The rules of SegmentHook apply: h must not retain the
// Segment or its Payload, and must not block.
func (s *Stack) SetTap(h SegmentHook) {
	if h == nil {
		s.tap.Store(nil)
		return
	}
	s.tap.Store(&hookBox{h: h, payload: wantsPayload(h)})
}

// wantsPayload reports whether b is a tap that reads payloads.
func (b *hookBox) wantsPayload() bool { return b != nil && b.payload }

// callTap hands seg to the tap, with the fields other hooks may have
// changed restored.
func (s *Stack) callTap(tap *hookBox, seg *Segment, dir Direction, h *tcpHeader, payload []byte) {
	views, viewOff := seg.views, seg.viewOff
	*seg = Segment{Dir: dir, Src: h.src, Dst: h.dst, Seq: h.seq, Ack: h.ack, Flags: h.flags, Window: h.window, Len: h.plen, views: views, viewOff: viewOff}
	if h.flags&FlagSYN != 0 {
		seg.MSS = mssOption(h.options)
	}
	if tap.payload {
		seg.Payload = payload
	}
	tap.h.Segment(seg)
}
