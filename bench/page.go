package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// The markers around the generated part of the performance page
// (doc/performance.md). RenderPage replaces what lies between them.
const (
	PageBegin = "<!-- bench table: go generate ./bench writes it from the newest full run in bench/results; do not edit -->"
	PageEnd   = "<!-- end of bench table -->"
)

// ReadResults reads one run's JSON document.
func ReadResults(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("bench results %s: %w", path, err)
	}
	return &r, nil
}

// pageSuites are the suites a run must have measured to stand on the
// performance page: every suite but SuiteShared, which runs made before it
// existed lack; the page shows its rows when the run has them.
var pageSuites = []string{SuitePerf, SuiteCLib, SuiteConnect, SuiteScale, SuiteMemory}

// Full reports whether the run measured every suite the performance page
// stands on (pageSuites): only such a run stands for the whole benchmark.
func (r *Results) Full() bool {
	for _, s := range pageSuites {
		if !r.ran(s) {
			return false
		}
	}
	return true
}

// NewestFull returns the path and results of the newest full run among
// dir's *.json files. The files are named by their start time
// (20060102-150405.json), so the newest sorts last.
func NewestFull(dir string) (string, *Results, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return "", nil, err
	}
	sort.Strings(paths)
	for _, p := range slices.Backward(paths) {
		r, err := ReadResults(p)
		if err != nil {
			return "", nil, err
		}
		if r.Full() {
			return p, r, nil
		}
	}
	return "", nil, fmt.Errorf("no full run (every suite: %s) among %d results in %s", strings.Join(pageSuites, ", "), len(paths), dir)
}

// RenderPage returns page with the text between PageBegin and PageEnd
// replaced by r's table, introduced by a line naming source (the JSON
// file's path as a reader finds it in the tree) and the run.
func RenderPage(page []byte, r *Results, source string) ([]byte, error) {
	begin := bytes.Index(page, []byte(PageBegin))
	end := bytes.Index(page, []byte(PageEnd))
	if begin < 0 || end < begin {
		return nil, errors.New("the page has no bench table markers (" + PageBegin + " ... " + PageEnd + ")")
	}
	var b bytes.Buffer
	b.Write(page[:begin+len(PageBegin)])
	fmt.Fprintf(&b, "\n\nThe run in `%s`, started %s.", filepath.ToSlash(source), r.Started.UTC().Format("2006-01-02 15:04 MST"))
	if r.Note != "" {
		fmt.Fprintf(&b, " %s", r.Note)
	}
	b.WriteString("\n\n```text\n")
	if err := r.WriteTable(&b); err != nil {
		return nil, err
	}
	b.WriteString("```\n\n")
	b.Write(page[end:])
	return b.Bytes(), nil
}

// UpdatePage renders the newest full run in resultsDir into the page file
// (go generate ./bench). source names resultsDir as the page shows it.
func UpdatePage(pagePath, resultsDir, source string) error {
	path, r, err := NewestFull(resultsDir)
	if err != nil {
		return err
	}
	page, err := os.ReadFile(pagePath)
	if err != nil {
		return err
	}
	out, err := RenderPage(page, r, filepath.Join(source, filepath.Base(path)))
	if err != nil {
		return fmt.Errorf("%s: %w", pagePath, err)
	}
	return os.WriteFile(pagePath, out, 0o644)
}
