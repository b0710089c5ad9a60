package ctl

import (
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
)

// Layer names of Stats.
const (
	layerTCP   = "tcp"
	layerMPA   = "mpa"
	layerDDP   = "ddp"
	layerRDMAP = "rdmap"
	layerVerbs = "verbs"
	layerOther = "other"
)

// counterInfo places an engine counter in a layer and documents it.
type counterInfo struct {
	layer string
	doc   string
}

// qpCounters maps every offload.QPStats counter (by its stat tag) to its
// layer and documentation. A test checks that it covers the struct. (A
// function, not a package variable: the package keeps no global state.)
func qpCounters() map[string]counterInfo {
	return map[string]counterInfo{
		"mpaFpduTx":              {layerMPA, "FPDUs handed to TCP."},
		"mpaFpduRx":              {layerMPA, "FPDUs received with a good CRC (or without CRC)."},
		"mpaOctetsTx":            {layerMPA, "FPDU octets handed to TCP, MPA headers, markers, padding and CRC included."},
		"mpaOctetsRx":            {layerMPA, "ULPDU octets received (DDP headers and payload)."},
		"mpaAlignedSegsTx":       {layerMPA, "Data segments sent starting with an FPDU (or a Marker then an FPDU) and holding whole FPDUs only."},
		"mpaAlignedSegsRx":       {layerMPA, "Data segments received starting with an FPDU (or a Marker then an FPDU) and holding whole FPDUs only."},
		"mpaSplitSegsTx":         {layerMPA, "Data segments sent that cut an FPDU (at their start or end)."},
		"mpaSplitSegsRx":         {layerMPA, "Data segments received that cut an FPDU (at their start or end)."},
		"mpaOooPlacedFpdus":      {layerMPA, "Tagged FPDUs (RDMA Write, Read Response) placed out of order: found whole in a segment that arrived with a gap in front of it, checked and placed before the gap was filled."},
		"mpaOooPlacedOctets":     {layerMPA, "Payload octets of the FPDUs placed out of order (placed again, in order, once the gap is filled)."},
		"mpaCrcErrors":           {layerMPA, "FPDUs whose MPA CRC did not match."},
		"mpaFpduTimeouts":        {layerMPA, "Connections ended because the rest of a half-received FPDU did not come within the FPDU timeout (the peer stopped in the middle of an FPDU): LLP/MPA 0x01 Terminates."},
		"mpaErrorsBeforeCrc":     {layerMPA, "Errors found in an FPDU (a DDP or RDMAP header's, a Marker's) and sent before that FPDU's CRC had arrived (CRC on): the FPDU's rest had not come with them."},
		"mpaBadRevisions":        {layerMPA, "MPA Requests of a revision above 2, closed without a Reply (RFC 5044 §7.1)."},
		"mpaAcceptTimeouts":      {layerMPA, "Connections accepted by a listener whose MPA Request had not arrived whole within the MPA accept timeout (--mpa-accept-timeout): reset, unanswered."},
		"mpaBadRequests":         {layerMPA, "Connections accepted by a listener that closed before their MPA Request was whole, or sent a frame that is not a valid MPA Request: closed, unanswered."},
		"mpaFirstFpduDelays":     {layerMPA, "Connections initiated here whose first FPDU waited --first-fpdu-delay after the MPA Reply, the peer not having said that it reads at once (Linux siw never does; siwtun does, in its Reply's extension block)."},
		"mpaStartupHoldsBounded": {layerMPA, "Connections accepted here without peer-to-peer mode whose held sends went out --startup-hold after the MPA Reply was acknowledged, the initiator having sent no FPDU yet (RFC 5044 §7.1.2 has a responder wait for one; Linux siw without peer_to_peer never offers the RTR)."},
		"mpaFinDelays":           {layerMPA, "Connections whose FIN waited --fin-delay after the application disconnected or destroyed the QP, the peer not known to be siwtun (Linux siw fails a Send it has already sent when the FIN comes before its send call returns)."},
		"mpaErrors":              {layerMPA, "Errors found in the MPA layer (LLP Terminates sent)."},
		"tcpOutSegs":             {layerTCP, "TCP segments sent on the queue pairs' connections, retransmissions included, as seen at the link."},
		"tcpInSegs":              {layerTCP, "TCP segments received on the queue pairs' connections, before TCP accepted them (retransmissions and duplicates included)."},
		"tcpOutDataSegs":         {layerTCP, "TCP segments carrying payload sent on the queue pairs' connections, retransmissions included."},
		"tcpInDataSegs":          {layerTCP, "TCP segments carrying payload received on the queue pairs' connections, retransmissions and duplicates included."},
		"ddpPlacedOctets":        {layerDDP, "Payload octets placed directly into memory regions."},
		"ddpUntaggedNoBuffer":    {layerDDP, "Sends that found no posted receive (DDP untagged error 0x02)."},
		"ddpUntaggedTooLong":     {layerDDP, "Sends longer than the posted receive (DDP untagged error 0x05)."},
		"ddpErrors":              {layerDDP, "Errors found in the DDP layer (DDP Terminates sent)."},
		"OutRdmaWrites":          {layerRDMAP, "RDMA Write messages sent."},
		"OutRdmaWriteOctets":     {layerRDMAP, "RDMA Write payload octets sent."},
		"InRdmaWrites":           {layerRDMAP, "RDMA Write messages received and placed."},
		"OutRdmaSends":           {layerRDMAP, "Send messages sent (all four kinds)."},
		"OutRdmaSendOctets":      {layerRDMAP, "Send payload octets sent."},
		"InRdmaSends":            {layerRDMAP, "Send messages received into posted receives."},
		"OutRdmaImmediates":      {layerRDMAP, "Immediate Data messages (RFC 7306) sent: one per RDMA Write or Send with Immediate Data."},
		"InRdmaImmediates":       {layerRDMAP, "Immediate Data messages (RFC 7306) received."},
		"OutRdmaReads":           {layerRDMAP, "RDMA Read Requests sent."},
		"rdmaReadsCompleted":     {layerRDMAP, "RDMA Reads whose response was fully placed."},
		"InRdmaReads":            {layerRDMAP, "RDMA Read Requests accepted for an answer."},
		"OutRdmaReadResponses":   {layerRDMAP, "RDMA Read Responses sent."},
		"OutRdmaReadOctets":      {layerRDMAP, "RDMA Read Response payload octets sent."},
		"OutRdmaAtomics":         {layerRDMAP, "Atomic Requests (RFC 7306: Fetch-and-Add, Compare-and-Swap) sent."},
		"rdmaAtomicsCompleted":   {layerRDMAP, "Atomics whose Atomic Response arrived (their result placed)."},
		"InRdmaAtomics":          {layerRDMAP, "Atomic Requests performed on local memory."},
		"OutRdmaAtomicResponses": {layerRDMAP, "Atomic Responses sent."},
		"rdmapIrdExceeded":       {layerRDMAP, "RDMA Read and Atomic Requests beyond the negotiated IRD (RDMAP remote operation error 0x07)."},
		"RdmaInv":                {layerRDMAP, "STags invalidated by Send with Invalidate."},
		"rdmapTerminateTx":       {layerRDMAP, "Terminate messages sent."},
		"rdmapTerminateRx":       {layerRDMAP, "Terminate messages received."},
		"rdmapErrors":            {layerRDMAP, "Errors found in the RDMAP layer (RDMAP Terminates sent)."},
		"sqPosted":               {layerVerbs, "Send work requests posted."},
		"sqCompleted":            {layerVerbs, "Send work requests completed successfully."},
		"sqErrors":               {layerVerbs, "Send work requests completed with an error status (flushes included)."},
		"rqPosted":               {layerVerbs, "Receive work requests posted."},
		"rqCompleted":            {layerVerbs, "Receive work requests completed successfully."},
		"rqErrors":               {layerVerbs, "Receive work requests completed with an error status (flushes included)."},
	}
}

// Object counts of the verbs layer, which are not engine counters.
const (
	nameQPActive = "qpActive"
	nameMRActive = "mrActive"
)

// Documentation of the verbs layer's object counts.
const (
	docQPActive = "Queue pairs that exist now."
	docMRActive = "Memory regions registered now."
)

// tcpCounter names and documents one netstack.TCPStats field.
type tcpCounter struct {
	field string // the TCPStats field, for the coverage test
	name  string // the TCP-MIB name (RFC 4022) or Linux's TcpExt name
	doc   string
	get   func(*netstack.TCPStats) uint64
}

// tcpCounters lists every netstack.TCPStats field in struct order. A test
// checks that it covers the struct and that each get reads its field.
func tcpCounters() []tcpCounter {
	return []tcpCounter{
		{"ActiveOpens", "tcpActiveOpens", "Connections opened actively (Dial) that completed the handshake.", func(s *netstack.TCPStats) uint64 { return s.ActiveOpens }},
		{"PassiveOpens", "tcpPassiveOpens", "Connections opened passively (accepted from a listener).", func(s *netstack.TCPStats) uint64 { return s.PassiveOpens }},
		{"AttemptFails", "tcpAttemptFails", "Dial or Listen calls that failed.", func(s *netstack.TCPStats) uint64 { return s.AttemptFails }},
		{"EstabResets", "tcpEstabResets", "Direct transitions to CLOSED from ESTABLISHED or CLOSE-WAIT.", func(s *netstack.TCPStats) uint64 { return s.EstabResets }},
		{"CurrEstab", "tcpCurrEstab", "Connections currently in ESTABLISHED (a gauge, not cumulative).", func(s *netstack.TCPStats) uint64 { return s.CurrEstab }},
		{"InSegs", "tcpInSegs", "Segments received by the stack, including those received in error.", func(s *netstack.TCPStats) uint64 { return s.InSegs }},
		{"OutSegs", "tcpOutSegs", "Segments sent by the stack, excluding retransmissions.", func(s *netstack.TCPStats) uint64 { return s.OutSegs }},
		{"RetransSegs", "tcpRetransSegs", "Segments retransmitted.", func(s *netstack.TCPStats) uint64 { return s.RetransSegs }},
		{"InErrs", "tcpInErrs", "Segments received in error (malformed or with a bad checksum).", func(s *netstack.TCPStats) uint64 { return s.InErrs }},
		{"OutRsts", "tcpOutRsts", "Segments sent with RST.", func(s *netstack.TCPStats) uint64 { return s.OutRsts }},
		{"InCsumErrors", "tcpInCsumErrors", "Segments dropped for a bad checksum (included in tcpInErrs).", func(s *netstack.TCPStats) uint64 { return s.InCsumErrors }},
		{"InRsts", "tcpInRsts", "Segments received with RST (not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.InRsts }},
		{"Timeouts", "tcpTimeouts", "Retransmission timer expiries (Linux TcpExtTCPTimeouts).", func(s *netstack.TCPStats) uint64 { return s.Timeouts }},
		{"FastRetrans", "tcpFastRetrans", "Segments retransmitted by fast retransmit (Linux TcpExtTCPFastRetrans).", func(s *netstack.TCPStats) uint64 { return s.FastRetrans }},
		{"SACKRecovery", "tcpSackRecovery", "Times SACK-based loss recovery was entered (Linux TcpExtTCPSackRecovery).", func(s *netstack.TCPStats) uint64 { return s.SACKRecovery }},
		{"TailRescues", "tcpTailRescues", "Data packets written again for connections whose TCP sender had stopped with data unacknowledged (siwtun's tail rescue; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.TailRescues }},
		{"HeldTails", "tcpHeldTails", "FPDU starts that segmentation offload held back because TCP had cut their FPDU at the peer's window edge, until the rest came (siwtun's; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.HeldTails }},
		{"HeldTailsAlone", "tcpHeldTailsAlone", "Held FPDU starts that left without their rest: it did not come after 4 window probes (300 ms), or a FIN overtook it (siwtun's; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.HeldTailsAlone }},
		{"HeldTailProbes", "tcpHeldTailProbes", "Window probes sent for held FPDU starts whose rest was slow to come: 20 ms, then twice as long each time (siwtun's; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.HeldTailProbes }},
		{"ResentOnGrid", "tcpResentOnGrid", "Retransmissions sent again along the FPDU grid of the aligned writes, each FPDU whole, rather than where TCP cut them (siwtun's; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.ResentOnGrid }},
	}
}

// socketCounters documents the verbs socket's counters
// (uverbs.Server.Counters), which the daemon adds to its engine's.
func socketCounters() map[string]counterInfo {
	return map[string]counterInfo{
		"verbsRxWatches": {layerVerbs, "Times a QP's receive path, having placed incoming data while the QP's verbs-socket ring goroutine slept, watched the client's rings for its answer."},
		"verbsRxTaken":   {layerVerbs, "Watches that found a request the client had posted and moved it to the engine without a doorbell."},
		"verbsRingFull":  {layerVerbs, "Times a QP's ring goroutine found the engine's queue full and paused (up to 1 ms) before draining the rings again."},
	}
}

// buildStats arranges a device's counters by layer. The tcp layer starts
// with the stack-wide TCP-MIB counters; the queue pairs' own tcp* counters
// follow, except where a stack-wide counter has the same name (tcpInSegs,
// tcpOutSegs: the stack's count is the MIB object; the per-QP ones stay
// visible per queue pair).
func buildStats(link string, tcp netstack.TCPStats, qp []offload.Counter, qps, mrs int) Stats {
	s := Stats{Link: link}
	tcpTable, qpTable := tcpCounters(), qpCounters()
	for name, info := range socketCounters() {
		qpTable[name] = info
	}
	seen := make(map[string]bool, len(tcpTable)+len(qp))
	for _, c := range tcpTable {
		s.TCP = append(s.TCP, Counter{Name: c.name, Value: c.get(&tcp), Doc: c.doc})
		seen[c.name] = true
	}
	for _, c := range qp {
		if seen[c.Name] {
			continue
		}
		seen[c.Name] = true
		info, ok := qpTable[c.Name]
		if !ok {
			info = counterInfo{layer: layerOther}
		}
		out := Counter{Name: c.Name, Value: c.Value, Doc: info.doc}
		switch info.layer {
		case layerTCP:
			s.TCP = append(s.TCP, out)
		case layerMPA:
			s.MPA = append(s.MPA, out)
		case layerDDP:
			s.DDP = append(s.DDP, out)
		case layerRDMAP:
			s.RDMAP = append(s.RDMAP, out)
		case layerVerbs:
			s.Verbs = append(s.Verbs, out)
		default:
			s.Other = append(s.Other, out)
		}
	}
	s.Verbs = append(s.Verbs,
		Counter{Name: nameQPActive, Value: uint64(qps), Doc: docQPActive},
		Counter{Name: nameMRActive, Value: uint64(mrs), Doc: docMRActive},
	)
	return s
}
