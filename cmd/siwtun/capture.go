package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/ctl"
)

func newCaptureCmd() *cobra.Command {
	o := &watchOptions{}
	var file string
	cmd := &cobra.Command{
		Use:   "capture --dev <dev> -w <file.pcapng>",
		Short: "Write the RNIC's TCP segments to a pcapng file, each with a comment on its FPDUs",
		Long: `capture asks the daemon of a device (siwtun up) for every TCP segment its
RNIC sends and receives, seen at its segment hook, and writes them as a
pcapng file of raw IP packets that Wireshark and tshark open. Each
packet carries a comment naming what siwtun's checker found in it: the
FPDUs (opcode, STag/TO or QN/MSN/MO, CRC verdict), the markers and
whether their FPDUPTR is right, FPDU alignment, and where the engine
placed the payload. -w - writes to standard output (wireshark -k -i -).

Wireshark decodes MPA only for connections whose MPA Request and Reply it
sees: start the capture before connecting. --qp keeps one queue pair's
connection. Stop it with Ctrl-C, -c or --duration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.what, o.log = "capture", cmd.ErrOrStderr()
			var f *os.File
			defer func() {
				if f != nil {
					f.Close()
				}
			}()
			// The file is created once the device's stream is up: a
			// device that is not there leaves no empty file behind.
			open := func() (watchSink, error) {
				var out io.Writer = cmd.OutOrStdout()
				if file != "-" {
					var err error
					if f, err = os.Create(file); err != nil {
						return nil, err
					}
					out = f
				}
				w, err := capture.NewWriter(out, o.ctl.dev)
				if err != nil {
					return nil, err
				}
				return &captureSink{w: w, file: file, log: cmd.ErrOrStderr()}, nil
			}
			if err := runWatch(o, open); err != nil {
				return err
			}
			if f != nil {
				err := f.Close()
				f = nil
				return err
			}
			return nil
		},
	}
	addWatchFlags(cmd, o)
	cmd.Flags().StringVarP(&file, "write", "w", "", "pcapng file to write (- for standard output)")
	cmd.MarkFlagRequired("write")
	return cmd
}

// captureSink writes blocks as pcapng packets.
type captureSink struct {
	w       *capture.Writer
	file    string
	log     io.Writer
	packets int
}

func (s *captureSink) block(b *segBlock) error {
	if b.seg == nil {
		return nil // completions with no segment to join: not a packet
	}
	p := packetOf(b.seg, b)
	var comments []string
	for i := range b.reports {
		if b.reports[i].Len > 0 {
			comments = append(comments, b.reports[i].Comment())
		}
	}
	for i := range b.places {
		comments = append(comments, placeString(&b.places[i]))
	}
	for i := range b.wcs {
		comments = append(comments, wcString(&b.wcs[i]))
	}
	s.packets++
	return s.w.Write(&p, comments...)
}

func (s *captureSink) finish(dropped uint64) error {
	if err := s.w.Flush(); err != nil {
		return err
	}
	name := s.file
	if name == "-" {
		name = "standard output"
	}
	fmt.Fprintf(s.log, "siwtun capture: %d packets written to %s", s.packets, name)
	if dropped > 0 {
		fmt.Fprintf(s.log, "; not observed: the daemon left out %d events in windows this capture could not keep up with", dropped)
	}
	fmt.Fprintln(s.log)
	return nil
}

// packetOf turns a watched segment into a capture packet.
func packetOf(s *ctl.WatchSegment, b *segBlock) capture.Packet {
	return capture.Packet{Time: b.time, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Ack: s.Ack, Flags: s.Flags, Window: s.Window, MSS: s.MSS, Payload: s.Payload}
}
