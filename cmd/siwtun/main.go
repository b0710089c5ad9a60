// Command siwtun is the software iWARP RNIC's command-line tool.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is the tool's version; releases set it with -ldflags "-X main.version=…".
var version = "0.1.0-dev"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "siwtun",
		Short: "A software iWARP RNIC in user space",
		Long: `siwtun is a software iWARP RNIC: its own TCP/IP stack (gVisor's netstack)
with MPA, DDP and RDMAP running inside the stack's receive and transmit
paths, and a verbs API for applications.`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newDemoCmd())
	root.AddCommand(newUpCmd())
	root.AddCommand(newCtlCmd())
	root.AddCommand(newPingCmd())
	root.AddCommand(newCheckCmd())
	root.AddCommand(newCaptureCmd())
	root.AddCommand(newTraceCmd())
	root.AddCommand(newWebCmd())
	root.AddCommand(newPerfCmd())
	root.AddCommand(newBenchCmd())
	return root
}

func main() {
	if err := newRootCmd().Execute(); err != nil {
		var st interface{ ExitStatus() int }
		if errors.As(err, &st) {
			os.Exit(st.ExitStatus()) // the command has said why
		}
		fmt.Fprintln(os.Stderr, "siwtun:", err)
		os.Exit(1)
	}
}
