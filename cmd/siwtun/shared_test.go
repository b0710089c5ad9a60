package main

import (
	"net/netip"
	"strings"
	"testing"
)

// TestParseShared: --shared takes an IPv4 address with or without a
// prefix length, and refuses IPv6, loopback and what is no address.
func TestParseShared(t *testing.T) {
	for _, tc := range []struct {
		in    string
		want  netip.Prefix
		given bool
		err   string
	}{
		{in: "198.18.0.1", want: netip.MustParsePrefix("198.18.0.1/32")},
		{in: "198.18.0.1/24", want: netip.MustParsePrefix("198.18.0.1/24"), given: true},
		{in: "2001:db8::1", err: "IPv4 only"},
		{in: "127.0.0.1", err: "not loopback"},
		{in: "0.0.0.0", err: "unicast"},
		{in: "eth0", err: "want an IPv4 address"},
		{in: "", err: "want an IPv4 address"},
	} {
		p, given, err := parseShared(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseShared(%q): %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || p != tc.want || given != tc.given {
			t.Errorf("parseShared(%q) = %v %v %v, want %v %v", tc.in, p, given, err, tc.want, tc.given)
		}
	}
}

// TestFixCommand: the command that adds a missing address keeps a given
// prefix length and interface (eth9: none of this machine's, whose
// networks would otherwise lend their prefix length; test/'s
// TestSharedBadInput checks that in a namespace of its own).
func TestFixCommand(t *testing.T) {
	for _, tc := range []struct {
		p     string
		given bool
		dev   string
		want  string
	}{
		{"192.0.2.7/24", true, "eth9", "ip addr add 192.0.2.7/24 dev eth9"},
		{"192.0.2.7/32", false, "eth9", "ip addr add 192.0.2.7/32 dev eth9"},
	} {
		if got := fixCommand(netip.MustParsePrefix(tc.p), tc.given, tc.dev); got != tc.want {
			t.Errorf("fixCommand(%s, %v, %q) = %q, want %q", tc.p, tc.given, tc.dev, got, tc.want)
		}
	}
}
