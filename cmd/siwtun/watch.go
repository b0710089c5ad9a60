package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/siwtun/siwtun/ctl/watch"
)

// watchOptions are the flags of `siwtun capture` and `siwtun trace`.
type watchOptions struct {
	ctl      ctlOptions
	qp       int
	count    int
	duration time.Duration
	// what names the command in the line that says the watch started;
	// log receives that line (standard error).
	what string
	log  io.Writer
}

func addWatchFlags(cmd *cobra.Command, o *watchOptions) {
	f := cmd.Flags()
	f.StringVar(&o.ctl.dev, "dev", defaultDev, "device to watch")
	socketDirFlag(f, &o.ctl.dir, "control sockets")
	f.IntVar(&o.qp, "qp", 0, "only the connection of this queue pair (and its placements and completions); 0: all, as in ctl qp --qp")
	f.IntVarP(&o.count, "count", "c", 0, "stop after this many segments (0: until interrupted)")
	f.DurationVar(&o.duration, "duration", 0, "stop after this long (0: until interrupted)")
}

// runWatch follows the device's traffic into the sink open returns until
// the flags' count or duration, the daemon's end, or SIGINT/SIGTERM.
func runWatch(o *watchOptions, open func() (watch.Sink, error)) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return watch.Run(ctx, watch.Options{
		Dial: o.ctl.dial, Dev: o.ctl.dev, QP: o.qp, Count: o.count, Duration: o.duration,
		What: o.what, Log: o.log,
	}, open)
}
