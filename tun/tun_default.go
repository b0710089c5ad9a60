//go:build !linux

package tun

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
)

// Create opens a TUN device; only Linux is supported.
func Create(name string, mtu int) (Device, error) {
	return nil, fmt.Errorf("tun: create %q: not supported on %s: %w", name, runtime.GOOS, errors.ErrUnsupported)
}

// Configure configures a TUN link; only Linux is supported.
func Configure(name string, mtu int, hostAddrs []netip.Prefix) error {
	return fmt.Errorf("tun: configure %q: not supported on %s: %w", name, runtime.GOOS, errors.ErrUnsupported)
}

// Delete removes a link; only Linux is supported.
func Delete(name string) error {
	return fmt.Errorf("tun: delete %q: not supported on %s: %w", name, runtime.GOOS, errors.ErrUnsupported)
}

// Exists reports whether a link exists; only Linux is supported.
func Exists(name string) (bool, error) {
	return false, fmt.Errorf("tun: exists %q: not supported on %s: %w", name, runtime.GOOS, errors.ErrUnsupported)
}

// CreateOffload opens a TUN device with segmentation offload; only Linux
// is supported.
func CreateOffload(name string, mtu int) (Device, error) {
	return nil, fmt.Errorf("tun: create %q: not supported on %s: %w", name, runtime.GOOS, errors.ErrUnsupported)
}
