package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/offload/mpa/inspect"
)

func newTraceCmd() *cobra.Command {
	o := &watchOptions{}
	var jsonOut bool
	var htmlOut string
	cmd := &cobra.Command{
		Use:   "trace --dev <dev>",
		Short: "Print, live, what the RNIC does with every TCP segment",
		Long: `trace prints one block per TCP segment the RNIC sends (out) or receives
(in): addresses, sequence number, length, position in the FPDU stream and
whether the segment is FPDU-aligned (if not, which FPDU was split and by
how much); each FPDU in it (opcode, STag/TO or QN/MSN/MO, length, CRC
verdict); each marker and whether its FPDUPTR is right; where the engine
placed the payload (region and offset, or receive and offset) and the
completions that followed. -j prints one JSON object per line.

FPDUs are decoded for connections whose MPA Request and Reply the trace
saw: start it before connecting. --qp keeps one queue pair's connection.

A trace that cannot keep up gets whole windows left out by the daemon, and
prints each one where it was ("--- not observed: ..."); the checker skips
the octets in it and picks the FPDU stream up again at the next FPDU it can
verify (the block says where and how).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.what, o.log = "trace", cmd.ErrOrStderr()
			if htmlOut != "" {
				return runWatch(o, func() (watchSink, error) { return newHTMLSink(o, htmlOut, cmd.ErrOrStderr()), nil })
			}
			return runWatch(o, func() (watchSink, error) {
				return &traceSink{w: cmd.OutOrStdout(), json: jsonOut, enc: json.NewEncoder(cmd.OutOrStdout())}, nil
			})
		},
	}
	addWatchFlags(cmd, o)
	cmd.Flags().BoolVarP(&jsonOut, "json", "j", false, "print JSON lines")
	cmd.Flags().StringVar(&htmlOut, "html", "", "instead of printing, write the web view of the trace (see siwtun web) to this self-contained HTML file when the trace ends")
	return cmd
}

// traceLine is one line of `siwtun trace -j`: a segment (with the
// checker's Reports: more than one when it let held segments be
// analysed), or a placement or completion that joined no segment.
type traceLine struct {
	Type    string           `json:"type"` // "segment", "place", "wc", "gap"
	Gap     *ctl.WatchGap    `json:"gap,omitempty"`
	Dir     string           `json:"dir,omitempty"`
	Ack     uint32           `json:"ack,omitempty"`
	Reports []inspect.Report `json:"reports,omitempty"`
	Places  []ctl.WatchPlace `json:"places,omitempty"`
	WCs     []ctl.WatchWC    `json:"wcs,omitempty"`
}

// traceSink prints blocks.
type traceSink struct {
	w    io.Writer
	json bool
	enc  *json.Encoder
}

func (s *traceSink) block(b *segBlock) error {
	if b.gap != nil {
		if s.json {
			return s.enc.Encode(traceLine{Type: "gap", Gap: b.gap})
		}
		_, err := fmt.Fprintf(s.w, "%s --- %s\n", b.time.Format("15:04:05.000000"), gapString(b.gap))
		return err
	}
	if s.json {
		l := traceLine{Type: "segment", Reports: b.reports, Places: b.places, WCs: b.wcs}
		switch {
		case b.seg != nil:
			l.Dir, l.Ack = b.seg.Dir, b.seg.Ack
		case len(b.places) > 0:
			l.Type = "place"
		default:
			l.Type = "wc"
		}
		return s.enc.Encode(l)
	}
	if b.seg != nil {
		if len(b.reports) == 0 {
			return nil
		}
		for i := range b.reports {
			prefix := fmt.Sprintf("%s %-3s ", b.time.Format("15:04:05.000000"), b.seg.Dir)
			if err := inspect.WriteReport(s.w, &b.reports[i], prefix); err != nil {
				return err
			}
		}
	} else {
		fmt.Fprintf(s.w, "%s\n", b.time.Format("15:04:05.000000"))
	}
	for i := range b.places {
		fmt.Fprintf(s.w, "    %s\n", placeString(&b.places[i]))
	}
	for i := range b.wcs {
		fmt.Fprintf(s.w, "    %s\n", wcString(&b.wcs[i]))
	}
	return nil
}

func (s *traceSink) finish(dropped uint64) error {
	if dropped > 0 {
		if s.json {
			return s.enc.Encode(map[string]any{"type": "dropped", "dropped": dropped})
		}
		fmt.Fprintf(s.w, "(not observed: the daemon left out %d events in the windows marked above: this trace could not keep up)\n", dropped)
	}
	return nil
}

// gapString renders a window the daemon left out, for example "not
// observed: the daemon left out 1200 segments, 40 placements, 2 completions
// from 10:00:01.000000 to 10:00:01.050000 (this trace fell behind)".
func gapString(g *ctl.WatchGap) string {
	s := fmt.Sprintf("not observed: the daemon left out %d segments", g.Segments)
	if g.Places > 0 {
		s += fmt.Sprintf(", %d placements", g.Places)
	}
	if g.WCs > 0 {
		s += fmt.Sprintf(", %d completions", g.WCs)
	}
	return s + fmt.Sprintf(" from %s to %s (this trace fell behind)", g.From.Format("15:04:05.000000"), g.To.Format("15:04:05.000000"))
}
