package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/apps/connperf"
	"github.com/siwtun/siwtun/verbs"
)

// benchConnOptions are the flags of siwtun bench conn.
type benchConnOptions struct {
	listen    string
	tcp       bool
	n         int
	hold      bool
	dev       string
	socketDir string
	timeout   time.Duration
}

func newBenchConnCmd() *cobra.Command {
	o := benchConnOptions{}
	cmd := &cobra.Command{
		Use:   "conn [server-address:port]",
		Short: "Connection set-up: connect time and connections per second (the benchmark's workload)",
		Long: `conn runs apps/connperf: with --listen it is the server: it says
"listening on" its address, accepts -n connections, each on a new queue pair of --dev (or, with --tcp, a kernel
TCP socket), keeps them until the client has closed them all, and exits;
with the server's address it is the client and opens -n connections one
after the other, each on a new queue pair, timing each connect, then
prints the connect times and the rate. With --hold the client keeps its
connections open after printing, until its standard input ends (the
benchmark reads the daemons' memory meanwhile).`,
		Example: `  siwtun bench conn --listen 198.18.2.2:7400 -n 1000 --dev siwtun1
  siwtun bench conn 198.18.2.2:7400 -n 1000 --dev siwtun0
  siwtun bench conn --tcp 198.18.3.2:7400 -n 1000`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBenchConn(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout(), o, args)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "", "serve on this address:port")
	f.BoolVar(&o.tcp, "tcp", false, "kernel TCP sockets instead of the RNIC's queue pairs")
	f.IntVarP(&o.n, "connections", "n", 1000, "connections to open (client) or accept (server)")
	f.BoolVar(&o.hold, "hold", false, "client: keep the connections after printing, until standard input ends")
	f.StringVar(&o.dev, "dev", "siwtun0", "siwtun device (its daemon's verbs socket)")
	socketDirFlag(f, &o.socketDir, "verbs sockets")
	f.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long")
	return cmd
}

func runBenchConn(ctx context.Context, in io.Reader, w io.Writer, o benchConnOptions, args []string) error {
	switch {
	case o.n < 1:
		return fmt.Errorf("-n %d: at least 1", o.n)
	case o.listen != "" && len(args) > 0:
		return errors.New("give either --listen (server) or the server's address (client), not both")
	case o.listen == "" && len(args) == 0:
		return errors.New("give --listen address:port (server) or the server's address:port (client)")
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var dev *verbs.Device
	if !o.tcp {
		var err error
		if dev, err = verbs.DialPath(filepath.Join(o.socketDir, o.dev+".sock")); err != nil {
			return err
		}
		defer dev.Close()
	}
	if o.listen != "" {
		return benchConnServe(ctx, w, dev, o)
	}
	var (
		res      connperf.Result
		closeAll func() error
	)
	if o.tcp {
		c, r, err := connperf.DialTCP(ctx, args[0], o.n)
		if err != nil {
			return err
		}
		res, closeAll = r, c.Close
	} else {
		addr, err := netip.ParseAddrPort(args[0])
		if err != nil {
			return err
		}
		c, r, err := connperf.DialVerbs(ctx, dev, addr, o.n)
		if err != nil {
			return err
		}
		res, closeAll = r, c.Close
	}
	enc := json.NewEncoder(w)
	if err := enc.Encode(res); err != nil {
		closeAll()
		return err
	}
	if o.hold {
		io.Copy(io.Discard, in)
	}
	return closeAll()
}

// benchConnServe is the server: accept, report, wait for the client to
// close everything.
func benchConnServe(ctx context.Context, w io.Writer, dev *verbs.Device, o benchConnOptions) error {
	if o.tcp {
		l, err := net.Listen("tcp", o.listen)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "listening on %s\n", l.Addr())
		c, err := connperf.AcceptTCP(l, o.n)
		l.Close()
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Fprintf(w, "accepted %d connections\n", c.Len())
		return c.WaitClosed(ctx)
	}
	addr, err := netip.ParseAddrPort(o.listen)
	if err != nil {
		return err
	}
	l, err := dev.Listen(addr, 128)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "listening on %s\n", l.Addr())
	c, err := connperf.AcceptVerbs(ctx, dev, l, o.n)
	l.Close()
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(w, "accepted %d connections\n", c.Len())
	return c.WaitDisconnected(ctx)
}
