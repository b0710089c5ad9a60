// Package rnictest builds in-process RNICs for tests, as net/http/httptest
// builds servers: one call instead of a stack, an engine and a verbs
// device assembled by hand in every test that needs a peer.
package rnictest

import (
	"net/netip"
	"testing"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic"
)

// New builds an RNIC named name on link, with address addr and MTU mtu,
// its engine configured by offload.DefaultConfig(name) and then by mod (if
// not nil). It is closed when the test ends; a failure ends the test.
func New(t testing.TB, link *netstack.Link, addr netip.Prefix, mtu int, name string, mod func(*offload.Config)) *rnic.RNIC {
	t.Helper()
	cfg := offload.DefaultConfig(name)
	if mod != nil {
		mod(&cfg)
	}
	r, err := rnic.New(link, rnic.Config{Stack: netstack.Options{Addrs: []netip.Prefix{addr}, MTU: mtu}, Engine: cfg})
	if err != nil {
		t.Fatalf("rnic.New: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
