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
	if err := demoNamespace(ns); err != nil {
		return err
	}
	defer func() {
		if e := netns.IP("netns", "del", ns); e != nil && err == nil {
			err = e
		}
	}()
	dir, err := os.MkdirTemp("", "siwtun-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	fmt.Fprintf(w, "siwtun demo: two RNICs on TUN devices in network namespace %s (MTU %d)\n", ns, o.mtu)
	rnics := []demoDaemon{{"siwtun0", "198.18.1.2/24", "198.18.1.1/24"}, {"siwtun1", "198.18.2.2/24", "198.18.2.1/24"}}
	var procs []*exec.Cmd
	defer func() { stopDemoDaemons(procs) }()
	for _, r := range rnics {
		p, err := r.start(w, self, ns, dir, o)
		if err != nil {
			return err
		}
		procs = append(procs, p)
	}
	devs := make([]*verbs.Device, 2)
	for i, r := range rnics {
		if devs[i], err = r.dial(dir); err != nil {
			return err
		}
		defer devs[i].Close()
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

// demoNamespace creates the network namespace ns with its loopback up and
// IPv4 forwarding on (its two daemons' host sides route between them); it
// deletes it again if a step fails.
func demoNamespace(ns string) error {
	if err := netns.IP("netns", "add", ns); err != nil {
		return err
	}
	err := netns.IP("netns", "exec", ns, "ip", "link", "set", "lo", "up")
	if err == nil {
		err = netns.IP("netns", "exec", ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
	}
	if err != nil {
		netns.IP("netns", "del", ns)
	}
	return err
}

// demoDaemon is one RNIC of the namespace demo: its device, its address
// and the host side's.
type demoDaemon struct{ dev, addr, host string }

// start runs `siwtun up` for the RNIC in namespace ns, its sockets in dir.
func (r demoDaemon) start(w io.Writer, self, ns, dir string, o demoOptions) (*exec.Cmd, error) {
	args := []string{"netns", "exec", ns, self, "up", "--dev", r.dev, "--addr", r.addr, "--host-addr", r.host,
		"--mtu", fmt.Sprint(o.mtu), "--mpa-rev", fmt.Sprint(o.rev), fmt.Sprintf("--crc=%v", o.crc),
		fmt.Sprintf("--markers=%v", o.markers), "--socket-dir", dir, "--log-level", "warn"}
	cmd := exec.Command("ip", args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("siwtun up %s: %w", r.dev, err)
	}
	fmt.Fprintf(w, "  %s: siwtun up (pid %d), RNIC %s, host side %s\n", r.dev, cmd.Process.Pid, r.addr, r.host)
	return cmd, nil
}

// dial opens the RNIC through its verbs socket in dir, waiting up to 20 s
// for its daemon to come up.
func (r demoDaemon) dial(dir string) (*verbs.Device, error) {
	path := filepath.Join(dir, r.dev+".sock")
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := verbs.DialPath(path)
		if err == nil {
			return d, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s did not come up: %w", r.dev, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopDemoDaemons interrupts the daemons and waits for each, killing one
// that has not stopped within 15 s.
func stopDemoDaemons(procs []*exec.Cmd) {
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
}
