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

// TestClientsDoNotLinkTheEngine: a program that only talks to a daemon
// through the verbs socket must not compile gVisor's TCP/IP stack or the
// engine. The verbs API and its vocabulary are clients; tools/rping and
// apps/perftest are applications, which import verbs and nothing of the
// RNIC's inside.
func TestClientsDoNotLinkTheEngine(t *testing.T) {
	engine := []string{module + "/netstack", module + "/offload", module + "/rnic", module + "/tun"}
	for _, tc := range []struct {
		pkg string
		app bool // an application: its own imports are verbs only
	}{
		{"./verbs", false},
		{"./verbs/ibv", false},
		{"./tools/rping", true},
		{"./apps/perftest", true},
	} {
		t.Run(tc.pkg, func(t *testing.T) {
			deps := goList(t, "-deps", tc.pkg)
			var bad []string
			for _, d := range deps {
				if strings.HasPrefix(d, "gvisor.dev/") || slices.Contains(engine, d) {
					bad = append(bad, d)
				}
			}
			if len(bad) > 0 {
				t.Errorf("%s depends on %d engine packages: %v", tc.pkg, len(bad), bad)
			}
			if !tc.app {
				return
			}
			for _, imp := range goList(t, "-f", `{{join .Imports " "}}`, tc.pkg) {
				if strings.HasPrefix(imp, module+"/") && imp != module+"/verbs" {
					t.Errorf("%s imports %s: an application imports %s/verbs only", tc.pkg, imp, module)
				}
			}
		})
	}
}

// TestControlPlaneDoesNotImportApplications: ctl serves the daemon's
// control socket; applications (apps/…, tools/…) depend on it, never the
// other way round.
func TestControlPlaneDoesNotImportApplications(t *testing.T) {
	for _, d := range goList(t, "-deps", "./ctl") {
		if strings.HasPrefix(d, module+"/apps/") || strings.HasPrefix(d, module+"/tools/") {
			t.Errorf("ctl depends on the application %s", d)
		}
	}
}
