package testkit

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSharedDirFromEnvironment(t *testing.T) {
	d := t.TempDir()
	if err := os.Mkdir(filepath.Join(d, "captures"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SIWTUN_SHARED", d)
	if got, ok := SharedDir("captures"); !ok || got != filepath.Join(d, "captures") {
		t.Errorf("SharedDir(captures) = %q, %v; want %q", got, ok, filepath.Join(d, "captures"))
	}
	if got, ok := SharedDir("peer"); ok {
		t.Errorf("SharedDir(peer) = %q, found; the directory does not exist", got)
	}
}

// TestMainCheckout: a worktree's .git file leads to the main checkout,
// beside which the shared material lies.
func TestMainCheckout(t *testing.T) {
	d := t.TempDir()
	main := filepath.Join(d, "main")
	gitdir := filepath.Join(main, ".git", "worktrees", "wt1")
	wt := filepath.Join(d, "wt", "wt1")
	for _, p := range []string{gitdir, wt} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(gitdir, "commondir"), []byte("../..\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wt, ".git"), []byte("gitdir: "+gitdir+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := mainCheckout(wt); got != main {
		t.Errorf("mainCheckout(worktree) = %q, want %q", got, main)
	}
	if got := mainCheckout(main); got != "" {
		t.Errorf("mainCheckout(main checkout) = %q, want \"\"", got)
	}
}
