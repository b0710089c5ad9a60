package siwtun

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/siwtun/siwtun"

// goList runs `go list` with args and returns its lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

// The RNIC's side of the tree: the TUN device, the TCP/IP stack, the
// engine, the RNIC assembled from them and the daemon that serves it, and
// the command that runs the daemon. Every other package of the module is
// on the client's side, or shared by both (the wire codecs in iwarp/, the
// verbs vocabulary, the sockets' protocols), and links none of them.
var rnicSide = []string{"tun", "netstack", "offload", "rnic", "daemon", "cmd/siwtun"}

// onRNICSide reports whether the package path p is on the RNIC's side:
// one of rnicSide or below it.
func onRNICSide(p string) bool {
	rel, ok := strings.CutPrefix(p, module+"/")
	if !ok {
		return false
	}
	for _, s := range rnicSide {
		if rel == s || strings.HasPrefix(rel, s+"/") {
			return true
		}
	}
	return false
}

// TestClientsDoNotLinkTheEngine: a program that only talks to a daemon
// through its sockets (the verbs API, libsiwtun's protocol, ctl's client,
// the live view, the benchmarks, the applications and examples) must not
// compile gVisor's TCP/IP stack or the engine. Every package not on the
// RNIC's side is checked, so a new one is guarded from its first commit.
func TestClientsDoNotLinkTheEngine(t *testing.T) {
	var checked []string
	for _, pkg := range goList(t, "./...") {
		if onRNICSide(pkg) {
			continue
		}
		checked = append(checked, pkg)
		t.Run(strings.TrimPrefix(pkg, module+"/"), func(t *testing.T) {
			var bad []string
			for _, d := range goList(t, "-deps", pkg) {
				if strings.HasPrefix(d, "gvisor.dev/") || onRNICSide(d) {
					bad = append(bad, d)
				}
			}
			if len(bad) > 0 {
				t.Errorf("%s depends on %d packages of the RNIC's side: %v", pkg, len(bad), bad)
			}
		})
	}
	// The packages the layering exists for must be among those checked.
	for _, want := range []string{"verbs", "verbs/ibv", "internal/uabi", "ctl", "web", "bench", "apps/perftest", "apps/connperf", "apps/tcpperf", "tools/rping", "examples/hello", "capture", "iwarp/mpa", "iwarp/ddp", "iwarp/rdmap", "iwarp/mpa/inspect"} {
		if !slices.Contains(checked, module+"/"+want) {
			t.Errorf("%s is not checked (not found, or counted on the RNIC's side)", want)
		}
	}
}

// TestApplicationsImportVerbsOnly: the applications and examples are
// written as a user's program is, against package verbs and nothing else
// of siwtun's.
func TestApplicationsImportVerbsOnly(t *testing.T) {
	for _, pkg := range []string{"./tools/rping", "./apps/perftest", "./apps/connperf", "./examples/hello"} {
		for _, imp := range goList(t, "-f", `{{join .Imports " "}}`, pkg) {
			if strings.HasPrefix(imp, module+"/") && imp != module+"/verbs" {
				t.Errorf("%s imports %s: an application imports %s/verbs only", pkg, imp, module)
			}
		}
	}
}

// TestControlPlaneDoesNotImportApplications: the control plane (ctl, its
// client, and daemon/ctlsrv, its server) serves applications (apps/…,
// tools/…), which depend on it, never the other way round.
func TestControlPlaneDoesNotImportApplications(t *testing.T) {
	for _, d := range goList(t, "-deps", "./ctl", "./daemon/ctlsrv") {
		if strings.HasPrefix(d, module+"/apps/") || strings.HasPrefix(d, module+"/tools/") {
			t.Errorf("ctl depends on the application %s", d)
		}
	}
}
