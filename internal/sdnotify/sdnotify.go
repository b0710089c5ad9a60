// Package sdnotify tells the service manager that started the daemon
// (systemd, for a unit with Type=notify) how it is doing, over the datagram
// socket named by $NOTIFY_SOCKET, as sd_notify(3) does: systemd then starts
// the units ordered after the RNIC once its device and sockets are up, not
// when its process has merely been forked.
package sdnotify

import (
	"fmt"
	"net"
	"os"
)

// The states a daemon sends (sd_notify(3)).
const (
	// Ready says start-up is finished: the device and sockets are up.
	Ready = "READY=1"
	// Stopping says the daemon is shutting down.
	Stopping = "STOPPING=1"
)

// Notify sends state to the socket named by $NOTIFY_SOCKET (a path, or an
// abstract name written with a leading @). Without that variable, as when
// the daemon is not run by systemd, it does nothing and reports false.
func Notify(state string) (sent bool, err error) {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return false, nil
	}
	// Go's net package maps a leading @ to Linux's abstract namespace.
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("sd_notify %s: %w", name, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sd_notify %s: %w", name, err)
	}
	return true, nil
}
