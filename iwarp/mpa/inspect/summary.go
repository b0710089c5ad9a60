package inspect

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
)

// DirSummary sums up one direction of a connection.
type DirSummary struct {
	// Conn numbers the connection (1 = first seen).
	Conn int `json:"conn"`
	// Src and Dst are the sender and the receiver.
	Src netip.AddrPort `json:"src"`
	Dst netip.AddrPort `json:"dst"`
	// Role is "initiator" or "responder" (empty: no MPA Request seen).
	Role string `json:"role,omitempty"`
	// Frame is the MPA Request or Reply this side sent.
	Frame string `json:"frame,omitempty"`
	// CRC and Markers are the MPA mode of this direction.
	CRC     bool `json:"crc"`
	Markers bool `json:"markers"`
	// Segments counts every segment, DataSegments those with payload,
	// FPDUSegments those whose FPDU octets were analysed and Aligned the
	// FPDU-aligned ones among them.
	Segments     int `json:"segments"`
	DataSegments int `json:"data_segments"`
	FPDUSegments int `json:"fpdu_segments"`
	Aligned      int `json:"aligned"`
	// FPDUs counts complete FPDUs; CRCGood and CRCBad their CRC verdicts
	// (both 0 when CRC is off).
	FPDUs   int `json:"fpdus"`
	CRCGood int `json:"crc_good"`
	CRCBad  int `json:"crc_bad"`
	// MarkersOK and MarkersBad count Markers by verdict.
	MarkersOK  int `json:"markers_ok"`
	MarkersBad int `json:"markers_bad"`
	// Retransmissions counts segments with nothing new, Held those that
	// arrived ahead of a gap, Undecoded those that could not be analysed.
	Retransmissions int `json:"retransmissions"`
	// RetransJudged counts the retransmissions whose alignment could be
	// told (their octets are FPDU octets recent enough) and
	// RetransAligned the FPDU-aligned ones among them: they start and end
	// on FPDU boundaries of the stream.
	RetransJudged  int `json:"retransmissions_judged"`
	RetransAligned int `json:"retransmissions_aligned"`
	Held           int `json:"held"`
	Undecoded      int `json:"undecoded"`
	// NotObserved counts the octets skipped because a live watch left
	// them out, Resyncs the times the FPDU stream was picked up again
	// after such octets, and Unsynced the segments not analysed while
	// looking for a boundary to pick it up at.
	NotObserved uint64 `json:"not_observed,omitempty"`
	Resyncs     int    `json:"resyncs,omitempty"`
	Unsynced    int    `json:"unsynced,omitempty"`
	// Note says why the direction could not be (fully) analysed.
	Note string `json:"note,omitempty"`
}

// AlignedPercent is the share of FPDU segments that are aligned, in
// percent (100 when there are none).
func (s *DirSummary) AlignedPercent() float64 {
	if s.FPDUSegments == 0 {
		return 100
	}
	return 100 * float64(s.Aligned) / float64(s.FPDUSegments)
}

// Summary returns a summary per direction of every connection seen, in
// the order the connections appeared (the side that sent the first
// segment first). Octets still held ahead of a gap are noted.
func (a *Analyzer) Summary() []DirSummary {
	var out []DirSummary
	for i, c := range a.list {
		for _, d := range c.dirs {
			out = append(out, d.summary(i+1))
		}
	}
	return out
}

// DirSummary returns the summary of the direction src → dst as Summary
// gives it, and its index in Summary's list; false if no segment of its
// connection was seen.
func (a *Analyzer) DirSummary(src, dst netip.AddrPort) (DirSummary, int, bool) {
	c := a.conns[keyOf(src, dst)]
	if c == nil {
		return DirSummary{}, 0, false
	}
	for i, x := range a.list {
		if x != c {
			continue
		}
		j := 0
		if c.dirs[1].src == src {
			j = 1
		}
		return c.dirs[j].summary(i + 1), 2*i + j, true
	}
	return DirSummary{}, 0, false
}

// summary sums up d, a direction of connection conn.
func (d *dir) summary(conn int) DirSummary {
	s := d.sum
	s.Conn = conn
	if s.Note == "" {
		switch {
		case len(d.held) > 0:
			s.Note = fmt.Sprintf("%d segments never analysed: the capture lacks octets at seq %d", len(d.held), d.next)
		case len(d.pend) > 0 || d.phase == phaseWait:
			s.Note = "the peer's MPA frame was not captured"
		case d.phase == phaseOther:
			s.Note = "not MPA"
		case d.phase == phaseStart && s.DataSegments > 0:
			s.Note = "the start of this direction was not captured"
		}
	}
	return s
}

// WriteSummary prints sums as a table, one row per direction.
func WriteSummary(w io.Writer, sums []DirSummary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONN\tDIRECTION\tROLE\tMPA\tSEGMENTS\tALIGNED\tFPDUS\tCRC\tMARKERS\tRETX\tHELD")
	for _, s := range sums {
		mode := "-"
		if s.Frame != "" {
			mode = "crc " + onOff(s.CRC) + ", markers " + onOff(s.Markers)
		}
		crc := "-"
		if s.CRC {
			crc = fmt.Sprintf("%d good, %d bad", s.CRCGood, s.CRCBad)
		}
		markers := "-"
		if s.Markers {
			markers = fmt.Sprintf("%d ok, %d bad", s.MarkersOK, s.MarkersBad)
		}
		role := s.Role
		if role == "" {
			role = "-"
		}
		retx := fmt.Sprint(s.Retransmissions)
		if s.RetransJudged > 0 {
			retx += fmt.Sprintf(" (%d of %d aligned)", s.RetransAligned, s.RetransJudged)
		}
		fmt.Fprintf(tw, "%d\t%v > %v\t%s\t%s\t%d\t%d (%.1f%%)\t%d\t%s\t%s\t%s\t%d\n",
			s.Conn, s.Src, s.Dst, role, mode, s.FPDUSegments, s.Aligned, s.AlignedPercent(),
			s.FPDUs, crc, markers, retx, s.Held)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range sums {
		if s.Note != "" {
			if _, err := fmt.Fprintf(w, "note: %v > %v: %s\n", s.Src, s.Dst, s.Note); err != nil {
				return err
			}
		}
	}
	return nil
}

// Clean reports whether r shows nothing wrong: an aligned (or non-FPDU)
// segment with good CRCs and good Markers, not undecoded.
func (r *Report) Clean() bool {
	if r.Kind == KindUndecoded || (r.Aligned != nil && !*r.Aligned) {
		return false
	}
	for _, f := range r.FPDUs {
		if f.CRC == "bad" {
			return false
		}
	}
	for _, m := range r.Markers {
		if !m.OK {
			return false
		}
	}
	return true
}

// WriteReport prints r as a block: a line for the segment, then one line
// per FPDU and per Marker, indented. prefix starts the first line (a time
// stamp, a direction).
func WriteReport(w io.Writer, r *Report, prefix string) error {
	var sb strings.Builder
	sb.WriteString(prefix)
	fmt.Fprintf(&sb, "%v > %v seq %d len %d", r.Src, r.Dst, r.Seq, r.Len)
	if r.Flags != "" {
		fmt.Fprintf(&sb, " [%s]", r.Flags)
	}
	switch r.Kind {
	case KindControl:
	case KindFPDU:
		fmt.Fprintf(&sb, " stream %d", r.Offset)
	default:
		fmt.Fprintf(&sb, " %s", r.Kind)
	}
	if r.Aligned != nil {
		if *r.Aligned {
			sb.WriteString(" aligned")
		} else {
			sb.WriteString(" NOT ALIGNED")
		}
	}
	if r.Held {
		sb.WriteString(" (arrived out of order)")
	}
	sb.WriteByte('\n')
	if r.Frame != "" {
		fmt.Fprintf(&sb, "    %s\n", r.Frame)
	}
	if r.NotObserved > 0 {
		fmt.Fprintf(&sb, "    not observed: the %d octets before this segment (left out of the watch)\n", r.NotObserved)
	}
	if r.Resync != "" {
		fmt.Fprintf(&sb, "    %s\n", r.Resync)
	}
	if r.Note != "" {
		fmt.Fprintf(&sb, "    note: %s\n", r.Note)
	}
	if s := r.SplitStart; s != nil {
		fmt.Fprintf(&sb, "    split: starts %d octets into FPDU %d%s\n", s.Before, s.FPDU, ofLen(s.Len))
	}
	if s := r.SplitEnd; s != nil {
		fmt.Fprintf(&sb, "    split: ends %d octets into FPDU %d%s\n", s.Before, s.FPDU, ofLen(s.Len))
	}
	for i := range r.FPDUs {
		sb.WriteString("    ")
		sb.WriteString(r.FPDUs[i].String())
		sb.WriteByte('\n')
	}
	for _, m := range r.Markers {
		fmt.Fprintf(&sb, "    %s\n", m.String())
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

func ofLen(n int) string {
	if n == 0 {
		return " (length not yet known)"
	}
	return fmt.Sprintf(" of %d", n)
}

// String renders f on one line, for example
// "FPDU 3 RDMA Write L stag 0x200 to 0x7f0000001000 payload 1408, len 1428, crc good".
func (f *FPDU) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "FPDU %d", f.Index)
	if h := f.Header; h != nil {
		fmt.Fprintf(&sb, " %s", h.Op)
		if h.Last {
			sb.WriteString(" L")
		}
		if h.Tagged {
			fmt.Fprintf(&sb, " stag 0x%x to 0x%x", h.STag, h.TO)
		} else if h.Op != "?" {
			fmt.Fprintf(&sb, " qn %d msn %d mo %d", h.QN, h.MSN, h.MO)
		}
		fmt.Fprintf(&sb, " payload %d", h.Payload)
		if h.Detail != "" {
			fmt.Fprintf(&sb, " [%s]", strings.TrimSpace(h.Detail))
		}
	}
	if f.Len > 0 {
		fmt.Fprintf(&sb, ", len %d", f.Len)
	}
	switch {
	case f.Begins && f.Ends:
	case f.Begins:
		fmt.Fprintf(&sb, ", first %d octets here", f.Here)
	case f.Ends:
		fmt.Fprintf(&sb, ", last %d octets here", f.Here)
	default:
		fmt.Fprintf(&sb, ", %d octets of its middle here", f.Here)
	}
	if f.CRC != "" {
		fmt.Fprintf(&sb, ", crc %s", f.CRC)
	}
	return sb.String()
}

// String renders m on one line, for example
// "marker at stream 1024 (+36) fpduptr 36 -> FPDU 2: ok".
func (m *Marker) String() string {
	verdict := "ok"
	if !m.OK {
		verdict = fmt.Sprintf("BAD, should be %d", m.Want)
	}
	return fmt.Sprintf("marker at stream %d (+%d) fpduptr %d -> FPDU %d: %s", m.Offset, m.At, m.FPDUPTR, m.FPDU, verdict)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// Comment renders r for a capture file's packet comment, on one line:
// the kind and alignment, then each split, FPDU and Marker, separated by
// "; ", for example "fpdu stream 1488 aligned; FPDU 2 RDMA Write stag
// 0x200 to 0x1000 payload 1380, len 1412, crc good; marker at stream 1536
// (+48) fpduptr 48 -> FPDU 2: ok".
func (r *Report) Comment() string {
	var b strings.Builder
	WriteReport(&b, r, "")
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	// The first line repeats the addresses and seq Wireshark shows anyway.
	first := string(r.Kind)
	if r.Kind == KindFPDU {
		first = fmt.Sprintf("fpdu stream %d", r.Offset)
	}
	if r.Aligned != nil {
		if *r.Aligned {
			first += " aligned"
		} else {
			first += " NOT ALIGNED"
		}
	}
	if r.Held {
		first += " (arrived out of order)"
	}
	for i := range lines[1:] {
		lines[i+1] = strings.TrimSpace(lines[i+1])
	}
	return strings.Join(append([]string{first}, lines[1:]...), "; ")
}
