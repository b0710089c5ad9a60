package main

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
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

// TestREADMEShowsHello: README's Go program is this file, whole.
func TestREADMEShowsHello(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := "```go\n" + string(src) + "```\n"
	if !strings.Contains(string(readme), block) {
		t.Errorf("README.md does not show examples/hello/main.go as it is; put the file between ```go and ``` in the Verbs section")
	}
}
