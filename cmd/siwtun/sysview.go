package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/siwtun/siwtun/ctl"
)

// errNoMountNS: the process may not have a mount namespace of its own
// (CAP_SYS_ADMIN): no view, the program runs with the host's /sys.
var errNoMountNS = errors.New("no mount namespace of its own (needs CAP_SYS_ADMIN)")

// viewDev is one running device as /sys/class/infiniband shows it.
type viewDev struct {
	Name   string // siwtun0
	Netdev string // the interface the RNIC sits on (its TUN device)
	GUID   string // node GUID, "xxxx:xxxx:xxxx:xxxx"
	FW     string
}

// viewDevices asks every running daemon of dir (only dev, when set) for
// what the view shows. A daemon that does not answer is left out.
func viewDevices(dir, dev string) []viewDev {
	socks, _ := filepath.Glob(filepath.Join(dir, "*.ctl"))
	sort.Strings(socks)
	var out []viewDev
	for _, s := range socks {
		name := ctl.DevFromPath(s)
		if dev != "" && name != dev {
			continue
		}
		c, err := ctl.Dial(s)
		if err != nil {
			continue
		}
		info, err1 := c.DevInfo()
		link, err2 := c.Link()
		c.Close()
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, viewDev{Name: name, Netdev: link.Netdev, GUID: info.NodeGUID, FW: info.FWVer})
	}
	return out
}

// macOfGUID undoes the modified EUI-64 of a node GUID (ff:fe in the middle,
// the universal/local bit flipped): the device's MAC, as siw derives its
// GUID from its interface's MAC.
func macOfGUID(guid string) ([6]byte, error) {
	var g [8]byte
	hex := strings.ReplaceAll(guid, ":", "")
	if len(hex) != 16 {
		return [6]byte{}, fmt.Errorf("node GUID %q: want 16 hex digits", guid)
	}
	for i := range g {
		v, err := strconv.ParseUint(hex[2*i:2*i+2], 16, 8)
		if err != nil {
			return [6]byte{}, fmt.Errorf("node GUID %q: %w", guid, err)
		}
		g[i] = byte(v)
	}
	return [6]byte{g[0] ^ 2, g[1], g[2], g[5], g[6], g[7]}, nil
}

// gidString is the GID in sysfs's form (eight groups of four hex digits):
// an iWARP GID is the MAC, then zeros.
func gidString(mac [6]byte) string {
	var raw [16]byte
	copy(raw[:], mac[:])
	parts := make([]string, 8)
	for i := range parts {
		parts[i] = fmt.Sprintf("%02x%02x", raw[2*i], raw[2*i+1])
	}
	return strings.Join(parts, ":")
}

// writeSysView writes, under root, the files of /sys/class/infiniband and
// /sys/class/infiniband_verbs that rdma-core's tools and tests read, as
// Linux shows them for a siw device (node type RNIC, one port, an iWARP
// GID, device/net/<interface>).
func writeSysView(root string, devs []viewDev) error {
	ib, verbs := filepath.Join(root, "infiniband"), filepath.Join(root, "infiniband_verbs")
	files := map[string]string{filepath.Join(verbs, "abi_version"): "6"}
	dirs := []string{ib, verbs}
	links := map[string]string{}
	for i, d := range devs {
		mac, err := macOfGUID(d.GUID)
		if err != nil {
			return fmt.Errorf("%s: %w", d.Name, err)
		}
		dev := filepath.Join(ib, d.Name)
		port := filepath.Join(dev, "ports", "1")
		uv := fmt.Sprintf("uverbs%d", i)
		dirs = append(dirs, filepath.Join(dev, "device", "net"), filepath.Join(port, "gids"), filepath.Join(port, "pkeys"),
			filepath.Join(port, "gid_attrs", "types"), filepath.Join(port, "gid_attrs", "ndevs"), filepath.Join(verbs, uv))
		for k, v := range map[string]string{
			"node_type": "4: RNIC", "node_guid": d.GUID, "sys_image_guid": d.GUID, "fw_ver": d.FW, "node_desc": "siwtun iWARP RNIC",
			"ports/1/state": "4: ACTIVE", "ports/1/phys_state": "5: LinkUp", "ports/1/link_layer": "Ethernet",
			"ports/1/rate": "2.5 Gb/sec (1X SDR)", "ports/1/lid": "0x0", "ports/1/sm_lid": "0x0", "ports/1/lid_mask_count": "0",
			"ports/1/sm_sl": "0", "ports/1/cap_mask": "0x00000000", "ports/1/gids/0": gidString(mac),
			"ports/1/pkeys/0": "0xffff", "ports/1/gid_attrs/types/0": "IB/RoCE v1", "ports/1/gid_attrs/ndevs/0": d.Netdev,
		} {
			files[filepath.Join(dev, k)] = v
		}
		files[filepath.Join(verbs, uv, "ibdev")] = d.Name
		files[filepath.Join(verbs, uv, "abi_version")] = "1"
		if d.Netdev != "" {
			links[filepath.Join(dev, "device", "net", d.Netdev)] = filepath.Join("/sys/class/net", d.Netdev)
		}
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for p, v := range files {
		if err := os.WriteFile(p, []byte(v+"\n"), 0o444); err != nil {
			return err
		}
	}
	for p, target := range links {
		if err := os.Symlink(target, p); err != nil {
			return err
		}
	}
	return nil
}

// enterSysView gives this thread, and the program it then execs, a mount
// namespace of its own where /sys/class is a tmpfs holding the host's
// classes (bind mounts of the real ones) and siwtun's infiniband and
// infiniband_verbs in place of the host's. Nothing is written to the
// host's /sys, and no mount propagates back (the namespace is private).
// The caller stays on its OS thread (runtime.LockOSThread) until exec.
// Without the right to a mount namespace of its own (a container with
// CAP_NET_ADMIN only) it returns errNoMountNS and changes nothing.
func enterSysView(devs []viewDev) error {
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("%w: unshare: %w", errNoMountNS, err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mounts private: %w", err)
	}
	const class = "/sys/class"
	old, err := unix.Open(class, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", class, err)
	}
	defer unix.Close(old)
	ents, err := os.ReadDir(class)
	if err != nil {
		return err
	}
	if err := unix.Mount("siwtun-sysview", class, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", class, err)
	}
	for _, e := range ents {
		if e.Name() == "infiniband" || e.Name() == "infiniband_verbs" {
			continue
		}
		dst := filepath.Join(class, e.Name())
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		src := fmt.Sprintf("/proc/self/fd/%d/%s", old, e.Name())
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s/%s: %w", class, e.Name(), err)
		}
	}
	if err := writeSysView(class, devs); err != nil {
		return err
	}
	return unix.Mount("", class, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}
