package siwtun

import (
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A newcomer finds the way through the tree by its maps: the root
// package's doc names every folder with what it is, and the engine's
// packages name every file. A map that misses a folder or a file hides it
// from the one reader who needs it, and a map naming what was moved or
// removed sends that reader nowhere, so the maps are checked against the
// tree in both directions.

// filesMapHeading is the doc heading under which a package lists its
// files, one code block line per file.
const filesMapHeading = "Files"

// fileMapped are the packages that must carry a file map: the engine's
// and the codecs it builds on, whose files are many and whose reader
// follows a data path through them. Any other package that has a
// "# Files" section is held to it as well.
var fileMapped = []string{"offload", "netstack", "iwarp/mpa", "iwarp/rdmap"}

// packageDoc returns the parsed package doc comment of the Go package in
// dir, taken from its non-test files (nil when none has one).
func packageDoc(t *testing.T, dir string) *comment.Doc {
	t.Helper()
	var text string
	for _, name := range goSources(t, dir) {
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if f.Doc != nil {
			text += f.Doc.Text()
		}
	}
	if text == "" {
		return nil
	}
	var p comment.Parser
	return p.Parse(text)
}

// goSources returns the names of the non-test Go files in dir.
func goSources(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if n := e.Name(); !e.IsDir() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			names = append(names, n)
		}
	}
	return names
}

// headingText returns a doc heading's plain text.
func headingText(h *comment.Heading) string {
	var b strings.Builder
	for _, x := range h.Text {
		if p, ok := x.(comment.Plain); ok {
			b.WriteString(string(p))
		}
	}
	return b.String()
}

// mapEntries returns the names a map's code blocks list: the first word of
// every line that starts at the block's margin (an indented line carries
// on the description of the entry above it). Only the blocks under the
// heading named under are read, or every block when under is "". The
// second result tells whether that heading is there.
func mapEntries(d *comment.Doc, under string) (names []string, found bool) {
	in := under == ""
	for _, b := range d.Content {
		switch b := b.(type) {
		case *comment.Heading:
			in = under == "" || headingText(b) == under
			found = found || in && under != ""
		case *comment.Code:
			if !in {
				continue
			}
			for _, line := range strings.Split(b.Text, "\n") {
				if line == "" || line[0] == ' ' || line[0] == '\t' {
					continue
				}
				names = append(names, strings.Fields(line)[0])
			}
		}
	}
	return names, found
}

// codeFolders returns the folders below the root (slash-separated) that a
// newcomer must find on the map: every top-level folder, and every folder
// holding Go or C sources. Test data, build output (bin/) and hidden
// folders are not the tree's code.
func codeFolders(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == "." {
			return nil
		}
		if d.IsDir() {
			if n := d.Name(); n == "testdata" || n == "bin" || strings.HasPrefix(n, ".") {
				return filepath.SkipDir
			}
			if !strings.Contains(path, string(filepath.Separator)) {
				dirs = append(dirs, filepath.ToSlash(path))
			}
			return nil
		}
		switch dir := filepath.Dir(path); filepath.Ext(path) {
		case ".go", ".c", ".h":
			if dir != "." { // the root is the map's own package
				dirs = append(dirs, filepath.ToSlash(dir))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// TestTreeMap: the root package's doc maps the tree, one line per folder
// ("iwarp/mpa/  what it is"), and names every folder of codeFolders and
// nothing that is not a folder of the tree.
func TestTreeMap(t *testing.T) {
	d := packageDoc(t, ".")
	if d == nil {
		t.Fatal("the root package has no doc comment: doc.go should map the tree")
	}
	entries, _ := mapEntries(d, "")
	mapped := map[string]bool{}
	for _, e := range entries {
		dir, ok := strings.CutSuffix(e, "/")
		switch {
		case !ok:
			t.Errorf("doc.go's map line %q does not name a folder (a folder ends in /)", e)
		case mapped[dir]:
			t.Errorf("doc.go's map names %s twice", e)
		default:
			if fi, err := os.Stat(filepath.FromSlash(dir)); err != nil || !fi.IsDir() {
				t.Errorf("doc.go's map names %s, which is not a folder of the tree: remove it or correct the path", e)
			}
		}
		mapped[dir] = true
	}
	for _, dir := range codeFolders(t) {
		if !mapped[dir] {
			t.Errorf("%s/ is missing from doc.go's map of the tree: add a line saying what it is, in its layer's section", dir)
		}
	}
}

// TestFileMaps: offload and netstack, and every package with a "# Files"
// section, name each of their non-test Go files there, and only those.
func TestFileMaps(t *testing.T) {
	for _, dir := range codeFolders(t) {
		if len(goSources(t, filepath.FromSlash(dir))) == 0 {
			continue
		}
		d := packageDoc(t, filepath.FromSlash(dir))
		var entries []string
		found := false
		if d != nil {
			entries, found = mapEntries(d, filesMapHeading)
		}
		if !found {
			if slices.Contains(fileMapped, dir) {
				t.Errorf("%s's package doc has no %q section: it should map the package's files", dir, "# "+filesMapHeading)
			}
			continue
		}
		checkFileMap(t, dir, entries)
	}
}

// checkFileMap compares the files a package's map names with its
// non-test Go files.
func checkFileMap(t *testing.T, dir string, entries []string) {
	t.Helper()
	files := goSources(t, filepath.FromSlash(dir))
	seen := map[string]bool{}
	for _, e := range entries {
		switch {
		case seen[e]:
			t.Errorf("%s's file map names %s twice", dir, e)
		case !slices.Contains(files, e):
			t.Errorf("%s's file map names %s, which is not a non-test Go file of the package: remove it or correct the name", dir, e)
		}
		seen[e] = true
	}
	for _, f := range files {
		if !seen[f] {
			t.Errorf("%s/%s is missing from the package's file map (%q in its doc): add a line saying what it holds", dir, f, "# "+filesMapHeading)
		}
	}
}
