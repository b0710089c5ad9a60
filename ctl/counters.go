package ctl

// Layer names of Stats and of CounterInfo.
const (
	LayerTCP   = "tcp"
	LayerMPA   = "mpa"
	LayerDDP   = "ddp"
	LayerRDMAP = "rdmap"
	LayerVerbs = "verbs"
	LayerOther = "other"
)

// CounterInfo places an engine counter in a layer and documents it.
type CounterInfo struct {
	Layer string // LayerTCP … LayerVerbs
	Doc   string // what it counts, one sentence
}

// QPCounters maps every offload.QPStats counter (by its stat tag) to its
// layer and documentation. A test checks that it covers the struct. (A
// function, not a package variable: the package keeps no global state.)
func QPCounters() map[string]CounterInfo {
	return map[string]CounterInfo{
		"mpaFpduTx":              {LayerMPA, "FPDUs handed to TCP."},
		"mpaFpduRx":              {LayerMPA, "FPDUs received with a good CRC (or without CRC)."},
		"mpaOctetsTx":            {LayerMPA, "FPDU octets handed to TCP, MPA headers, markers, padding and CRC included."},
		"mpaOctetsRx":            {LayerMPA, "ULPDU octets received (DDP headers and payload)."},
		"mpaAlignedSegsTx":       {LayerMPA, "Data segments sent starting with an FPDU (or a Marker then an FPDU) and holding whole FPDUs only."},
		"mpaAlignedSegsRx":       {LayerMPA, "Data segments received starting with an FPDU (or a Marker then an FPDU) and holding whole FPDUs only."},
		"mpaSplitSegsTx":         {LayerMPA, "Data segments sent that cut an FPDU (at their start or end)."},
		"mpaSplitSegsRx":         {LayerMPA, "Data segments received that cut an FPDU (at their start or end)."},
		"mpaOooPlacedFpdus":      {LayerMPA, "Tagged FPDUs (RDMA Write, Read Response) placed out of order: found whole in a segment that arrived with a gap in front of it, checked and placed before the gap was filled."},
		"mpaOooPlacedOctets":     {LayerMPA, "Payload octets of the FPDUs placed out of order (placed again, in order, once the gap is filled)."},
		"mpaCrcErrors":           {LayerMPA, "FPDUs whose MPA CRC did not match."},
		"mpaFpduTimeouts":        {LayerMPA, "Connections ended because the rest of a half-received FPDU did not come within the FPDU timeout (the peer stopped in the middle of an FPDU): LLP/MPA 0x01 Terminates."},
		"mpaErrorsBeforeCrc":     {LayerMPA, "Errors found in an FPDU (a DDP or RDMAP header's, a Marker's) and sent before that FPDU's CRC had arrived (CRC on): the FPDU's rest had not come with them."},
		"mpaBadRevisions":        {LayerMPA, "MPA Requests of a revision above 2, closed without a Reply (RFC 5044 §7.1)."},
		"mpaAcceptTimeouts":      {LayerMPA, "Connections accepted by a listener whose MPA Request had not arrived whole within the MPA accept timeout (--mpa-accept-timeout): reset, unanswered."},
		"mpaBadRequests":         {LayerMPA, "Connections accepted by a listener that closed before their MPA Request was whole, or sent a frame that is not a valid MPA Request: closed, unanswered."},
		"mpaFirstFpduDelays":     {LayerMPA, "Connections initiated here whose first FPDU waited --first-fpdu-delay after the MPA Reply, the peer not having said that it reads at once (Linux siw never does; siwtun does, in its Reply's extension block)."},
		"mpaStartupHoldsBounded": {LayerMPA, "Connections accepted here without peer-to-peer mode whose held sends went out --startup-hold after the MPA Reply was acknowledged, the initiator having sent no FPDU yet (RFC 5044 §7.1.2 has a responder wait for one; Linux siw without peer_to_peer never offers the RTR)."},
		"mpaFinDelays":           {LayerMPA, "Connections whose FIN waited --fin-delay after the application disconnected or destroyed the QP, the peer not known to be siwtun (Linux siw fails a Send it has already sent when the FIN comes before its send call returns)."},
		"mpaErrors":              {LayerMPA, "Errors found in the MPA layer (LLP Terminates sent)."},
		"tcpOutSegs":             {LayerTCP, "TCP segments sent on the queue pairs' connections, retransmissions included, as seen at the link."},
		"tcpInSegs":              {LayerTCP, "TCP segments received on the queue pairs' connections, before TCP accepted them (retransmissions and duplicates included)."},
		"tcpOutDataSegs":         {LayerTCP, "TCP segments carrying payload sent on the queue pairs' connections, retransmissions included."},
		"tcpInDataSegs":          {LayerTCP, "TCP segments carrying payload received on the queue pairs' connections, retransmissions and duplicates included."},
		"ddpPlacedOctets":        {LayerDDP, "Payload octets placed directly into memory regions."},
		"ddpUntaggedNoBuffer":    {LayerDDP, "Sends that found no posted receive (DDP untagged error 0x02)."},
		"ddpUntaggedTooLong":     {LayerDDP, "Sends longer than the posted receive (DDP untagged error 0x05)."},
		"ddpErrors":              {LayerDDP, "Errors found in the DDP layer (DDP Terminates sent)."},
		"OutRdmaWrites":          {LayerRDMAP, "RDMA Write messages sent."},
		"OutRdmaWriteOctets":     {LayerRDMAP, "RDMA Write payload octets sent."},
		"InRdmaWrites":           {LayerRDMAP, "RDMA Write messages received and placed."},
		"OutRdmaSends":           {LayerRDMAP, "Send messages sent (all four kinds)."},
		"OutRdmaSendOctets":      {LayerRDMAP, "Send payload octets sent."},
		"InRdmaSends":            {LayerRDMAP, "Send messages received into posted receives."},
		"OutRdmaImmediates":      {LayerRDMAP, "Immediate Data messages (RFC 7306) sent: one per RDMA Write or Send with Immediate Data."},
		"InRdmaImmediates":       {LayerRDMAP, "Immediate Data messages (RFC 7306) received."},
		"OutRdmaReads":           {LayerRDMAP, "RDMA Read Requests sent."},
		"rdmaReadsCompleted":     {LayerRDMAP, "RDMA Reads whose response was fully placed."},
		"InRdmaReads":            {LayerRDMAP, "RDMA Read Requests accepted for an answer."},
		"OutRdmaReadResponses":   {LayerRDMAP, "RDMA Read Responses sent."},
		"OutRdmaReadOctets":      {LayerRDMAP, "RDMA Read Response payload octets sent."},
		"OutRdmaAtomics":         {LayerRDMAP, "Atomic Requests (RFC 7306: Fetch-and-Add, Compare-and-Swap) sent."},
		"rdmaAtomicsCompleted":   {LayerRDMAP, "Atomics whose Atomic Response arrived (their result placed)."},
		"InRdmaAtomics":          {LayerRDMAP, "Atomic Requests performed on local memory."},
		"OutRdmaAtomicResponses": {LayerRDMAP, "Atomic Responses sent."},
		"rdmapIrdExceeded":       {LayerRDMAP, "RDMA Read and Atomic Requests beyond the negotiated IRD (RDMAP remote operation error 0x07)."},
		"RdmaInv":                {LayerRDMAP, "STags invalidated by Send with Invalidate."},
		"rdmapTerminateTx":       {LayerRDMAP, "Terminate messages sent."},
		"rdmapTerminateRx":       {LayerRDMAP, "Terminate messages received."},
		"rdmapErrors":            {LayerRDMAP, "Errors found in the RDMAP layer (RDMAP Terminates sent)."},
		"sqPosted":               {LayerVerbs, "Send work requests posted."},
		"sqCompleted":            {LayerVerbs, "Send work requests completed successfully."},
		"sqErrors":               {LayerVerbs, "Send work requests completed with an error status (flushes included)."},
		"rqPosted":               {LayerVerbs, "Receive work requests posted."},
		"rqCompleted":            {LayerVerbs, "Receive work requests completed successfully."},
		"rqErrors":               {LayerVerbs, "Receive work requests completed with an error status (flushes included)."},
	}
}

// SocketCounters documents the verbs socket's counters
// (uverbs.Server.Counters), which the daemon adds to its engine's.
func SocketCounters() map[string]CounterInfo {
	return map[string]CounterInfo{
		"verbsRxWatches": {LayerVerbs, "Times a QP's receive path, having placed incoming data while the QP's verbs-socket ring goroutine slept, watched the client's rings for its answer."},
		"verbsRxTaken":   {LayerVerbs, "Watches that found a request the client had posted and moved it to the engine without a doorbell."},
		"verbsRingFull":  {LayerVerbs, "Times a QP's ring goroutine found the engine's queue full and paused (up to 1 ms) before draining the rings again."},
	}
}
