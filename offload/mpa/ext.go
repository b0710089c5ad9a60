package mpa

import (
	"strconv"
	"strings"
)

// Ext is a set of RDMAP extensions (RFC 7306) a siwtun RNIC supports on a
// connection. RFC 7306 gives them no negotiation of their own, and a peer
// without them (Linux siw) terminates the stream at the first extended
// opcode, so siwtun announces them in an extension block at the end of
// the MPA private data (see ExtBlockLen): an initiator that offers
// extensions appends the block to its Request; a responder that supports
// some of them answers with a block of its own only to a Request that had
// one, carrying what both support; the connection uses what the Reply's
// block says (Params.Ext). The block is not part of the ULP's private data:
// ParseFrame takes it off, and Config.Request leaves it out when the
// private data would not fit with it.
//
// Why not a reserved bit of the frame header: Linux siw builds its Reply
// from the Request's flag word (the key swapped), so a reserved bit an
// initiator set would come back in siw's Reply as if siw had set it.
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

// ExtAll is every extension this implementation supports.
const ExtAll = ExtImmediate | ExtAtomic

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
	if rest := e &^ ExtAll; rest != 0 {
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
