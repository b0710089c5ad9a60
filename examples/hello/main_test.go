package main

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/verbs/uverbs"
)

// TestHello runs the program against two RNICs served on verbs sockets in
// a temporary directory, as two daemons would serve them (in this process,
// on an in-memory link: no root).
func TestHello(t *testing.T) {
	dir := t.TempDir()
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	for _, d := range []struct {
		name string
		link *netstack.Link
		addr string
	}{{"siwtun0", la, "198.18.0.1/24"}, {"siwtun1", lb, "198.18.0.2/24"}} {
		r, err := rnic.New(d.link, rnic.Config{Stack: netstack.Options{Addrs: []netip.Prefix{netip.MustParsePrefix(d.addr)}, MTU: 1500},
			Engine: offload.DefaultConfig(d.name)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		srv, err := uverbs.NewServer(r.Device, nil)
		if err != nil {
			t.Fatal(err)
		}
		l, err := uverbs.Listen(filepath.Join(dir, d.name+".sock"), -1)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	t.Setenv("SIWTUN_SOCKET_DIR", dir)
	var out bytes.Buffer
	if err := run("siwtun0", "siwtun1", netip.MustParseAddrPort("198.18.0.2:7471"), &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), `listener: "hello over iWARP" written, then "done" received`) ||
		!strings.Contains(out.String(), "client: wrote 16 bytes to 0x") {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestGoAPIPageShowsHello: the Go verbs API page shows this file whole.
func TestGoAPIPageShowsHello(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join("..", "..", "doc", "go-api.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := "```go\n" + string(src) + "```\n"
	if !strings.Contains(string(page), block) {
		t.Errorf("doc/go-api.md does not show examples/hello/main.go as it is; put the file between ```go and ```")
	}
}

// TestREADMEExcerptOfHello: README's Go example is an excerpt of this
// file: its lines, other than the "// ..." that mark a gap, are lines of
// main.go, in the file's order.
func TestREADMEExcerptOfHello(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```go\n")
	excerpt, _, closed := strings.Cut(rest, "```\n")
	if !ok || !closed {
		t.Fatal("README.md has no ```go block")
	}
	lines := strings.Split(string(src), "\n")
	shown := 0
	for _, want := range strings.Split(strings.TrimSuffix(excerpt, "\n"), "\n") {
		if strings.TrimSpace(want) == "// ..." {
			continue
		}
		i := slices.Index(lines, want)
		if i < 0 {
			t.Fatalf("README.md's Go example has a line examples/hello/main.go has not (or not after the lines before it):\n%s", want)
		}
		lines = lines[i+1:]
		shown++
	}
	if shown < 5 {
		t.Errorf("README.md's Go example shows %d lines of examples/hello/main.go", shown)
	}
}
