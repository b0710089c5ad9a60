package siwtun

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The engine's rooms stay small enough to read whole: a file that grows
// past maxFileLines, or a function past maxFuncLines, has become two
// concerns, and a newcomer reading the RNIC's data path should meet one
// at a time.
const (
	maxFileLines = 600
	maxFuncLines = 80
)

// goFiles returns the Go files below dir, test files included.
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestFileLength: no Go file in offload/ or netstack/ (tests included)
// is longer than maxFileLines.
func TestFileLength(t *testing.T) {
	for _, dir := range []string{"offload", "netstack"} {
		for _, path := range goFiles(t, dir) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(b), "\n"); n > maxFileLines {
				t.Errorf("%s has %d lines, more than %d: split it by topic", path, n, maxFileLines)
			}
		}
	}
}

// TestFunctionLength: no function of the engine (offload/, tests not
// included) is longer than maxFuncLines, except a table of names: a
// function whose every return is a string literal.
func TestFunctionLength(t *testing.T) {
	fset := token.NewFileSet()
	for _, path := range goFiles(t, "offload") {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n > maxFuncLines && !namesTable(fd) {
				t.Errorf("%s: %s has %d lines, more than %d", fset.Position(fd.Pos()), fd.Name.Name, n, maxFuncLines)
			}
		}
	}
}

// namesTable reports whether every return of fd returns one string literal.
func namesTable(fd *ast.FuncDecl) bool {
	returns, literal := 0, 0
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			returns++
			if len(n.Results) == 1 {
				if l, ok := n.Results[0].(*ast.BasicLit); ok && l.Kind == token.STRING {
					literal++
				}
			}
		}
		return true
	})
	return returns > 0 && returns == literal
}
