// Package netns holds what siwtun's network-namespace runs share: the check
// that this host allows them and a runner for ip(8), which creates the
// namespaces and configures links in them.
package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// CanRun says why network namespaces with TUN devices cannot be used here,
// if they cannot: they need root, /dev/net/tun and ip(8) in PATH. It returns
// nil when all three are present.
func CanRun() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces and TUN devices)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return errors.New("needs /dev/net/tun (modprobe tun)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("needs ip(8) from iproute2")
	}
	return nil
}

// IP runs ip(8) with args and waits for it. If ip fails, the error names
// the command line and carries ip's exit status and its combined stdout
// and stderr.
func IP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
