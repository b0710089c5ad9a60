package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readPages returns the files of dir by name.
func readPages(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string][]byte{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		pages[e.Name()] = b
	}
	return pages
}

// TestGeneratedDocsCurrent: the committed man pages (doc/man) and CLI
// reference (doc/cli) are what siwtun gendoc writes from the commands as
// they are now, whatever the environment (a socket directory set in
// SIWTUN_SOCKET_DIR does not reach the defaults they show).
func TestGeneratedDocsCurrent(t *testing.T) {
	t.Setenv("SIWTUN_SOCKET_DIR", "/elsewhere")
	tmp := t.TempDir()
	man, md := filepath.Join(tmp, "man"), filepath.Join(tmp, "cli")
	mustRun(t, "gendoc", "--man", man, "--markdown", md)
	for _, tc := range []struct{ got, committed string }{
		{man, filepath.Join("..", "..", "doc", "man")},
		{md, filepath.Join("..", "..", "doc", "cli")},
	} {
		got, want := readPages(t, tc.got), readPages(t, tc.committed)
		if len(got) < 20 {
			t.Fatalf("gendoc wrote %d pages into %s, want one per command", len(got), tc.got)
		}
		for name, b := range got {
			w, ok := want[name]
			switch {
			case !ok:
				t.Errorf("%s/%s is missing: run go generate ./cmd/siwtun", tc.committed, name)
			case !bytes.Equal(b, w):
				t.Errorf("%s/%s is stale: run go generate ./cmd/siwtun", tc.committed, name)
			}
		}
		for name := range want {
			if _, ok := got[name]; !ok {
				t.Errorf("%s/%s describes no command: run go generate ./cmd/siwtun", tc.committed, name)
			}
		}
	}
}

// TestGeneratedDocsReadAsWritten: the help texts reach the pages as they
// read in siwtun --help: placeholders in angle brackets and words with
// underscores or stars are not taken for HTML or emphasis; the pages carry
// no generation date; the hidden gendoc command has no page.
func TestGeneratedDocsReadAsWritten(t *testing.T) {
	tmp := t.TempDir()
	man, md := filepath.Join(tmp, "man"), filepath.Join(tmp, "cli")
	if err := genDocs(man, md); err != nil {
		t.Fatal(err)
	}
	up, err := os.ReadFile(filepath.Join(man, "siwtun-up.1"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(up, []byte(`.TH "SIWTUN-UP" "1" "Nov 2026" "siwtun" "siwtun manual"`)) {
		t.Errorf("siwtun-up.1's header is not the fixed one:\n%s", up[:min(len(up), 200)])
	}
	if !bytes.Contains(up, []byte(`<socket-dir>/<dev>\&.sock`)) {
		t.Errorf("siwtun-up.1 lost the <socket-dir>/<dev>.sock placeholder")
	}
	capture, err := os.ReadFile(filepath.Join(man, "siwtun-capture.1"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(capture, []byte("siwtun capture --dev <dev> -w <file.pcapng>")) {
		t.Errorf("siwtun-capture.1's synopsis lost its placeholders")
	}
	exec, err := os.ReadFile(filepath.Join(man, "siwtun-exec.1"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(exec, []byte("ib_*_bw")) || !bytes.Contains(exec, []byte("ibv_devinfo")) {
		t.Errorf("siwtun-exec.1 took ib_*_bw or ibv_devinfo for emphasis")
	}
	mdUp, err := os.ReadFile(filepath.Join(md, "siwtun_up.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(mdUp, []byte(`\<socket-dir\>/\<dev\>.sock`)) {
		t.Errorf("siwtun_up.md does not escape <socket-dir>, which Markdown would drop as an HTML tag")
	}
	for _, dir := range []string{man, md} {
		for name, b := range readPages(t, dir) {
			if strings.Contains(name, "gendoc") {
				t.Errorf("%s: the hidden gendoc command has a page", name)
			}
			if bytes.Contains(b, []byte("Auto generated")) {
				t.Errorf("%s carries cobra's generation stamp", name)
			}
		}
	}
}
