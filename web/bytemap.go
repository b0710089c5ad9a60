package web

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// Span is one run of a segment's payload octets that belong to one field:
// At and Len in payload octets, the Field, and the index in the segment's
// FPDUs (FPDU) and Markers (Marker) of the FPDU and Marker it belongs to
// (-1: none). It encodes to JSON as the array [at, len, field, fpdu,
// marker] to keep large traces small.
type Span struct {
	// At and Len are the run's first payload octet and its length.
	At, Len int
	// Field is what the octets are.
	Field Field
	// FPDU and Marker index the segment's FPDUs and Markers (-1: none).
	FPDU   int
	Marker int
}

// MarshalJSON implements json.Marshaler.
func (s Span) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 24)
	b = append(b, '[')
	b = strconv.AppendInt(b, int64(s.At), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(s.Len), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(s.Field), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(s.FPDU), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(s.Marker), 10)
	return append(b, ']'), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (s *Span) UnmarshalJSON(b []byte) error {
	var a [5]int
	if _, err := fmt.Sscanf(string(b), "[%d,%d,%d,%d,%d]", &a[0], &a[1], &a[2], &a[3], &a[4]); err != nil {
		return fmt.Errorf("web: span %s: %w", b, err)
	}
	*s = Span{At: a[0], Len: a[1], Field: Field(a[2]), FPDU: a[3], Marker: a[4]}
	return nil
}

// FrameLen returns the length of the MPA Request or Reply frame at the
// front of p (its fixed part plus PD_Length), at most len(p); 0 when p does
// not start with a frame.
func FrameLen(p []byte) int {
	if len(p) < mpa.FrameHeaderLen {
		return 0
	}
	n := mpa.FrameHeaderLen + int(binary.BigEndian.Uint16(p[18:20]))
	return min(n, len(p))
}

// frameSpans lays out an MPA frame of n octets whose fixed part is at the
// front of p.
func frameSpans(p []byte, n int) []Span {
	spans := []Span{
		{At: 0, Len: 16, Field: FieldFrameKey, FPDU: -1, Marker: -1},
		{At: 16, Len: 2, Field: FieldFrameFlags, FPDU: -1, Marker: -1},
		{At: 18, Len: 2, Field: FieldFramePDLen, FPDU: -1, Marker: -1},
	}
	at := mpa.FrameHeaderLen
	const enhanced = 0x10
	if p[16]&enhanced != 0 && p[17] >= 2 && n >= at+4 {
		spans = append(spans, Span{At: at, Len: 4, Field: FieldFrameIRDORD, FPDU: -1, Marker: -1})
		at += 4
	}
	if n > at {
		end := n
		if len(p) >= n {
			if pd, ext := mpa.SplitExtBlock(p[at:n]); ext != 0 {
				end = at + len(pd)
			}
		}
		if end > at {
			spans = append(spans, Span{At: at, Len: end - at, Field: FieldFramePD, FPDU: -1, Marker: -1})
		}
		if end < n {
			spans = append(spans, Span{At: end, Len: n - end, Field: FieldFrameExt, FPDU: -1, Marker: -1})
		}
	}
	return spans
}

// ByteMap lays out the payload p of a segment as the checker analysed it
// in r: the MPA frame, then each FPDU's octets as Markers, ULPDU_Length,
// DDP and RDMAP header fields, payload, pad and CRC, each Marker at its
// stream position (a multiple of 512 from the first FPDU octet) when
// markers is set. Octets the checker did not analyse (a retransmission, a
// segment held ahead of a gap, octets already seen) are FieldUnknown.
func ByteMap(r *inspect.Report, p []byte, markers bool) []Span {
	n := len(p)
	var spans []Span
	fs := 0 // where the FPDU stream octets begin
	switch r.Kind {
	case inspect.KindRequest, inspect.KindReply:
		fs = FrameLen(p)
		if fs >= mpa.FrameHeaderLen {
			spans = frameSpans(p, fs)
		}
	case inspect.KindFPDU:
		var skip int
		if _, err := fmt.Sscanf(r.Note, "first %d octets already seen", &skip); err == nil && skip > 0 && skip <= n {
			spans = append(spans, Span{At: 0, Len: skip, Field: FieldUnknown, FPDU: -1, Marker: -1})
			fs = skip
		}
	case inspect.KindOther:
		return []Span{{At: 0, Len: n, Field: FieldOther, FPDU: -1, Marker: -1}}
	default:
		if n == 0 {
			return nil
		}
		return []Span{{At: 0, Len: n, Field: FieldUnknown, FPDU: -1, Marker: -1}}
	}
	ws := r.Offset
	we := ws + uint64(n-fs)
	for i := range r.FPDUs {
		spans = fpduSpans(spans, r, i, ws, we, fs, markers)
	}
	return fillHoles(spans, n)
}

// piece is one logical field of an FPDU before Markers are inserted.
type piece struct {
	f Field
	n int
}

// fpduPieces returns the logical fields of FPDU f (without Markers).
func fpduPieces(f *inspect.FPDU) []piece {
	if f.Len == 0 {
		return []piece{{FieldFPDU, 1 << 30}}
	}
	u := f.ULPDULen
	ps := []piece{{FieldULPDULen, 2}}
	h := f.Header
	if h == nil || h.Op == "?" {
		ps = append(ps, piece{FieldULPDU, u})
	} else {
		ps = append(ps, piece{FieldDDPCtrl, 1}, piece{FieldRDMAPCtrl, 1})
		hl := ddp.TaggedHeaderLen
		if h.Tagged {
			ps = append(ps, piece{FieldSTag, 4}, piece{FieldTO, 8})
		} else {
			hl = ddp.UntaggedHeaderLen
			ps = append(ps, piece{FieldInvSTag, 4}, piece{FieldQN, 4}, piece{FieldMSN, 4}, piece{FieldMO, 4})
		}
		rest := u - hl
		switch {
		case !h.Tagged && h.Op == rdmap.OpReadRequest.String() && rest >= rdmap.ReadRequestLen:
			ps = append(ps, piece{FieldReadReq, rdmap.ReadRequestLen})
			rest -= rdmap.ReadRequestLen
		case !h.Tagged && (h.Op == rdmap.OpImmediate.String() || h.Op == rdmap.OpImmediateSE.String()) && rest >= rdmap.ImmediateDataLen:
			ps = append(ps, piece{FieldImmData, rdmap.ImmediateDataLen})
			rest -= rdmap.ImmediateDataLen
		case !h.Tagged && h.Op == rdmap.OpAtomicRequest.String() && rest >= rdmap.AtomicRequestLen:
			ps = append(ps, piece{FieldAtomicReq, rdmap.AtomicRequestLen})
			rest -= rdmap.AtomicRequestLen
		case !h.Tagged && h.Op == rdmap.OpAtomicResponse.String() && rest >= rdmap.AtomicResponseLen:
			ps = append(ps, piece{FieldAtomicResp, rdmap.AtomicResponseLen})
			rest -= rdmap.AtomicResponseLen
		case !h.Tagged && h.Op == rdmap.OpTerminate.String() && rest >= rdmap.TerminateHeaderLen:
			ps = append(ps, piece{FieldTermHdr, rdmap.TerminateHeaderLen})
			rest -= rdmap.TerminateHeaderLen
			if rest > 0 {
				ps = append(ps, piece{FieldTermCopy, rest})
				rest = 0
			}
		}
		if rest > 0 {
			ps = append(ps, piece{FieldPayload, rest})
		}
	}
	if pad := (4 - (2+u)%4) % 4; pad > 0 {
		ps = append(ps, piece{FieldPad, pad})
	}
	return append(ps, piece{FieldCRC, 4})
}

// fpduSpans appends the spans of r.FPDUs[i] that fall into the stream
// window [ws, we), which starts at payload octet fs.
func fpduSpans(spans []Span, r *inspect.Report, i int, ws, we uint64, fs int, markers bool) []Span {
	f := &r.FPDUs[i]
	emit := func(from, to uint64, field Field, marker int) {
		from, to = max(from, ws), min(to, we)
		if from >= to {
			return
		}
		at := fs + int(from-ws)
		l := int(to - from)
		if k := len(spans) - 1; k >= 0 && spans[k].Field == field && spans[k].FPDU == i && spans[k].Marker == marker && spans[k].At+spans[k].Len == at && field != FieldMarker {
			spans[k].Len += l
			return
		}
		spans = append(spans, Span{At: at, Len: l, Field: field, FPDU: i, Marker: marker})
	}
	pos := f.Offset
	for _, pc := range fpduPieces(f) {
		left := pc.n
		for left > 0 && pos < we {
			if markers && pos%mpa.MarkerInterval == 0 {
				emit(pos, pos+mpa.MarkerLen, FieldMarker, markerIndex(r, pos))
				pos += mpa.MarkerLen
				continue
			}
			chunk := uint64(left)
			if markers {
				chunk = min(chunk, (pos/mpa.MarkerInterval+1)*mpa.MarkerInterval-pos)
			}
			emit(pos, pos+chunk, pc.f, -1)
			pos += chunk
			left -= int(chunk)
		}
	}
	return spans
}

// markerIndex returns the index in r.Markers of the Marker at stream
// offset off, or -1 (it is completed in another segment).
func markerIndex(r *inspect.Report, off uint64) int {
	for i := range r.Markers {
		if r.Markers[i].Offset == off {
			return i
		}
	}
	return -1
}

// fillHoles fills the octets no span covers with FieldUnknown, so that the
// spans (built in order) tile [0, n).
func fillHoles(spans []Span, n int) []Span {
	out := make([]Span, 0, len(spans)+2)
	at := 0
	for _, s := range spans {
		if s.At > at {
			out = append(out, Span{At: at, Len: s.At - at, Field: FieldUnknown, FPDU: -1, Marker: -1})
		}
		if s.At+s.Len <= at {
			continue
		}
		out = append(out, s)
		at = s.At + s.Len
	}
	if at < n {
		out = append(out, Span{At: at, Len: n - at, Field: FieldUnknown, FPDU: -1, Marker: -1})
	}
	return out
}
