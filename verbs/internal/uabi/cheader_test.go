package uabi

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

func TestCHeader(t *testing.T) {
	testkit.Golden(t, "testdata/siwtun_uabi.h", CHeader())
}

// TestCHeaderCompiles builds a C file that includes the header and counts
// the fields of the hello reply through its X-macro.
func TestCHeaderCompiles(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "siwtun_uabi.h"), CHeader(), 0o644); err != nil {
		t.Fatal(err)
	}
	src := `#include "siwtun_uabi.h"
#define ONE(kind, name) + 1
_Static_assert(0 SIWTUN_HELLO_REPLY(ONE) == 18, "hello reply fields");
_Static_assert(SIWTUN_OP_CANCEL == 19 && SIWTUN_CREATE_QP_REPLY_FDS == 2, "ops");
int main(void) { return 0; }
`
	if err := os.WriteFile(filepath.Join(dir, "check.c"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(cc, "-std=c11", "-Wall", "-Werror", "-fsyntax-only", filepath.Join(dir, "check.c")).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
}

func TestCName(t *testing.T) {
	for in, want := range map[string]string{"MaxQPWR": "MAX_QPWR", "FWVersion": "FW_VERSION", "AllocPD": "ALLOC_PD",
		"Param.PrivateData": "PARAM_PRIVATE_DATA", "EMSS": "EMSS", "MaxQPInitRdAtom": "MAX_QP_INIT_RD_ATOM", "QP": "QP", "STag": "STAG"} {
		if got := cName(in); got != want {
			t.Errorf("cName(%q) = %q, want %q", in, got, want)
		}
	}
}
