package testkit

import (
	"bytes"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func TestHex(t *testing.T) {
	got := Hex(t, "4d50 41 20")
	if !bytes.Equal(got, []byte("MPA ")) {
		t.Fatalf("Hex = %x", got)
	}
}

func TestGoldenMatches(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.golden")
	if err := os.WriteFile(path, []byte("same\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	Golden(t, path, []byte("same\n")) // fails t if it differs
}

func TestEventually(t *testing.T) {
	var n atomic.Int32
	go func() {
		time.Sleep(5 * time.Millisecond)
		n.Store(1)
	}()
	Eventually(t, 10*time.Second, "the flag", func() bool { return n.Load() == 1 })
	if n.Load() != 1 {
		t.Fatal("returned before the condition held")
	}
}
