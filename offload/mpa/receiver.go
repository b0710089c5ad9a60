package mpa

import (
	"encoding/binary"

	"github.com/siwtun/siwtun/offload/mpa/internal/crc32c"
)

// Handler receives the ULPDUs a Receiver takes out of the stream. A non-nil
// error from any method stops the Receiver, which returns it from Write
// unchanged.
type Handler interface {
	// BeginFPDU starts an FPDU whose ULPDU_Length (Markers not counted)
	// is ulpduLen.
	BeginFPDU(ulpduLen int) error
	// ULPDU delivers the next octets of the current FPDU's ULPDU, Markers
	// removed, in arbitrary chunks; in total exactly ulpduLen octets. p is
	// only valid during the call and must not be modified (the CRC may be
	// computed over it afterwards). The CRC has not been checked yet.
	ULPDU(p []byte) error
	// EndFPDU ends the FPDU after its pad and CRC. crcOK reports whether
	// the CRC matched; it is always true when CRC is off.
	EndFPDU(crcOK bool) error
}

// ReceiverStats counts what a Receiver has seen.
type ReceiverStats struct {
	Bytes      uint64 // stream octets consumed: FPDUs incl. Markers, pad, CRC
	FPDUs      uint64 // FPDUs completed (EndFPDU called)
	ULPDUBytes uint64 // ULPDU octets delivered to the Handler
	Markers    uint64 // Markers removed and found valid
	BadMarkers uint64 // Markers with an FPDUPTR that fits neither reading
	CRCErrors  uint64 // FPDUs whose CRC did not match (CRC on only)

	// Markers after a leading Marker in the same FPDU, by the FPDUPTR
	// reading the peer used (see MarkerPtr).
	PtrFromFPDUStart   uint64
	PtrFromULPDULength uint64
}

// Receiver parsing states.
const (
	stLen  uint8 = iota // ULPDU_Length field
	stData              // ULPDU octets
	stPad               // pad octets
	stCRC               // CRC trailer
)

// Receiver takes FPDUs out of one direction's in-order TCP byte stream. It
// is an io.Writer, meant to be handed to gVisor's tcp.Endpoint.Read so it
// sees each segment's payload as it is read; it never buffers an FPDU
// (only up to 4 octets of a split ULPDU_Length, CRC or Marker). Octet 0 of
// the stream is the first octet of the first FPDU. A Receiver is not safe
// for concurrent use.
type Receiver struct {
	crcOn   bool
	markers bool
	h       Handler
	pos     uint64 // stream offset of the next octet
	err     error  // sticky

	state   uint8
	inFPDU  bool   // an FPDU has started (start is valid)
	start   uint64 // stream offset of the FPDU's first octet (leading Marker included)
	leading bool   // the FPDU began with a Marker
	need    int    // octets left in stData / stPad
	ulpdu   int
	crc     uint32
	span    []byte  // input octets covered by the CRC, not yet added to crc (aliases the current Write's input)
	acc     [4]byte // split ULPDU_Length or CRC
	nacc    int
	mk      [MarkerLen]byte // split Marker
	stats   ReceiverStats
	// badMarker is the error of a Marker that disagreed with the current
	// FPDU's start, held for the FPDU's CRC (CRC on; see Pending).
	badMarker *Error

	mo MarkerObserver // h, when it observes Markers
}

// Init resets r for a new connection direction. crc: CRCs are checked.
// markers: the peer inserts Markers (we asked). h receives the ULPDUs.
func (r *Receiver) Init(crc, markers bool, h Handler) {
	*r = Receiver{
		crcOn:   crc,
		markers: markers,
		h:       h,
	}
	r.mo, _ = h.(MarkerObserver)
}

// Resume puts r at stream offset pos, which must be an FPDU boundary, as
// if the octets before it had been consumed: a checker that did not see
// part of a stream picks it up again at an FPDU it has verified (Marker
// positions follow from pos). The settings, Handler and counters are kept;
// an earlier error is cleared.
func (r *Receiver) Resume(pos uint64) {
	*r = Receiver{crcOn: r.crcOn, markers: r.markers, h: r.h, mo: r.mo, stats: r.stats, pos: pos}
}

// Stats returns the counters so far.
func (r *Receiver) Stats() ReceiverStats {
	s := r.stats
	s.Bytes = r.pos
	return s
}

// FPDUStart returns the stream offset of the first octet (its leading
// Marker included) of the FPDU being received, or of the last one when
// the Receiver is between FPDUs. A Handler may call it from BeginFPDU on.
func (r *Receiver) FPDUStart() uint64 { return r.start }

// StreamOffset returns the stream offset of the next octet to arrive:
// after EndFPDU, the end of the FPDU that ended.
func (r *Receiver) StreamOffset() uint64 { return r.pos }

// Awaiting returns how many more stream octets (Markers not counted) the
// FPDU being received needs before its CRC is known: 0 between FPDUs;
// within a ULPDU_Length field split across writes, the octets that field
// still lacks (its FPDU's size is not known yet).
func (r *Receiver) Awaiting() int {
	if !r.inFPDU {
		return 0
	}
	switch r.state {
	case stLen:
		return ulpduLenLen - r.nacc
	case stData:
		return r.need + padLen(r.ulpdu) + crcLen
	case stPad:
		return r.need + crcLen
	default:
		return crcLen - r.nacc
	}
}

// Pending returns the error of a Marker of the current FPDU that
// disagreed with the FPDU's start (CodeMarkerMismatch), held for the FPDU's
// CRC, or nil. RFC 5044 §8 has a Marker that disagrees with the
// ULPDU_Length reported "in the event that the CRC is valid": with CRC on
// the Receiver goes on to the FPDU's CRC, by the ULPDU_Length, and then
// returns this error from Write if the CRC is good, or ends the FPDU with
// EndFPDU(false) if it is not (the Marker was damaged with the FPDU). A
// caller that cannot wait for the CRC (its octets have not arrived) may
// report the error itself; Pending keeps returning it until the FPDU ends.
func (r *Receiver) Pending() *Error { return r.badMarker }

// Write consumes stream octets. It returns len(p) and nil, or on error how
// much of p was consumed, up to and including the octets that caused it. Errors from the Handler are returned
// as is; framing errors are *Error (CodeMarkerMismatch for a bad Marker:
// with CRC on, once the FPDU's CRC proved good; see Pending).
// After an error the Receiver is stopped: later calls return the same
// error.
func (r *Receiver) Write(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.h == nil {
		r.err = newError(CodeLocalCatastrophic, "mpa Receiver used before Init")
		return 0, r.err
	}
	n, err := r.write(p)
	r.flush() // never keep a reference to p
	if err != nil {
		r.err = err
	}
	return n, err
}

// write is Write without the bookkeeping.
func (r *Receiver) write(p []byte) (int, error) {
	done := 0
	for len(p) > 0 {
		run := len(p)
		if r.markers {
			off := int(r.pos % MarkerInterval)
			if off < MarkerLen {
				n, err := r.marker(p, off)
				done += n
				p = p[n:]
				if err != nil {
					return done, err
				}
				continue
			}
			run = min(run, MarkerInterval-off)
		}
		n, err := r.feed(p[:run])
		done += n
		p = p[n:]
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// marker consumes octets of the Marker at stream offset pos-off.
func (r *Receiver) marker(p []byte, off int) (int, error) {
	if off == 0 && !r.inFPDU {
		r.beginFPDU() // a leading Marker belongs to the FPDU that follows
		r.leading = true
	}
	n := copy(r.mk[off:], p)
	r.take(p[:n], true)
	if off+n < MarkerLen {
		return n, nil
	}
	// The Marker is complete: validate FPDUPTR (its low two bits are
	// treated as zero as RFC 5044 asks of receivers; the reserved half is
	// ignored).
	raw := binary.BigEndian.Uint16(r.mk[2:])
	ptr := raw &^ 3
	d := r.pos - MarkerLen - r.start
	ok, reading := false, PtrFromFPDUStart
	switch {
	case !r.leading || d == 0:
		ok = ptr == uint16(d)
	case ptr == uint16(d):
		ok = true
		r.stats.PtrFromFPDUStart++
	case ptr == uint16(d-MarkerLen):
		ok, reading = true, PtrFromULPDULength
		r.stats.PtrFromULPDULength++
	}
	if ok {
		r.stats.Markers++
	} else {
		r.stats.BadMarkers++
	}
	if r.mo != nil {
		alt := uint16(d)
		if r.leading && d != 0 {
			alt = uint16(d - MarkerLen)
		}
		return n, r.mo.Marker(Marker{Offset: r.pos - MarkerLen, FPDUPTR: raw, FPDUStart: r.start, Want: uint16(d), WantAlt: alt, OK: ok, Reading: reading})
	}
	if ok {
		return n, nil
	}
	err := newError(CodeMarkerMismatch, "Marker at stream offset %d has FPDUPTR %d, its FPDU starts %d octets before it", r.pos-MarkerLen, ptr, d)
	if r.crcOn {
		if r.badMarker == nil {
			r.badMarker = err // until the FPDU's CRC (Pending)
		}
		return n, nil
	}
	return n, err
}

// beginFPDU starts a new FPDU at the current stream offset.
func (r *Receiver) beginFPDU() {
	r.inFPDU = true
	r.start = r.pos
	r.leading = false
	r.crc = 0
	r.state = stLen
	r.nacc = 0
}

// feed consumes Marker-free octets of the FPDU stream.
func (r *Receiver) feed(p []byte) (int, error) {
	done := 0
	for len(p) > 0 {
		switch r.state {
		case stLen:
			if !r.inFPDU {
				r.beginFPDU()
			}
			n := copy(r.acc[r.nacc:ulpduLenLen], p)
			r.take(p[:n], true)
			done += n
			p = p[n:]
			if r.nacc += n; r.nacc < ulpduLenLen {
				continue
			}
			r.nacc = 0
			r.ulpdu = int(binary.BigEndian.Uint16(r.acc[:]))
			r.need = r.ulpdu
			r.state = stData
			if err := r.h.BeginFPDU(r.ulpdu); err != nil {
				return done, err
			}
			if r.need == 0 {
				r.endData()
			}
		case stData:
			n := min(len(p), r.need)
			r.take(p[:n], true)
			r.need -= n
			r.stats.ULPDUBytes += uint64(n)
			done += n
			err := r.h.ULPDU(p[:n])
			p = p[n:]
			if err != nil {
				return done, err
			}
			if r.need == 0 {
				r.endData()
			}
		case stPad:
			n := min(len(p), r.need)
			r.take(p[:n], true)
			r.need -= n
			done += n
			p = p[n:]
			if r.need == 0 {
				r.state = stCRC
			}
		case stCRC:
			n := copy(r.acc[r.nacc:crcLen], p)
			r.take(p[:n], false)
			done += n
			p = p[n:]
			if r.nacc += n; r.nacc < crcLen {
				continue
			}
			r.nacc = 0
			r.flush()
			ok := !r.crcOn || binary.LittleEndian.Uint32(r.acc[:]) == r.crc
			if !ok {
				r.stats.CRCErrors++
			}
			r.inFPDU = false
			r.state = stLen
			if me := r.badMarker; me != nil {
				r.badMarker = nil
				if ok {
					return done, me // the CRC is valid: the Marker's error stands
				}
			}
			r.stats.FPDUs++
			if err := r.h.EndFPDU(ok); err != nil {
				return done, err
			}
		}
	}
	return done, nil
}

// endData moves on from a complete ULPDU to its pad (or CRC).
func (r *Receiver) endData() {
	r.need = padLen(r.ulpdu)
	r.state = stPad
	if r.need == 0 {
		r.state = stCRC
	}
}

// take advances the stream offset over p, a piece of the current Write's
// input, adding it to the CRC if inCRC. Pieces that follow each other in
// the input (ULPDU octets and the Markers between them) are collected into
// one span and added with a single crc32c.Update, so the CRC runs on long
// blocks even with Markers.
func (r *Receiver) take(p []byte, inCRC bool) {
	r.pos += uint64(len(p))
	if !inCRC || !r.crcOn || len(p) == 0 {
		return
	}
	if n := len(r.span); n > 0 && n+len(p) <= cap(r.span) && &r.span[:n+1][n] == &p[0] {
		r.span = r.span[:n+len(p)]
		return
	}
	r.flush()
	r.span = p
}

// flush adds the pending span to the CRC.
func (r *Receiver) flush() {
	if len(r.span) > 0 {
		r.crc = crc32c.Update(r.crc, r.span)
	}
	r.span = nil
}
