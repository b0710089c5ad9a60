package offload

import (
	"reflect"
	"sync/atomic"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
)

// QPStats are the counters of a queue pair (and, summed, of a device), in
// the style of gVisor's tcpip.Stats: one atomic counter per field, each
// documented; names follow irdma/rxe where they exist.
type QPStats struct {
	// FPDUsTx counts FPDUs handed to TCP.
	FPDUsTx atomic.Uint64 `stat:"mpaFpduTx"`
	// FPDUsRx counts FPDUs received with a good CRC (or no CRC).
	FPDUsRx atomic.Uint64 `stat:"mpaFpduRx"`
	// BytesTx counts FPDU octets handed to TCP (headers, markers, CRC).
	BytesTx atomic.Uint64 `stat:"mpaOctetsTx"`
	// BytesRx counts ULPDU octets received (DDP headers and payload).
	BytesRx atomic.Uint64 `stat:"mpaOctetsRx"`
	// SegmentsTx and SegmentsRx count the connection's TCP segments seen by
	// the link hook (inbound before TCP accepted them: retransmissions and
	// duplicates included); DataSegmentsTx/Rx those carrying payload.
	SegmentsTx     atomic.Uint64 `stat:"tcpOutSegs"`
	SegmentsRx     atomic.Uint64 `stat:"tcpInSegs"`
	DataSegmentsTx atomic.Uint64 `stat:"tcpOutDataSegs"`
	DataSegmentsRx atomic.Uint64 `stat:"tcpInDataSegs"`
	// AlignedSegsTx/Rx count data segments that start with an FPDU (or a
	// Marker then an FPDU) and hold whole FPDUs only; SplitSegsTx/Rx those
	// that do not (an FPDU cut by the segment's start or end). Segments of
	// the MPA Request/Reply are in neither.
	AlignedSegsTx atomic.Uint64 `stat:"mpaAlignedSegsTx"`
	AlignedSegsRx atomic.Uint64 `stat:"mpaAlignedSegsRx"`
	SplitSegsTx   atomic.Uint64 `stat:"mpaSplitSegsTx"`
	SplitSegsRx   atomic.Uint64 `stat:"mpaSplitSegsRx"`
	// PlacedOOOFPDUs and PlacedOOOBytes count the tagged FPDUs (RDMA Write,
	// Read Response) placed out of order — found whole in a segment that
	// arrived with a gap in front of it — and their payload octets. The
	// in-order path places and counts them again when the gap is filled.
	PlacedOOOFPDUs atomic.Uint64 `stat:"mpaOooPlacedFpdus"`
	PlacedOOOBytes atomic.Uint64 `stat:"mpaOooPlacedOctets"`
	// CRCErrors counts FPDUs whose MPA CRC did not match.
	CRCErrors atomic.Uint64 `stat:"mpaCrcErrors"`
	// FPDUTimeouts counts connections ended because an FPDU's remaining
	// octets did not come within Config.FPDUTimeout (the peer stopped in
	// the middle of an FPDU, or its ULPDU_Length was damaged upwards on
	// the wire): LLP / MPA 0x01 Terminates.
	FPDUTimeouts atomic.Uint64 `stat:"mpaFpduTimeouts"`
	// ErrorsBeforeCRC counts errors found in an FPDU (a DDP or RDMAP
	// header's, a Marker's) and sent before that FPDU's CRC had arrived
	// (CRC on: the read that brought them ended before the FPDU did).
	ErrorsBeforeCRC atomic.Uint64 `stat:"mpaErrorsBeforeCrc"`
	// BadRevisions counts MPA Requests of a revision this RNIC does not
	// speak (above 2), closed without a Reply (RFC 5044 §7.1).
	BadRevisions atomic.Uint64 `stat:"mpaBadRevisions"`
	// AcceptTimeouts counts connections accepted by a listener whose MPA
	// Request had not arrived whole when the MPA accept timeout
	// (Config.AcceptTimeout) passed: reset, unanswered.
	AcceptTimeouts atomic.Uint64 `stat:"mpaAcceptTimeouts"`
	// BadRequests counts connections accepted by a listener that closed
	// or reset before their MPA Request was whole, or sent a frame that
	// is not a valid MPA Request: closed, unanswered.
	BadRequests atomic.Uint64 `stat:"mpaBadRequests"`
	// FirstFPDUDelays counts connections this RNIC initiated whose first
	// FPDU (or RTR) waited Config.FirstFPDUDelay after the MPA Reply: the
	// peer's Reply did not say it reads at once (mpa.ExtReady), as
	// Linux siw's never does.
	FirstFPDUDelays atomic.Uint64 `stat:"mpaFirstFpduDelays"`
	// StartupHoldsBounded counts connections accepted here without
	// peer-to-peer mode whose held sends went out when Config.StartupHold
	// had passed after the MPA Reply's acknowledgement, the initiator
	// having sent no FPDU yet (a server that speaks first, towards an
	// initiator such as Linux siw that does not offer peer-to-peer mode).
	StartupHoldsBounded atomic.Uint64 `stat:"mpaStartupHoldsBounded"`
	// FINDelays counts connections whose FIN waited Config.FINDelay after
	// the application ended the QP, the peer not known to be siwtun.
	FINDelays atomic.Uint64 `stat:"mpaFinDelays"`
	// PlacedBytes counts payload octets placed directly into regions.
	PlacedBytes atomic.Uint64 `stat:"ddpPlacedOctets"`
	// RecvNoBuffer counts Sends that found no posted receive.
	RecvNoBuffer atomic.Uint64 `stat:"ddpUntaggedNoBuffer"`
	// RecvTooLong counts Sends longer than the posted receive.
	RecvTooLong atomic.Uint64 `stat:"ddpUntaggedTooLong"`
	// WritesTx counts RDMA Write messages sent.
	WritesTx atomic.Uint64 `stat:"OutRdmaWrites"`
	// WriteBytesTx counts RDMA Write payload octets sent.
	WriteBytesTx atomic.Uint64 `stat:"OutRdmaWriteOctets"`
	// WritesRx counts RDMA Write messages placed.
	WritesRx atomic.Uint64 `stat:"InRdmaWrites"`
	// SendsTx counts Send messages (all four kinds) sent.
	SendsTx atomic.Uint64 `stat:"OutRdmaSends"`
	// SendBytesTx counts Send payload octets sent.
	SendBytesTx atomic.Uint64 `stat:"OutRdmaSendOctets"`
	// SendsRx counts Send messages received into posted receives.
	SendsRx atomic.Uint64 `stat:"InRdmaSends"`
	// ImmediatesTx counts Immediate Data messages (RFC 7306) sent: one
	// per RDMA Write or Send with Immediate Data.
	ImmediatesTx atomic.Uint64 `stat:"OutRdmaImmediates"`
	// ImmediatesRx counts Immediate Data messages received.
	ImmediatesRx atomic.Uint64 `stat:"InRdmaImmediates"`
	// ReadsTx counts RDMA Read Requests sent.
	ReadsTx atomic.Uint64 `stat:"OutRdmaReads"`
	// ReadsCompleted counts RDMA Reads whose response was fully placed.
	ReadsCompleted atomic.Uint64 `stat:"rdmaReadsCompleted"`
	// ReadsRx counts RDMA Read Requests accepted for an answer.
	ReadsRx atomic.Uint64 `stat:"InRdmaReads"`
	// ReadResponsesTx counts RDMA Read Responses sent.
	ReadResponsesTx atomic.Uint64 `stat:"OutRdmaReadResponses"`
	// ReadBytesTx counts RDMA Read Response payload octets sent.
	ReadBytesTx atomic.Uint64 `stat:"OutRdmaReadOctets"`
	// AtomicsTx counts Atomic Requests (RFC 7306) sent.
	AtomicsTx atomic.Uint64 `stat:"OutRdmaAtomics"`
	// AtomicsCompleted counts atomics whose Atomic Response arrived.
	AtomicsCompleted atomic.Uint64 `stat:"rdmaAtomicsCompleted"`
	// AtomicsRx counts Atomic Requests performed on local memory.
	AtomicsRx atomic.Uint64 `stat:"InRdmaAtomics"`
	// AtomicResponsesTx counts Atomic Responses sent.
	AtomicResponsesTx atomic.Uint64 `stat:"OutRdmaAtomicResponses"`
	// IRDOverflows counts Read and Atomic Requests beyond the negotiated IRD.
	IRDOverflows atomic.Uint64 `stat:"rdmapIrdExceeded"`
	// Invalidations counts STags invalidated by Send with Invalidate.
	Invalidations atomic.Uint64 `stat:"RdmaInv"`
	// TerminatesTx counts Terminate messages sent.
	TerminatesTx atomic.Uint64 `stat:"rdmapTerminateTx"`
	// TerminatesRx counts Terminate messages received.
	TerminatesRx atomic.Uint64 `stat:"rdmapTerminateRx"`
	// TermRDMAP, TermDDP and TermLLP count errors found here, by layer.
	TermRDMAP atomic.Uint64 `stat:"rdmapErrors"`
	TermDDP   atomic.Uint64 `stat:"ddpErrors"`
	TermLLP   atomic.Uint64 `stat:"mpaErrors"`
	// SQPosted, SQCompleted and SQErrors count send work requests.
	SQPosted    atomic.Uint64 `stat:"sqPosted"`
	SQCompleted atomic.Uint64 `stat:"sqCompleted"`
	SQErrors    atomic.Uint64 `stat:"sqErrors"`
	// RQPosted, RQCompleted and RQErrors count receive work requests.
	RQPosted    atomic.Uint64 `stat:"rqPosted"`
	RQCompleted atomic.Uint64 `stat:"rqCompleted"`
	RQErrors    atomic.Uint64 `stat:"rqErrors"`
}

func (s *QPStats) countTerminate(c rdmap.Code) {
	switch c.Layer() {
	case rdmap.LayerRDMAP:
		s.TermRDMAP.Add(1)
	case rdmap.LayerDDP:
		s.TermDDP.Add(1)
	default:
		s.TermLLP.Add(1)
	}
}

// add adds every counter of o to s.
func (s *QPStats) add(o *QPStats) {
	sv, ov := reflect.ValueOf(s).Elem(), reflect.ValueOf(o).Elem()
	for i := 0; i < sv.NumField(); i++ {
		sv.Field(i).Addr().Interface().(*atomic.Uint64).Add(ov.Field(i).Addr().Interface().(*atomic.Uint64).Load())
	}
}

// Counter is one named counter value.
type Counter struct {
	Name  string
	Value uint64
	Doc   string
}

// Counters lists the counters with their stable names, in field order.
func (s *QPStats) Counters() []Counter {
	sv := reflect.ValueOf(s).Elem()
	st := sv.Type()
	out := make([]Counter, 0, st.NumField())
	for i := 0; i < st.NumField(); i++ {
		f := st.Field(i)
		out = append(out, Counter{Name: f.Tag.Get("stat"), Value: sv.Field(i).Addr().Interface().(*atomic.Uint64).Load()})
	}
	return out
}

// segmentObserver is the QP's segment hook: TCP counters and FPDU
// alignment. It reads only the FPDU headers of a segment, in place, except
// for an inbound segment that arrived with a gap in front of it, which pl
// (if not nil) may place out of order.
type segmentObserver struct {
	qp *QP
	pl *oooPlacer
}

// HeadersOnly marks the hook as a netstack.HeaderHook.
func (*segmentObserver) HeadersOnly() {}

// Segment observes one segment.
func (o *segmentObserver) Segment(seg *netstack.Segment) {
	o.qp.stats.countSegment(seg)
	if seg.Len == 0 {
		return
	}
	a, aligned, split := o.qp.aligner(seg.Dir)
	r := a.Classify(seg.Seq, seg.Len, seg)
	al, sp := tally(r)
	addNonZero(aligned, al)
	addNonZero(split, sp)
	if r.Beyond && seg.Dir == netstack.Inbound && o.pl != nil {
		o.pl.segment(seg)
	}
}

// Segments observes the wire segments of one super-segment, with one lock
// of the aligner and one update of each counter for all of them.
func (o *segmentObserver) Segments(run *netstack.SegmentRun) {
	seg := run.Next()
	if seg == nil {
		return
	}
	dir := seg.Dir
	a, aligned, split := o.qp.aligner(dir)
	var n, nAligned, nSplit uint64
	a.Lock()
	for ; seg != nil; seg = run.Next() {
		n++
		r := a.ClassifyLocked(seg.Seq, seg.Len, seg)
		al, sp := tally(r)
		nAligned += al
		nSplit += sp
		if r.Beyond && dir == netstack.Inbound && o.pl != nil {
			// The placer takes the QP's lock, which is held around
			// the aligners' set-up: not under the aligner's lock.
			a.Unlock()
			o.pl.segment(seg)
			a.Lock()
		}
	}
	a.Unlock()
	o.qp.stats.countDataSegments(dir, n)
	addNonZero(aligned, nAligned)
	addNonZero(split, nSplit)
}

// aligner returns the QP's aligner for segments travelling in dir, and its
// counters of aligned and split segments.
func (qp *QP) aligner(dir netstack.Direction) (*mpa.Aligner, *atomic.Uint64, *atomic.Uint64) {
	if dir == netstack.Outbound {
		return &qp.alignTx, &qp.stats.AlignedSegsTx, &qp.stats.SplitSegsTx
	}
	return &qp.alignRx, &qp.stats.AlignedSegsRx, &qp.stats.SplitSegsRx
}

// tally returns 1 in aligned or split for a segment classified as such,
// and nothing for one that could not be classified.
func tally(r mpa.Alignment) (aligned, split uint64) {
	switch {
	case !r.Known:
		return 0, 0
	case r.Aligned:
		return 1, 0
	default:
		return 0, 1
	}
}

// addNonZero adds n to c, skipping the atomic operation when n is 0.
func addNonZero(c *atomic.Uint64, n uint64) {
	if n != 0 {
		c.Add(n)
	}
}

// uncount takes n back from a count made before a write that failed. The
// messages a peer answers (RDMA Read and Atomic Requests) and the answers
// themselves are counted just before they are written, not after: the
// answer can reach the requester, and its work request complete there,
// before the write returns on this side, and a count read after a
// completion must include the message that completed it.
func uncount(c *atomic.Uint64, n uint64) { c.Add(-n) }

// countDataSegments counts n data-bearing TCP segments travelling in dir.
func (s *QPStats) countDataSegments(dir netstack.Direction, n uint64) {
	if dir == netstack.Outbound {
		s.SegmentsTx.Add(n)
		s.DataSegmentsTx.Add(n)
		return
	}
	s.SegmentsRx.Add(n)
	s.DataSegmentsRx.Add(n)
}

// countSegment counts the QP's TCP segments.
func (s *QPStats) countSegment(seg *netstack.Segment) {
	switch {
	case seg.Len > 0:
		s.countDataSegments(seg.Dir, 1)
	case seg.Dir == netstack.Outbound:
		s.SegmentsTx.Add(1)
	default:
		s.SegmentsRx.Add(1)
	}
}

// rdmapCodeForMPA maps an MPA error code to its LLP Terminate code.
func rdmapCodeForMPA(code uint8) rdmap.Code {
	return rdmap.MakeCode(rdmap.LayerLLP, 0, code)
}
