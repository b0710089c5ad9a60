package main

import (
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestSocketDirEverywhere: every command that reaches a daemon (it has a
// --dev flag) takes --socket-dir, and its default is SIWTUN_SOCKET_DIR
// when that is set, /run/siwtun when not: one helper defines them all.
func TestSocketDirEverywhere(t *testing.T) {
	for _, env := range []string{"/tmp/siwtun-socketdir-test", ""} {
		t.Setenv("SIWTUN_SOCKET_DIR", env)
		want := env
		if want == "" {
			want = "/run/siwtun"
		}
		checked := 0
		var walk func(c *cobra.Command)
		walk = func(c *cobra.Command) {
			for _, sub := range c.Commands() {
				walk(sub)
			}
			lookup := func(name string) *pflag.Flag {
				if f := c.Flags().Lookup(name); f != nil {
					return f
				}
				return c.InheritedFlags().Lookup(name)
			}
			if lookup("dev") == nil {
				return
			}
			f := lookup("socket-dir")
			if f == nil {
				t.Errorf("%s has --dev but no --socket-dir", c.CommandPath())
				return
			}
			if f.DefValue != want {
				t.Errorf("SIWTUN_SOCKET_DIR=%q: %s --socket-dir defaults to %q, want %q", env, c.CommandPath(), f.DefValue, want)
			}
			checked++
		}
		walk(newRootCmd())
		if checked < 8 {
			t.Errorf("only %d commands with --dev and --socket-dir", checked)
		}
	}
}
