package rdmap

import (
	"fmt"
	"strings"
)

// Layer is the layer field of a Terminate message: the protocol layer that
// detected the error (RFC 5040 §4.8).
type Layer uint8

// Layers (RFC 5040 §4.8; siw TERM_ERROR_LAYER_*).
const (
	// LayerRDMAP is an error detected by RDMAP.
	LayerRDMAP Layer = 0
	// LayerDDP is an error detected by DDP.
	LayerDDP Layer = 1
	// LayerLLP is an error detected by the lower layer protocol (MPA).
	LayerLLP Layer = 2
)

// String returns "RDMAP", "DDP", "LLP" or "layer(N)".
func (l Layer) String() string {
	switch l {
	case LayerRDMAP:
		return "RDMAP"
	case LayerDDP:
		return "DDP"
	case LayerLLP:
		return "LLP"
	}
	return fmt.Sprintf("layer(%d)", uint8(l))
}

// Error types, per layer (RFC 5040 §7.1, RFC 5041 §7.2, RFC 5044 §8,
// IANA "RDDP" registry).
const (
	// ETypeRDMAPLocalCatastrophic is RDMAP's Local Catastrophic Error.
	ETypeRDMAPLocalCatastrophic = 0
	// ETypeRDMAPRemoteProtection is RDMAP's Remote Protection Error.
	ETypeRDMAPRemoteProtection = 1
	// ETypeRDMAPRemoteOperation is RDMAP's Remote Operation Error.
	ETypeRDMAPRemoteOperation = 2
	// ETypeDDPLocalCatastrophic is DDP's Local Catastrophic error.
	ETypeDDPLocalCatastrophic = 0
	// ETypeDDPTagged is DDP's Tagged Buffer Error.
	ETypeDDPTagged = 1
	// ETypeDDPUntagged is DDP's Untagged Buffer Error.
	ETypeDDPUntagged = 2
	// ETypeLLPMPA is the LLP's only error type, MPA error.
	ETypeLLPMPA = 0
)

// Code is a Terminate error code: Layer, EType and Error Code packed as
// they are on the wire, i.e. the upper 16 bits of the Terminate Control
// field: layer in bits 15..12, etype in 11..8, error code in 7..0.
//
// Code is an integer rather than a struct so that every defined error can
// be a named constant (the package has no variables); build others with
// MakeCode and take them apart with Layer, EType and ECode.
type Code uint16

// MakeCode packs a layer, error type and error code. Layer and etype are
// truncated to their 4-bit fields.
func MakeCode(layer Layer, etype, ecode uint8) Code {
	return Code(uint16(layer&0xF)<<12 | uint16(etype&0xF)<<8 | uint16(ecode))
}

// Layer returns the layer that detected the error.
func (c Code) Layer() Layer { return Layer(c >> 12) }

// EType returns the error type, whose meaning depends on the layer.
func (c Code) EType() uint8 { return uint8(c>>8) & 0xF }

// ECode returns the error code, whose meaning depends on layer and etype.
func (c Code) ECode() uint8 { return uint8(c) }

// Terminate error codes: every entry of RFC 5040 §7.1 (RDMAP), RFC 5041
// §7.2 (DDP) and RFC 5044 §8 plus RFC 6581 (LLP), as registered by IANA
// (RDDP registry, RFC 6580) and as used by Linux siw (iwarp.h) and decoded
// by Wireshark. Protection errors (etype 1) and operation errors (etype 2)
// of RDMAP share one code space; STag cannot be invalidated (0x09) and
// Unspecified (0xFF) exist under both etypes.
const (
	// TermRDMAPLocalCatastrophic is RDMAP Local Catastrophic Error
	// (0/0/any; IANA registers it for ALL error codes, this constant uses
	// 0x00; Linux siw sends 0xFF when a QP is moved to TERMINATE).
	TermRDMAPLocalCatastrophic Code = 0x0000

	// TermRDMAPInvalidSTag is Remote Protection / Invalid STag (0/1/0x00).
	TermRDMAPInvalidSTag Code = 0x0100
	// TermRDMAPBaseBounds is Remote Protection / Base or bounds violation
	// (0/1/0x01).
	TermRDMAPBaseBounds Code = 0x0101
	// TermRDMAPAccess is Remote Protection / Access rights violation
	// (0/1/0x02).
	TermRDMAPAccess Code = 0x0102
	// TermRDMAPStagNotAssoc is Remote Protection / STag not associated
	// with RDMAP Stream (0/1/0x03).
	TermRDMAPStagNotAssoc Code = 0x0103
	// TermRDMAPTOWrap is Remote Protection / TO wrap (0/1/0x04).
	TermRDMAPTOWrap Code = 0x0104
	// TermRDMAPProtCannotInvalidate is Remote Protection / STag cannot be
	// invalidated (0/1/0x09). siw uses it when the invalidation of a Send
	// with Invalidate fails for lack of access rights.
	TermRDMAPProtCannotInvalidate Code = 0x0109
	// TermRDMAPProtUnspecified is Remote Protection / Unspecified Error
	// (0/1/0xFF).
	TermRDMAPProtUnspecified Code = 0x01FF

	// TermRDMAPBadVersion is Remote Operation / Invalid RDMAP version
	// (0/2/0x05).
	TermRDMAPBadVersion Code = 0x0205
	// TermRDMAPUnexpectedOp is Remote Operation / Unexpected OpCode
	// (0/2/0x06).
	TermRDMAPUnexpectedOp Code = 0x0206
	// TermRDMAPCatastrophicStream is Remote Operation / Catastrophic error,
	// localized to RDMAP Stream (0/2/0x07). siw sends it when a peer
	// exceeds the IRD.
	TermRDMAPCatastrophicStream Code = 0x0207
	// TermRDMAPCatastrophicGlobal is Remote Operation / Catastrophic error,
	// global (0/2/0x08).
	TermRDMAPCatastrophicGlobal Code = 0x0208
	// TermRDMAPCannotInvalidate is Remote Operation / STag cannot be
	// invalidated (0/2/0x09).
	TermRDMAPCannotInvalidate Code = 0x0209
	// TermRDMAPUnspecified is Remote Operation / Unspecified Error
	// (0/2/0xFF).
	TermRDMAPUnspecified Code = 0x02FF

	// TermDDPLocalCatastrophic is DDP Local Catastrophic (1/0/0x00).
	TermDDPLocalCatastrophic Code = 0x1000

	// TermDDPTaggedInvalidSTag is Tagged Buffer / Invalid STag (1/1/0x00).
	TermDDPTaggedInvalidSTag Code = 0x1100
	// TermDDPTaggedBaseBounds is Tagged Buffer / Base or bounds violation
	// (1/1/0x01).
	TermDDPTaggedBaseBounds Code = 0x1101
	// TermDDPTaggedStagNotAssoc is Tagged Buffer / STag not associated with
	// DDP Stream (1/1/0x02).
	TermDDPTaggedStagNotAssoc Code = 0x1102
	// TermDDPTaggedTOWrap is Tagged Buffer / TO wrap (1/1/0x03).
	TermDDPTaggedTOWrap Code = 0x1103
	// TermDDPTaggedBadVersion is Tagged Buffer / Invalid DDP version
	// (1/1/0x04).
	TermDDPTaggedBadVersion Code = 0x1104

	// TermDDPInvalidQN is Untagged Buffer / Invalid QN (1/2/0x01).
	TermDDPInvalidQN Code = 0x1201
	// TermDDPNoBuffer is Untagged Buffer / Invalid MSN - no buffer
	// available (1/2/0x02). siw also uses it for a message longer than the
	// posted receive buffer.
	TermDDPNoBuffer Code = 0x1202
	// TermDDPInvalidMSN is Untagged Buffer / Invalid MSN - MSN range is
	// not valid (1/2/0x03).
	TermDDPInvalidMSN Code = 0x1203
	// TermDDPInvalidMO is Untagged Buffer / Invalid MO (1/2/0x04).
	TermDDPInvalidMO Code = 0x1204
	// TermDDPTooLong is Untagged Buffer / DDP Message too long for
	// available buffer (1/2/0x05).
	TermDDPTooLong Code = 0x1205
	// TermDDPUntaggedBadVersion is Untagged Buffer / Invalid DDP version
	// (1/2/0x06).
	TermDDPUntaggedBadVersion Code = 0x1206

	// TermLLPConnLost is MPA / TCP connection closed, terminated or lost
	// (2/0/0x01).
	TermLLPConnLost Code = 0x2001
	// TermLLPCRC is MPA / MPA CRC error (2/0/0x02).
	TermLLPCRC Code = 0x2002
	// TermLLPMarker is MPA / Marker and ULPDU_Length field mismatch
	// (2/0/0x03).
	TermLLPMarker Code = 0x2003
	// TermLLPBadFrame is MPA / Invalid MPA Request or Reply frame
	// (2/0/0x04).
	TermLLPBadFrame Code = 0x2004
	// TermLLPLocalCatastrophic is MPA / Local catastrophic error
	// (2/0/0x05, RFC 6581 enhanced connection establishment).
	TermLLPLocalCatastrophic Code = 0x2005
	// TermLLPInsufficientIRD is MPA / Insufficient IRD resources
	// (2/0/0x06, RFC 6581).
	TermLLPInsufficientIRD Code = 0x2006
	// TermLLPNoMatchingRTR is MPA / No matching RTR option (2/0/0x07,
	// RFC 6581).
	TermLLPNoMatchingRTR Code = 0x2007
)

// etypeName returns the error type in words, e.g. "remote protection".
func (c Code) etypeName() string {
	switch c.Layer() {
	case LayerRDMAP:
		switch c.EType() {
		case ETypeRDMAPLocalCatastrophic:
			return "local catastrophic"
		case ETypeRDMAPRemoteProtection:
			return "remote protection"
		case ETypeRDMAPRemoteOperation:
			return "remote operation"
		}
	case LayerDDP:
		switch c.EType() {
		case ETypeDDPLocalCatastrophic:
			return "local catastrophic"
		case ETypeDDPTagged:
			return "tagged buffer"
		case ETypeDDPUntagged:
			return "untagged buffer"
		case 3:
			return "reserved for LLP"
		}
	case LayerLLP:
		if c.EType() == ETypeLLPMPA {
			return "MPA"
		}
	}
	return fmt.Sprintf("etype %d", c.EType())
}

// ecodeName returns the error code in words, e.g. "invalid STag".
func (c Code) ecodeName() string {
	e := c.ECode()
	switch c.Layer() {
	case LayerRDMAP:
		if c.EType() == ETypeRDMAPLocalCatastrophic {
			return "local catastrophic error"
		}
		switch e {
		case 0x00:
			return "invalid STag"
		case 0x01:
			return "base or bounds violation"
		case 0x02:
			return "access rights violation"
		case 0x03:
			return "STag not associated with RDMAP stream"
		case 0x04:
			return "TO wrap"
		case 0x05:
			return "invalid RDMAP version"
		case 0x06:
			return "unexpected opcode"
		case 0x07:
			return "catastrophic error, localized to RDMAP stream"
		case 0x08:
			return "catastrophic error, global"
		case 0x09:
			return "STag cannot be invalidated"
		case 0xFF:
			return "unspecified error"
		}
	case LayerDDP:
		switch c.EType() {
		case ETypeDDPLocalCatastrophic:
			return "local catastrophic error"
		case ETypeDDPTagged:
			switch e {
			case 0x00:
				return "invalid STag"
			case 0x01:
				return "base or bounds violation"
			case 0x02:
				return "STag not associated with DDP stream"
			case 0x03:
				return "TO wrap"
			case 0x04:
				return "invalid DDP version"
			}
		case ETypeDDPUntagged:
			switch e {
			case 0x01:
				return "invalid QN"
			case 0x02:
				return "invalid MSN - no buffer available"
			case 0x03:
				return "invalid MSN - MSN range is not valid"
			case 0x04:
				return "invalid MO"
			case 0x05:
				return "DDP message too long for available buffer"
			case 0x06:
				return "invalid DDP version"
			}
		}
	case LayerLLP:
		switch e {
		case 0x01:
			return "TCP connection closed, terminated or lost"
		case 0x02:
			return "MPA CRC error"
		case 0x03:
			return "marker and ULPDU length mismatch"
		case 0x04:
			return "invalid MPA request or reply frame"
		case 0x05:
			return "local catastrophic error"
		case 0x06:
			return "insufficient IRD resources"
		case 0x07:
			return "no matching RTR option"
		}
	}
	return "unknown error code"
}

// String returns layer, error type and error code, e.g.
// "RDMAP/remote-protection/invalid STag (0x00)".
func (c Code) String() string {
	return fmt.Sprintf("%s/%s/%s (0x%02x)", c.Layer(),
		strings.ReplaceAll(c.etypeName(), " ", "-"), c.ecodeName(), c.ECode())
}

// Error is an error that maps to a Terminate code. The engine returns it
// from deep inside its receive path; whoever sends the Terminate extracts
// the code with errors.As.
type Error struct {
	// Code is the Terminate error code to report to the peer.
	Code Code
	// Msg describes the failure locally; it is not sent.
	Msg string
	// Err is the error wrapped by Errorf's %w verb, if any.
	Err error
}

// Errorf returns an *Error for code whose message is formatted as by
// fmt.Errorf; an error operand of %w is kept in Err and visible to
// errors.Is and errors.As.
func Errorf(code Code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	e := &Error{Code: code, Msg: err.Error()}
	if inner, ok := err.(interface{ Unwrap() error }); ok {
		e.Err = inner.Unwrap()
	} else if _, ok := err.(interface{ Unwrap() []error }); ok {
		e.Err = err
	}
	return e
}

// Error returns e.g. "rdmap: remote protection error: invalid STag: stag
// 0x1234 not registered": the layer, the error type, the error code and
// the message.
func (e *Error) Error() string {
	s := strings.ToLower(e.Code.Layer().String()) + ": " + e.Code.etypeName() + " error: " + e.Code.ecodeName()
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// Unwrap returns the error wrapped by Errorf, if any.
func (e *Error) Unwrap() error { return e.Err }
