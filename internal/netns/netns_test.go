package netns

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func requireIP(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip(8) from iproute2")
	}
}

// TestIP runs ip(8) commands that need no privileges: one that succeeds and
// one ip rejects, whose error must name the command and carry ip's message.
func TestIP(t *testing.T) {
	requireIP(t)
	if err := IP("-V"); err != nil {
		t.Fatalf("ip -V: %v", err)
	}
	err := IP("nosuchobject", "show")
	if err == nil {
		t.Fatal("ip nosuchobject show succeeded, want an error")
	}
	msg := err.Error()
	for _, want := range []string{"ip nosuchobject show: ", "exit status", `"nosuchobject" is unknown`} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
}

// TestCanRun checks CanRun's answer against this host: non-root is refused
// for root first; root with /dev/net/tun and ip(8) is accepted.
func TestCanRun(t *testing.T) {
	err := CanRun()
	if os.Geteuid() != 0 {
		if err == nil || !strings.Contains(err.Error(), "needs root") {
			t.Fatalf("CanRun() = %v as uid %d, want a needs-root error", err, os.Geteuid())
		}
		return
	}
	_, tunErr := os.Stat("/dev/net/tun")
	_, ipErr := exec.LookPath("ip")
	switch {
	case tunErr != nil:
		if err == nil || !strings.Contains(err.Error(), "/dev/net/tun") {
			t.Fatalf("CanRun() = %v without /dev/net/tun, want an error naming it", err)
		}
	case ipErr != nil:
		if err == nil || !strings.Contains(err.Error(), "ip(8)") {
			t.Fatalf("CanRun() = %v without ip(8), want an error naming it", err)
		}
	case err != nil:
		t.Fatalf("CanRun() = %v as root with /dev/net/tun and ip(8)", err)
	}
}
