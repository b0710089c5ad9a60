// Package mpa implements MPA, the Marker PDU Aligned framing layer of iWARP
// (RFC 5044, with the RFC 6581 enhanced connection setup), the way Linux
// siw and RDMA hardware put it on the wire.
//
// The package has three parts:
//
//   - Startup frames: [Frame], [ParseFrame], [FrameReader] and the pure
//     negotiation functions [Config.Request], [Respond], [Complete] and
//     [Config.RejectReply], which turn local preferences and the peer's
//     frame into per-connection [Params].
//   - FPDU transmit: [Sender] builds one FPDU into a caller's buffer with a
//     single copy of the payload, inserting Markers at their stream
//     positions, and computes the CRC32c over the copy while it is hot.
//   - FPDU receive: [Receiver] is an [io.Writer] fed with in-order TCP
//     payload in arbitrary chunks (gVisor's tcp.Endpoint.Read hands it one
//     segment at a time). It removes and validates Markers, checks the CRC
//     and passes ULPDU bytes to a [Handler] without buffering an FPDU.
//
// Beside them, the checks of what others put on the wire: [Aligner]
// classifies a connection's segments by FPDU alignment, and [FindFPDUs]
// finds whole FPDUs in one segment without the stream before it.
//
// # Files
//
// Every non-test file of the package, with what it holds (maps_test.go at
// the root keeps this list and the folder in step):
//
//	doc.go        this overview and the wire facts the package settles
//	frame.go      startup frames: the MPA Request, Reply and RTR on the wire
//	negotiate.go  Config and Params: the negotiation of CRC, Markers and
//	              the peer-to-peer mode
//	ext.go        Ext: what one siwtun RNIC announces to another in the
//	              private data
//	sender.go     Sender: one FPDU built in place, Markers, pad and CRC
//	receiver.go   Receiver: FPDUs taken out of the in-order stream, handed
//	              to a Handler
//	observe.go    Marker and MarkerObserver: the Markers a Receiver removes
//	errors.go     Error and the LLP/MPA Terminate codes
//	align.go      Aligner: a direction's segments classified by FPDU
//	              alignment
//	whole.go      FindFPDUs: the whole FPDUs inside one segment
//
// # Wire facts this package relies on
//
// All multi-octet fields are big-endian except the CRC trailer: the standard
// CRC32c value (Castagnoli, reflected, init and final xor 0xFFFFFFFF) is sent
// least-significant octet first, so "123456789" (CRC 0xE3069283) goes out as
// 83 92 06 E3. This is what Linux siw sends; the golden tests check it
// against captures of kernel siw with CRC on.
//
// # Markers and the CRC
//
// When Markers are negotiated for a direction, a 4-octet Marker
// {Reserved 0x0000, FPDUPTR be16} sits at every stream position that is a
// multiple of 512, counted from the first octet of the first FPDU, so the
// first Marker is the first thing of the first FPDU. Markers are not counted
// in ULPDU_Length and do not change the pad, but they are covered by the CRC.
//
// Two details are not settled by code we could read from a conformant
// implementation; this package settles them as follows.
//
// (a) A Marker that falls exactly on an FPDU boundary (a "leading Marker")
// belongs to the FPDU that follows it: its FPDUPTR is 0 and it is covered
// by that FPDU's CRC. Evidence: Wireshark's MPA dissector (our conformance
// oracle) starts the CRC at the first octet of the segment, which is the
// leading Marker when one is there, and adds 4 octets per Marker in the
// segment to the CRC length (packet-iwarp-mpa.c dissect_mpa_fpdu and
// dissect_fpdu_crc); the OSC software iWARP stack (the one independent
// marker implementation at hand) also emits the leading Marker as the first
// block of the FPDU and runs its CRC over all blocks.
//
// (b) The FPDUPTR of a later Marker in an FPDU that begins with a leading
// Marker: RFC 5044's wording counts "from the beginning of the ULPDU Length
// field", which would be 4 less than the distance from the FPDU's first
// octet (the leading Marker). The [Sender] by default counts from the FPDU's
// first octet ([PtrFromFPDUStart]): that is the one rule under which the
// leading Marker's own value 0 needs no special case, it agrees with (a)
// (the leading Marker is part of the FPDU), and it is what the OSC stack
// sends. [Sender.SetMarkerPtr] switches to the other reading for interop.
// The [Receiver] accepts both readings, counts which one it saw in
// [ReceiverStats], and rejects any other value with Terminate code 0x03.
package mpa
