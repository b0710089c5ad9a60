package mpa

import (
	"encoding/binary"

	"github.com/siwtun/siwtun/iwarp/mpa/internal/crc32c"
)

// WholeFPDU is one whole FPDU found inside a TCP segment's payload by
// FindFPDUs, without the stream in front of it.
type WholeFPDU struct {
	// Off is the offset in the segment of the FPDU's first octet (its
	// leading Marker, when it has one).
	Off int
	// Len is the FPDU's length in the segment: ULPDU_Length, ULPDU, pad,
	// CRC and the Markers inside it.
	Len int
	// ByMarker says a Marker located the FPDU (it lies in a run of FPDUs
	// that a Marker in the segment points into, every Marker inside the
	// run agreeing). Otherwise it was found only by the segment's
	// alignment: the segment starts with an FPDU and the FPDU lengths
	// chain exactly to its end, which a wrong guess can also do, so only a
	// CRC makes such an FPDU trustworthy.
	ByMarker bool
}

// maxFound bounds the FPDUs FindFPDUs reports per segment (a segment of
// 64 KiB holds at most 8192 FPDUs of 8 octets).
const maxFound = 8192

// FindFPDUs appends to dst the whole FPDUs in seg, the payload of a TCP
// segment whose first octet has stream offset pos (octets from the first
// octet of the first FPDU; only pos modulo MarkerInterval matters, so a
// 32-bit offset that wrapped is fine). markers says whether the stream
// carries Markers.
//
// The FPDUs are found, as an RNIC finds them in a segment that arrived out
// of order, by alignment (the segment is a run of whole FPDUs: it starts
// with an FPDU, or a Marker then an FPDU, and the lengths chain exactly to
// its end) or, with Markers, by a Marker's FPDUPTR pointing at an FPDU
// start in the segment, followed by the FPDUs chaining from there. A run
// stops before an FPDU holding a Marker that disagrees with it. FPDUs of an
// aligned run are ByMarker from the first one holding a Marker on. Only the framing is
// read: the caller checks CRCs (WholeFPDU.ULPDU) and decides whether an
// FPDU found by alignment alone is to be trusted.
func FindFPDUs(dst []WholeFPDU, seg []byte, pos uint32, markers bool) []WholeFPDU {
	start := len(dst)
	if run, ok := chain(dst, seg, pos, markers, 0); ok && len(run) > start {
		if markers {
			// The run's Markers all agree with it (chain checked them):
			// from the first FPDU holding one on, a Marker vouches for
			// the boundaries.
			confirmed := false
			for i := start; i < len(run); i++ {
				confirmed = confirmed || run[i].holdsMarker(pos)
				run[i].ByMarker = confirmed
			}
		}
		return run
	}
	dst = dst[:start]
	if !markers {
		return dst
	}
	// Markers sit at the stream offsets that are multiples of
	// MarkerInterval.
	next := 0 // the first segment offset a new run may start at
	for m := nextMarker(pos, 0); m+MarkerLen <= len(seg); m += MarkerInterval {
		if m < next {
			continue
		}
		f, ok := markerTarget(seg, pos, m)
		if !ok || f < next {
			continue
		}
		n := len(dst)
		dst, _ = chain(dst, seg, pos, markers, f)
		if len(dst) == n || dst[n].Off+dst[n].Len <= m {
			// Nothing whole there, or the Marker is not inside the
			// FPDU it points at.
			dst = dst[:n]
			continue
		}
		last := dst[len(dst)-1]
		next = last.Off + last.Len
	}
	for i := start; i < len(dst); i++ {
		dst[i].ByMarker = true
	}
	return dst
}

// markerTarget returns the segment offset of the first octet of the FPDU
// that the Marker at segment offset m points at, or false when that is
// before the segment. Both FPDUPTR readings are accepted: from the FPDU's
// first octet (its leading Marker included) and from its ULPDU_Length.
func markerTarget(seg []byte, pos uint32, m int) (int, bool) {
	ptr := int(binary.BigEndian.Uint16(seg[m+2:m+4]) &^ 3)
	f := m - ptr
	if f < 0 {
		return 0, false
	}
	if f != m && isMarkerAt(pos, f-MarkerLen) {
		// A Marker ends just before: it belongs to the FPDU after it (an
		// FPDU never starts right after a Marker), so FPDUPTR counted
		// from the ULPDU_Length field.
		if f < MarkerLen {
			return 0, false // that Marker is before the segment
		}
		f -= MarkerLen
	}
	return f, true
}

// nextMarker returns the segment offset of the first Marker at or after
// segment offset off.
func nextMarker(pos uint32, off int) int {
	return off + int((MarkerInterval-(pos+uint32(off))%MarkerInterval)%MarkerInterval)
}

// isMarkerAt reports whether a Marker starts at segment offset off.
func isMarkerAt(pos uint32, off int) bool {
	return (pos+uint32(off))%MarkerInterval == 0
}

// chain appends the run of whole FPDUs starting at segment offset off and
// reports whether the run ends exactly at the segment's end (a Marker
// ending the segment counts as the next FPDU's, and the run still ends
// there). With markers, a run stops before the first FPDU holding a Marker
// that disagrees with it.
func chain(dst []WholeFPDU, seg []byte, pos uint32, markers bool, off int) ([]WholeFPDU, bool) {
	start := len(dst)
	p := off
	for len(dst)-start < maxFound {
		if p == len(seg) {
			return dst, true
		}
		f := p
		q := p
		if markers && isMarkerAt(pos, q) {
			q += MarkerLen
			if q == len(seg) {
				return dst, true
			}
		}
		l, ok := lenAt(seg, pos, markers, q)
		if !ok {
			return dst, false
		}
		framed := ulpduLenLen + l + padLen(l) + crcLen
		wire := framed
		if markers {
			wire += MarkerLen * markersIn(uint64(pos+uint32(q)), framed)
		}
		end := q + wire
		if end > len(seg) {
			return dst, false
		}
		w := WholeFPDU{Off: f, Len: end - f}
		if markers && !w.markersAgree(seg, pos) {
			return dst, false
		}
		dst = append(dst, w)
		p = end
	}
	return dst, false
}

// lenAt reads the ULPDU_Length field at segment offset q (a Marker may sit
// between its two octets), or false if it is not all inside the segment.
func lenAt(seg []byte, pos uint32, markers bool, q int) (int, bool) {
	var b [ulpduLenLen]byte
	for i := range b {
		if markers && isMarkerAt(pos, q) {
			q += MarkerLen
		}
		if q >= len(seg) {
			return 0, false
		}
		b[i] = seg[q]
		q++
	}
	return int(binary.BigEndian.Uint16(b[:])), true
}

// holdsMarker reports whether a Marker lies inside the FPDU.
func (w WholeFPDU) holdsMarker(pos uint32) bool {
	first := nextMarker(pos, w.Off)
	return first < w.Off+w.Len
}

// markersAgree reports whether every Marker inside the FPDU points at its
// first octet (or, after a leading Marker, at its ULPDU_Length).
func (w WholeFPDU) markersAgree(seg []byte, pos uint32) bool {
	leading := isMarkerAt(pos, w.Off)
	first := nextMarker(pos, w.Off)
	for m := first; m < w.Off+w.Len; m += MarkerInterval {
		ptr := int(binary.BigEndian.Uint16(seg[m+2:m+4]) &^ 3)
		d := m - w.Off
		if ptr != d && !(leading && d != 0 && ptr == d-MarkerLen) {
			return false
		}
	}
	return true
}

// ULPDU appends to dst the FPDU's ULPDU (Markers, ULPDU_Length, pad and
// CRC removed) taken from seg, the segment FindFPDUs found it in (at stream
// offset pos), and reports whether its CRC matches; with crc false the CRC
// is not checked and ok is always true.
func (w WholeFPDU) ULPDU(dst, seg []byte, pos uint32, markers, crc bool) (ulpdu []byte, ok bool) {
	b := seg[w.Off : w.Off+w.Len]
	if crc {
		want := binary.LittleEndian.Uint32(b[len(b)-crcLen:])
		if crc32c.Checksum(b[:len(b)-crcLen]) != want {
			return dst, false
		}
	}
	start := len(dst)
	for i := 0; i < len(b)-crcLen; {
		if markers && isMarkerAt(pos, w.Off+i) {
			i += MarkerLen
			continue
		}
		n := len(b) - crcLen - i
		if markers {
			n = min(n, MarkerInterval-int((pos+uint32(w.Off+i))%MarkerInterval))
		}
		dst = append(dst, b[i:i+n]...)
		i += n
	}
	framed := dst[start:]
	l := int(binary.BigEndian.Uint16(framed))
	copy(framed, framed[ulpduLenLen:ulpduLenLen+l])
	return dst[:start+l], true
}
