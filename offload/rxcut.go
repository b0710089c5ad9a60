package offload

import (
	"fmt"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// When a header error goes out, with CRC on.
//
// An FPDU's DDP and RDMAP headers arrive before the CRC that covers them,
// at the FPDU's end, up to 65,535 octets later. An RNIC placing
// cut-through, as this receiver does (each segment's payload goes to its
// target as it arrives, as in Linux siw and RNICs that do not buffer whole
// FPDUs), validates a DDP segment's header before it places any of its
// payload and, when a check fails, places none of the segment's rest and
// reports the error with the segment's DDP header and length (RFC 5041
// §7.1; the codes of RFC 5041 §7.2 and RFC 5040 §7.1). Until the CRC
// has been checked it cannot tell a header the peer sent that way from one
// damaged on the wire in a way TCP's checksum missed (RFC 5044 §8: that is
// the MPA CRC error, LLP / MPA 0x02).
//
// This receiver decides by what it holds:
//
//   - The rest of the FPDU arrived with its header (a read handed over the
//     CRC too; the normal case, a sender aligning one FPDU per segment):
//     the error waits for the CRC, which costs no time. A bad CRC makes it
//     the CRC error; MPA delivers nothing after its first error (RFC 5044
//     §8), so the header's error is then dropped.
//   - The read that brought the header ended before the FPDU's CRC (the
//     FPDU spans segments still to come, or its rest never comes): the
//     header's error goes out at once, as the header shows it (readDone).
//     The receiver holds no verdict hostage to octets that may never come
//     (a peer announcing 65,517 octets toward a 16-octet receive buffer,
//     then stalling), and it cannot report a CRC error it never saw. Such
//     errors are counted in ErrorsBeforeCRC.
//
// With CRC off there is nothing to wait for: every error goes out as it
// is found (fail).

// readDone runs when a read has handed the receiver every octet that had
// arrived. An error still waiting for its FPDU's CRC goes out now: the CRC
// did not come with it (see above). A Marker's error (mpa.Receiver.Pending)
// comes first: when the framing is in doubt, so is the header it framed.
func (r *rxState) readDone() error {
	if me := r.mpa.Pending(); me != nil {
		r.inFPDU, r.deferred = false, nil
		r.qp.stats.ErrorsBeforeCRC.Add(1)
		return r.fail(rdmapCodeForMPA(me.Code), ibv.WCLocQPOpErr, fmt.Errorf("%w (its FPDU's CRC not yet arrived)", me))
	}
	d := r.deferred
	if d == nil {
		return nil
	}
	r.inFPDU, r.deferred = false, nil
	r.qp.stats.ErrorsBeforeCRC.Add(1)
	return r.fail(d.code, d.local, fmt.Errorf("%w (found in the header, %d octets of its FPDU not yet arrived)", d.cause, r.mpa.Awaiting()))
}
