package siwtun

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The tree's rooms stay small enough to read whole: a function past
// maxFuncLines, or a file of the engine past maxFileLines, has become two
// concerns, and a newcomer reading the RNIC's data path should meet one
// at a time. Outside the engine a file may hold more of one concern (a
// page builder, a benchmark's runner, up to maxOtherFileLines), and
// tests, which are tables of cases, are held to no function length.
const (
	maxFileLines      = 600
	maxOtherFileLines = 1000
	maxFuncLines      = 80
)

// engineDirs are the engine's folders, held to maxFileLines.
var engineDirs = []string{"offload", "iwarp", "netstack"}

// goFiles returns the Go files below dir, test files included.
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "bin" || path != "." && strings.HasPrefix(d.Name(), ".")) {
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

// TestFileLength: no Go file in the engine's folders (tests included) is
// longer than maxFileLines, and no other Go file but a test longer than
// maxOtherFileLines.
func TestFileLength(t *testing.T) {
	for _, path := range goFiles(t, ".") {
		limit := maxOtherFileLines
		if inEngine(path) {
			limit = maxFileLines
		} else if strings.HasSuffix(path, "_test.go") {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n > limit {
			t.Errorf("%s has %d lines, more than %d: split it by topic", path, n, limit)
		}
	}
}

// inEngine reports whether path is in one of engineDirs.
func inEngine(path string) bool {
	for _, d := range engineDirs {
		if strings.HasPrefix(path, d+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// TestFunctionLength: no function of the module (tests not included) is
// longer than maxFuncLines, except a table of names: a function whose
// every return is a string literal.
func TestFunctionLength(t *testing.T) {
	fset := token.NewFileSet()
	for _, path := range goFiles(t, ".") {
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

// TestCFunctionLength: no function of libsiwtun (the library's C files;
// its test programs are held to none, as Go tests are) is longer than
// maxFuncLines.
func TestCFunctionLength(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("libsiwtun", "*.c"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no C files in libsiwtun (%v)", err)
	}
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range cFunctions(string(b)) {
			if f.lines > maxFuncLines {
				t.Errorf("%s:%d: %s has %d lines, more than %d", path, f.line, f.name, f.lines, maxFuncLines)
			}
		}
	}
}

// cFunc is a C function definition: its name, its first line and its
// length in lines (from its declarator to its closing brace).
type cFunc struct {
	name        string
	line, lines int
}

// cFunctions finds the function definitions of C source src by matching
// braces, with comments, strings, character constants and preprocessor
// lines left out: a brace at file level opens a function when the text
// since the previous declaration ends in a parameter list (and is not an
// initializer).
func cFunctions(src string) []cFunc {
	code := stripC(src)
	var out []cFunc
	depth, declStart := 0, 0
	var cur *cFunc
	for i := 0; i < len(code); i++ {
		switch c := code[i]; {
		case c == '{' && depth == 0:
			decl := strings.TrimSpace(code[declStart:i])
			if open := strings.IndexByte(decl, '('); open > 0 && strings.HasSuffix(decl, ")") && !strings.Contains(decl, "=") {
				name := strings.Fields(strings.TrimRight(decl[:open], " \t\n*"))
				first := declStart + strings.Index(code[declStart:], decl)
				cur = &cFunc{name: strings.TrimLeft(name[len(name)-1], "*"), line: 1 + strings.Count(code[:first], "\n")}
			}
			depth++
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				if cur != nil {
					cur.lines = 1 + strings.Count(code[:i], "\n") - cur.line + 1
					out = append(out, *cur)
					cur = nil
				}
				declStart = i + 1
			}
		case c == ';' && depth == 0:
			declStart = i + 1
		}
	}
	return out
}

// stripC blanks C comments, string and character literals and
// preprocessor lines (keeping their newlines), so braces in them are not
// counted.
func stripC(src string) string {
	b := []byte(src)
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '/' && i+1 < len(b) && b[i+1] == '*':
			end := strings.Index(src[i+2:], "*/")
			if end < 0 {
				end = len(src) - i - 4
			}
			blank(b[i : i+end+4])
			i += end + 3
		case b[i] == '/' && i+1 < len(b) && b[i+1] == '/',
			b[i] == '#' && (i == 0 || b[i-1] == '\n'):
			j := i
			for j < len(b) && (b[j] != '\n' || b[j-1] == '\\') {
				j++
			}
			blank(b[i:j])
			i = j
		case b[i] == '"' || b[i] == '\'':
			q, j := b[i], i+1
			for j < len(b) && b[j] != q {
				if b[j] == '\\' {
					j++
				}
				j++
			}
			blank(b[i:min(j+1, len(b))])
			i = j
		}
	}
	return string(b)
}

// blank replaces every byte of b but newlines with a space.
func blank(b []byte) {
	for i := range b {
		if b[i] != '\n' {
			b[i] = ' '
		}
	}
}

// TestCFunctions: the brace counter finds each definition with its
// length, and is not misled by braces in comments, strings, characters,
// preprocessor lines or initializers.
func TestCFunctions(t *testing.T) {
	src := `#include <stdio.h>
#define OPEN {
static const int table[] = { 1, 2 };
/* a comment { */
static struct x *
make(int a,
     int b)
{
	const char *s = "}{";
	char c = '{';
	if (a) {
		return NULL; // }
	}
	return NULL;
}

int main(void) { return 0; }
`
	got := cFunctions(src)
	want := []cFunc{{"make", 5, 11}, {"main", 17, 1}}
	if !slices.Equal(got, want) {
		t.Errorf("cFunctions = %+v, want %+v", got, want)
	}
}
