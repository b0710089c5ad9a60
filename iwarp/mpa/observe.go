package mpa

// Marker describes one Marker a Receiver took out of the stream.
type Marker struct {
	// Offset is the stream offset of the Marker's first octet (a multiple
	// of MarkerInterval).
	Offset uint64
	// FPDUPTR is the Marker's FPDUPTR field as sent (low two bits
	// included).
	FPDUPTR uint16
	// FPDUStart is the stream offset of the FPDU the Marker belongs to: the
	// one it must point at. A Marker on an FPDU boundary belongs to the
	// FPDU that follows it.
	FPDUStart uint64
	// Want is the FPDUPTR that points at FPDUStart (the distance from the
	// FPDU's first octet to the Marker); WantAlt is the other accepted
	// reading, 4 less, when the FPDU begins with a leading Marker and this
	// is a later one (else equal to Want).
	Want, WantAlt uint16
	// OK says whether FPDUPTR (low two bits ignored) is Want or WantAlt.
	OK bool
	// Reading is the reading the FPDUPTR matched when the two differ.
	Reading MarkerPtr
}

// MarkerObserver may be implemented by a Handler that wants to see every
// Marker the Receiver removes (a capture checker, a tracer). When the
// Handler implements it, a bad Marker is reported to Marker instead of
// stopping the Receiver: a nil return lets the stream go on (the Marker is
// still counted in ReceiverStats.BadMarkers), an error stops it and is
// returned from Write as is.
type MarkerObserver interface {
	Marker(m Marker) error
}

// FPDUWireLen returns the number of stream octets of an FPDU carrying
// ulpduLen octets of ULPDU that starts at stream offset off: ULPDU_Length,
// ULPDU, pad, CRC and, with markers, the Markers that fall into it (a
// Marker at off belongs to it, one right after its CRC to the next FPDU).
// It is what a Sender's WireLen would say at that offset.
func FPDUWireLen(off uint64, ulpduLen int, markers bool) int {
	n := ulpduLenLen + ulpduLen + padLen(ulpduLen) + crcLen
	if markers {
		n += MarkerLen * markersIn(off, n)
	}
	return n
}
