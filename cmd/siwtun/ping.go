package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/tools/rping"
	"github.com/siwtun/siwtun/verbs"
)

// exitStatus ends siwtun with a status once the command has printed why
// (main prints nothing more).
type exitStatus int

func (s exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(s)) }

// ExitStatus is the process exit status.
func (s exitStatus) ExitStatus() int { return int(s) }

// statusInterrupted is a shell's status for a process ended by SIGINT.
const statusInterrupted = 130

// pingOptions are the flags of siwtun ping (rping's, plus the device).
type pingOptions struct {
	server, client bool
	addr           string
	port           int
	size, count    int
	verbose        bool
	validate       bool
	debug          bool
	persistent     bool
	dev            string
	socketDir      string
}

func newPingCmd() *cobra.Command {
	o := &pingOptions{}
	cmd := &cobra.Command{
		Use:   "ping -s [-vVdP] [-S size] [-a addr] [-p port] | -c [-vVd] [-S size] [-C count] -a addr [-p port]",
		Short: "Ping over RDMA like rping: a server, or a client that pings it",
		Long: `ping speaks the protocol of rdma-core's rping (librdmacm/examples/rping.c)
on a siwtun device, so it pings and is pinged by the real rping of another
RNIC. Per ping the client Sends the advert of its source buffer (16 bytes:
address, rkey, size, big-endian); the server RDMA READs the data, Sends a
"go ahead"; the client Sends the advert of its sink buffer; the server RDMA
WRITEs the data back and Sends "go ahead" again. The data is rping's:
"rdma-ping-<n>: " and a rotating run of the ASCII characters A to z.

Output and exit status are rping's: "ping data: ..." (-v), "server
DISCONNECT EVENT...", "data mismatch!" (-V), status 0 when done or when
the peer disconnected, 255 on failure, 22 for invalid flags. A line
starting "siwtun ping: " adds the cause where rping leaves it unsaid.

The device is reached through its daemon's verbs socket
(<socket-dir>/<dev>.sock; siwtun up).

  siwtun ping -s -a 198.18.2.2 -v                 # server on siwtun1's address
  siwtun ping -c -a 198.18.2.2 -C 10 -S 4096 -V -v --dev siwtun0`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(cmd, fmt.Errorf("unexpected argument %q", args[0]))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPing(cmd, o)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.server, "server", "s", false, "server side")
	f.BoolVarP(&o.client, "client", "c", false, "client side")
	f.StringVarP(&o.addr, "addr", "a", "", "address: the server's to connect to (client), the one to listen on (server; default every IPv4 address, ::0 for IPv6 too)")
	f.IntVarP(&o.port, "port", "p", rping.DefaultPort, "port")
	f.IntVarP(&o.size, "size", "S", rping.DefaultSize, fmt.Sprintf("ping data size (%d to %d; the server's must be at least the client's)", rping.MinSize, rping.MaxSize))
	f.IntVarP(&o.count, "count", "C", 0, "ping count (client; 0 pings until the server goes)")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "display ping data to stdout")
	f.BoolVarP(&o.validate, "validate", "V", false, "validate ping data (the server checks the data it read against rping's pattern)")
	f.BoolVarP(&o.debug, "debug", "d", false, "debug printfs")
	f.BoolVarP(&o.persistent, "persistent", "P", false, "persistent server mode allowing multiple connections")
	f.StringVar(&o.dev, "dev", defaultDev, "device (its daemon's verbs socket)")
	socketDirFlag(f, &o.socketDir, "verbs sockets")
	cmd.SetFlagErrorFunc(usageError)
	return cmd
}

// usageError prints err and the usage, as rping does for a bad option,
// and ends with EINVAL's status.
func usageError(cmd *cobra.Command, err error) error {
	w := cmd.ErrOrStderr()
	fmt.Fprintf(w, "siwtun ping: %v\n", err)
	fmt.Fprint(w, cmd.UsageString())
	return exitStatus(rping.StatusInvalid)
}

// check validates the flags and returns the address to listen on or
// connect to.
func (o *pingOptions) check() (netip.AddrPort, error) {
	switch {
	case o.server && o.client:
		return netip.AddrPort{}, errors.New("-s (server) and -c (client) exclude each other")
	case !o.server && !o.client:
		return netip.AddrPort{}, errors.New("one of -s (server) or -c (client) is required")
	case o.client && o.persistent:
		return netip.AddrPort{}, errors.New("-P (persistent) is a server flag")
	case o.client && o.addr == "":
		return netip.AddrPort{}, errors.New("the client needs the server's address (-a addr)")
	case o.port < 1 || o.port > 65535:
		return netip.AddrPort{}, fmt.Errorf("invalid port %d (valid range is 1 to 65535)", o.port)
	case o.dev == "" || strings.ContainsAny(o.dev, "/\x00") || o.dev == "." || o.dev == "..":
		return netip.AddrPort{}, fmt.Errorf("invalid device name %q", o.dev)
	}
	ip := netip.IPv4Unspecified() // rping's default: INADDR_ANY
	if o.addr != "" {
		a, err := netip.ParseAddr(o.addr)
		if err != nil {
			// rping resolves host names on the host; the RNIC has its own
			// addresses, so siwtun takes them literally.
			return netip.AddrPort{}, fmt.Errorf("invalid address %q: an IPv4 or IPv6 address is needed", o.addr)
		}
		ip = a.Unmap()
	}
	if o.client && ip.IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("invalid address %q: the client needs the server's address", o.addr)
	}
	return netip.AddrPortFrom(ip, uint16(o.port)), nil
}

// open opens the device through its daemon's verbs socket.
func (o *pingOptions) open(cmd *cobra.Command) (*verbs.Device, error) {
	return verbs.DialPath(filepath.Join(o.socketDir, o.dev+".sock"))
}

func runPing(cmd *cobra.Command, o *pingOptions) error {
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	addr, err := o.check()
	if err != nil {
		return usageError(cmd, err)
	}
	ro := rping.Options{Size: o.size, Count: o.count, Verbose: o.verbose, Validate: o.validate,
		Debug: o.debug, Persistent: o.persistent, Stdout: stdout, Stderr: stderr}
	if err := ro.Check(); err != nil {
		return pingStatus(stderr, err)
	}
	dev, err := o.open(cmd)
	if err != nil {
		fmt.Fprintf(stderr, "siwtun ping: open %s: %v (is `siwtun up --dev %s` running?)\n", o.dev, err, o.dev)
		return exitStatus(rping.StatusFailed)
	}
	defer dev.Close()
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.server {
		err = serve(ctx, dev, addr, ro)
	} else {
		err = rping.Ping(ctx, dev, addr, ro)
	}
	return pingStatus(stderr, err)
}

func serve(ctx context.Context, dev *verbs.Device, addr netip.AddrPort, ro rping.Options) error {
	srv, err := rping.Listen(dev, addr, ro)
	if err != nil {
		return err
	}
	return srv.Serve(ctx)
}

// pingStatus turns a run's result into siwtun's exit: rping's status for
// its failures (already printed), 130 when a signal stopped it.
func pingStatus(stderr io.Writer, err error) error {
	var ee *rping.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		return exitStatus(ee.ExitStatus())
	case errors.Is(err, context.Canceled):
		return exitStatus(statusInterrupted)
	}
	fmt.Fprintf(stderr, "siwtun ping: %v\n", err)
	return exitStatus(rping.StatusFailed)
}
