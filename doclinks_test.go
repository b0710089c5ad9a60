package siwtun

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The user documentation is README.md and the pages under doc/; a link
// between them that leads nowhere is a reader stopped mid-way, so every
// relative link must name a file of the tree and, for a #fragment, a
// heading of that page.

// docPages returns README.md and every Markdown file under doc/.
func docPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md"}
	err := filepath.WalkDir("doc", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

var (
	fence      = regexp.MustCompile("^\\s{0,3}(```|~~~)")
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	inlineLink = regexp.MustCompile(`\]\(\s*(?:<([^>]+)>|([^)\s]+))(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)`)
	htmlAttr   = regexp.MustCompile(`(?i)<(?:a|img)\s[^>]*?(?:href|src)="([^"]+)"`)
	heading    = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`(?i)<a\s[^>]*?(?:name|id)="([^"]+)"`)
	mdLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// mdLine is one line of a page outside its fenced code blocks.
type mdLine struct {
	n    int
	text string
}

// proseLines returns the lines of a Markdown page outside fenced code.
func proseLines(b []byte) []mdLine {
	var lines []mdLine
	inFence := ""
	for i, l := range strings.Split(string(b), "\n") {
		if m := fence.FindStringSubmatch(l); m != nil {
			switch {
			case inFence == "":
				inFence = m[1]
			case m[1] == inFence:
				inFence = ""
			}
			continue
		}
		if inFence == "" {
			lines = append(lines, mdLine{i + 1, l})
		}
	}
	return lines
}

// anchors returns the fragments a page's headings get on GitHub (lower
// case, punctuation dropped, spaces as hyphens, -1, -2, ... for repeats),
// and those of its explicit <a name=...> anchors.
func anchors(b []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(b) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l.text, -1) {
			out[m[1]] = true
		}
		m := heading.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		text := mdLink.ReplaceAllString(m[2], "$1")
		text = strings.ReplaceAll(text, "`", "")
		var s strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-':
				s.WriteRune(r)
			case r == ' ':
				s.WriteByte('-')
			}
		}
		slug := s.String()
		if k := seen[slug]; k > 0 {
			out[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// pageLinks returns the link targets of a page with their line numbers:
// inline links and images, reference definitions and HTML href/src,
// outside code.
func pageLinks(b []byte) []mdLine {
	var links []mdLine
	for _, l := range proseLines(b) {
		text := codeSpan.ReplaceAllString(l.text, "")
		for _, re := range []*regexp.Regexp{inlineLink, refDef, htmlAttr} {
			for _, m := range re.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if target == "" && len(m) > 2 {
					target = m[2] // the inline link's target without <>
				}
				links = append(links, mdLine{l.n, target})
			}
		}
	}
	return links
}

// TestDocLinks: every relative link in README.md and doc/ names a file or
// directory of the repository, and a #fragment names a heading (or an
// explicit anchor) of the Markdown page it points into.
func TestDocLinks(t *testing.T) {
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	cache := map[string]map[string]bool{}
	pageAnchors := func(path string) map[string]bool {
		if a, ok := cache[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		cache[path] = anchors(b)
		return cache[path]
	}
	checked := 0
	for _, page := range docPages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range pageLinks(b) {
			target := l.text
			if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
				continue // a URL: not checked here (no network)
			}
			checked++
			pathPart, frag, _ := strings.Cut(target, "#")
			if p, err := url.PathUnescape(pathPart); err == nil {
				pathPart = p
			}
			dest := page
			if pathPart != "" {
				if filepath.IsAbs(pathPart) {
					t.Errorf("%s:%d: %s is an absolute path: link relative to the page", page, l.n, target)
					continue
				}
				dest = filepath.Join(filepath.Dir(page), pathPart)
				abs, _ := filepath.Abs(dest)
				if rel, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(rel, "..") {
					t.Errorf("%s:%d: %s points outside the repository", page, l.n, target)
					continue
				}
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: %s: no such file in the repository", page, l.n, target)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !pageAnchors(dest)[frag] {
				t.Errorf("%s:%d: %s: %s has no heading with the anchor #%s", page, l.n, target, dest, frag)
			}
		}
	}
	if checked == 0 {
		t.Error("no relative link found in README.md or doc/: the link scanner is broken")
	}
}

// TestDocLinkScanner: the scanner finds links where Markdown has them and
// not in code, and makes GitHub's heading anchors.
func TestDocLinkScanner(t *testing.T) {
	page := []byte("# Title\n" +
		"See [the guide](doc/guide.md#running-two-rnics) and ![a](img.png \"t\").\n" +
		"`[not](a-link.md)` and [x](<with space.md>)\n" +
		"```\n[in](code.md)\n```\n" +
		"[ref]: doc/ref.md\n" +
		"<img src=\"doc/fig.png\">\n" +
		"## Running two RNICs\n" +
		"## Immediate Data (RFC 7306)\n" +
		"## Benchmarks (`make bench`)\n" +
		"## Running two RNICs\n" +
		"## [Linked](x.md) heading\n")
	var got []string
	for _, l := range pageLinks(page) {
		got = append(got, fmt.Sprintf("%d:%s", l.n, l.text))
	}
	want := "2:doc/guide.md#running-two-rnics 2:img.png 3:with space.md 7:doc/ref.md 8:doc/fig.png 13:x.md"
	if strings.Join(got, " ") != want {
		t.Errorf("links %q\nwant %q", strings.Join(got, " "), want)
	}
	a := anchors(page)
	for _, w := range []string{"title", "running-two-rnics", "running-two-rnics-1", "immediate-data-rfc-7306", "benchmarks-make-bench", "linked-heading"} {
		if !a[w] {
			t.Errorf("no anchor %q in %v", w, a)
		}
	}
}
