// Package web is siwtun's view for teaching RNIC internals: a view model
// built from the engine's own records (the ctl watch stream of segments,
// placements and completions, run through the segment checker of
// `siwtun check`, and the ctl queue pair, counter and region queries),
// and a page with embedded assets that draws it: a ladder diagram of the
// segments, the byte map of a chosen segment, memory strips of the
// registered regions, the queue pairs' state machine, the MPA
// negotiation and the counters. The page is written as one self-contained
// file (WriteHTML) or served live (Server).
package web

import (
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// View is everything the page shows. It is the JSON document embedded in
// the page.
type View struct {
	// Title names the trace ("siwtun demo", "siwtun trace siwtun0").
	Title string `json:"title"`
	// Local is the device whose segments the ladder shows on its left
	// side; Peer the device on the right, when it is watched too.
	Local string `json:"local"`
	Peer  string `json:"peer,omitempty"`
	// Start is the time the trace's microsecond times count from (wall
	// clock); the times themselves are CLOCK_MONOTONIC differences, the
	// clock every daemon on a host shares, counted from StartMono.
	Start     time.Time `json:"start"`
	StartMono int64     `json:"start_mono,omitempty"`
	// Live says the page is served by `siwtun web` and follows /events.
	Live bool `json:"live,omitempty"`
	// Version is the number of updates the view includes (live pages ask
	// /events for the ones after it).
	Version int `json:"version"`
	// Fields describes the byte maps' fields, indexed by Field.
	Fields []FieldInfo `json:"fields"`
	// Addrs are the segments' address pairs ("src > dst"), indexed by
	// Segment.A.
	Addrs []string `json:"addrs"`
	// Conns are the connection directions as the checker summed them up.
	Conns []inspect.DirSummary `json:"conns"`
	// Segments are the TCP segments, in the order they were first seen.
	Segments []Segment `json:"segs"`
	// Places are the engine's placements, in the order they were made.
	Places []Place `json:"places"`
	// Regions are the registered memory regions the placements went into.
	Regions []Region `json:"regions"`
	// Terminates are the Terminate messages seen in the segments.
	Terminates []Terminate `json:"terms"`
	// WCs are the completions the engine delivered.
	WCs []WC `json:"wcs"`
	// QPs are the watched devices' queue pairs with their state history.
	QPs []QP `json:"qps"`
	// Stats are each watched device's counters by layer, by device name.
	Stats map[string]*ctl.Stats `json:"stats,omitempty"`
	// Steps are the steps of a demo or lesson, with their text.
	Steps []Step `json:"steps,omitempty"`
	// Dropped counts watch events the daemons left out (in Gaps).
	Dropped uint64 `json:"dropped,omitempty"`
	// Gaps are the windows of events a daemon left out because the view
	// did not keep up: what was not observed, and where in the ladder.
	Gaps []Gap `json:"gaps,omitempty"`
	// Full says the view holds as many segments as it may (its memory is
	// bounded): later traffic is not in it.
	Full bool `json:"full,omitempty"`
	// Sampling says how the view samples a device that sends more than it
	// can take (the daemons' policy), for the page to show.
	Sampling string `json:"sampling,omitempty"`
	// Anatomy is the round trip taken apart hop by hop (anatomy.go): the
	// watched daemons' stamps, or a lesson's run.
	Anatomy *Anatomy `json:"anatomy,omitempty"`
}

// Gap is a window of one device's events that its daemon left out (ctl
// WatchGap): the view did not observe them.
type Gap struct {
	// N is its index in View.Gaps; Dev the device whose events they were.
	N   int    `json:"n"`
	Dev string `json:"dev"`
	// Seg is the index of the first ladder row at or after the window's
	// start: the rows before it came earlier; rows of the other device
	// may follow that came while it lasted.
	Seg int `json:"seg"`
	// T and T2 are the times of the first and the last event left out
	// (µs since View.Start).
	T  int64 `json:"t"`
	T2 int64 `json:"t2"`
	// Segments, Places and WCs count the events left out.
	Segments uint64 `json:"segs"`
	Places   uint64 `json:"places,omitempty"`
	WCs      uint64 `json:"wcs,omitempty"`
}

// Segment is one TCP segment with what the checker found in it.
type Segment struct {
	// N is its index in View.Segments.
	N int `json:"n"`
	// Conn numbers its connection (View.Conns' Conn), 0 before known.
	Conn int `json:"c"`
	// Out says the local device sent it (else the peer did).
	Out bool `json:"o"`
	// T is when the local device saw it (sent or received), in
	// microseconds since View.Start; PT when the peer device saw it (-1:
	// not seen there). The ladder's rows are in the order of the earlier
	// of the two.
	T  int64 `json:"t"`
	PT int64 `json:"pt"`
	// Src and Dst are the TCP segment's addresses, as the index in
	// View.Addrs of "src > dst" (A), and filled in only in Go (a trace of
	// many segments names few address pairs).
	A   int    `json:"a"`
	Src string `json:"-"`
	Dst string `json:"-"`
	// Seq, Ack, Len and Flags are the TCP segment's.
	Seq   uint32 `json:"seq"`
	Ack   uint32 `json:"ack"`
	Len   int    `json:"len"`
	Flags string `json:"fl,omitempty"`
	// Kind is the checker's kind of the segment (inspect.Kind).
	Kind string `json:"k"`
	// Class is what the segment carries, for colours and patterns:
	// "ctl", "mpa-req", "mpa-rep", "send", "write", "rreq", "rresp",
	// "term", "fpdu" (FPDU octets of no header in this segment), "other".
	Class string `json:"cls"`
	// Label is the short text drawn on its arrow.
	Label string `json:"lb"`
	// Aligned is the checker's alignment verdict (nil: not FPDU octets).
	Aligned *bool `json:"al,omitempty"`
	// Retx: all its octets had been seen before (a retransmission).
	Retx bool `json:"rx,omitempty"`
	// OOO: it arrived ahead of a gap (out of order) and was analysed when
	// the gap was filled.
	OOO bool `json:"ooo,omitempty"`
	// Drop: one device sent it and the other never received it (dropped
	// on the link, e.g. by an impairment). Known only when both are watched.
	Drop bool `json:"drop,omitempty"`
	// Stream is the FPDU stream offset of its first FPDU octet.
	Stream uint64 `json:"so"`
	// Frame is the MPA Request or Reply it carries.
	Frame string `json:"fr,omitempty"`
	// Note is the checker's note.
	Note string `json:"no,omitempty"`
	// NotObserved counts the octets in front of it that were not observed
	// (left out of the watch); Resync says where and how the checker
	// picked the FPDU stream up again after them.
	NotObserved int    `json:"nob,omitempty"`
	Resync      string `json:"rs,omitempty"`
	// Split says which FPDUs the segment boundaries cut (not aligned).
	SplitStart *inspect.Split `json:"ss,omitempty"`
	SplitEnd   *inspect.Split `json:"se,omitempty"`
	// FPDUs and Markers are the checker's (inspect.FPDU, inspect.Marker).
	FPDUs   []FPDU   `json:"fp,omitempty"`
	Markers []Marker `json:"mk,omitempty"`
	// MarkersOn says the direction carries Markers.
	MarkersOn bool `json:"mon,omitempty"`
	// Map is its byte map.
	Map []Span `json:"map,omitempty"`
	// Places are the indexes in View.Places of the placements of its
	// FPDUs.
	Places []int `json:"pl,omitempty"`
}

// Place is one placement of an FPDU's payload.
type Place struct {
	// N is its index in View.Places; T its time (µs since View.Start).
	N int   `json:"n"`
	T int64 `json:"t"`
	// Seg is the index of the segment whose FPDU it placed (-1: unknown).
	Seg int `json:"seg"`
	// Region is the index in View.Regions of the region (-1: a Send into
	// a receive buffer, or unknown).
	Region int `json:"region"`
	// Dev is the device that placed it (the receiver).
	Dev string `json:"dev"`
	// The engine's record (ctl.WatchPlace).
	QP     uint32 `json:"qp"`
	Op     string `json:"op"`
	STag   uint32 `json:"stag"`
	TO     uint64 `json:"to"`
	Offset uint64 `json:"off"`
	RecvWR uint64 `json:"recv_wr,omitempty"`
	MSN    uint32 `json:"msn,omitempty"`
	MO     uint32 `json:"mo,omitempty"`
	Len    int    `json:"len"`
	// OOO: placed before the octets in front of it had arrived.
	OOO bool `json:"ooo,omitempty"`
	// Again: placed again in order after an out-of-order placement of the
	// same octets (idempotent re-placement when the gap filled).
	Again bool `json:"again,omitempty"`
}

// Region is a registered memory region.
type Region struct {
	// Dev is the device the region is registered with.
	Dev string `json:"dev"`
	// STag names it; Addr is its first byte's tagged offset.
	STag uint32 `json:"stag"`
	Addr uint64 `json:"addr"`
	// Len is its length; 0 when unknown (then the page sizes its strip by
	// the placements).
	Len int `json:"len"`
	// Access lists its rights ("LOCAL_WRITE|REMOTE_WRITE").
	Access string `json:"access,omitempty"`
	// PD is its protection domain.
	PD uint32 `json:"pd"`
	// Known says Len, Access and PD come from the engine's region table.
	Known bool `json:"known"`
}

// Terminate is a Terminate message seen in a segment.
type Terminate struct {
	// Seg is the segment's index; Out says the local device sent it.
	Seg int  `json:"seg"`
	Out bool `json:"o"`
	// Detail is the decoded Terminate header: the error code (the rule
	// broken) and the offending DDP/RDMAP headers copied into it.
	Detail string `json:"detail"`
	// RFC is the section that defines the error code's layer.
	RFC string `json:"rfc"`
}

// WC is a work completion.
type WC struct {
	// T is its time (µs since View.Start); Seg the segment it followed.
	T   int64 `json:"t"`
	Seg int   `json:"seg"`
	// Dev is the device that delivered it.
	Dev string `json:"dev"`
	ctl.WatchWC
}

// QP is a queue pair of the local device with the states it was seen in.
type QP struct {
	// Dev is the device it belongs to.
	Dev string `json:"dev"`
	ctl.QP
	// History is every state it was seen in, with the time first seen.
	History []StateAt `json:"history"`
}

// StateAt is a queue pair state and when it was first seen.
type StateAt struct {
	State string `json:"state"`
	T     int64  `json:"t"`
}

// Step is one step of a demo or lesson.
type Step struct {
	// N is its index in View.Steps.
	N int `json:"n"`
	// T is when it began (µs since View.Start) and Seg the first segment
	// after it.
	T   int64 `json:"t"`
	Seg int   `json:"seg"`
	// Title and Text say what it does and what to look at.
	Title string `json:"title"`
	Text  string `json:"text,omitempty"`
}

// FPDU is an FPDU, or the part of it in one segment, as the checker
// describes it (inspect.FPDU, with short JSON names).
type FPDU struct {
	// Index, Offset, Len, ULPDULen, At, Here, Begins, Ends, Header and CRC
	// are inspect.FPDU's fields of the same names.
	Index    uint64  `json:"i"`
	Offset   uint64  `json:"o"`
	Len      int     `json:"l"`
	ULPDULen int     `json:"u"`
	At       int     `json:"a"`
	Here     int     `json:"h"`
	Begins   bool    `json:"b,omitempty"`
	Ends     bool    `json:"e,omitempty"`
	Header   *Header `json:"hd,omitempty"`
	CRC      string  `json:"crc,omitempty"`
}

// Header is an FPDU's DDP and RDMAP header (inspect.Header, with short
// JSON names).
type Header struct {
	// Op, Tagged, Last, STag, TO, QN, MSN, MO, Payload and Detail are
	// inspect.Header's fields of the same names.
	Op      string `json:"op"`
	Tagged  bool   `json:"t,omitempty"`
	Last    bool   `json:"l,omitempty"`
	STag    uint32 `json:"s,omitempty"`
	TO      uint64 `json:"to,omitempty"`
	QN      uint32 `json:"qn,omitempty"`
	MSN     uint32 `json:"msn,omitempty"`
	MO      uint32 `json:"mo,omitempty"`
	Payload int    `json:"p"`
	Detail  string `json:"d,omitempty"`
}

// Marker is a Marker as the checker describes it (inspect.Marker, with
// short JSON names).
type Marker struct {
	// Offset, At, FPDUPTR, Want, FPDU and OK are inspect.Marker's fields
	// of the same names.
	Offset  uint64 `json:"o"`
	At      int    `json:"a"`
	FPDUPTR uint16 `json:"p"`
	Want    uint16 `json:"w"`
	FPDU    uint64 `json:"f"`
	OK      bool   `json:"ok,omitempty"`
}

// fpdusOf converts the checker's FPDUs.
func fpdusOf(in []inspect.FPDU) []FPDU {
	if len(in) == 0 {
		return nil
	}
	out := make([]FPDU, len(in))
	for i, f := range in {
		out[i] = FPDU{Index: f.Index, Offset: f.Offset, Len: f.Len, ULPDULen: f.ULPDULen, At: f.At, Here: f.Here, Begins: f.Begins, Ends: f.Ends, CRC: f.CRC}
		if h := f.Header; h != nil {
			out[i].Header = &Header{Op: h.Op, Tagged: h.Tagged, Last: h.Last, STag: h.STag, TO: h.TO, QN: h.QN, MSN: h.MSN, MO: h.MO, Payload: h.Payload, Detail: h.Detail}
		}
	}
	return out
}

// markersOf converts the checker's Markers.
func markersOf(in []inspect.Marker) []Marker {
	if len(in) == 0 {
		return nil
	}
	out := make([]Marker, len(in))
	for i, m := range in {
		out[i] = Marker{Offset: m.Offset, At: m.At, FPDUPTR: m.FPDUPTR, Want: m.Want, FPDU: m.FPDU, OK: m.OK}
	}
	return out
}
