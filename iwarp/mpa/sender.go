package mpa

import (
	"encoding/binary"
	"slices"

	"github.com/siwtun/siwtun/iwarp/mpa/internal/crc32c"
)

// FPDU layout constants.
const (
	// MarkerInterval is the stream distance between two Markers.
	MarkerInterval = 512
	// MarkerLen is the length of a Marker.
	MarkerLen = 4
	// MaxULPDULen is the largest ULPDU_Length an FPDU can carry.
	MaxULPDULen = 0xffff

	ulpduLenLen = 2 // the ULPDU_Length field
	crcLen      = 4 // the CRC trailer (present even when CRC is off)
)

// MarkerPtr selects how a Sender counts the FPDUPTR of a Marker that is not
// the first thing of its FPDU, when the FPDU begins with a leading Marker.
// The two readings differ only in that case; see the package documentation.
type MarkerPtr uint8

// FPDUPTR readings.
const (
	// PtrFromFPDUStart counts from the FPDU's first octet, which is the
	// leading Marker when there is one (the default; what OSC iWARP sends).
	PtrFromFPDUStart MarkerPtr = iota
	// PtrFromULPDULength counts from the ULPDU_Length field, i.e. 4 less
	// when the FPDU begins with a leading Marker (RFC 5044's wording taken
	// literally).
	PtrFromULPDULength
)

// String returns "fpdu-start" or "ulpdu-length".
func (m MarkerPtr) String() string {
	if m == PtrFromULPDULength {
		return "ulpdu-length"
	}
	return "fpdu-start"
}

// padLen returns the number of pad octets after a ULPDU of n octets: the
// FPDU without Markers is a multiple of 4.
func padLen(n int) int {
	return (4 - (ulpduLenLen+n)%4) % 4
}

// Sender builds FPDUs for one direction of a connection. It tracks the
// stream offset (0 = first octet of the first FPDU) to place Markers.
//
// One FPDU is built per Begin/Write/Finish sequence, appended to the
// caller's buffer. The payload is copied once, and the CRC is computed as
// it is copied (crc32c.CopyUpdate: one pass over the data, as an RNIC's DMA
// engine computes it) for pieces of at least fuseMin octets; the octets
// between them (headers, pad, short pieces) are covered in one run each,
// when the next long piece comes or at Finish. With Markers, which cut the
// payload every 512 octets, the CRC is one run over the whole FPDU at
// Finish instead: folding is fast only on long runs. With a large enough
// buffer nothing is allocated.
// A Sender is not safe for concurrent use.
type Sender struct {
	ready   bool // Init was called
	crcOn   bool
	markers bool
	ptr     MarkerPtr
	pos     uint64 // stream offset of the next octet

	// The FPDU under construction.
	active  bool
	buf     []byte
	start   uint64 // stream offset of the FPDU's first octet
	leading bool   // the FPDU began with a Marker
	at      int    // index in buf of the FPDU's first octet
	want    int    // ULPDU_Length
	got     int    // ULPDU octets written so far
	crc     uint32 // CRC32c of buf[at:crcAt]
	crcAt   int    // index in buf up to which crc covers the FPDU
}

// fuseMin is the shortest piece a Sender copies and checksums in one pass;
// shorter ones are appended and left for the next run of the CRC (the
// folding code needs 256 octets, and short runs are cheaper together).
const fuseMin = 256

// Init resets s for a new connection direction. crc: CRCs are computed
// (else the trailer is zero). markers: we insert Markers (the peer asked
// for them). The stream offset restarts at 0, which must be the first
// octet of the first FPDU after the MPA Request/Reply.
func (s *Sender) Init(crc, markers bool) {
	*s = Sender{
		ready:   true,
		crcOn:   crc,
		markers: markers,
	}
}

// SetMarkerPtr selects the FPDUPTR reading for Markers after a leading
// Marker (default PtrFromFPDUStart). It does not affect anything else.
func (s *Sender) SetMarkerPtr(m MarkerPtr) { s.ptr = m }

// StreamOffset returns the stream offset of the next FPDU's first octet.
func (s *Sender) StreamOffset() uint64 { return s.pos }

// markersIn returns how many Markers a run of n non-Marker octets starting
// at stream offset pos carries: a Marker is inserted at each multiple of
// MarkerInterval that is reached while octets remain to be sent.
func markersIn(pos uint64, n int) int {
	first := int((MarkerInterval - pos%MarkerInterval) % MarkerInterval)
	if first >= n {
		return 0
	}
	return (n-first-1)/(MarkerInterval-MarkerLen) + 1
}

// WireLen returns the total length of an FPDU carrying ulpduLen octets of
// ULPDU if it is the next one sent: ULPDU_Length, ULPDU, pad, CRC and the
// Markers that fall into it at the current stream offset (a Marker at the
// FPDU's start belongs to it; one right after its CRC belongs to the next).
func (s *Sender) WireLen(ulpduLen int) int { return s.WireLenAt(s.pos, ulpduLen) }

// WireLenAt is WireLen for an FPDU starting at stream offset pos (with
// Markers the length depends on where the FPDU falls).
func (s *Sender) WireLenAt(pos uint64, ulpduLen int) int {
	n := ulpduLenLen + ulpduLen + padLen(ulpduLen) + crcLen
	if s.markers {
		n += MarkerLen * markersIn(pos, n)
	}
	return n
}

// Markers reports whether the Sender inserts Markers.
func (s *Sender) Markers() bool { return s.markers }

// MaxULPDULen returns the largest ULPDU length whose FPDU, sent next, has a
// WireLen of at most segLen, or 0 if no FPDU fits.
func (s *Sender) MaxULPDULen(segLen int) int { return s.MaxULPDULenAt(s.pos, segLen) }

// MaxULPDULenAt is MaxULPDULen for an FPDU starting at stream offset pos.
func (s *Sender) MaxULPDULenAt(pos uint64, segLen int) int {
	if s.WireLenAt(pos, 0) > segLen {
		return 0
	}
	lo, hi := 0, MaxULPDULen // WireLenAt(pos, lo) ≤ segLen
	if s.WireLenAt(pos, hi) <= segLen {
		return hi
	}
	for hi-lo > 1 { // invariant: WireLenAt(pos, lo) ≤ segLen < WireLenAt(pos, hi)
		mid := lo + (hi-lo)/2
		if s.WireLenAt(pos, mid) <= segLen {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// Begin starts an FPDU of ulpduLen ULPDU octets, appending to dst (pass
// buf[:0] to build into buf). It writes any leading Marker and the
// ULPDU_Length field. It panics if an FPDU is already in progress or
// ulpduLen is out of range.
func (s *Sender) Begin(dst []byte, ulpduLen int) {
	if s.active {
		panic("mpa: Sender.Begin while an FPDU is in progress")
	}
	if ulpduLen < 0 || ulpduLen > MaxULPDULen {
		panic("mpa: Sender.Begin: ULPDU length out of range")
	}
	if !s.ready {
		panic("mpa: Sender used before Init")
	}
	s.active = true
	s.buf = dst
	s.start = s.pos
	s.leading = false
	s.at = len(dst)
	s.want, s.got = ulpduLen, 0
	s.crc, s.crcAt = 0, s.at
	var h [ulpduLenLen]byte
	binary.BigEndian.PutUint16(h[:], uint16(ulpduLen))
	s.put(h[:])
}

// Write appends ULPDU octets (DDP header, then payload, in any chunking).
// p must not overlap the buffer given to Begin (it is copied with the CRC
// computed on the way, crc32c.CopyUpdate). It panics if more than the
// ulpduLen given to Begin are written.
func (s *Sender) Write(p []byte) {
	if !s.active {
		panic("mpa: Sender.Write without Begin")
	}
	if len(p) > s.want-s.got {
		panic("mpa: Sender.Write past the ULPDU length given to Begin")
	}
	s.got += len(p)
	s.put(p)
}

// Finish appends the pad, any Marker due between pad and CRC, and the CRC
// trailer (CRC32c, least-significant octet first; zero when CRC is off). It
// returns the FPDU (dst from Begin with the FPDU appended) and advances the
// stream offset. It panics if fewer octets than the ulpduLen given to Begin
// were written.
func (s *Sender) Finish() []byte {
	if !s.active {
		panic("mpa: Sender.Finish without Begin")
	}
	if s.got != s.want {
		panic("mpa: Sender.Finish before the whole ULPDU was written")
	}
	var pad [3]byte
	s.put(pad[:padLen(s.want)])
	if s.markers && s.pos%MarkerInterval == 0 {
		s.putMarker() // a Marker between pad and CRC
	}
	var trailer [crcLen]byte
	if s.crcOn {
		binary.LittleEndian.PutUint32(trailer[:], crc32c.Update(s.crc, s.buf[s.crcAt:]))
	}
	// The CRC starts 4-aligned in the stream, so no Marker falls inside it.
	s.buf = append(s.buf, trailer[:]...)
	s.pos += crcLen
	s.active = false
	b := s.buf
	s.buf = nil
	return b
}

// put appends non-Marker octets, inserting Markers at their positions.
func (s *Sender) put(p []byte) {
	for len(p) > 0 {
		n := len(p)
		if s.markers {
			off := int(s.pos % MarkerInterval)
			if off == 0 {
				s.putMarker()
				off = MarkerLen
			}
			n = min(n, MarkerInterval-off)
		}
		if s.crcOn && !s.markers && n >= fuseMin {
			s.copyCRC(p[:n])
		} else {
			s.buf = append(s.buf, p[:n]...)
		}
		s.pos += uint64(n)
		p = p[n:]
	}
}

// copyCRC appends p, computing the CRC over what buf holds beyond crcAt and
// then over p as it is copied.
func (s *Sender) copyCRC(p []byte) {
	l := len(s.buf)
	if cap(s.buf)-l < len(p) {
		s.buf = slices.Grow(s.buf, len(p))
	}
	s.buf = s.buf[:l+len(p)]
	s.crc = crc32c.CopyUpdate(s.crc, s.buf[s.crcAt:l], s.buf[l:], p)
	s.crcAt = len(s.buf)
}

// putMarker appends the Marker due at the current stream offset.
func (s *Sender) putMarker() {
	d := s.pos - s.start
	if d == 0 {
		s.leading = true
	} else if s.leading && s.ptr == PtrFromULPDULength {
		d -= MarkerLen
	}
	s.buf = append(s.buf, 0, 0, byte(d>>8), byte(d))
	s.pos += MarkerLen
}
