package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/internal/netns"
	"github.com/siwtun/siwtun/verbs"
)

// runNetnsDemo is the main job: a private network namespace with two RNICs
// (siwtun0 and siwtun1, each its own siwtun up process and address, routed
// by the namespace's kernel), a verbs application on their verbs sockets
// doing a Send, an RDMA Write and an RDMA Read, and then everything it
// created removed.
func runNetnsDemo(w io.Writer, o demoOptions) (err error) {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ns := fmt.Sprintf("siwtun-demo-%d", os.Getpid())
	if err := netns.IP("netns", "add", ns); err != nil {
		return err
	}
	defer func() {
		if e := netns.IP("netns", "del", ns); e != nil && err == nil {
			err = e
		}
	}()
	if err := netns.IP("netns", "exec", ns, "ip", "link", "set", "lo", "up"); err != nil {
		return err
	}
	if err := netns.IP("netns", "exec", ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "siwtun-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	fmt.Fprintf(w, "siwtun demo: two RNICs on TUN devices in network namespace %s (MTU %d)\n", ns, o.mtu)
	type rnic struct{ dev, addr, host string }
	rnics := []rnic{{"siwtun0", "198.18.1.2/24", "198.18.1.1/24"}, {"siwtun1", "198.18.2.2/24", "198.18.2.1/24"}}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			p.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				p.Process.Kill()
			}
		}
	}()
	for _, r := range rnics {
		args := []string{"netns", "exec", ns, self, "up", "--dev", r.dev, "--addr", r.addr, "--host-addr", r.host,
			"--mtu", fmt.Sprint(o.mtu), "--mpa-rev", fmt.Sprint(o.rev), fmt.Sprintf("--crc=%v", o.crc),
			fmt.Sprintf("--markers=%v", o.markers), "--socket-dir", dir, "--log-level", "warn"}
		cmd := exec.Command("ip", args...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("siwtun up %s: %w", r.dev, err)
		}
		procs = append(procs, cmd)
		fmt.Fprintf(w, "  %s: siwtun up (pid %d), RNIC %s, host side %s\n", r.dev, cmd.Process.Pid, r.addr, r.host)
	}
	devs := make([]*verbs.Device, 2)
	for i, r := range rnics {
		path := filepath.Join(dir, r.dev+".sock")
		deadline := time.Now().Add(20 * time.Second)
		for {
			d, err := verbs.DialPath(path)
			if err == nil {
				devs[i] = d
				defer d.Close()
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s did not come up: %w", r.dev, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	fmt.Fprintf(w, "  the application opened both through their verbs sockets in %s\n\n", dir)
	c, err := runApp(w, devs[0], devs[1], netip.MustParseAddr("198.18.2.2"), o.size)
	if err != nil {
		return err
	}
	if cl, err := ctl.Dial(ctl.SocketPath(dir, "siwtun0")); err == nil {
		if qps, err := cl.QPs(0); err == nil {
			fmt.Fprintln(w, "   siwtun ctl qp on siwtun0:")
			ctl.WriteQPs(w, qps)
		}
		cl.Close()
	}
	fmt.Fprintf(w, "\n5. disconnect, stop both daemons, delete the namespace\n")
	c.Disconnect()
	fmt.Fprintln(w, strings.Repeat("-", 8), "all data verified")
	return nil
}
