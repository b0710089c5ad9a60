package testkit

import (
	"os"
	"path/filepath"
	"strings"
)

// SharedDir returns the directory sub (captures, peer, ...) of the shared
// material that lives beside the repository: $SIWTUN_SHARED/sub if that
// variable is set, else ../shared/sub from the checkout's root, or, in a
// git worktree, from the main checkout's root. ok is false when there is
// no such directory: a test then uses its own copy in testdata, or skips.
// The tree never names the absolute path of one machine.
func SharedDir(sub string) (dir string, ok bool) {
	if d := os.Getenv("SIWTUN_SHARED"); d != "" {
		return existingDir(filepath.Join(d, sub))
	}
	root, err := moduleRoot()
	if err != nil {
		return "", false
	}
	roots := []string{root}
	if main := mainCheckout(root); main != "" && main != root {
		roots = append(roots, main)
	}
	for _, r := range roots {
		if d, ok := existingDir(filepath.Join(r, "..", "shared", sub)); ok {
			return d, true
		}
	}
	return "", false
}

func existingDir(d string) (string, bool) {
	fi, err := os.Stat(d)
	if err != nil || !fi.IsDir() {
		return "", false
	}
	abs, err := filepath.Abs(d)
	if err != nil {
		return "", false
	}
	return abs, true
}

// moduleRoot returns the directory of the go.mod above the working
// directory (a test runs in its package's directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}

// mainCheckout returns the main checkout of the git worktree at root
// (whose .git is a file "gitdir: <main>/.git/worktrees/<name>"), or "".
func mainCheckout(root string) string {
	b, err := os.ReadFile(filepath.Join(root, ".git"))
	if err != nil {
		return "" // a directory (the main checkout itself) or no git
	}
	gitdir, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir: ")
	if !ok {
		return ""
	}
	if !filepath.IsAbs(gitdir) {
		gitdir = filepath.Join(root, gitdir)
	}
	common := filepath.Join(gitdir, "..", "..") // <main>/.git
	if c, err := os.ReadFile(filepath.Join(gitdir, "commondir")); err == nil {
		common = strings.TrimSpace(string(c))
		if !filepath.IsAbs(common) {
			common = filepath.Join(gitdir, common)
		}
	}
	common = filepath.Clean(common)
	if filepath.Base(common) != ".git" {
		return "" // a bare repository has no checkout
	}
	return filepath.Dir(common)
}
