package daemon

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/siwtun/siwtun/daemon/uverbs"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/rnic/rnictest"
	"github.com/siwtun/siwtun/verbs"
)

// TestVerbsSocketPermChild is the child of TestVerbsSocketPermissions: it
// opens the device through the socket, as whichever user it was started
// as, and fails with the error if it cannot.
func TestVerbsSocketPermChild(t *testing.T) {
	path := os.Getenv("SIWTUN_PERM_SOCKET")
	if path == "" {
		t.Skip("child of TestVerbsSocketPermissions only")
	}
	dev, err := verbs.DialPath(path)
	if err != nil {
		t.Fatalf("DIAL: %v", err)
	}
	defer dev.Close()
	if _, err := dev.AllocPD(); err != nil {
		t.Fatalf("ALLOCPD: %v", err)
	}
	groups, _ := os.Getgroups()
	t.Logf("uid %d gid %d groups %v: opened %s", os.Getuid(), os.Getgid(), groups, dev.Name())
}

// TestVerbsSocketPermissions: the verbs socket of siwtun up (serveVerbs)
// has mode 0660 and the group of --socket-group; a user outside the group
// cannot connect (EACCES), one in it can, as a supplementary or as its
// primary group.
func TestVerbsSocketPermissions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the clients run as uid 65534 with chosen groups (syscall.Credential)")
	}
	const group = "daemon" // Debian's gid 1; the clients' own group is 65534
	g, err := user.LookupGroup(group)
	if err != nil {
		t.Skipf("no group %q to give the socket: %v", group, err)
	}
	gid, _ := strconv.Atoi(g.Gid)

	// Directories and the test binary the unprivileged clients can reach.
	open := func() string {
		d, err := os.MkdirTemp("", "siwtun-perm-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	sockDir, binDir := open(), open()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "siwtun.test")
	if err := copyFile(self, bin, 0o755); err != nil {
		t.Fatal(err)
	}

	la, _ := netstack.Pipe(1500, netstack.Impairments{})
	r := rnictest.New(t, la, netip.MustParsePrefix("198.18.0.1/24"), 1500, "siwtun0", nil)
	srv, err := uverbs.NewServer(r.Device, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop, path, err := serveVerbs(srv, sockDir, "siwtun0", group, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if mode := st.Mode & 0o7777; mode != 0o660 || st.Uid != 0 || int(st.Gid) != gid || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		t.Fatalf("socket %s: mode %#o, owner %d:%d; want a socket of mode 0660, owner 0:%d", path, mode, st.Uid, st.Gid, gid)
	}
	t.Logf("%s: mode %#o, owner %d:%d (%s)", path, st.Mode&0o7777, st.Uid, st.Gid, group)

	run := func(cred *syscall.Credential) (string, error) {
		cmd := exec.Command(bin, "-test.run=^TestVerbsSocketPermChild$", "-test.v", "-test.count=1")
		cmd.Env = []string{"SIWTUN_PERM_SOCKET=" + path, "HOME=/", "PATH=/usr/bin:/bin"}
		cmd.Dir = binDir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, c := range []struct {
		name  string
		cred  *syscall.Credential
		allow bool
	}{
		{"uid 65534, not in the group", &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}, false},
		{"uid 65534, the group supplementary", &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{uint32(gid)}}, true},
		{"uid 65534, the group primary", &syscall.Credential{Uid: 65534, Gid: uint32(gid), Groups: []uint32{}}, true},
		{"root", nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := run(c.cred)
			switch {
			case c.allow && err != nil:
				t.Fatalf("could not open the device: %v\n%s", err, out)
			case !c.allow && err == nil:
				t.Fatalf("opened the device from outside the group:\n%s", out)
			case !c.allow && !strings.Contains(out, "DIAL: ") || !c.allow && !strings.Contains(out, "permission denied"):
				t.Fatalf("failed, but not with permission denied: %v\n%s", err, out)
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "DIAL: ") || strings.Contains(l, "opened ") {
					t.Log(strings.TrimSpace(l))
				}
			}
		})
	}
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
