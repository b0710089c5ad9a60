package siwtun

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// issueRef matches a reference to a numbered issue of a tracker, across a
// line break in a comment ("issue\n// 18"). An upstream project's public
// issue (golang/go#75804) is a link a reader can follow and is allowed.
var issueRef = regexp.MustCompile(`(?i)\bissues?\b(\s|//|#|\*|-)*#?[0-9]+`)

// testNameIssue matches a test, benchmark or fuzz target named after an issue.
var testNameIssue = regexp.MustCompile(`(?i)func (Test|Benchmark|Fuzz|Example)\w*(issue|bug)_?[0-9]`)

// TestCommentsGiveReasons: no code, test or script cites an issue number;
// a reader of the code has no tracker, so a comment says what it guards
// against instead. Prose for users (*.md) is not code and not checked here.
func TestCommentsGiveReasons(t *testing.T) {
	for _, f := range trackedFiles(t) {
		if strings.HasSuffix(f, ".md") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !isText(b) || !bytes.Contains(bytes.ToLower(b), []byte("issue")) {
			continue
		}
		for _, re := range []*regexp.Regexp{issueRef, testNameIssue} {
			for _, loc := range re.FindAllIndex(b, -1) {
				line := bytes.Count(b[:loc[0]], []byte("\n")) + 1
				t.Errorf("%s:%d cites an issue (%q): say what it guards against instead", f, line, b[loc[0]:loc[1]])
			}
		}
	}
}
