package test

import (
	"bufio"
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/syncbuf"
)

// installPrefix is make install's default PREFIX, under the test's DESTDIR.
const installPrefix = "usr/local"

// TestMakeInstall: make install into a DESTDIR puts the binary, libsiwtun,
// the man pages, the shell completions, the systemd unit template and the
// example device configuration where doc/install.md says; the installed
// siwtun exec finds the installed library; the unit's command line, as
// systemd would run it from the installed unit and configuration, brings
// an RNIC up in a namespace and SIGTERM takes it down (subtest unit, root);
// make uninstall removes everything but the device's configuration.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not found: make install is what is tested")
	}
	tmp := t.TempDir()
	dest, bin := filepath.Join(tmp, "dest"), filepath.Join(tmp, "bin")
	// BIN keeps the checkout's bin/ untouched while other tests use it.
	if out, err := exec.Command("make", "-C", "..", "install", "DESTDIR="+dest, "BIN="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	prefix := filepath.Join(dest, installPrefix)
	checkInstalledFiles(t, dest, bin)
	checkInstalledExec(t, prefix)
	checkUnitSyntax(t, dest)

	t.Run("unit", func(t *testing.T) {
		requireRoot(t)
		conf := filepath.Join(dest, "etc", "siwtun", "siwtun0.conf")
		example, err := os.ReadFile(conf + ".example")
		if err != nil {
			t.Fatal(err)
		}
		// As doc/install.md says: the example, copied to the device's name.
		if err := os.WriteFile(conf, example, 0o644); err != nil {
			t.Fatal(err)
		}
		runUnitCommand(t, dest, "siwtun0")
	})

	if out, err := exec.Command("make", "-C", "..", "uninstall", "DESTDIR="+dest).CombinedOutput(); err != nil {
		t.Fatalf("make uninstall: %v\n%s", err, out)
	}
	var left []string
	filepath.WalkDir(dest, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dest, path)
			left = append(left, rel)
		}
		return nil
	})
	want := ""
	if _, err := os.Stat(filepath.Join(dest, "etc", "siwtun", "siwtun0.conf")); err == nil {
		want = "etc/siwtun/siwtun0.conf"
	}
	if got := strings.Join(left, " "); got != want {
		t.Errorf("after make uninstall, left: %q; want only the device's configuration (%q)", got, want)
	}
}

// checkInstalledFiles checks every installed file: present, its mode, and
// what says it is the right one.
func checkInstalledFiles(t *testing.T, dest, bin string) {
	t.Helper()
	p := func(rel string) string { return filepath.Join(dest, rel) }
	pages, err := filepath.Glob(filepath.Join("..", "doc", "man", "*.1"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no man pages in doc/man (%v)", err)
	}
	files := []struct {
		path, contains string
		mode           fs.FileMode
	}{
		{installPrefix + "/bin/siwtun", "\x7fELF", 0o755},
		{installPrefix + "/share/bash-completion/completions/siwtun", "__start_siwtun", 0o644},
		{installPrefix + "/share/zsh/site-functions/_siwtun", "#compdef siwtun", 0o644},
		{installPrefix + "/share/fish/vendor_completions.d/siwtun.fish", "complete -c siwtun", 0o644},
		{installPrefix + "/lib/systemd/system/siwtun@.service", "ExecStart=/usr/local/bin/siwtun up --dev %i $SIWTUN_FLAGS", 0o644},
		{"etc/siwtun/siwtun0.conf.example", "SIWTUN_FLAGS=", 0o644},
	}
	for _, page := range pages {
		files = append(files, struct {
			path, contains string
			mode           fs.FileMode
		}{installPrefix + "/share/man/man1/" + filepath.Base(page), ".TH ", 0o644})
	}
	// libsiwtun is built when rdma-core's headers are there (make setup
	// installs them); then it must be installed.
	if _, err := os.Stat(filepath.Join(bin, "libsiwtun.so")); err == nil {
		files = append(files, struct {
			path, contains string
			mode           fs.FileMode
		}{installPrefix + "/lib/siwtun/libsiwtun.so", "\x7fELF", 0o755})
	} else {
		t.Logf("libsiwtun not built (no rdma-core headers): its installation is not checked")
	}
	for _, f := range files {
		fi, err := os.Stat(p(f.path))
		if err != nil {
			t.Errorf("not installed: %v", err)
			continue
		}
		if fi.Mode().Perm() != f.mode {
			t.Errorf("%s has mode %v, want %v", f.path, fi.Mode().Perm(), f.mode)
		}
		b, err := os.ReadFile(p(f.path))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), f.contains) {
			t.Errorf("%s does not contain %q", f.path, f.contains)
		}
		if strings.Contains(string(b), "@BINDIR@") || strings.Contains(string(b), "@SYSCONFDIR@") {
			t.Errorf("%s keeps a placeholder make install should have replaced", f.path)
		}
	}
}

// checkInstalledExec: the installed siwtun exec preloads the installed
// libsiwtun (../lib/siwtun from the binary), with no SIWTUN_LIB to help.
func checkInstalledExec(t *testing.T, prefix string) {
	t.Helper()
	lib := filepath.Join(prefix, "lib", "siwtun", "libsiwtun.so")
	if _, err := os.Stat(lib); err != nil {
		return // not built: checkInstalledFiles said so
	}
	cmd := exec.Command(filepath.Join(prefix, "bin", "siwtun"), "exec", "--", "printenv", "LD_PRELOAD")
	cmd.Env = withoutEnv(os.Environ(), "SIWTUN_LIB", "LD_PRELOAD")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("installed siwtun exec: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != lib {
		t.Errorf("installed siwtun exec preloads %q, want the installed %s", got, lib)
	}
}

// checkUnitSyntax runs systemd-analyze verify, where it is installed, on
// the installed unit (its binary's path moved into DESTDIR, where it is):
// an unknown key or a bad value is reported there, where systemd would
// only log it at boot.
func checkUnitSyntax(t *testing.T, dest string) {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not found: the unit's syntax is not verified")
		return
	}
	b, err := os.ReadFile(filepath.Join(dest, installPrefix, "lib", "systemd", "system", "siwtun@.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := strings.ReplaceAll(string(b), "/usr/local/bin/siwtun", filepath.Join(dest, installPrefix, "bin", "siwtun"))
	path := filepath.Join(t.TempDir(), "siwtun@siwtun0.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify siwtun@siwtun0.service: %v\n%s", err, out)
	}
}

// unit is what the test takes from the installed siwtun@.service.
type unit struct {
	typ, execStart, envFile, killSignal string
	stopTimeout                         time.Duration
}

// readUnit reads the [Service] settings of the unit at path, with the
// instance's specifiers (%i, %I, %%) expanded as systemd expands them.
func readUnit(t *testing.T, path, instance string) unit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	spec := strings.NewReplacer("%i", instance, "%I", instance, "%%", "%")
	var u unit
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			section = line
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || section != "[Service]" {
			continue
		}
		value = spec.Replace(strings.TrimSpace(value))
		switch strings.TrimSpace(key) {
		case "Type":
			u.typ = value
		case "ExecStart":
			u.execStart = value
		case "EnvironmentFile":
			u.envFile = value
		case "KillSignal":
			u.killSignal = value
		case "TimeoutStopSec":
			d, err := time.ParseDuration(value)
			if err != nil {
				d, err = time.ParseDuration(value + "s")
			}
			if err != nil {
				t.Fatalf("TimeoutStopSec=%s: %v", value, err)
			}
			u.stopTimeout = d
		}
	}
	if u.execStart == "" || u.envFile == "" {
		t.Fatalf("%s has no ExecStart or no EnvironmentFile", path)
	}
	return u
}

// readEnvFile reads an EnvironmentFile: KEY=VALUE lines, # comments, a
// value in double or single quotes taken without them.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[strings.TrimSpace(k)] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return env
}

// expandExec splits an ExecStart command line into words as systemd does
// for this unit: a word that is $VAR alone becomes the variable's words,
// ${VAR} inside a word its value.
func expandExec(t *testing.T, line string, env map[string]string) []string {
	t.Helper()
	var argv []string
	for _, w := range strings.Fields(line) {
		if name, ok := strings.CutPrefix(w, "$"); ok && !strings.HasPrefix(name, "{") {
			v, set := env[name]
			if !set {
				t.Fatalf("ExecStart uses $%s, which the EnvironmentFile does not set", name)
			}
			argv = append(argv, strings.Fields(v)...)
			continue
		}
		argv = append(argv, os.Expand(w, func(name string) string { return env[name] }))
	}
	return argv
}

// runUnitCommand runs the installed unit's ExecStart for instance dev in a
// namespace, as systemd would run it, and checks its life: READY=1 once
// the RNIC is up (Type=notify), the device and its link as ctl link shows
// them, then KillSignal: STOPPING=1, a clean exit within TimeoutStopSec,
// the device and the sockets gone.
func runUnitCommand(t *testing.T, dest, dev string) {
	t.Helper()
	u := readUnit(t, filepath.Join(dest, installPrefix, "lib", "systemd", "system", "siwtun@.service"), dev)
	if u.typ != "notify" || u.killSignal != "SIGTERM" || u.stopTimeout <= 0 {
		t.Fatalf("unit: Type=%s KillSignal=%s TimeoutStopSec=%v; want notify, SIGTERM and a timeout", u.typ, u.killSignal, u.stopTimeout)
	}
	env := readEnvFile(t, filepath.Join(dest, strings.TrimPrefix(u.envFile, "-")))
	argv := expandExec(t, u.execStart, env)
	// The unit names the installed path; the binary is under DESTDIR.
	if argv[0] != "/"+installPrefix+"/bin/siwtun" {
		t.Fatalf("ExecStart runs %s, want /%s/bin/siwtun", argv[0], installPrefix)
	}
	argv[0] = filepath.Join(dest, argv[0])
	t.Logf("ExecStart: %s", strings.Join(argv, " "))

	n := newNetns(t)
	tmp := t.TempDir()
	notify := filepath.Join(tmp, "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The daemon's sockets go to a directory of the test's own (systemd's
	// daemon would use /run/siwtun, which other daemons may share here).
	sockets := filepath.Join(tmp, "run")
	cmd := n.command(argv...)
	cmd.Env = append(withoutEnv(os.Environ(), "NOTIFY_SOCKET", "SIWTUN_SOCKET_DIR"),
		"NOTIFY_SOCKET="+notify, "SIWTUN_SOCKET_DIR="+sockets)
	log := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed once the process has been waited for, waitErr set.
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill() // by its PID: the daemon this test started
			<-exited
		}
	})

	states := make(chan string, 4)
	go func() {
		buf := make([]byte, 512)
		for {
			k, err := l.Read(buf)
			if err != nil {
				close(states)
				return
			}
			states <- string(buf[:k])
		}
	}()
	waitState := func(want string) {
		t.Helper()
		select {
		case s := <-states:
			if s != want {
				t.Fatalf("the daemon sent %q on NOTIFY_SOCKET, want %q\n%s", s, want, log.String())
			}
		case <-exited:
			t.Fatalf("the daemon exited (%v) before sending %s\n%s", waitErr, want, log.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s on NOTIFY_SOCKET after 30 s\n%s", want, log.String())
		}
	}
	waitState("READY=1")

	// Up: ctl link answers for the device with the conf's addresses, and
	// the host side of the TUN device has its address.
	link := n.run(argv[0], "ctl", "link", "--socket-dir", sockets)
	for _, want := range []string{"link " + dev + "/1 state ACTIVE", "netdev " + dev, "addrs 198.18.0.2/24", "host_addrs 198.18.0.1/24"} {
		if !strings.Contains(link, want) {
			t.Errorf("ctl link: %q does not say %q", link, want)
		}
	}
	if out := n.run("ip", "-o", "addr", "show", "dev", dev); !strings.Contains(out, "198.18.0.1/24") {
		t.Errorf("ip addr show %s: %s", dev, out)
	}

	// Stop as systemd stops it.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitState("STOPPING=1")
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("after SIGTERM the daemon exited with %v, want status 0\n%s", waitErr, log.String())
		}
	case <-time.After(u.stopTimeout):
		t.Fatalf("the daemon still runs %v after SIGTERM (TimeoutStopSec: systemd would kill it)\n%s", u.stopTimeout, log.String())
	}
	if out, err := n.command("ip", "link", "show", dev).CombinedOutput(); err == nil {
		t.Errorf("%s is still there after the daemon stopped: %s", dev, out)
	}
	for _, s := range []string{dev + ".sock", dev + ".ctl"} {
		if _, err := os.Stat(filepath.Join(sockets, s)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("socket %s left behind (stat: %v)", s, err)
		}
	}
	if t.Failed() {
		t.Logf("daemon log:\n%s", log.String())
	}
}

// withoutEnv returns env without the variables named.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		keep := true
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
