package interop

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/iwarp/mpa"
)

// tsharkVerdict is what Wireshark's dissectors made of a capture
// (capture.RunTshark's counts, whose Lines also collect the MPA frame
// problems found here), plus the MPA frames.
type tsharkVerdict struct {
	capture.TsharkResult
	// MPA are the MPA Requests and Replies in capture order, decoded by
	// siwtun's parser from the TCP payload Wireshark marked as such.
	MPA []mpaFrame
}

// mpaFrame is an MPA Request or Reply and who sent it.
type mpaFrame struct {
	From  string // "siwtun" or "siw"
	Frame mpa.Frame
}

func (f mpaFrame) String() string { return f.From + ": " + f.Frame.String() }

// runTshark dissects file with tshark and counts FPDUs, CRC verdicts,
// malformed packets and expert errors.
func runTshark(ctx context.Context, file string) (tsharkVerdict, error) {
	v := tsharkVerdict{TsharkResult: capture.RunTshark(ctx, "tshark", file)}
	if v.Err != nil {
		return v, v.Err
	}
	// The MPA frames, from the payload of the segments Wireshark decoded
	// as a Request or a Reply.
	args := append([]string{"-r", file, "-n", "-Y", "iwarp_mpa.req || iwarp_mpa.rep", "-T", "fields", "-e", "ip.src", "-e", "tcp.payload"}, capture.TsharkHeuristicsOff...)
	out, err := exec.CommandContext(ctx, "tshark", args...).Output()
	if err != nil {
		return v, fmt.Errorf("tshark %s: %w", strings.Join(args, " "), err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		b, err := hex.DecodeString(strings.ReplaceAll(f[1], ":", ""))
		if err != nil {
			return v, fmt.Errorf("tshark payload %q: %w", f[1], err)
		}
		var fr mpa.FrameReader
		_, done, err := fr.Feed(b)
		if err != nil || !done {
			v.Lines = append(v.Lines, fmt.Sprintf("MPA frame from %s that siwtun's parser refuses (%v): %x", f[0], err, b))
			continue
		}
		frame, err := fr.Frame()
		if err != nil {
			v.Lines = append(v.Lines, fmt.Sprintf("MPA frame from %s: %v", f[0], err))
			continue
		}
		from := "siw"
		if isSiwtun(f[0]) {
			from = "siwtun"
			// RFC 5044 §7.1: reserved bits are sent as zero (0x0f, and
			// 0x10 below revision 2). siw echoes what it was sent, so
			// only siwtun's own frames are held to it.
			reserved := byte(0x0f)
			if frame.Rev < 2 {
				reserved |= 0x10
			}
			if b[16]&reserved != 0 {
				v.Lines = append(v.Lines, fmt.Sprintf("siwtun's MPA frame sets reserved flag bits %#02x: %x", b[16]&reserved, b[:20]))
			}
		}
		v.MPA = append(v.MPA, mpaFrame{From: from, Frame: frame})
	}
	return v, nil
}

// clean reports whether the capture shows no problem: no bad CRC, nothing
// malformed, no expert error, and (crc) every FPDU with a good CRC or
// (!crc) no CRC verdict at all. A capture without FPDUs passes either way.
func (v tsharkVerdict) clean(crc bool) error {
	var errs []string
	if v.BadCRC > 0 || v.Malformed > 0 || v.ExpertErrors > 0 {
		errs = append(errs, fmt.Sprintf("%d bad CRC, %d malformed, %d expert errors: %s", v.BadCRC, v.Malformed, v.ExpertErrors, strings.Join(first(v.Lines, 5), "; ")))
	} else if len(v.Lines) > 0 {
		errs = append(errs, strings.Join(first(v.Lines, 5), "; "))
	}
	switch {
	case crc && v.GoodCRC != v.FPDUs:
		errs = append(errs, fmt.Sprintf("CRC on but %d of %d FPDUs have a good CRC", v.GoodCRC, v.FPDUs))
	case !crc && v.GoodCRC+v.BadCRC > 0:
		errs = append(errs, fmt.Sprintf("CRC expected off, tshark checked %d CRCs", v.GoodCRC+v.BadCRC))
	}
	if len(errs) > 0 {
		return fmt.Errorf("tshark: %s", strings.Join(errs, "; "))
	}
	return nil
}

// summary is the tshark part of a row's figures.
func (v tsharkVerdict) summary() string {
	s := fmt.Sprintf("tshark: %d frames, %d FPDUs", v.Frames, v.FPDUs)
	if v.GoodCRC+v.BadCRC > 0 {
		s += fmt.Sprintf(", %d Good CRC32", v.GoodCRC)
		if v.BadCRC > 0 {
			s += fmt.Sprintf(", %d BAD", v.BadCRC)
		}
	} else {
		s += ", CRC off"
	}
	if v.Malformed > 0 {
		s += fmt.Sprintf(", %d malformed", v.Malformed)
	}
	return s
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// checker runs `siwtun check`, the marker, CRC and alignment checker, on
// captures.
type checker struct {
	bin string
}

// checkDir is the part of `siwtun check -j`'s per-direction summary the
// table uses.
type checkDir struct {
	Src          string `json:"src"`
	CRCBad       int    `json:"crc_bad"`
	MarkersBad   int    `json:"markers_bad"`
	FPDUSegments int    `json:"fpdu_segments"`
	Aligned      int    `json:"aligned"`
	Note         string `json:"note"`
}

// check runs the checker on file: per sender, aligned segments of those
// carrying FPDUs, and an error for any bad CRC or marker.
func (c *checker) check(ctx context.Context, file string) (string, error) {
	dirs, err, perr := c.directions(ctx, file)
	if perr != nil {
		return "", perr
	}
	aligned := map[string][2]int{}
	bad := 0
	for _, d := range dirs {
		who := "siw"
		if isSiwtun(d.Src) {
			who = "siwtun"
		}
		a := aligned[who]
		aligned[who] = [2]int{a[0] + d.Aligned, a[1] + d.FPDUSegments}
		bad += d.CRCBad + d.MarkersBad
	}
	s := fmt.Sprintf("check: aligned siwtun %d/%d, siw %d/%d", aligned["siwtun"][0], aligned["siwtun"][1], aligned["siw"][0], aligned["siw"][1])
	if err != nil || bad > 0 {
		return s, fmt.Errorf("siwtun check %s: %d bad CRCs or markers (%v)", file, bad, err)
	}
	return s, nil
}

// directions runs `siwtun check -j` on file and returns its
// per-direction summaries, the command's own error (it exits 1 when it
// finds a bad CRC or marker) and an error if its output is unreadable.
func (c *checker) directions(ctx context.Context, file string) (dirs []checkDir, exitErr, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, exitErr := exec.CommandContext(ctx, c.bin, "check", "-j", file).Output()
	var res struct {
		Directions []checkDir `json:"directions"`
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		return nil, exitErr, fmt.Errorf("siwtun check %s: %v (%v)", file, jerr, exitErr)
	}
	return res.Directions, exitErr, nil
}

// badBySender counts the FPDUs with a bad CRC or marker in a capture, by
// who sent them (siw, siwtun), as siwtun check finds them.
func (c *checker) badBySender(file string) (siw, siwtun int, err error) {
	dirs, _, err := c.directions(context.Background(), file)
	if err != nil {
		return 0, 0, err
	}
	for _, d := range dirs {
		if isSiwtun(d.Src) {
			siwtun += d.CRCBad + d.MarkersBad
		} else {
			siw += d.CRCBad + d.MarkersBad
		}
	}
	return siw, siwtun, nil
}

// checkCapture checks a capture with tshark (clean, CRC on or off as crc
// says) and with the marker/alignment checker, and returns tshark's
// verdict and the figures of both.
func (e *env) checkCapture(pcap string, crc bool) (tsharkVerdict, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	v, err := runTshark(ctx, pcap)
	if err != nil {
		return v, "", err
	}
	var errs []error
	if err := v.clean(crc); err != nil {
		errs = append(errs, err)
	}
	cs, err := e.check.check(ctx, pcap)
	if err != nil {
		errs = append(errs, err)
	}
	return v, v.summary() + "; " + cs, joinErrs(errs)
}
