package sdnotify

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// listen opens a datagram socket like systemd's notification socket.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func receive(t *testing.T, l *net.UnixConn) string {
	t.Helper()
	l.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 256)
	n, err := l.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotifyPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	l := listen(t, path)
	t.Setenv("NOTIFY_SOCKET", path)
	for _, state := range []string{Ready, Stopping} {
		sent, err := Notify(state)
		if !sent || err != nil {
			t.Fatalf("Notify(%s) = %v, %v", state, sent, err)
		}
		if got := receive(t, l); got != state {
			t.Errorf("received %q, want %q", got, state)
		}
	}
}

// TestNotifyAbstract: systemd may name an abstract socket (@...).
func TestNotifyAbstract(t *testing.T) {
	name := fmt.Sprintf("@siwtun-sdnotify-test-%d", os.Getpid())
	l := listen(t, name)
	t.Setenv("NOTIFY_SOCKET", name)
	if sent, err := Notify(Ready); !sent || err != nil {
		t.Fatalf("Notify = %v, %v", sent, err)
	}
	if got := receive(t, l); got != Ready {
		t.Errorf("received %q, want %q", got, Ready)
	}
}

// TestNotifyUnset: outside systemd nothing is sent and nothing fails.
func TestNotifyUnset(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := Notify(Ready); sent || err != nil {
		t.Errorf("Notify without NOTIFY_SOCKET = %v, %v; want false, nil", sent, err)
	}
}

// TestNotifyNoListener: a socket that is not there is an error naming it.
func TestNotifyNoListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gone")
	t.Setenv("NOTIFY_SOCKET", path)
	if sent, err := Notify(Ready); sent || err == nil {
		t.Errorf("Notify to a missing socket = %v, %v; want an error", sent, err)
	}
}
