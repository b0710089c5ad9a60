package uabi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestCHeaderCurrent: the C library builds against the header CHeader
// renders now; it fails when the protocol changed and the header was not
// generated again.
func TestCHeaderCurrent(t *testing.T) {
	path := filepath.Join("..", "..", "libsiwtun", "siwtun_abi.h")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(CHeader()) {
		t.Errorf("%s is not what CHeader renders: run go generate ./internal/uabi", path)
	}
}

// TestCHeaderCompiles builds a C file that includes the header and counts
// the fields of the hello reply through its X-macro.
func TestCHeaderCompiles(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "siwtun_abi.h"), CHeader(), 0o644); err != nil {
		t.Fatal(err)
	}
	src := `#include "siwtun_abi.h"
#define ONE(kind, name) + 1
_Static_assert(0 SW_HELLO_REPLY(ONE) == 23, "hello reply fields");
_Static_assert(SW_OP_CANCEL == 19 && SW_CREATE_QP_REPLY_FDS == 2, "ops");
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

// TestOpsDocTable checks that the table in Ops' doc comment is Ops.
func TestOpsDocTable(t *testing.T) {
	src, err := os.ReadFile("protocol.go")
	if err != nil {
		t.Fatal(err)
	}
	want := opsDocTable()
	if !strings.Contains(string(src), want) {
		t.Errorf("the table of Ops' doc comment is not Ops; it should read\n%s", want)
	}
}

// opsDocTable renders Ops as the table of its doc comment.
func opsDocTable() string {
	var b strings.Builder
	fmt.Fprintf(&b, "//\top  name           request        fds  reply           fds\n")
	for _, op := range Ops {
		reply, fds := "none", "-"
		if op.Reply != nil {
			reply, fds = reflect.TypeOf(op.Reply).Elem().Name(), fmt.Sprint(op.ReplyFDs)
		}
		fmt.Fprintf(&b, "//\t%2d  %-14s %-14s %d    %-15s %s\n", op.Op, op.Name,
			reflect.TypeOf(op.Request).Elem().Name(), op.RequestFDs, reply, fds)
	}
	return b.String()
}
