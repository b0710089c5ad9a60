package main

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/ctl"
)

// newCtlAnatomyCmd is `siwtun ctl anatomy`: the recorders of hop stamps
// of two daemons on this host, around any traffic between them (rping, a
// C program through libsiwtun, an application of one's own).
func newCtlAnatomyCmd(o *ctlOptions) *cobra.Command {
	var peer, peerDir string
	cmd := &cobra.Command{
		Use:   "anatomy start|stop|show",
		Short: "Record the hops of the traffic between two daemons and take its round trips apart",
		Long: `anatomy drives the recorders of hop stamps of --dev's daemon and of
--peer's (both on this host, their control sockets in --socket-dir):
start forgets earlier stamps and records, stop stops, show stops and
prints, for every connection between the two devices that carried
messages, the median and 99th percentile of each hop of each direction,
as siwtun perf write --lat --anatomy does. The applications' own hops
(their post, their sight of the data) need their stamps, which only
siwtun perf --anatomy hands over; for other programs those rows are
empty, and the legs between the daemons are what the table shows. Take it
of a ping-pong: the stamps of a stream of messages in flight at once are
joined to the right messages, but the applications' are not.`,
		Example: `  siwtun ctl anatomy start --dev siwtun0 --peer siwtun1
  siwtun exec --dev siwtun1 -- ib_write_lat -R -d siwtun1 -s 4 -n 1000 &
  siwtun exec --dev siwtun0 -- ib_write_lat -R -d siwtun0 -s 4 -n 1000 198.18.2.2
  siwtun ctl anatomy show --dev siwtun0 --peer siwtun1`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"start", "stop", "show"},
		RunE: func(cmd *cobra.Command, args []string) error {
			if peer == "" {
				return errors.New("--peer: name the other daemon's device")
			}
			if peerDir == "" {
				peerDir = o.dir
			}
			if peer == o.dev && peerDir == o.dir {
				return fmt.Errorf("--peer %s is --dev itself", peer)
			}
			devs := []string{ctl.SocketPath(o.dir, o.dev), ctl.SocketPath(peerDir, peer)}
			switch args[0] {
			case "start":
				return anatomyAction(devs, ctl.AnatomyStart)
			case "stop":
				return anatomyAction(devs, ctl.AnatomyStop)
			case "show":
				return anatomyShow(cmd.OutOrStdout(), o, devs)
			}
			return fmt.Errorf("unknown action %q: want start, stop or show", args[0])
		},
	}
	cmd.Flags().StringVar(&peer, "peer", "", "the other daemon's device")
	cmd.Flags().StringVar(&peerDir, "peer-socket-dir", "", "the directory of the other daemon's control socket (default: --socket-dir)")
	return cmd
}

// anatomyAction sends action to the daemon of each control socket.
func anatomyAction(sockets []string, action string) error {
	for _, path := range sockets {
		c, err := ctl.Dial(path)
		if err != nil {
			return err
		}
		_, err = c.Anatomy(action)
		c.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// anatomyShow stops both recorders and prints each connection's anatomy.
func anatomyShow(w io.Writer, o *ctlOptions, sockets []string) error {
	if err := anatomyAction(sockets, ctl.AnatomyStop); err != nil {
		return err
	}
	var sides [2]anatomy.Side
	var lost uint64
	for i, path := range sockets {
		dev := ctl.DevFromPath(path)
		c, err := ctl.Dial(path)
		if err != nil {
			return err
		}
		recs, st, err := c.AnatomyRecords()
		c.Close()
		if err != nil {
			return err
		}
		sides[i], lost = anatomy.Side{Name: dev, Records: recs}, lost+st.Lost
	}
	flows := sharedFlows(sides[0].Records, sides[1].Records)
	if len(flows) == 0 {
		return fmt.Errorf("no messages between %s and %s were recorded (was `siwtun ctl anatomy start` run before the traffic?)", sides[0].Name, sides[1].Name)
	}
	var all []anatomy.Anatomy
	for _, f := range flows {
		all = append(all, anatomy.Assemble(sides[0], sides[1], f))
	}
	if o.wantJSON() {
		return ctl.WriteJSON(w, all, o.pretty)
	}
	for i, an := range all {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "connection %s:%d <-> %s:%d\n", sides[0].Name, flows[i].Src, sides[1].Name, flows[i].Dst)
		fmt.Fprint(w, an.String())
	}
	if lost > 0 {
		fmt.Fprintf(w, "%d stamps were lost (each daemon keeps the newest %d)\n", lost, anatomy.RingSize)
	}
	return nil
}

// sharedFlows returns the connections between the two daemons that
// carried messages, each as the flow from the first daemon's port: a
// message written on one side (Built) and placed on the other, in the
// order the first such message was written.
func sharedFlows(a, b []anatomy.Record) []anatomy.Flow {
	placed := func(recs []anatomy.Record) map[anatomy.Flow]bool {
		m := map[anatomy.Flow]bool{}
		for _, r := range recs {
			if r.Hop == anatomy.Placed {
				m[anatomy.Flow{Src: r.SrcPort, Dst: r.DstPort}] = true
			}
		}
		return m
	}
	inA, inB := placed(a), placed(b)
	var out []anatomy.Flow
	add := func(f anatomy.Flow) {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	for _, r := range a {
		if f := (anatomy.Flow{Src: r.SrcPort, Dst: r.DstPort}); r.Hop == anatomy.Built && inB[f] {
			add(f)
		}
	}
	for _, r := range b {
		if f := (anatomy.Flow{Src: r.SrcPort, Dst: r.DstPort}); r.Hop == anatomy.Built && inA[f] {
			add(f.Reverse())
		}
	}
	return out
}
