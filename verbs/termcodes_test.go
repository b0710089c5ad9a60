package verbs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// tcRow is one row of the Terminate code table: a condition a hostile
// peer creates on purpose, and the Terminate the engine must answer it
// with. doc/terminate-codes.md mirrors the table row for row
// (TestTerminateCodesDoc).
type tcRow struct {
	name string
	code rdmap.Code
	rfc  string
	// crcOn runs the row with CRC on only (an FPDU whose CRC fails);
	// other rows run with CRC on and off.
	crcOn bool
	// srv adjusts the engine of the side that detects the error; peer
	// the raw peer's MPA configuration.
	srv  func(*offload.Config)
	peer func(*mpa.Config)
	// hostile does what the row's peer does on an established connection
	// (the raw peer initiated it) and returns the offending ULPDU, whose
	// DDP header the Terminate must copy where RFC 5040 §4.8 has it
	// copied (nil: nothing to compare).
	hostile func(e *tcEnv) []byte
	// reply, for a row of connection set-up, is the MPA Reply a raw
	// responder answers the engine's Request with (the engine initiates).
	reply func(req mpa.Frame) mpa.Frame
	// delivered marks an RFC 7306 message the engine took in (its
	// extension negotiated) before its RDMAP layer found it wrong: RFC
	// 7306 §8.1 item 2 has the Terminate copy its DDP header, whatever the
	// code, and no RDMAP header.
	delivered bool
	// recv is the status the server's posted receive completes with;
	// recvSGE, if set, is that receive's SGE (default: all of rbuf).
	recv    verbs.WCStatus
	recvSGE func(e *tcEnv) verbs.SGE
}

// tcEnv is an established connection between the engine under test
// (srv) and a raw peer (p), and the server's memory.
type tcEnv struct {
	t   *testing.T
	crc bool
	srv *side
	p   *rawPeer
	// dst: every right; ro: REMOTE_READ only; other: another PD; rbuf:
	// the 16-octet buffer of the posted receive (ID 77); sink: where the
	// server's own Reads and atomics land.
	dst, ro, other, rbuf, sink *guarded
}

// send sends one whole FPDU carrying ulpdu (a good CRC).
func (e *tcEnv) send(ulpdu []byte) []byte { e.p.send(ulpdu, false); return ulpdu }

// cut sends the ULPDU_Length of an FPDU whose ULPDU is ulpdu followed by
// only the first n octets of it, and then nothing: the peer stalls in the
// middle of the FPDU.
func (e *tcEnv) cut(ulpdu []byte, n int) []byte {
	e.t.Helper()
	b := binary.BigEndian.AppendUint16(nil, uint16(len(ulpdu)))
	if _, err := e.p.conn.Write(append(b, ulpdu[:n]...)); err != nil {
		e.t.Fatal(err)
	}
	return ulpdu
}

func sendMsg(msn, mo uint32, last bool, payload []byte) []byte {
	return untagged(rdmap.OpSend, ddp.QNSend, msn, mo, last, payload)
}

func taggedMsg(op rdmap.Opcode, stag uint32, to uint64, last bool, payload []byte) []byte {
	h := ddp.Header{Tagged: true, Last: last, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(op), STag: stag, TO: to}
	b := make([]byte, h.Len()+len(payload))
	h.Marshal(b)
	copy(b[h.Len():], payload)
	return b
}

func readReqMsg(msn uint32, rr rdmap.ReadRequest, extra int) []byte {
	body := make([]byte, rdmap.ReadRequestLen+extra)
	rr.Marshal(body)
	return untagged(rdmap.OpReadRequest, ddp.QNReadRequest, msn, 0, true, body)
}

func atomicReqMsg(msn uint32, m rdmap.AtomicRequest) []byte {
	body := make([]byte, rdmap.AtomicRequestLen)
	m.Marshal(body)
	return untagged(rdmap.OpAtomicRequest, ddp.QNReadRequest, msn, 0, true, body)
}

func immMsg(msn uint32, m rdmap.Immediate) []byte {
	body := make([]byte, rdmap.ImmediateDataLen)
	m.Marshal(body)
	return untagged(rdmap.OpImmediate, ddp.QNSend, msn, 0, true, body)
}

// readOf is a Read Request for n octets of g at off.
func readOf(g *guarded, off, n int) rdmap.ReadRequest {
	return rdmap.ReadRequest{SinkSTag: 0x1234, SinkTO: 0, Size: uint32(n), SrcSTag: g.mr.RKey(), SrcTO: g.mr.Addr() + uint64(off)}
}

// atomicOn is a FetchAdd of 1 on the word of g at off.
func atomicOn(g *guarded, off int) rdmap.AtomicRequest {
	return rdmap.FetchAdd(1, g.mr.RKey(), g.mr.Addr()+uint64(off), 1, 0)
}

// firstFPDU sends the raw peer's first FPDU, a zero-length RDMA Write,
// before the server sends anything (RFC 5044 §7.1.2 has a responder send
// no FPDU before the initiator's first).
func (e *tcEnv) firstFPDU() {
	e.send(taggedMsg(rdmap.OpWrite, e.dst.mr.RKey(), e.dst.mr.Addr(), true, nil))
}

// serverRead has the server post an RDMA Read of 64 octets into its sink
// and returns the Read Request the raw peer receives for it.
func (e *tcEnv) serverRead() rdmap.ReadRequest {
	e.firstFPDU()
	e.srv.post(verbs.SendWR{ID: 1, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{e.sink.mr.SGE(0, 64)}, RemoteAddr: 0x10000, RKey: 0x4321})
	return e.p.readRequest(1)
}

// serverAtomic has the server post a FetchAdd and returns the Atomic
// Request the raw peer receives for it.
func (e *tcEnv) serverAtomic() rdmap.AtomicRequest {
	e.t.Helper()
	e.firstFPDU()
	e.srv.post(verbs.SendWR{ID: 1, Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{e.sink.mr.SGE(0, 8)}, RemoteAddr: 0x10000, RKey: 0x4321, CompareAdd: 1})
	h, op, body := e.p.next()
	var m rdmap.AtomicRequest
	if op != rdmap.OpAtomicRequest || m.Unmarshal(body) != nil {
		e.t.Fatalf("raw peer got %v %v, want an Atomic Request", op, h)
	}
	return m
}

func atomicRespMsg(msn uint32, reqID uint32) []byte {
	body := make([]byte, rdmap.AtomicResponseLen)
	(&rdmap.AtomicResponse{ReqID: reqID, Value: 7}).Marshal(body)
	return untagged(rdmap.OpAtomicResponse, ddp.QNAtomicResponse, msn, 0, true, body)
}

// markerFPDU is an FPDU carrying ulpdu that starts the stream, so its
// first 4 octets are a Marker (FPDUPTR 0), with the Marker's FPDUPTR set
// to ptr. With fixCRC (and CRC on) the CRC is computed over what is sent:
// the CRC is valid, the Marker alone disagrees (RFC 5044 §8); without,
// the Marker looks damaged on the wire.
func markerFPDU(tx *mpa.Sender, crc bool, ulpdu []byte, ptr uint16, fixCRC bool) []byte {
	tx.Begin(nil, len(ulpdu))
	tx.Write(ulpdu)
	f := tx.Finish()
	binary.BigEndian.PutUint16(f[2:4], ptr)
	if crc && fixCRC {
		c := crc32.Checksum(f[:len(f)-4], crc32.MakeTable(crc32.Castagnoli))
		binary.LittleEndian.PutUint32(f[len(f)-4:], c)
	}
	return f
}

const (
	rfcLLP   = "RFC 5044 §8"
	rfc6581  = "RFC 6581 (IANA RDDP registry)"
	rfcDDP   = "RFC 5041 §7"
	rfcRDMAP = "RFC 5040 §7.1"

	// The rows of RFC 7306's messages cite the section that makes the
	// condition an error, or that picks its code.
	rfcImmDDP       = "RFC 5041 §7, RFC 7306 §6.3"   // one receive, one segment of exactly 8 octets
	rfcAtomicDDP    = "RFC 5041 §7, RFC 7306 §5.2.1" // QN 1 with the Read Requests, one untagged segment
	rfcUnsupported  = "RFC 5040 §7.1, RFC 7306 §1.1" // an extension the peer did not negotiate
	rfcImmSend      = "RFC 5040 §7.1, RFC 7306 §6.3" // siwtun's Send with Immediate Data pairing
	rfcAOpCode      = "RFC 7306 §5.2.1, §10.1"       // AOpCode not FetchAdd (0x0) or CmpSwap (0x2)
	rfcAtomicResp   = "RFC 7306 §5.2.2, §5.4"        // a response that answers no request due
	rfcAtomicTarget = "RFC 5040 §7.1, RFC 7306 §5"   // addressed as an RDMA Read's source
	rfcAtomicIRD    = "RFC 5040 §7.1, RFC 7306 §5.2" // IRD shared with RDMA Read Requests
	rfcMisaligned   = "RFC 7306 §8.2"
)

// tcRows is the Terminate code table: every condition under which the
// engine chooses a Terminate code, driven by a hostile peer.
func tcRows() []tcRow {
	p2p := func(c *mpa.Config) { c.P2P = mpa.RTRWrite }
	markers := func(c *offload.Config) { c.Markers = true }
	noExt := func(c *mpa.Config) { c.Ext = 0 }
	ird1 := func(c *offload.Config) { c.IRD = 1 }
	ord1 := func(c *mpa.Config) { c.ORD = 1 }
	return []tcRow{
		// The LLP (MPA) layer.
		{name: "crc-error", code: rdmap.TermLLPCRC, rfc: rfcLLP, crcOn: true, recv: verbs.WCLocQPOpErr,
			hostile: func(e *tcEnv) []byte { e.p.send(sendMsg(1, 0, true, []byte("hello")), true); return nil }},
		{name: "crc-error-header-error", code: rdmap.TermLLPCRC, rfc: rfcLLP, crcOn: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { e.p.send(untagged(rdmap.OpSend, 3, 1, 0, true, []byte("x")), true); return nil }},
		{name: "crc-error-tagged-header-error", code: rdmap.TermLLPCRC, rfc: rfcLLP, crcOn: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				e.p.send(taggedMsg(rdmap.OpWrite, e.dst.mr.RKey(), e.dst.mr.Addr()+1<<40, true, make([]byte, 64)), true)
				return nil
			}},
		{name: "marker-damaged", code: rdmap.TermLLPCRC, rfc: rfcLLP, crcOn: true, srv: markers, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				e.write(markerFPDU(&e.p.tx, e.crc, taggedMsg(rdmap.OpWrite, e.dst.mr.RKey(), e.dst.mr.Addr(), true, []byte("x")), 8, false))
				return nil
			}},
		{name: "marker-mismatch", code: rdmap.TermLLPMarker, rfc: rfcLLP, srv: markers, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				e.write(markerFPDU(&e.p.tx, e.crc, taggedMsg(rdmap.OpWrite, e.dst.mr.RKey(), e.dst.mr.Addr(), true, []byte("x")), 8, true))
				return nil
			}},
		{name: "marker-mismatch-fpdu-incomplete", code: rdmap.TermLLPMarker, rfc: rfcLLP, srv: markers, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				e.write(markerFPDU(&e.p.tx, e.crc, taggedMsg(rdmap.OpWrite, e.dst.mr.RKey(), e.dst.mr.Addr(), true, make([]byte, 400)), 8, true)[:mpa.MarkerLen+2+ddp.TaggedHeaderLen])
				return nil
			}},
		{name: "fpdu-incomplete", code: rdmap.TermLLPConnLost, rfc: rfcLLP, recv: verbs.WCLocQPOpErr,
			srv:     func(c *offload.Config) { c.FPDUTimeout = 300 * time.Millisecond },
			hostile: func(e *tcEnv) []byte { e.cut(sendMsg(1, 0, true, make([]byte, 16)), 24); return nil }},
		{name: "rtr-missing", code: rdmap.TermLLPNoMatchingRTR, rfc: rfc6581, peer: p2p, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(sendMsg(1, 0, true, []byte("not an RTR"))) }},
		{name: "reply-no-matching-rtr", code: rdmap.TermLLPNoMatchingRTR, rfc: rfc6581,
			srv: func(c *offload.Config) { c.P2P = mpa.RTRWrite },
			reply: func(req mpa.Frame) mpa.Frame {
				return mpa.Frame{Reply: true, Rev: 2, Enhanced: true, IRD: 4, ORD: 4, P2P: true, RTR: mpa.RTRSend, CRC: req.CRC}
			}},
		{name: "reply-insufficient-ird", code: rdmap.TermLLPInsufficientIRD, rfc: rfc6581,
			srv: func(c *offload.Config) { c.IRD = 2 },
			reply: func(req mpa.Frame) mpa.Frame {
				// An ORD within the device's 128 would raise our IRD (the
				// relaxed negotiation Linux siw does); past it, it cannot.
				return mpa.Frame{Reply: true, Rev: 2, Enhanced: true, IRD: 4, ORD: ibv.MaxIRDORD + 1, CRC: req.CRC}
			}},
		{name: "reply-revision-above-request", code: rdmap.TermLLPBadFrame, rfc: rfcLLP,
			srv: func(c *offload.Config) { c.MPARev = 1 },
			reply: func(req mpa.Frame) mpa.Frame {
				return mpa.Frame{Reply: true, Rev: 2, Enhanced: true, IRD: 4, ORD: 4, CRC: req.CRC}
			}},

		// The DDP layer.
		{name: "reply-peer-to-peer-not-asked", code: rdmap.TermLLPNoMatchingRTR, rfc: rfc6581,
			srv: func(c *offload.Config) { c.P2P = 0 }, // offered by default
			reply: func(req mpa.Frame) mpa.Frame {
				return mpa.Frame{Reply: true, Rev: 2, Enhanced: true, IRD: 4, ORD: 4, P2P: true, RTR: mpa.RTRWrite, CRC: req.CRC}
			}},
		{name: "ulpdu-of-one-octet", code: rdmap.TermDDPLocalCatastrophic, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { e.send([]byte{0x41}); return nil }},
		{name: "ulpdu-shorter-than-ddp-header", code: rdmap.TermDDPLocalCatastrophic, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { e.send(sendMsg(1, 0, true, nil)[:10]); return nil }},
		{name: "ddp-version-tagged", code: rdmap.TermDDPTaggedBadVersion, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				b := taggedMsg(rdmap.OpWrite, e.dst.mr.RKey(), e.dst.mr.Addr(), true, []byte("x"))
				b[0] &^= 3
				return e.send(b)
			}},
		{name: "ddp-version-untagged", code: rdmap.TermDDPUntaggedBadVersion, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				b := sendMsg(1, 0, true, []byte("x"))
				b[0] = b[0]&^3 | 2
				return e.send(b)
			}},
		{name: "write-invalid-stag", code: rdmap.TermDDPTaggedInvalidSTag, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				return e.send(taggedMsg(rdmap.OpWrite, e.dst.mr.RKey()^0x100, e.dst.mr.Addr(), true, []byte("x")))
			}},
		{name: "write-out-of-bounds", code: rdmap.TermDDPTaggedBaseBounds, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				return e.send(taggedMsg(rdmap.OpWrite, e.dst.mr.RKey(), e.dst.mr.Addr()+4090, true, make([]byte, 8)))
			}},
		{name: "write-other-pd", code: rdmap.TermDDPTaggedStagNotAssoc, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				return e.send(taggedMsg(rdmap.OpWrite, e.other.mr.RKey(), e.other.mr.Addr(), true, []byte("x")))
			}},
		{name: "read-response-wrong-stag", code: rdmap.TermDDPTaggedInvalidSTag, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				rr := e.serverRead()
				return e.send(taggedMsg(rdmap.OpReadResponse, rr.SinkSTag^0x100, rr.SinkTO, true, make([]byte, 64)))
			}},
		{name: "read-response-outside-sink", code: rdmap.TermDDPTaggedBaseBounds, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				rr := e.serverRead()
				return e.send(taggedMsg(rdmap.OpReadResponse, rr.SinkSTag, rr.SinkTO+8, true, make([]byte, 64)))
			}},
		{name: "read-response-out-of-order", code: rdmap.TermDDPTaggedBaseBounds, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				rr := e.serverRead()
				return e.send(taggedMsg(rdmap.OpReadResponse, rr.SinkSTag, rr.SinkTO+8, false, make([]byte, 8)))
			}},
		{name: "read-response-ends-short", code: rdmap.TermDDPTaggedBaseBounds, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				rr := e.serverRead()
				return e.send(taggedMsg(rdmap.OpReadResponse, rr.SinkSTag, rr.SinkTO, true, make([]byte, 32)))
			}},
		{name: "invalid-qn", code: rdmap.TermDDPInvalidQN, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(untagged(rdmap.OpSend, 3, 1, 0, true, []byte("x"))) }},
		{name: "send-no-receive", code: rdmap.TermDDPNoBuffer, rfc: rfcDDP, recv: verbs.WCSuccess,
			hostile: func(e *tcEnv) []byte {
				e.send(sendMsg(1, 0, true, []byte("one")))
				return e.send(sendMsg(2, 0, true, []byte("two")))
			}},
		{name: "immediate-no-receive", code: rdmap.TermDDPNoBuffer, rfc: rfcImmDDP, recv: verbs.WCSuccess,
			hostile: func(e *tcEnv) []byte {
				e.send(sendMsg(1, 0, true, []byte("one")))
				return e.send(immMsg(2, rdmap.Immediate{Data: 5}))
			}},
		{name: "send-msn-out-of-range", code: rdmap.TermDDPInvalidMSN, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(sendMsg(5, 0, true, []byte("x"))) }},
		{name: "read-request-msn-out-of-range", code: rdmap.TermDDPInvalidMSN, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(readReqMsg(2, readOf(e.dst, 0, 64), 0)) }},
		{name: "atomic-request-msn-out-of-range", code: rdmap.TermDDPInvalidMSN, rfc: rfcAtomicDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(atomicReqMsg(3, atomicOn(e.dst, 0))) }},
		{name: "send-starts-at-nonzero-mo", code: rdmap.TermDDPInvalidMO, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(sendMsg(1, 4, true, []byte("x"))) }},
		{name: "send-segment-at-wrong-mo", code: rdmap.TermDDPInvalidMO, rfc: rfcDDP, recv: verbs.WCLocQPOpErr,
			hostile: func(e *tcEnv) []byte {
				e.send(sendMsg(1, 0, false, []byte("abcd")))
				return e.send(sendMsg(1, 8, true, []byte("x")))
			}},
		{name: "read-request-not-one-segment", code: rdmap.TermDDPInvalidMO, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				b := readReqMsg(1, readOf(e.dst, 0, 64), 0)
				b[0] &^= 0x40 // L clear
				return e.send(b)
			}},
		{name: "immediate-inside-send", code: rdmap.TermDDPInvalidMO, rfc: rfcImmDDP, recv: verbs.WCLocQPOpErr,
			hostile: func(e *tcEnv) []byte {
				e.send(sendMsg(1, 0, false, []byte("abcd")))
				return e.send(immMsg(1, rdmap.Immediate{Data: 5}))
			}},
		{name: "immediate-not-one-segment", code: rdmap.TermDDPInvalidMO, rfc: rfcImmDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				b := immMsg(1, rdmap.Immediate{Data: 5})
				b[0] &^= 0x40
				return e.send(b)
			}},
		{name: "atomic-request-not-one-segment", code: rdmap.TermDDPInvalidMO, rfc: rfcAtomicDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				b := atomicReqMsg(1, atomicOn(e.dst, 0))
				b[0] &^= 0x40
				return e.send(b)
			}},
		{name: "send-announces-more-than-the-receive", code: rdmap.TermDDPTooLong, rfc: rfcDDP, recv: verbs.WCLocLenErr,
			// 65,517 octets toward the 16-octet receive, the peer then
			// idle with the FPDU's rest unsent: the header shows the
			// error, and no timer runs (FPDUTimeout is off).
			hostile: func(e *tcEnv) []byte {
				return e.cut(sendMsg(1, 0, true, make([]byte, 65517)), ddp.UntaggedHeaderLen+16)
			}},
		{name: "send-longer-than-the-receive", code: rdmap.TermDDPTooLong, rfc: rfcDDP, recv: verbs.WCLocLenErr,
			hostile: func(e *tcEnv) []byte { return e.send(sendMsg(1, 0, true, make([]byte, 17))) }},
		{name: "read-request-too-long", code: rdmap.TermDDPTooLong, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(readReqMsg(1, readOf(e.dst, 0, 64), 4)) }},
		{name: "immediate-too-long", code: rdmap.TermDDPTooLong, rfc: rfcImmDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				b := immMsg(1, rdmap.Immediate{Data: 5})
				return e.send(append(b, 1, 2, 3, 4))
			}},
		{name: "atomic-request-too-long", code: rdmap.TermDDPTooLong, rfc: rfcAtomicDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(append(atomicReqMsg(1, atomicOn(e.dst, 0)), 1, 2, 3, 4)) }},
		{name: "read-request-short", code: rdmap.TermDDPLocalCatastrophic, rfc: rfcDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				return e.send(readReqMsg(1, readOf(e.dst, 0, 64), 0)[:ddp.UntaggedHeaderLen+20])
			}},
		// RFC 7306 §6.3: exactly 8 octets of Immediate Data.
		{name: "immediate-short", code: rdmap.TermDDPLocalCatastrophic, rfc: rfcImmDDP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				return e.send(immMsg(1, rdmap.Immediate{Data: 5})[:ddp.UntaggedHeaderLen+4])
			}},

		// The RDMAP layer.
		{name: "rdmap-version", code: rdmap.TermRDMAPBadVersion, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				b := sendMsg(1, 0, true, []byte("x"))
				b[1] = b[1]&0x3f | 2<<6
				return e.send(b)
			}},
		{name: "opcode-unknown", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(untagged(rdmap.Opcode(0xF), 0, 1, 0, true, []byte("x"))) }},
		{name: "send-tagged", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(taggedMsg(rdmap.OpSend, 5, 0, true, []byte("x"))) }},
		{name: "read-response-unsolicited", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				return e.send(taggedMsg(rdmap.OpReadResponse, e.sink.mr.RKey(), e.sink.mr.Addr(), true, make([]byte, 8)))
			}},
		{name: "read-response-while-an-atomic-is-due", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcAtomicResp, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				e.serverAtomic()
				return e.send(taggedMsg(rdmap.OpReadResponse, e.sink.mr.RKey(), e.sink.mr.Addr(), true, make([]byte, 8)))
			}},
		{name: "immediate-not-negotiated", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcUnsupported, peer: noExt, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(immMsg(1, rdmap.Immediate{Data: 5})) }},
		{name: "immediate-send-missing", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcImmSend, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				e.send(immMsg(1, rdmap.Immediate{Data: 5, Flags: rdmap.ImmSendFollows}))
				return e.send(taggedMsg(rdmap.OpWrite, e.dst.mr.RKey(), e.dst.mr.Addr(), true, []byte("x")))
			}},
		{name: "atomic-not-negotiated", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcUnsupported, peer: noExt, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(atomicReqMsg(1, atomicOn(e.dst, 0))) }},
		{name: "atomic-unknown-operation", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcAOpCode, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				m := atomicOn(e.dst, 0)
				m.Op = 7
				return e.send(atomicReqMsg(1, m))
			}},
		// AOpCode 0x1 is Reserved (RFC 7306 §10.1): RFC 7306 has no Swap.
		{name: "atomic-reserved-operation", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcAOpCode, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				m := atomicOn(e.dst, 0)
				m.Op, m.AddSwapMask = rdmap.AtomicReserved, ^uint64(0)
				return e.send(atomicReqMsg(1, m))
			}},
		{name: "atomic-response-unsolicited", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcAtomicResp, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(atomicRespMsg(1, 1)) }},
		{name: "atomic-response-while-a-read-is-due", code: rdmap.TermRDMAPUnexpectedOp, rfc: rfcAtomicResp, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				e.serverRead()
				return e.send(atomicRespMsg(1, 1))
			}},
		{name: "atomic-response-other-request", code: rdmap.TermRDMAPUnspecified, rfc: rfcAtomicResp, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				m := e.serverAtomic()
				return e.send(atomicRespMsg(1, m.ReqID+1))
			}},
		{name: "read-invalid-stag", code: rdmap.TermRDMAPInvalidSTag, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				rr := readOf(e.dst, 0, 64)
				rr.SrcSTag ^= 0x100
				return e.send(readReqMsg(1, rr, 0))
			}},
		{name: "read-out-of-bounds", code: rdmap.TermRDMAPBaseBounds, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(readReqMsg(1, readOf(e.dst, 4090, 64), 0)) }},
		{name: "read-no-remote-read", code: rdmap.TermRDMAPAccess, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(readReqMsg(1, readOf(e.rbuf, 0, 8), 0)) }},
		{name: "read-other-pd", code: rdmap.TermRDMAPStagNotAssoc, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(readReqMsg(1, readOf(e.other, 0, 64), 0)) }},
		{name: "write-no-remote-write", code: rdmap.TermRDMAPAccess, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				return e.send(taggedMsg(rdmap.OpWrite, e.ro.mr.RKey(), e.ro.mr.Addr(), true, []byte("x")))
			}},
		{name: "atomic-invalid-stag", code: rdmap.TermRDMAPInvalidSTag, rfc: rfcAtomicTarget, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				m := atomicOn(e.dst, 0)
				m.STag ^= 0x100
				return e.send(atomicReqMsg(1, m))
			}},
		{name: "atomic-out-of-bounds", code: rdmap.TermRDMAPBaseBounds, rfc: rfcAtomicTarget, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(atomicReqMsg(1, atomicOn(e.dst, 4096))) }},
		{name: "atomic-no-remote-atomic", code: rdmap.TermRDMAPAccess, rfc: rfcAtomicTarget, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(atomicReqMsg(1, atomicOn(e.ro, 0))) }},
		{name: "atomic-other-pd", code: rdmap.TermRDMAPStagNotAssoc, rfc: rfcAtomicTarget, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(atomicReqMsg(1, atomicOn(e.other, 0))) }},
		{name: "send-invalidate-unknown-stag", code: rdmap.TermRDMAPCannotInvalidate, rfc: rfcRDMAP, recv: verbs.WCRemInvReqErr,
			hostile: func(e *tcEnv) []byte {
				return e.send(untaggedInv(rdmap.OpSendInv, 0x00abcd01, []byte("inv?")))
			}},
		{name: "send-invalidate-other-pd", code: rdmap.TermRDMAPProtCannotInvalidate, rfc: rfcRDMAP, recv: verbs.WCRemInvReqErr,
			hostile: func(e *tcEnv) []byte { return e.send(untaggedInv(rdmap.OpSendInv, e.other.mr.RKey(), []byte("inv?"))) }},
		{name: "read-beyond-ird", code: rdmap.TermRDMAPCatastrophicStream, rfc: rfcRDMAP, srv: ird1, peer: ord1, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				var out []byte
				for msn := uint32(1); msn <= 8; msn++ {
					out = append(out, e.fpdu(readReqMsg(msn, readOf(e.dst, 0, 4096), 0))...)
				}
				e.write(out) // all in one segment: the responder cannot answer in between
				return nil
			}},
		{name: "atomic-beyond-ird", code: rdmap.TermRDMAPCatastrophicStream, rfc: rfcAtomicIRD, srv: ird1, peer: ord1, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte {
				var out []byte
				for msn := uint32(1); msn <= 8; msn++ {
					out = append(out, e.fpdu(atomicReqMsg(msn, atomicOn(e.dst, 0)))...)
				}
				e.write(out)
				return nil
			}},
		// RFC 7306 §8.2 names the code of a word not 64-bit aligned.
		{name: "atomic-misaligned", code: rdmap.TermRDMAPCatastrophicStream, rfc: rfcMisaligned, delivered: true, recv: verbs.WCFlushErr,
			hostile: func(e *tcEnv) []byte { return e.send(atomicReqMsg(1, atomicOn(e.dst, 4))) }},
		{name: "receive-region-gone", code: rdmap.TermRDMAPLocalCatastrophic, rfc: rfcRDMAP, recv: verbs.WCLocProtErr,
			hostile: func(e *tcEnv) []byte {
				if err := e.rbuf.mr.Dereg(); err != nil {
					e.t.Fatal(err)
				}
				return e.send(sendMsg(1, 0, true, []byte("x")))
			}},
		{name: "send-from-a-bad-local-region", code: rdmap.TermRDMAPLocalCatastrophic, rfc: rfcRDMAP, recv: verbs.WCFlushErr,
			// The error is the server's own (its Send names a region it
			// deregistered): the Terminate tells the peer why the stream
			// ends.
			hostile: func(e *tcEnv) []byte {
				e.firstFPDU()
				sge := e.sink.mr.SGE(0, 8)
				gone := e.srv.region(8, verbs.AccessLocalWrite)
				sge.LKey = gone.mr.LKey()
				if err := gone.mr.Dereg(); err != nil {
					e.t.Fatal(err)
				}
				e.srv.post(verbs.SendWR{ID: 9, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sge}})
				if wc := poll(e.t, e.srv.scq, 1)[0]; wc.ID != 9 || wc.Status != verbs.WCLocProtErr {
					e.t.Fatalf("Send completion {id %d %v}, want {id 9 %v}", wc.ID, wc.Status, verbs.WCLocProtErr)
				}
				return nil
			}},
		{name: "receive-without-local-write", code: rdmap.TermRDMAPLocalCatastrophic, rfc: rfcRDMAP, recv: verbs.WCLocAccessErr,
			recvSGE: func(e *tcEnv) verbs.SGE { return e.ro.mr.SGE(0, 16) },
			hostile: func(e *tcEnv) []byte { return e.send(sendMsg(1, 0, true, []byte("x"))) }},
		{name: "receive-outside-its-region", code: rdmap.TermRDMAPLocalCatastrophic, rfc: rfcRDMAP, recv: verbs.WCLocProtErr,
			recvSGE: func(e *tcEnv) verbs.SGE {
				return verbs.SGE{Addr: e.rbuf.mr.Addr(), Length: 32, LKey: e.rbuf.mr.LKey()}
			},
			hostile: func(e *tcEnv) []byte { return e.send(sendMsg(1, 0, true, []byte("x"))) }},
	}
}

// untaggedInv is a one-segment Send with Invalidate (op) of stag.
func untaggedInv(op rdmap.Opcode, stag uint32, payload []byte) []byte {
	h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(op), ULPData: stag, QN: ddp.QNSend, MSN: 1}
	b := make([]byte, h.Len()+len(payload))
	h.Marshal(b)
	copy(b[h.Len():], payload)
	return b
}

// fpdu frames ulpdu as the raw peer's next FPDU without sending it.
func (e *tcEnv) fpdu(ulpdu []byte) []byte {
	e.p.tx.Begin(nil, len(ulpdu))
	e.p.tx.Write(ulpdu)
	return e.p.tx.Finish()
}

// write sends stream octets as they are, in one write.
func (e *tcEnv) write(b []byte) {
	e.t.Helper()
	if _, err := e.p.conn.Write(b); err != nil {
		e.t.Fatal(err)
	}
}

// TestTerminateCodes runs every row of the Terminate code table against
// the engine over an in-memory link, with CRC on and off: a raw peer
// misbehaves as the row says, and the engine must send exactly the row's
// Terminate (on QN 2, MSN 1, its DDP header copied where RFC 5040 §4.8
// has it copied), complete its posted receive with the row's status and
// write no byte outside its regions.
func TestTerminateCodes(t *testing.T) {
	for _, row := range tcRows() {
		for _, crc := range []bool{true, false} {
			if row.crcOn && !crc {
				continue
			}
			t.Run(fmt.Sprintf("%s/crc=%v", row.name, crc), func(t *testing.T) {
				t.Parallel()
				if row.reply != nil {
					runSetupRow(t, row, crc)
					return
				}
				runRow(t, row, crc)
			})
		}
	}
}

// runRow runs a row on a connection the raw peer initiated.
func runRow(t *testing.T, row tcRow, crc bool) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cs := newStack(t, la, cliAddr, 1500)
	srv := newSide(t, on(lb, srvAddr, 1500), "siwtun1", func(c *offload.Config) {
		c.CRC = crc
		c.FPDUTimeout = -1 // no timer: only what arrived can end the stream
		if row.srv != nil {
			row.srv(c)
		}
	}, 8)
	all := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	pd2, err := srv.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	e := &tcEnv{t: t, crc: crc, srv: srv,
		dst: srv.region(4096, all), ro: srv.region(64, verbs.AccessRemoteRead), other: srv.regionPD(pd2, 4096, all),
		rbuf: srv.region(16, verbs.AccessLocalWrite), sink: srv.region(64, verbs.AccessLocalWrite)}
	if err := srv.qp.Modify(verbs.QPInit); err != nil {
		t.Fatal(err)
	}
	sge := e.rbuf.mr.SGE(0, 16)
	if row.recvSGE != nil {
		sge = row.recvSGE(e)
	}
	srv.recv(verbs.RecvWR{ID: 77, SGL: []verbs.SGE{sge}})
	cfg := mpa.Config{Rev: 2, CRC: crc, IRD: 8, ORD: 8, Ext: mpa.ExtAll}
	if row.peer != nil {
		row.peer(&cfg)
	}
	e.p = dialRaw(t, cs, srv, cfg)
	offending := row.hostile(e)
	h, term := e.p.terminate()
	if term.Code != row.code {
		t.Fatalf("Terminate %v, want %v", term.Code, row.code)
	}
	if h.QN != ddp.QNTerminate || h.MSN != 1 || h.MO != 0 || !h.Last {
		t.Fatalf("Terminate DDP header %v, want QN 2 MSN 1 MO 0 L", h)
	}
	if row.delivered && term.HasRDMAPHeader {
		t.Fatalf("Terminate copies an RDMAP header %x for an RFC 7306 message (RFC 7306 §8.1 item 2: none)", term.RDMAPHeader)
	}
	if offending != nil && (copiesDDPHeader(row.code) || row.delivered) {
		n := ddp.HeaderLen(offending[0])
		if !term.HasDDPHeader || !bytes.Equal(term.DDPHeader, offending[:n]) {
			t.Fatalf("Terminate copies DDP header %x (D %v), want %x", term.DDPHeader, term.HasDDPHeader, offending[:n])
		}
		if int(term.DDPSegLen) != len(offending)&0xffff {
			t.Fatalf("Terminate DDP segment length %d, want %d", term.DDPSegLen, len(offending))
		}
	}
	if ev := srv.waitEvent(verbs.EventTerminateSent); ev.Code != row.code {
		t.Fatalf("server reported Terminate %v sent, want %v", ev.Code, row.code)
	}
	srv.waitEvent(verbs.EventDisconnected)
	if wc := poll(t, srv.rcq, 1)[0]; wc.ID != 77 || wc.Status != row.recv {
		t.Fatalf("receive completion {id %d %v}, want {id 77 %v}", wc.ID, wc.Status, row.recv)
	}
	if st := srv.qp.State(); st != verbs.QPErr {
		t.Fatalf("server QP %v after its Terminate, want ERR", st)
	}
	for _, g := range []*guarded{e.dst, e.ro, e.other, e.sink} {
		g.checkGuards(t)
	}
	if row.name != "receive-region-gone" {
		e.rbuf.checkGuards(t)
	}
}

// copiesDDPHeader reports whether a Terminate of code copies the failed
// segment's DDP header (RFC 5040 §4.8; rdmap.NewTerminate).
func copiesDDPHeader(c rdmap.Code) bool {
	t := rdmap.NewTerminate(c, 18, make([]byte, ddp.UntaggedHeaderLen), nil)
	return t.HasDDPHeader
}

// runSetupRow runs a row of connection set-up: the engine initiates, a raw
// responder answers with the row's Reply, and the engine must refuse it
// with the row's Terminate, the stream's first and only FPDU.
func runSetupRow(t *testing.T, row tcRow, crc bool) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cli := newSide(t, on(la, cliAddr, 1500), "siwtun0", func(c *offload.Config) {
		c.CRC = crc
		row.srv(c)
	}, 8)
	ss := newStack(t, lb, srvAddr, 1500)
	l, err := ss.Listen(netipPort(srvPort))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	type answer struct {
		rep   mpa.Frame
		after []byte
		err   error
	}
	got := make(chan answer, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			got <- answer{err: err}
			return
		}
		defer c.Close()
		hdr := make([]byte, mpa.FrameHeaderLen)
		io.ReadFull(c, hdr)
		rest := make([]byte, binary.BigEndian.Uint16(hdr[18:]))
		io.ReadFull(c, rest)
		req, err := mpa.ParseFrame(append(hdr, rest...))
		if err != nil {
			got <- answer{err: err}
			return
		}
		rep := row.reply(req)
		b, err := rep.Append(nil)
		if err == nil {
			_, err = c.Write(b)
		}
		after, _ := io.ReadAll(c)
		got <- answer{rep: rep, after: after, err: err}
	}()
	if err := cli.qp.Connect(ctx, netipPort(srvPort), verbs.ConnParam{}); err == nil {
		t.Fatal("Connect accepted the Reply")
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	var r fpduCollector
	r.rx.Init(crc || a.rep.CRC, false, &r)
	if _, err := r.rx.Write(a.after); err != nil || len(r.ulpdus) != 1 {
		t.Fatalf("after the Reply the initiator sent %x (%d FPDUs, %v), want one Terminate", a.after, len(r.ulpdus), err)
	}
	u := r.ulpdus[0]
	var h ddp.Header
	n, err := h.Unmarshal(u)
	if err != nil {
		t.Fatal(err)
	}
	var term rdmap.Terminate
	if err := term.Unmarshal(u[n:]); err != nil {
		t.Fatal(err)
	}
	if _, op := rdmap.ParseCtrl(h.ULPCtrl); op != rdmap.OpTerminate || h.QN != ddp.QNTerminate || term.Code != row.code {
		t.Fatalf("sent %v %v, want a Terminate %v", h, term.Code, row.code)
	}
	if st := cli.qp.State(); st != verbs.QPInit {
		t.Fatalf("QP state %v after a refused Reply, want INIT", st)
	}
}

// fpduCollector collects the ULPDUs of good FPDUs.
type fpduCollector struct {
	rx     mpa.Receiver
	cur    []byte
	ulpdus [][]byte
}

func (c *fpduCollector) BeginFPDU(n int) error { c.cur = make([]byte, 0, n); return nil }
func (c *fpduCollector) ULPDU(b []byte) error  { c.cur = append(c.cur, b...); return nil }
func (c *fpduCollector) EndFPDU(ok bool) error {
	if !ok {
		return fmt.Errorf("bad CRC")
	}
	c.ulpdus = append(c.ulpdus, c.cur)
	return nil
}

// ibvStatus is the libibverbs name of a completion status, as the doc
// table writes it ("—" for a row of connection set-up: no receive).
func ibvStatus(row tcRow) string {
	if row.reply != nil {
		return "—"
	}
	return map[verbs.WCStatus]string{
		verbs.WCSuccess:      "IBV_WC_SUCCESS",
		verbs.WCLocLenErr:    "IBV_WC_LOC_LEN_ERR",
		verbs.WCLocQPOpErr:   "IBV_WC_LOC_QP_OP_ERR",
		verbs.WCLocProtErr:   "IBV_WC_LOC_PROT_ERR",
		verbs.WCFlushErr:     "IBV_WC_WR_FLUSH_ERR",
		verbs.WCLocAccessErr: "IBV_WC_LOC_ACCESS_ERR",
		verbs.WCRemInvReqErr: "IBV_WC_REM_INV_REQ_ERR",
	}[row.recv]
}

// TestTerminateCodesDoc: doc/terminate-codes.md's table has exactly the
// rows of tcRows, in the same order, each with the row's Terminate (as
// rdmap.Code's String writes it), the status its posted receive completes
// with, and its RFC.
func TestTerminateCodesDoc(t *testing.T) {
	f, err := os.Open("../doc/terminate-codes.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var doc [][]string
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "| Row |"):
			in = true
		case in && strings.HasPrefix(line, "| ---"):
		case in && strings.HasPrefix(line, "|"):
			var cells []string
			for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
				cells = append(cells, strings.Trim(strings.TrimSpace(c), "`"))
			}
			doc = append(doc, cells)
		default:
			in = false
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	rows := tcRows()
	for i := range max(len(rows), len(doc)) {
		switch {
		case i >= len(doc):
			t.Errorf("row %q (%v) is not in the doc's table", rows[i].name, rows[i].code)
		case len(doc[i]) != 5:
			t.Errorf("doc row %d has %d cells, want 5 (Row, Condition, Terminate, Posted receive, RFC): %q", i+1, len(doc[i]), doc[i])
		case i >= len(rows):
			t.Errorf("doc row %q has no row in tcRows", doc[i][0])
		case doc[i][0] != rows[i].name || doc[i][2] != rows[i].code.String() || doc[i][3] != ibvStatus(rows[i]) || doc[i][4] != rows[i].rfc:
			t.Errorf("doc row %d is %q | %q | %q | %q, want %q | %q | %q | %q", i+1, doc[i][0], doc[i][2], doc[i][3], doc[i][4],
				rows[i].name, rows[i].code.String(), ibvStatus(rows[i]), rows[i].rfc)
		case doc[i][1] == "":
			t.Errorf("doc row %q says no condition", doc[i][0])
		}
	}
}
