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
	run, err := collectAnatomy(sockets)
	if err != nil {
		return err
	}
	if len(run.flows) == 0 {
		return fmt.Errorf("%s (was `siwtun ctl anatomy start` run before the traffic?)", run.none())
	}
	if o.wantJSON() {
		return ctl.WriteJSON(w, run.all, o.pretty)
	}
	for i, an := range run.all {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "connection %s\n", run.title(i))
		fmt.Fprint(w, an.String())
	}
	if run.lost > 0 {
		fmt.Fprintf(w, "%d stamps were lost (each daemon keeps the newest %d)\n", run.lost, anatomy.RingSize)
	}
	return nil
}

// anatomyRun is what the recorders of the daemons of one or two devices
// hold, taken apart: every connection between the two (or, of one
// device, between two of its own ports) that carried messages.
type anatomyRun struct {
	sides [2]anatomy.Side
	flows []anatomy.Flow // each from sides[0]'s port to sides[1]'s
	all   []anatomy.Anatomy
	lost  uint64
	on    bool // a recorder is still on
}

// collectAnatomy reads the recorders of the daemons of sockets (one or
// two control sockets) and assembles each connection between them.
func collectAnatomy(sockets []string) (anatomyRun, error) {
	var run anatomyRun
	for i, path := range sockets {
		dev := ctl.DevFromPath(path)
		c, err := ctl.Dial(path)
		if err != nil {
			return run, err
		}
		recs, st, err := c.AnatomyRecords()
		c.Close()
		if err != nil {
			return run, err
		}
		run.sides[i], run.lost, run.on = anatomy.Side{Name: dev, Records: recs}, run.lost+st.Lost, run.on || st.On
	}
	one := len(sockets) == 1
	if one {
		run.sides[1] = run.sides[0]
	}
	for _, f := range sharedFlows(run.sides[0].Records, run.sides[1].Records) {
		if one && slices.Contains(run.flows, f.Reverse()) {
			continue // a connection of one daemon is found from both ends
		}
		run.flows = append(run.flows, f)
		run.all = append(run.all, anatomy.Assemble(run.sides[0], run.sides[1], f))
	}
	return run, nil
}

// title names connection i: "siwtun0:40000 <-> siwtun1:18515".
func (r *anatomyRun) title(i int) string {
	return fmt.Sprintf("%s:%d <-> %s:%d", r.sides[0].Name, r.flows[i].Src, r.sides[1].Name, r.flows[i].Dst)
}

// none says that no messages were recorded.
func (r *anatomyRun) none() string {
	if r.sides[0].Name == r.sides[1].Name {
		return fmt.Sprintf("no messages between two ports of %s were recorded", r.sides[0].Name)
	}
	return fmt.Sprintf("no messages between %s and %s were recorded", r.sides[0].Name, r.sides[1].Name)
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
