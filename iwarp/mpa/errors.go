package mpa

import "fmt"

// LLP/MPA Terminate error codes (RFC 5040 Terminate message, Layer 2
// "LLP", EType 0), with the RFC 6581 additions. An [Error]'s Code is one of
// these, so the engine can put it into a Terminate message unchanged.
const (
	CodeConnectionLost    uint8 = 0x01 // TCP connection closed, terminated or lost
	CodeCRCError          uint8 = 0x02 // MPA CRC error
	CodeMarkerMismatch    uint8 = 0x03 // Marker and ULPDU_Length mismatch
	CodeInvalidFrame      uint8 = 0x04 // invalid MPA Request or Reply frame
	CodeLocalCatastrophic uint8 = 0x05 // local catastrophic error (RFC 6581)
	CodeInsufficientIRD   uint8 = 0x06 // insufficient IRD resources (RFC 6581)
	CodeNoMatchingRTR     uint8 = 0x07 // no matching RTR option (RFC 6581)
)

// Error is an MPA protocol error. Code is the LLP/MPA Terminate error code
// (see CodeCRCError and friends) that describes it on the wire.
type Error struct {
	Code uint8  // LLP/MPA Terminate error code
	Msg  string // what happened, in plain words
	Err  error  // underlying cause, if any
}

// Error returns "mpa: <Msg>[: <Err>] (terminate code 0xNN)".
func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("mpa: %s: %v (terminate code 0x%02x)", e.Msg, e.Err, e.Code)
	}
	return fmt.Sprintf("mpa: %s (terminate code 0x%02x)", e.Msg, e.Code)
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// newError builds an *Error with a formatted message.
func newError(code uint8, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// RejectedError reports an MPA Reply with the R (reject) bit set: the peer
// refused the connection. PrivateData is the ULP private data the peer sent
// with the rejection (after any RFC 6581 IRD/ORD block).
type RejectedError struct {
	PrivateData []byte
}

// Error returns "mpa: peer rejected the connection" and the size of the
// private data that came with it.
func (e *RejectedError) Error() string {
	if len(e.PrivateData) == 0 {
		return "mpa: peer rejected the connection"
	}
	return fmt.Sprintf("mpa: peer rejected the connection (%d bytes of private data)", len(e.PrivateData))
}
