package siwtun

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// The tree holds sources, documentation and the test data they need; build
// and test output (binaries, profiles) stays out of it, however it was
// produced, because a clone should be small and every file in it readable.
const maxTrackedSize = 1 << 20

// nonText are the tracked files that are not text, each by name: captures
// and golden bytes the codec tests read, and the figures of the docs.
// Anything else that is not text is build output or belongs elsewhere.
var nonText = []string{
	// Linux siw's rping traffic, CRC on and off (iwarp/mpa, capture/).
	"iwarp/mpa/testdata/siw-rping-crc-mtu1500.pcap",
	"iwarp/mpa/testdata/siw-rping-nocrc-mtu1500.pcap",
	// FPDUs with bad CRCs, as siw sent them (iwarp/mpa).
	"iwarp/mpa/testdata/siw-bad-crc-fpdus.bin",
	// The teaching view's lessons, as doc/teaching shows them
	// (cmd/siwtun's lesson test writes them from the headless browser).
	"doc/teaching/lesson-anatomy.png",
	"doc/teaching/lesson-credits.png",
	"doc/teaching/lesson-markers.png",
	"doc/teaching/lesson-negotiation.png",
	"doc/teaching/lesson-out-of-order.png",
	"doc/teaching/lesson-placement.png",
	"doc/teaching/lesson-terminate.png",
}

// trackedFiles returns the files git tracks in this checkout that exist
// on disk (a file deleted but not yet committed is not in the tree).
func trackedFiles(t *testing.T) []string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not found: the tracked files are git's")
	}
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout (git ls-files: %v)", err)
	}
	var files []string
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if fi, err := os.Lstat(f); err == nil && fi.Mode().IsRegular() {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		t.Fatal("git ls-files listed no file")
	}
	return files
}

// isText reports whether b is text: valid UTF-8 without NUL bytes (an ELF
// binary, an archive, an image or a capture fails both).
func isText(b []byte) bool {
	return !bytes.HasPrefix(b, []byte("\x7fELF")) && bytes.IndexByte(b, 0) < 0 && utf8.Valid(b)
}

// TestTrackedFilesAreSources: no tracked file is over maxTrackedSize, and
// none is binary unless nonText names it.
func TestTrackedFilesAreSources(t *testing.T) {
	files := trackedFiles(t)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > maxTrackedSize {
			t.Errorf("%s is %d bytes, over %d: build output or data that belongs outside the tree", f, len(b), maxTrackedSize)
		}
		if !isText(b) && !slices.Contains(nonText, f) {
			kind := "not text"
			if bytes.HasPrefix(b, []byte("\x7fELF")) {
				kind = "an ELF binary"
			}
			t.Errorf("%s is %s: remove it (build output is ignored by .gitignore), or name it in nonText if it is test data", f, kind)
		}
	}
	for _, f := range nonText {
		if !slices.Contains(files, f) {
			t.Errorf("nonText names %s, which is not in the tree: remove it from the list", f)
		}
	}
}

// TestGitignoreCoversBuildOutput: what make build and go test leave
// behind is ignored, so it cannot be committed by accident.
func TestGitignoreCoversBuildOutput(t *testing.T) {
	trackedFiles(t) // skips outside a git checkout
	for _, p := range []string{
		"bin/siwtun", "bin/libsiwtun.so", "bin/asan/libsiwtun.so", "bin/siwtun-ctest", // make build
		"siwtun",                           // go build ./cmd/siwtun
		"verbs.test", "iwarp/mpa/mpa.test", // go test -c, go test -cpuprofile
		"cpu.out", "offload/cpu.prof", "x.pprof", "cover.out", // profiles and coverage
		"libsiwtun/verbs.o", // a C object built by hand
	} {
		if err := exec.Command("git", "check-ignore", "-q", "--no-index", p).Run(); err != nil {
			t.Errorf("%s is not ignored by .gitignore", p)
		}
	}
}

// machinePath matches an absolute path of one development machine's file
// system: a home directory or a work area. The tree finds what lies beside
// it relatively (the shared material is ../shared from the checkout,
// internal/testkit.SharedDir), so it works wherever it is cloned.
var machinePath = regexp.MustCompile(`(^|[^A-Za-z0-9_.~$/-])/(work|home|Users|root)/|[A-Za-z]:\\Users\\`)

// machineDirs are the literal parts of machinePath, to skip quickly the
// files that cannot match (built, so that this file does not match).
var machineDirs = func() []string {
	dirs := []string{`:\Users\`}
	for _, d := range []string{"work", "home", "Users", "root"} {
		dirs = append(dirs, "/"+d+"/")
	}
	return dirs
}()

// TestNoMachinePaths: no tracked text file (code, tests, testdata, docs)
// names a path of one machine.
func TestNoMachinePaths(t *testing.T) {
	for _, f := range trackedFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !isText(b) || !slices.ContainsFunc(machineDirs, func(d string) bool { return bytes.Contains(b, []byte(d)) }) {
			continue
		}
		for i, line := range strings.Split(string(b), "\n") {
			if machinePath.MatchString(line) {
				t.Errorf("%s:%d names a path of one machine: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}
