// Package testkit holds the helpers siwtun's tests share: golden files,
// hex test vectors and waiting for a condition. Only tests import it.
package testkit

import (
	"bytes"
	"encoding/hex"
	"flag"
	"os"
	"strings"
	"testing"
	"time"
)

// update is the test binaries' -update flag: Golden rewrites its files.
var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// Golden compares got with the file at path, or writes got there when the
// test runs with -update.
func Golden(t testing.TB, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update rewrites it)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// Hex decodes s, hex digits that may be grouped with spaces, and fails t
// if s is not hex.
func Hex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// Eventually polls cond every millisecond until it holds, and fails t,
// naming what it waited for, if it does not within timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
