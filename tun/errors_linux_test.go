package tun

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestCreateError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string // substring of the message
	}{
		{name: "no device node", err: syscall.ENOENT, want: "modprobe tun"},
		{name: "no driver", err: syscall.ENODEV, want: "modprobe tun"},
		{name: "no driver (ENXIO)", err: syscall.ENXIO, want: "modprobe tun"},
		{name: "TUNSETIFF EPERM", err: os.NewSyscallError("ioctl", syscall.EPERM), want: "needs CAP_NET_ADMIN: run as root"},
		{name: "open EACCES", err: syscall.EACCES, want: "needs CAP_NET_ADMIN: run as root"},
		{name: "TUNSETIFF EBUSY", err: os.NewSyscallError("ioctl", syscall.EBUSY), want: `device "siwtun0" is in use (is another siwtun up running?)`},
		{name: "pre-check EBUSY", err: syscall.EBUSY, want: "is in use"},
		{name: "TAP of that name", err: os.NewSyscallError("ioctl", syscall.EINVAL), want: "is not a free TUN"},
		{name: "veth of that name", err: syscall.EEXIST, want: "is not a free TUN"},
		{name: "other", err: syscall.EMFILE, want: `tun: create "siwtun0": too many open files`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := createError("siwtun0", tt.err)
			if !strings.Contains(got.Error(), tt.want) {
				t.Errorf("createError(%v) = %q, want it to contain %q", tt.err, got, tt.want)
			}
			if !errors.Is(got, tt.err) {
				t.Errorf("createError(%v) does not wrap the original error", tt.err)
			}
		})
	}
	// The wrapped errno keeps the standard classifications.
	if !errors.Is(createError("x", syscall.EPERM), fs.ErrPermission) {
		t.Error("EPERM is not fs.ErrPermission")
	}
	if !errors.Is(createError("x", syscall.ENOENT), fs.ErrNotExist) {
		t.Error("ENOENT is not fs.ErrNotExist")
	}
}

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"siwtun0", true},
		{"", true},
		{"abcdefghijklmno", true}, // 15 bytes
		{"abcdefghijklmnop", false},
		{".", false},
		{"..", false},
		{"a/b", false},
		{"a:b", false},
		{"a b", false},
		{"tun\n", false},
	}
	for _, tt := range tests {
		err := validName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("validName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("validName(%q) = %v, does not wrap EINVAL", tt.name, err)
		}
	}
}

func TestEventString(t *testing.T) {
	for e, want := range map[Event]string{EventUp: "up", EventDown: "down", EventMTUUpdate: "mtu-update", 8: "Event(8)"} {
		if got := e.String(); got != want {
			t.Errorf("Event(%d).String() = %q, want %q", int(e), got, want)
		}
	}
}
