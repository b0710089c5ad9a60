package netstack

import (
	"net/netip"
	"testing"
)

// TestFlowTableLast: the table's last-found flow answers repeated lookups,
// and a removed flow is never returned again, even by that shortcut: a new
// connection with the same addresses gets its own flow.
func TestFlowTableLast(t *testing.T) {
	var tb flowTable
	tb.init()
	k1 := flowKey{local: netip.MustParseAddrPort("198.18.0.1:7174"), remote: netip.MustParseAddrPort("198.18.0.2:40000")}
	k2 := flowKey{local: netip.MustParseAddrPort("198.18.0.1:7174"), remote: netip.MustParseAddrPort("198.18.0.2:40001")}
	f1, f2 := tb.getOrCreate(k1), tb.getOrCreate(k2)
	if f1 == f2 {
		t.Fatal("two keys, one flow")
	}
	for i := 0; i < 3; i++ {
		if got := tb.get(k1); got != f1 {
			t.Fatalf("get(k1) = %p, want %p", got, f1)
		}
		if got := tb.get(k2); got != f2 {
			t.Fatalf("get(k2) = %p, want %p", got, f2)
		}
	}
	if tb.get(k1) != f1 || tb.last.Load() != f1 {
		t.Fatal("k1's flow is not the last found")
	}
	tb.remove(k1, f1)
	if got := tb.get(k1); got != nil {
		t.Fatalf("removed flow still found: %p", got)
	}
	f3 := tb.getOrCreate(k1)
	if f3 == f1 || tb.get(k1) != f3 {
		t.Fatalf("after removal get(k1) = %p, new flow %p, old %p", tb.get(k1), f3, f1)
	}
	if tb.get(k2) != f2 {
		t.Fatal("k2's flow lost")
	}
}
