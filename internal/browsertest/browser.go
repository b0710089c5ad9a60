// Package browsertest drives pages in a headless Chromium (Debian's
// chromium package) through chromedp, for the web view's tests. Tests skip
// when no chromium is installed; CI installs it.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Browser is one headless Chromium with one tab.
type Browser struct {
	// Ctx is the tab's context for chromedp.Run.
	Ctx    context.Context
	mu     sync.Mutex
	errors []string
}

// New starts a headless Chromium for t and closes it when t ends. It skips
// t when no chromium (or chromium-browser) is on PATH.
func New(t testing.TB) *Browser {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("no chromium on PATH: the browser tests need Debian's chromium package (CI installs it)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // tests run as root
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("enable-precise-memory-info", true),
		chromedp.WindowSize(1280, 800),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	b := &Browser{Ctx: ctx}
	// The first Run starts the browser; it must not have a timeout.
	if err := chromedp.Do(ctx, chromedp.Sleep(0)); err != nil {
		cancelC()
		cancelA()
		t.Fatalf("starting chromium: %v", err)
	}
	msgs := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.add(m.String() + " " + m.URL)
			}
		}
	}()
	t.Cleanup(func() {
		cancelC()
		cancelA()
		<-done
	})
	return b
}

func (b *Browser) add(s string) {
	b.mu.Lock()
	b.errors = append(b.errors, s)
	b.mu.Unlock()
}

// Errors returns the console errors, uncaught exceptions and error log
// entries seen so far.
func (b *Browser) Errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...)
}

// Do runs actions with a timeout.
func (b *Browser) Do(t testing.TB, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("browser: %v (console errors: %q)", err, b.Errors())
	}
}

// Eval evaluates a JavaScript expression in the page and decodes its
// value into T.
func Eval[T any](t testing.TB, b *Browser, expr string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		t.Fatalf("browser: evaluating %s: %v (console errors: %q)", expr, err, b.Errors())
	}
	return v
}

// Screenshot saves a PNG of the window as name in ArtifactDir.
func (b *Browser) Screenshot(t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("browser: screenshot: %v", err)
	}
	path := filepath.Join(ArtifactDir(t), name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	return path
}

// ArtifactDir is where tests leave screenshots and files for people to
// look at: $SIWTUN_TEST_ARTIFACTS, else siwtun-test-artifacts in the
// system's temporary directory. It is created if needed and not removed.
func ArtifactDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SIWTUN_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "siwtun-test-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
