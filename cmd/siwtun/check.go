package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// maxFindings is how many problem segments `siwtun check` prints without -v.
const maxFindings = 20

func newCheckCmd() *cobra.Command {
	var jsonOut, verbose bool
	cmd := &cobra.Command{
		Use:   "check <file.pcap|file.pcapng>",
		Short: "Check the MPA markers, CRCs and FPDU alignment in a capture",
		Long: `check reads a pcap or pcapng capture of iWARP connections (siwtun's own,
Linux siw's, a hardware RNIC's, ...), reassembles each TCP direction, reads
the MPA Request and Reply (CRC and markers per direction, where the FPDU
stream starts) and walks every FPDU with siwtun's own MPA receiver. It
prints, per connection direction: segments, how many are FPDU-aligned
(they start with an FPDU, or a marker and then an FPDU, and hold only
whole FPDUs), FPDUs and their CRC verdicts, markers (each at its 512-octet
stream position) and whether their FPDUPTR points at the right FPDU
header, and retransmissions (segments with nothing new), each judged
aligned when it starts and ends on FPDU boundaries. Then the segments that show a problem: not aligned (which FPDU
was split, by how much), a bad CRC, a bad marker. -v prints every
segment; -j prints JSON.

The exit status is 1 when a CRC or a marker is bad.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			segs, err := capture.ReadFile(args[0])
			if err != nil {
				return err
			}
			return runCheck(cmd.OutOrStdout(), args[0], segs, jsonOut, verbose)
		},
	}
	cmd.Flags().BoolVarP(&jsonOut, "json", "j", false, "print JSON")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print every segment")
	return cmd
}

// checkResult is the JSON form of a check.
type checkResult struct {
	File       string               `json:"file"`
	Directions []inspect.DirSummary `json:"directions"`
	// Segments are every segment with -v, else those that show a problem.
	Segments []inspect.Report `json:"segments"`
}

func runCheck(w io.Writer, file string, segs []inspect.Segment, jsonOut, verbose bool) error {
	a := inspect.New()
	var shown []inspect.Report
	problems := 0
	for _, s := range segs {
		for _, r := range a.Add(s) {
			clean := r.Clean()
			if !clean {
				problems++
			}
			if verbose || (!clean && (jsonOut || len(shown) < maxFindings)) {
				shown = append(shown, r)
			}
		}
	}
	sums := a.Summary()
	if jsonOut {
		enc := json.NewEncoder(w)
		if err := enc.Encode(checkResult{File: file, Directions: sums, Segments: shown}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(w, "%s: %d TCP segments, %d connection(s)\n\n", file, len(segs), (len(sums)+1)/2)
		if err := inspect.WriteSummary(w, sums); err != nil {
			return err
		}
		if len(shown) > 0 {
			if verbose {
				fmt.Fprintf(w, "\nsegments:\n")
			} else {
				fmt.Fprintf(w, "\nsegments with a problem (%d):\n", problems)
			}
			for i := range shown {
				if err := inspect.WriteReport(w, &shown[i], fmt.Sprintf("%s  ", shown[i].Time.Format("15:04:05.000000"))); err != nil {
					return err
				}
			}
			if !verbose && problems > len(shown) {
				fmt.Fprintf(w, "... and %d more (-v prints every segment)\n", problems-len(shown))
			}
		}
	}
	var badCRC, badMarkers int
	for _, s := range sums {
		badCRC += s.CRCBad
		badMarkers += s.MarkersBad
	}
	if badCRC+badMarkers > 0 {
		return fmt.Errorf("check %s: %d bad CRC(s), %d bad marker(s)", file, badCRC, badMarkers)
	}
	return nil
}
