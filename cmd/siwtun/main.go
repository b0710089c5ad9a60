// Command siwtun is the software iWARP RNIC's command-line tool.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/siwtun/siwtun/verbs"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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
	root.AddCommand(newExecCmd())
	root.AddCommand(newGenDocCmd())
	// A mistyped flag says where the usage is (SilenceUsage keeps the
	// whole usage off every other error).
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageHint(c, err)
	})
	return root
}

// usageHint adds "run 'siwtun up --help' for usage" to err.
func usageHint(c *cobra.Command, err error) error {
	return fmt.Errorf("%w (run '%s --help' for usage)", err, c.CommandPath())
}

// socketDirFlag defines --socket-dir on f, the one way every command
// takes the directory of the daemons' verbs and control sockets: the flag,
// else the SIWTUN_SOCKET_DIR environment variable (which verbs.Dial and
// libsiwtun also read), else /run/siwtun. what says which sockets the
// command uses there.
func socketDirFlag(f *pflag.FlagSet, p *string, what string) {
	f.StringVar(p, "socket-dir", defaultSocketDir(), "directory of the daemons' "+what+" (default: $SIWTUN_SOCKET_DIR, else "+verbs.SocketDir+")")
}

// defaultSocketDir is the --socket-dir default of every command: the
// SIWTUN_SOCKET_DIR environment variable, which verbs.Dial also reads,
// else /run/siwtun.
func defaultSocketDir() string {
	if d := os.Getenv("SIWTUN_SOCKET_DIR"); d != "" {
		return d
	}
	return verbs.SocketDir
}

// execute runs the command line args (without the program name) on root.
// createFile creates the file path and writes it with write.
func createFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func execute(root *cobra.Command, args []string) error {
	root.SetArgs(joinWordValues(root, args))
	c, err := root.ExecuteC()
	if err != nil && strings.HasPrefix(err.Error(), "unknown command ") {
		// An argument a command does not take (cobra.NoArgs says
		// "unknown command"), or a mistyped subcommand.
		return usageHint(c, err)
	}
	return err
}

func main() {
	if err := execute(newRootCmd(), os.Args[1:]); err != nil {
		var st interface{ ExitStatus() int }
		if errors.As(err, &st) {
			os.Exit(st.ExitStatus()) // the command has said why
		}
		fmt.Fprintln(os.Stderr, "siwtun:", err)
		os.Exit(1)
	}
}
