package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/ctl"
)

// defaultDev is the device `siwtun ctl` asks when --dev is not given.
const defaultDev = "siwtun0"

// ctlOptions are the flags shared by every `siwtun ctl` command.
type ctlOptions struct {
	dev    string
	dir    string
	json   bool
	pretty bool
}

// wantJSON reports whether to print JSON: -j, or -p (which implies -j).
func (o *ctlOptions) wantJSON() bool { return o.json || o.pretty }

// socket is the control socket of the selected device.
func (o *ctlOptions) socket() (string, error) {
	if o.dev == "" || strings.ContainsAny(o.dev, "/\x00") || o.dev == "." || o.dev == ".." {
		return "", fmt.Errorf("invalid device name %q", o.dev)
	}
	return ctl.SocketPath(o.dir, o.dev), nil
}

// dial connects to the selected device's daemon.
func (o *ctlOptions) dial() (*ctl.Client, error) {
	path, err := o.socket()
	if err != nil {
		return nil, err
	}
	return ctl.Dial(path)
}

func newCtlCmd() *cobra.Command {
	o := &ctlOptions{}
	cmd := &cobra.Command{
		Use:   "ctl",
		Short: "Query a running siwtun daemon: device, link, queue pairs, counters",
		Long: `ctl asks the daemon of a device (siwtun up) over its control socket,
<socket-dir>/<dev>.ctl, and prints the answer the way the RDMA tools do:
devinfo like ibv_devinfo, link like rdma link show, qp like
rdma resource show qp, stats like rdma statistic show. -j prints JSON
whose field names are the text keys; -p prints it indented.`,
	}
	f := cmd.PersistentFlags()
	f.StringVar(&o.dev, "dev", defaultDev, "device to query")
	socketDirFlag(f, &o.dir, "control sockets")
	f.BoolVarP(&o.json, "json", "j", false, "print JSON")
	f.BoolVarP(&o.pretty, "pretty", "p", false, "print indented JSON (implies --json)")
	cmd.RegisterFlagCompletionFunc("dev", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return socketDevs(o.dir), cobra.ShellCompDirectiveNoFileComp
	})
	cmd.AddCommand(newCtlDevInfoCmd(o), newCtlLinkCmd(o), newCtlQPCmd(o), newCtlStatsCmd(o), newCtlProcCmd(o), newCtlAnatomyCmd(o))
	return cmd
}

func newCtlDevInfoCmd(o *ctlOptions) *cobra.Command {
	var verbose bool
	cmd := &cobra.Command{
		Use:   "devinfo",
		Short: "Print the device's attributes (like ibv_devinfo)",
		Long: `devinfo prints the device's attributes in ibv_devinfo's layout. -v adds
the limits (max_qp, max_sge, ...) and siwtun's iWARP settings: the real
netdev MTU next to the verbs MTU enum, the default effective MSS, the MPA
revision, CRC, markers, peer-to-peer mode and the IRD/ORD defaults.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.DevInfo()
			if err != nil {
				return err
			}
			if o.wantJSON() {
				return ctl.WriteJSON(cmd.OutOrStdout(), d, o.pretty)
			}
			return ctl.WriteDevInfo(cmd.OutOrStdout(), d, verbose)
		},
	}
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print every attribute and siwtun's iWARP settings")
	return cmd
}

func newCtlLinkCmd(o *ctlOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "link",
		Short: "List the running devices' links (like rdma link show)",
		Long: `link prints one line per running device, like rdma link show, with the
RNIC's own addresses and the host's. Without --dev it lists every device
whose control socket in --socket-dir answers.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var links []ctl.Link
			var err error
			if cmd.Flags().Changed("dev") {
				links, err = oneLink(o)
			} else {
				links, err = allLinks(o.dir)
			}
			if err != nil {
				return err
			}
			if o.wantJSON() {
				return ctl.WriteJSON(cmd.OutOrStdout(), links, o.pretty)
			}
			return ctl.WriteLinks(cmd.OutOrStdout(), links)
		},
	}
}

func oneLink(o *ctlOptions) ([]ctl.Link, error) {
	c, err := o.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	l, err := c.Link()
	if err != nil {
		return nil, err
	}
	return []ctl.Link{l}, nil
}

// allLinks asks every control socket in dir; sockets nobody answers on
// (left by a daemon that died) are skipped.
func allLinks(dir string) ([]ctl.Link, error) {
	var links []ctl.Link
	var errs []error
	for _, dev := range socketDevs(dir) {
		c, err := ctl.Dial(ctl.SocketPath(dir, dev))
		if errors.Is(err, ctl.ErrNoDaemon) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		l, err := c.Link()
		c.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		links = append(links, l)
	}
	if len(links) == 0 {
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		return nil, fmt.Errorf("no siwtun daemon is running (no control socket in %s answers; start one with `siwtun up`)", dir)
	}
	return links, nil
}

// socketDevs lists the device names of the control sockets in dir, sorted.
func socketDevs(dir string) []string {
	if dir == "" {
		dir = ctl.DefaultSocketDir
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var devs []string
	for _, e := range ents {
		if e.Type()&os.ModeSocket != 0 && strings.HasSuffix(e.Name(), ctl.SocketSuffix) {
			devs = append(devs, ctl.DevFromPath(filepath.Join(dir, e.Name())))
		}
	}
	sort.Strings(devs)
	return devs
}

func newCtlQPCmd(o *ctlOptions) *cobra.Command {
	var qpn uint32
	cmd := &cobra.Command{
		Use:   "qp",
		Short: "List the queue pairs (like rdma resource show qp)",
		Long: `qp prints one line per queue pair, like rdma resource show qp, with the
connection's addresses and negotiated iWARP parameters. With --qp N it
prints that queue pair and then its counters, one line per layer, like
rdma statistic qp show.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			qps, err := c.QPs(int(qpn))
			if err != nil {
				return err
			}
			if len(qps) == 0 && !o.wantJSON() {
				if qpn != 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "%s has no queue pair %d\n", o.dev, qpn)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "%s has no queue pairs\n", o.dev)
				}
				return nil
			}
			return writeQPs(cmd.OutOrStdout(), o, qps, qpn != 0)
		},
	}
	cmd.Flags().Uint32Var(&qpn, "qp", 0, "only this queue pair, with its counters (0: all)")
	return cmd
}

func writeQPs(w io.Writer, o *ctlOptions, qps []ctl.QP, one bool) error {
	if o.wantJSON() {
		return ctl.WriteJSON(w, qps, o.pretty)
	}
	if err := ctl.WriteQPs(w, qps); err != nil {
		return err
	}
	if one {
		for _, q := range qps {
			if err := ctl.WriteQPCounters(w, q); err != nil {
				return err
			}
		}
	}
	return nil
}

func newCtlStatsCmd(o *ctlOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Print the device's counters by layer (like rdma statistic show)",
		Long: `stats prints the device's counters, one line per layer (tcp, mpa, ddp,
rdmap, verbs), like rdma statistic show. -j adds each counter's
documentation.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			s, err := c.Stats()
			if err != nil {
				return err
			}
			if o.wantJSON() {
				return ctl.WriteJSON(cmd.OutOrStdout(), s, o.pretty)
			}
			return ctl.WriteStats(cmd.OutOrStdout(), s)
		},
	}
}

func newCtlProcCmd(o *ctlOptions) *cobra.Command {
	var gc bool
	cmd := &cobra.Command{
		Use:   "proc",
		Short: "Print the daemon process's footprint: goroutines, RSS, descriptors, mappings",
		Long: `proc prints the daemon process's own figures: its pid, goroutines, OS
threads, resident set (VmRSS) and its peak (VmHWM), Go heap in use, open
file descriptors and memory mappings. After a load has gone they return to
their baseline; the reliability tests and make soak check that. --gc
first has the daemon collect its garbage and return the freed memory to
the system, so that the resident set is what it still holds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			p, err := c.Proc(gc)
			if err != nil {
				return err
			}
			if o.wantJSON() {
				return ctl.WriteJSON(cmd.OutOrStdout(), p, o.pretty)
			}
			return ctl.WriteProc(cmd.OutOrStdout(), p)
		},
	}
	cmd.Flags().BoolVar(&gc, "gc", false, "collect garbage and return freed memory to the system first")
	return cmd
}
