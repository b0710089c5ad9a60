package mpa

import (
	"strconv"
	"strings"
)

// Ext is what a siwtun RNIC announces to another in the extension block
// at the end of the MPA private data (see ExtBlockLen): the RDMAP
// extensions (RFC 7306) it supports on the connection, and, in a Reply,
// ExtReady. RFC 7306 gives its extensions no negotiation of their own,
// and a peer without them (Linux siw) terminates the stream at the first
// extended opcode, so an initiator that offers extensions appends the
// block to its Request; a responder answers with a block of its own only
// to a Request that had one, carrying the extensions both support (and
// ExtReady); the connection uses the extensions the Reply's block names
// (Params.Ext). The block is not part of the ULP's private data:
// ParseFrame takes it off, and Config.Request leaves it out when the
// private data would not fit with it.
//
// Why not the reserved bits of the frame header: RFC 5044 §7.1 has them
// sent as zero, a strict peer may refuse a frame that sets one, and Linux
// siw builds its Reply from the Request's flags octet (the key swapped),
// so a reserved bit an initiator set would come back in siw's Reply as if
// siw had set it. The private data is the room the RFCs leave to what
// the two ends agree between themselves.
type Ext uint8

// Extensions.
const (
	// ExtImmediate is RFC 7306's Immediate Data (opcodes 0x8, 0x9): RDMA
	// Write with Immediate Data and siwtun's Send with Immediate Data.
	ExtImmediate Ext = 1 << iota
	// ExtAtomic is RFC 7306's atomic operations (opcodes 0xA, 0xB):
	// Fetch-and-Add and Compare-and-Swap on the peer's memory.
	ExtAtomic
)

// ExtAll is every RDMAP extension this implementation supports.
const ExtAll = ExtImmediate | ExtAtomic

// ExtReady, in a Reply's block only, says that the responder reads FPDUs
// that arrive right after its Reply (its receive path owns the stream
// before the Reply leaves), so the initiator need not hold its first FPDU
// or RTR back (the engine's Config.FirstFPDUDelay, for Linux siw, which
// hands its socket to its receive path only after its Reply has gone).
// It is not an RDMAP extension. It is safe to trust because a Request
// never carries it: a peer that echoes the Request's private data in its
// Reply (an application may) cannot claim it by accident.
const ExtReady Ext = 0x80

// String returns the extensions joined by "|" ("imm|atomic"), or "none".
func (e Ext) String() string {
	if e == 0 {
		return "none"
	}
	var parts []string
	if e&ExtImmediate != 0 {
		parts = append(parts, "imm")
	}
	if e&ExtAtomic != 0 {
		parts = append(parts, "atomic")
	}
	if e&ExtReady != 0 {
		parts = append(parts, "ready")
	}
	if rest := e &^ (ExtAll | ExtReady); rest != 0 {
		parts = append(parts, "0x"+strconv.FormatUint(uint64(rest), 16))
	}
	return strings.Join(parts, "|")
}

// The extension block, the last ExtBlockLen octets of a frame's private
// data:
//
//	octets 0..5  "siwtun"
//	octet  6     extVersion (1)
//	octet  7     Ext, never 0
//
// Private data that ends otherwise (another version, or an Ext of 0) has
// no block: it is all the ULP's.
const (
	// ExtBlockLen is the length of the extension block.
	ExtBlockLen = 8
	extMagic    = "siwtun"
	extVersion  = 1
)

// appendExtBlock appends the extension block announcing e to b.
func appendExtBlock(b []byte, e Ext) []byte {
	b = append(b, extMagic...)
	return append(b, extVersion, byte(e))
}

// SplitExtBlock returns the ULP private data of pd (a frame's private data
// after any IRD/ORD block) and the extensions of the extension block at
// its end, or pd and 0 when it has none.
func SplitExtBlock(pd []byte) ([]byte, Ext) {
	n := len(pd) - ExtBlockLen
	if n < 0 {
		return pd, 0
	}
	b := pd[n:]
	if string(b[:len(extMagic)]) != extMagic || b[6] != extVersion || b[7] == 0 {
		return pd, 0
	}
	return pd[:n], Ext(b[7])
}
