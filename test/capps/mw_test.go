package capps

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCMW runs siwtun-mwtest (libsiwtun/test/mwtest.c, built with ASan
// and UBSan, under the library built with them) on two daemons: memory
// windows of siwtun1 used by siwtun0 through libibverbs' own calls —
// ibv_alloc_mw of both types, IBV_WR_BIND_MW and ibv_bind_mw, a Write and
// a Read through a window at an offset, Send with Invalidate
// (IBV_WC_WITH_INV), IBV_WR_LOCAL_INV, the refused Write after it,
// EBUSY from ibv_dereg_mr, ibv_dealloc_mw — and ibv_query_device's
// max_mw and capability flags.
func TestCMW(t *testing.T) {
	e := newEnv(t)
	prog := filepath.Join(filepath.Dir(e.ctest), "siwtun-mwtest")
	out, err := e.start("", e.asanEnv(),
		prog, "siwtun0", "siwtun1", "17990").wait(t, 2*time.Minute)
	if err != nil || !strings.Contains(out, "\nPASS\n") {
		t.Fatalf("siwtun-mwtest: %v\n%s", err, out)
	}
	for _, check := range []string{"ok device mw attributes", "ok alloc mw", "ok type 2 bind write read", "ok type 1 ibv_bind_mw",
		"ok remote invalidate", "ok local invalidate", "ok dereg mr with window bound", "ok write after local invalidate refused",
		"ok dealloc mw"} {
		if !strings.Contains(out, check+"\n") {
			t.Fatalf("siwtun-mwtest did not report %q:\n%s", check, out)
		}
	}
	t.Logf("siwtun-mwtest:\n%s", out)
}
