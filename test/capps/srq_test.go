package capps

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCSRQ runs siwtun-srqtest (libsiwtun/test/srqtest.c, built with ASan
// and UBSan, under the library built with them) on two daemons: four QPs
// of siwtun1 on one SRQ made with rdma_create_srq, Sends from four QPs of
// siwtun0 checked byte for byte, ibv_post_srq_recv's errors, the limit
// event through ibv_get_async_event, EBUSY, and growing the SRQ.
func TestCSRQ(t *testing.T) {
	e := newEnv(t)
	prog := filepath.Join(filepath.Dir(e.ctest), "siwtun-srqtest")
	out, err := e.start("", e.asanEnv(),
		prog, "siwtun0", "siwtun1", "17980").wait(t, 2*time.Minute)
	if err != nil || !strings.Contains(out, "\nPASS\n") {
		t.Fatalf("siwtun-srqtest: %v\n%s", err, out)
	}
	for _, check := range []string{"ok post srq recv errors", "ok rounds", "ok srq limit event", "ok destroy srq in use", "ok grow srq"} {
		if !strings.Contains(out, check+"\n") {
			t.Fatalf("siwtun-srqtest did not report %q:\n%s", check, out)
		}
	}
	t.Logf("siwtun-srqtest:\n%s", out)
}
