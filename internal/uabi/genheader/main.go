// Command genheader writes the verbs socket's C header (uabi.CHeader) to
// the file its argument names: go generate ./internal/uabi runs it for
// libsiwtun/siwtun_abi.h.
package main

import (
	"fmt"
	"os"

	"github.com/siwtun/siwtun/internal/uabi"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: genheader FILE")
		os.Exit(2)
	}
	if err := os.WriteFile(os.Args[1], uabi.CHeader(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "genheader:", err)
		os.Exit(1)
	}
}
