package inspect

import "sort"

// maxEnds is how many of the latest FPDU ends a direction keeps for
// judging retransmissions: 128 Ki, several MB of stream even for the
// smallest FPDUs, far more than TCP keeps in flight.
const maxEnds = 1 << 17

// judgeRetransmission sets rep.Aligned for a retransmitted segment of n
// octets from seq, all already seen: it is FPDU-aligned when it starts and
// ends on FPDU boundaries of the stream walked (it then holds only whole
// FPDUs). Octets of the MPA frames, or too old to be among the FPDU ends
// kept, are not judged.
func (d *dir) judgeRetransmission(rep *Report, seq uint32, n int) {
	if d.phase != phaseFPDU {
		return
	}
	start, ok1 := d.onGrid(seq)
	end, ok2 := d.onGrid(seq + uint32(n))
	if !ok1 || !ok2 {
		return
	}
	aligned := start && end
	rep.Aligned = &aligned
	d.sum.RetransJudged++
	if aligned {
		d.sum.RetransAligned++
	}
}

// onGrid reports whether the octet at seq (at most next) starts an FPDU
// of the stream walked (or follows the last one), and whether that can be
// told.
func (d *dir) onGrid(seq uint32) (is, known bool) {
	back := uint64(d.next - seq)
	if back > d.fpos {
		return false, false // before the FPDU stream
	}
	off := d.fpos - back
	if off == 0 || off == d.lastEnd {
		return true, true
	}
	if len(d.ends) == 0 || off < d.ends[0] {
		return false, false
	}
	i := sort.Search(len(d.ends), func(i int) bool { return d.ends[i] >= off })
	return i < len(d.ends) && d.ends[i] == off, true
}
