// Package inspect checks the iWARP traffic of TCP connections segment by
// segment, as seen on the wire: in a capture file of any implementation,
// or live from a siwtun device's segment tap.
//
// An [Analyzer] is fed TCP segments (both directions, in capture order).
// For each connection it reassembles each direction, reads the MPA Request
// and Reply (which say, per direction, whether CRCs and Markers are in use
// and where the FPDU stream starts), and then walks the FPDUs with the
// engine's own MPA receiver ([mpa.Receiver], with an [mpa.MarkerObserver]),
// so the checker and the RNIC cannot disagree about what is valid. For
// every segment it returns a [Report]:
//
//   - where its payload sits in the FPDU stream (stream offset 0 is the
//     first octet of the first FPDU, the reference point of the Markers);
//   - the FPDUs in it, whole or in part, with their DDP/RDMAP headers
//     (opcode, STag/TO or QN/MSN/MO) and their CRC verdict;
//   - every Marker in it: its stream offset (a multiple of 512), its
//     FPDUPTR, and whether that points at the right FPDU header;
//   - whether the segment is FPDU-aligned: it starts with an FPDU (or a
//     Marker and then an FPDU: a Marker on an FPDU boundary belongs to the
//     FPDU that follows) and holds only whole FPDUs. If not, which FPDU was
//     split and by how much.
//
// Retransmitted octets are walked once; a segment that carries nothing new
// is a retransmission, judged FPDU-aligned when it starts and ends on FPDU
// boundaries of the stream walked. Segments that arrive ahead of a gap are
// held and analysed when the gap is filled. A live reader that
// missed segments (a watch that left out a window) says which sequence
// ranges passed unseen ([Analyzer.NotObserved]): a segment ahead of such
// octets is not out of order, the octets are counted as not observed, and
// the FPDU stream is picked up again at the next boundary the checker can
// verify (a matching CRC, a Marker, a valid header chain).
// [Analyzer.Summary] sums it all up per connection direction.
package inspect
