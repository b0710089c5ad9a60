package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// libName is the file name of libsiwtun, the libibverbs/librdmacm-compatible
// library (libsiwtun/), built next to the siwtun binary.
const libName = "libsiwtun.so"

func newExecCmd() *cobra.Command {
	var dev, socketDir string
	var rsockets, noSysfs bool
	cmd := &cobra.Command{
		Use:   "exec [--dev siwtun0] -- PROGRAM [ARGS...]",
		Short: "Run an unmodified libibverbs/librdmacm program on a siwtun device",
		Long: `exec runs PROGRAM with libsiwtun preloaded (LD_PRELOAD) over the installed
rdma-core libraries, so its verbs and rdma_cm calls reach the siwtun daemons'
verbs sockets: ibv_devices, ibv_devinfo, rping, perftest's ib_*_bw/lat -R, ...

--dev limits the devices the program sees to one (SIWTUN_DEV), so a client
and a server on two daemons of one host each use their own RNIC. The library
is taken from SIWTUN_LIB, else found next to the siwtun binary (make build's
bin/) or in ../lib/siwtun from it (make install's PREFIX/lib/siwtun). The
program replaces siwtun: its exit status is exec's.

--rsockets runs an ordinary TCP socket program over rsockets (librdmacm's
sockets over RDMA): rdma-core's librspreload.so is preloaded after libsiwtun
(LD_PRELOAD=libsiwtun.so:librspreload.so), so the program's socket calls go
to rsocket, rconnect, rsend, ..., which libsiwtun implements on the siwtun
device. The program's TCP connections to a siwtun RNIC's address then run
over an RDMA connection; the address must be the RNIC's (the host's kernel
does not have it). librspreload.so is taken from SIWTUN_RSPRELOAD, else
rdma-core's install path (Debian: /usr/lib/<arch>/rsocket/librspreload.so).

Run as root, the program also gets a view of /sys/class/infiniband and
/sys/class/infiniband_verbs showing the running siwtun devices as Linux shows
a siw device (node_type, node_guid, fw_ver, ports/1/gids and gid_attrs,
device/net/<interface>, uverbsN/ibdev), which rdma-core's tests and other
programs read: a mount namespace of the program's own with a tmpfs on
/sys/class (the host's classes bound into it), never a write to the host's
/sys. --no-sysfs leaves /sys as it is; without CAP_SYS_ADMIN (a container with
CAP_NET_ADMIN only) there is no view, and exec says so on stderr.`,
		Example: `  siwtun exec --dev siwtun1 -- rping -s -a 198.18.2.2 -v
  siwtun exec --dev siwtun0 -- rping -c -a 198.18.2.2 -v -V -C 10
  siwtun exec -- ibv_devinfo -v
  siwtun exec --rsockets --dev siwtun1 -- rstream -T s -b 198.18.2.2 -S 65536 -C 1000`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lib, err := findLib()
			if err != nil {
				return err
			}
			prog, err := exec.LookPath(args[0])
			if err != nil {
				return fmt.Errorf("exec %s: %w", args[0], err)
			}
			env := os.Environ()
			pre := lib
			if rsockets {
				rsp, err := findRspreload()
				if err != nil {
					return err
				}
				pre += ":" + rsp
			}
			if old := os.Getenv("LD_PRELOAD"); old != "" {
				pre += ":" + old
			}
			env = setEnv(env, "LD_PRELOAD", pre)
			if dev != "" {
				env = setEnv(env, "SIWTUN_DEV", dev)
			}
			if socketDir != "" {
				env = setEnv(env, "SIWTUN_SOCKET_DIR", socketDir)
			}
			if !noSysfs && os.Geteuid() == 0 {
				err := enterSysView(viewDevices(socketDir, dev))
				switch {
				case errors.Is(err, errNoMountNS):
					fmt.Fprintf(os.Stderr, "siwtun exec: no /sys/class/infiniband view: %v (--no-sysfs goes without it quietly)\n", err)
				case err != nil:
					return fmt.Errorf("the /sys/class/infiniband view (--no-sysfs goes without): %w", err)
				}
			}
			return syscall.Exec(prog, args, env)
		},
	}
	cmd.Flags().StringVar(&dev, "dev", "", "the only device the program sees (default: every running siwtun device)")
	cmd.Flags().BoolVar(&rsockets, "rsockets", false, "run a TCP socket program over rsockets (preload rdma-core's librspreload.so after libsiwtun)")
	cmd.Flags().BoolVar(&noSysfs, "no-sysfs", false, "do not give the program the /sys/class/infiniband view of the running devices")
	socketDirFlag(cmd.Flags(), &socketDir, "verbs sockets, passed to the program as SIWTUN_SOCKET_DIR")
	return cmd
}

// findLib returns the absolute path of libsiwtun: SIWTUN_LIB, or the file
// next to the running siwtun binary (bin/ of make build), or in
// ../lib/siwtun from it (make install: PREFIX/bin and PREFIX/lib/siwtun).
func findLib() (string, error) {
	if p := os.Getenv("SIWTUN_LIB"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("SIWTUN_LIB: %w", err)
		}
		return abs, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(self); err == nil {
		self = r
	}
	var tried []string
	for _, dir := range []string{filepath.Dir(self), filepath.Join(filepath.Dir(self), "..", "lib", "siwtun")} {
		p := filepath.Join(dir, libName)
		if _, err := os.Stat(p); err == nil {
			return filepath.Abs(p)
		}
		tried = append(tried, p)
	}
	return "", errors.New("libsiwtun not found (looked for " + strings.Join(tried, ", ") +
		"): build it with make build (bin/" + libName + "), or set SIWTUN_LIB")
}

// rspreloadGlobs are where rdma-core installs librspreload.so: Debian's
// multiarch directory, then other distributions' lib64 and lib.
var rspreloadGlobs = []string{"/usr/lib/*/rsocket/librspreload.so", "/usr/lib64/rsocket/librspreload.so",
	"/usr/lib/rsocket/librspreload.so", "/usr/local/lib*/rsocket/librspreload.so"}

// findRspreload returns the path of rdma-core's librspreload.so:
// SIWTUN_RSPRELOAD, or the first of rspreloadGlobs that exists.
func findRspreload() (string, error) {
	if p := os.Getenv("SIWTUN_RSPRELOAD"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("SIWTUN_RSPRELOAD: %w", err)
		}
		return abs, nil
	}
	for _, g := range rspreloadGlobs {
		if m, _ := filepath.Glob(g); len(m) > 0 {
			return m[0], nil
		}
	}
	return "", errors.New("librspreload.so not found (looked for " + strings.Join(rspreloadGlobs, ", ") +
		"): install rdma-core's rsockets preload (Debian: librdmacm1), or set SIWTUN_RSPRELOAD")
}

// setEnv replaces or appends KEY=value in env.
func setEnv(env []string, key, value string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			env[i] = key + "=" + value
			return env
		}
	}
	return append(env, key+"="+value)
}
