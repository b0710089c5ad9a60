// Command pagegen renders the newest full run of bench/results into the
// performance page, between its markers (bench.PageBegin, bench.PageEnd).
// It is go generate ./bench; make bench runs it after the run.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/siwtun/siwtun/bench"
)

func main() {
	page := flag.String("page", "../doc/performance.md", "the page to render into")
	dir := flag.String("results", "results", "the directory of the runs' JSON documents")
	source := flag.String("source", "bench/results", "the directory as the page names it")
	flag.Parse()
	if err := bench.UpdatePage(*page, *dir, *source); err != nil {
		fmt.Fprintln(os.Stderr, "pagegen:", err)
		os.Exit(1)
	}
}
