package perftest

import (
	"bytes"
	"context"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siwtun/siwtun/daemon/uverbs"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/rnic/rnictest"
	"github.com/siwtun/siwtun/verbs"
)

// testTimeout guards against hangs; it is not a performance bound.
const testTimeout = 2 * time.Minute

var (
	cliPrefix = netip.MustParsePrefix("198.18.0.1/24")
	srvPrefix = netip.MustParsePrefix("198.18.0.2/24")
)

// newDevice is one in-process RNIC on link.
func newDevice(t testing.TB, link *netstack.Link, addr netip.Prefix, name string, mtu int) *verbs.Device {
	t.Helper()
	return rnictest.New(t, link, addr, mtu, name, nil).Device
}

// devicePair is two in-process RNICs joined by an in-memory link.
func devicePair(t testing.TB, mtu int) (cli, srv *verbs.Device) {
	t.Helper()
	la, lb := netstack.Pipe(mtu, netstack.Impairments{})
	return newDevice(t, la, cliPrefix, "siwtun0", mtu), newDevice(t, lb, srvPrefix, "siwtun1", mtu)
}

// socketPair is two in-process RNICs served on verbs sockets in a temp
// dir, opened through them as an application in another process would.
func socketPair(t testing.TB) (cli, srv *verbs.Device) {
	t.Helper()
	lcli, lsrv := devicePair(t, 1500)
	dir := t.TempDir()
	open := func(local *verbs.Device) *verbs.Device {
		path := filepath.Join(dir, local.Name()+".sock")
		l, err := uverbs.Listen(path, -1)
		if err != nil {
			t.Fatal(err)
		}
		s, err := uverbs.NewServer(local, nil)
		if err != nil {
			t.Fatal(err)
		}
		go s.Serve(l)
		t.Cleanup(func() { s.Close() })
		d, err := verbs.DialPath(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	return open(lcli), open(lsrv)
}

// side is what one end of a run produced.
type side struct {
	out    bytes.Buffer
	report *Report
	err    error
}

// runBoth runs a server and a client with cfg (and per-side tweaks) on a
// fresh device pair and waits for both.
func runBoth(t testing.TB, cfg Config, port uint16, tweak func(client bool, c *Config)) (cli, srv *side) {
	t.Helper()
	cdev, sdev := devicePair(t, 1500)
	return runOn(t, cdev, sdev, cfg, port, tweak)
}

func runOn(t testing.TB, cdev, sdev *verbs.Device, cfg Config, port uint16, tweak func(client bool, c *Config)) (cli, srv *side) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cli, srv = &side{}, &side{}
	ccfg, scfg := cfg, cfg
	ccfg.ConnectRetryDelay = 20 * time.Millisecond
	ccfg.ConnectRetries = 100
	if tweak != nil {
		tweak(true, &ccfg)
		tweak(false, &scfg)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		srv.report, srv.err = RunServer(ctx, sdev, port, scfg, &srv.out)
		if srv.err != nil {
			cancel()
		}
	}()
	go func() {
		defer wg.Done()
		cli.report, cli.err = RunClient(ctx, cdev, netip.AddrPortFrom(srvPrefix.Addr(), port), ccfg, &cli.out)
		if cli.err != nil {
			cancel()
		}
	}()
	wg.Wait()
	return cli, srv
}

// Masks for the figures that change from run to run.
var (
	maskPSN   = regexp.MustCompile(`(QPN|PSN) (0x)?[0-9a-f]+`)
	maskFloat = regexp.MustCompile(`\d+\.\d+`)
	maskIters = regexp.MustCompile(`(?m)^( \d+ +)\d+`)
	rowSpaces = regexp.MustCompile(`(?m)^ \d.*$`)
	spaces    = regexp.MustCompile(`[ \t]+`)
)

// masked is the output with QP numbers, PSNs and every decimal figure
// replaced, and the table rows' runs of blanks (padding that depends on
// the figures' widths) collapsed; sizes and iteration counts stay, except
// the counts of a timed run. TestRows checks the rows' exact spacing.
func masked(s string, timed bool) string {
	s = maskPSN.ReplaceAllString(s, "$1 *")
	if timed {
		s = maskIters.ReplaceAllString(s, "${1}N")
	}
	return rowSpaces.ReplaceAllStringFunc(s, func(row string) string {
		return strings.TrimRight(spaces.ReplaceAllString(maskFloat.ReplaceAllString(row, "#.##"), " "), " ")
	})
}
