package offload

import (
	"io"

	"github.com/siwtun/siwtun/anatomy"

	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
)

// fpduPayload is one write's FPDUs of a message as a netstack.Payload:
// gVisor reads them straight into its send buffer, and each FPDU is built
// there in place (header, payload from the registered memory, markers, pad,
// CRC), so transmit copies the payload once. If gVisor offers a smaller
// slice than the write (a short write), the FPDUs are built in a buffer
// lent by the device and copied from there.
type fpduPayload struct {
	t      *txState
	h      *ddp.Header
	hl     int
	base   uint64 // TO of the message's first byte (tagged)
	msgLen uint64
	full   uint64  // payload bytes of a full FPDU (without Markers; see payloadAt)
	off    uint64  // message offset of the next FPDU to build
	si, so int     // source chunk and offset of that FPDU's payload
	count  int     // FPDUs in this write
	total  int     // wire bytes of this write
	done   int     // bytes handed to gVisor
	built  []byte  // the fallback copy, if used
	buf    *[]byte // its buffer, from t.bufs until the copy is handed over
	// builtAt is when the FPDUs were built, for the hop stamps (0: not
	// stamped).
	builtAt int64
}

// payloadAt returns the payload bytes of a full FPDU starting at stream
// offset pos: f.full, or with Markers what fits the EMSS with the Markers
// that fall into an FPDU there (their number depends on the position),
// 4-aligned.
func (f *fpduPayload) payloadAt(pos uint64) uint64 {
	if !f.t.mpa.Markers() {
		return f.full
	}
	return uint64(f.t.mpa.MaxULPDULenAt(pos, f.t.emss)-f.hl) &^ 3
}

// fpduLen returns the payload bytes of the next FPDU of a message with left
// bytes to go, starting at stream offset pos. With Markers, an FPDU that
// would end exactly on a Marker position is made 4 bytes shorter (the rest
// goes into the next FPDU): the Marker then falls inside the next FPDU
// instead of at a segment's end, where Wireshark's iWARP dissector counts
// it into the wrong segment and loses the FPDU boundaries from there on.
// Both placements are valid MPA; this one is decoded by everyone.
func (f *fpduPayload) fpduLen(pos, left uint64) uint64 {
	n := min(left, f.payloadAt(pos))
	if !f.t.mpa.Markers() || n < 8 {
		return n
	}
	if end := pos + uint64(f.t.mpa.WireLenAt(pos, f.hl+int(n))); end%mpa.MarkerInterval == 0 {
		n -= 4
	}
	return n
}

// Len implements netstack.Payload.
func (f *fpduPayload) Len() int { return f.total - f.done }

// Read implements netstack.Payload.
func (f *fpduPayload) Read(p []byte) (int, error) {
	if f.done == f.total {
		return 0, io.EOF
	}
	if f.done == 0 && f.built == nil && len(p) >= f.total {
		out := f.build(p[:0:len(p)])
		if &out[0] != &p[0] {
			copy(p, out) // cannot happen: p has room; kept for safety
		}
		f.done = f.total
		if f.t.hops.On() {
			f.builtAt = anatomy.Now()
		}
		return f.total, nil
	}
	if f.built == nil {
		f.buf = f.t.bufs.Get().(*[]byte)
		f.built = f.build((*f.buf)[:0])
		if f.t.hops.On() {
			f.builtAt = anatomy.Now()
		}
	}
	n := copy(p, f.built[f.done:])
	f.done += n
	if f.done == f.total {
		f.built = nil
		f.t.bufs.Put(f.buf)
		f.buf = nil
	}
	return n, nil
}

// build appends this write's FPDUs to dst and advances the message cursor;
// it runs once per write.
func (f *fpduPayload) build(dst []byte) []byte {
	t, h := f.t, f.h
	for i := 0; i < f.count; i++ {
		n := f.fpduLen(t.mpa.StreamOffset(), f.msgLen-f.off)
		h.Last = f.off+n == f.msgLen
		if h.Tagged {
			h.TO = f.base + f.off
		} else {
			h.MO = uint32(f.off)
		}
		h.Marshal(t.hdr[:f.hl])
		t.mpa.Begin(dst, f.hl+int(n))
		t.mpa.Write(t.hdr[:f.hl])
		for left := int(n); left > 0; {
			c := t.src[f.si][f.so:]
			if len(c) > left {
				c = c[:left]
			}
			t.mpa.Write(c)
			left -= len(c)
			f.so += len(c)
			if f.so == len(t.src[f.si]) {
				f.si, f.so = f.si+1, 0
			}
		}
		dst = t.mpa.Finish()
		f.off += n
	}
	return dst
}
