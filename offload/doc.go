// Package offload is the iWARP engine of a siwtun RNIC: what a card's
// offload does between its TCP stack and its verbs. It runs the MPA, DDP
// and RDMAP protocols (their wire codecs are iwarp/mpa, iwarp/ddp and
// iwarp/rdmap) for the queue pairs of one [Device], on the connections of
// one netstack.Stack, and moves payload straight between TCP and
// registered memory ([Regions]): one copy on each side, no intermediate
// buffer.
//
// # Files
//
// Every non-test file of the package, with what it holds (maps_test.go at
// the root keeps this list and the folder in step):
//
//	doc.go          this overview
//	config.go       Config: a device's iWARP defaults and limits
//	device.go       Device: the QP and region tables, counters, Close
//	mtu.go          the smallest MTU and MSS the engine can run on, and the
//	                check of a link's MTU against them
//	cm.go           connection management: Connect, Listen, ConnRequest, the
//	                MPA Request/Reply, and start, which puts a connection
//	                under a QP
//	startup.go      the start of a connection: the responder's hold until
//	                the first FPDU, the peer-to-peer RTR
//	qp.go           QP: work queues, posting, completions, states (see QP)
//	qpclose.go      the end of a QP's connection (Terminate first, then the
//	                FIN): Disconnect, Destroy
//	srq.go          SRQ: shared receive queues
//	rx.go           the receive loop and engine, rxState
//	rxops.go        the receive opcodes: where each one's payload goes, and
//	                what its last segment completes
//	rxcut.go        when a header error goes out while its FPDU's CRC has
//	                not yet arrived
//	ooo.go          out-of-order placement of tagged FPDUs
//	tx.go           the transmit loop: send requests and Read Responses to
//	                FPDUs
//	txfpdu.go       builds one TCP write's FPDUs in place in the send buffer
//	imm.go          RFC 7306 Immediate Data, both ways (Write and Send with
//	                Immediate Data), for peers that negotiated it (mpa.Ext)
//	atomic.go       RFC 7306 atomics (Fetch-and-Add, Compare-and-Swap), both
//	                ways
//	regions.go      Regions: memory regions and their STags, access checks
//	regions_list.go Regions.List, the regions in table order for the control
//	                plane
//	stag.go         unpredictable STags: the keyed permutation of a table's
//	                slots
//	mw.go           memory windows: allocation, binding, invalidation
//	stats.go        counters, and the segment observer that counts FPDU
//	                alignment
//	tap.go          the segment, placement and completion tap (Device.Watch)
//	hops.go         the engine's stamps of a round trip's anatomy
//
// # A segment's way in
//
// The engine sits on the connection's in-order TCP byte stream. The QP's
// RX goroutine (rxLoop) calls the connection's ReadTo with the QP's
// mpa.Receiver as the writer, so gVisor's TCP Read hands each segment's
// payload to the receiver as it is read, in the netstack's buffers.
// The receiver takes FPDUs out of the stream (Markers removed, CRC
// computed over the octets as they pass) and drives rxState, an
// mpa.Handler: BeginFPDU, the ULPDU in chunks, EndFPDU. rxState collects
// the DDP header and any RDMAP header (Read Request, Terminate) in its
// header phases, checks it, and the opcode's begin in rxOps picks where
// the payload goes: into the region an RDMA Write's STag names or the sink
// of the oldest outstanding Read (rxPlace), across the receive at the head
// of the receive queue (rxScatter, a Send), or nowhere. The payload is
// copied there from the segment once. EndFPDU learns whether the CRC was
// good; the opcode's end then counts, and on a message's last segment
// completes it: the receive, the Read, or an inbound Read Request queued
// for the TX goroutine to answer.
//
// Beside the stream, a per-connection hook sees every TCP segment at the
// link (segmentObserver): it counts FPDU alignment, and when a segment
// arrives beyond a gap, the out-of-order placer (ooo.go) places the tagged
// FPDUs it carries at once, as an RNIC does; the in-order path places the
// same octets again later and does everything else in stream order.
//
// An error in what arrives (a bad header, an STag the peer may not use, a
// CRC error) is the receive path's fail: the QP enters ERR, the request
// it hit completes with an error and the rest are flushed, and a Terminate
// naming the error and carrying the offending headers is queued for the TX
// goroutine, which sends it and closes the stream.
//
// # The way out
//
// PostSend copies a work request into a preallocated send-queue slot and
// wakes the QP's TX goroutine (txLoop), which picks the next job: a
// Terminate, the peer-to-peer RTR, a Read Response (up to irqMaxBurst in a
// row while send requests wait) or the next send request, respecting ORD
// and fences. A message goes out as FPDUs of at most the connection's
// effective MSS, each segment starting with an FPDU: the FPDUs of one TCP
// write are built in place in gVisor's send buffer (fpduPayload), header,
// payload from registered memory, Markers, pad and CRC, so the payload is
// copied once. A request completes when all of it is with TCP, as in
// Linux siw; an RDMA Read when its last Read Response segment is placed.
//
// # A queue pair's life
//
// CreateQP makes a QP in RESET. Connect (active side) or
// Listener.Accept and ConnRequest.Accept (passive side) dial or take a TCP
// connection, exchange the MPA Request and Reply, and start the QP: it
// enters RTS, or RTR for a peer-to-peer responder until the peer's RTR
// arrives, and its RX and TX goroutines run until the stream ends —
// Disconnect, a Terminate either way, or the TCP connection's end. Then the
// QP is in ERR with its work flushed, and can be reset and connected again.
// The QP type's comment draws these states and says which goroutine owns
// each of its fields.
//
// The verbs API (package verbs) is the application's view of all this;
// package rnic assembles a stack, a Device and a verbs device in one
// process.
package offload
