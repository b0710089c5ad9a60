package offload

import (
	"errors"
	"testing"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// TestReregister: the STag names the new memory, PD and access at once;
// the old Region is invalid; an invalidated region is valid again; bad
// input and unknown STags change nothing.
func TestReregister(t *testing.T) {
	tab := NewRegions(8)
	a, b := make([]byte, 64), make([]byte, 128)
	r, err := tab.Register(1, a, 0x1000, ibv.AccessLocalWrite|ibv.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	stag := r.STag()
	n, err := tab.Reregister(stag, 2, b, 0x9000, ibv.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := tab.Lookup(stag)
	if !ok || got != n || got.PD() != 2 || got.Addr() != 0x9000 || got.Len() != 128 || got.Access() != ibv.AccessRemoteRead || &got.Bytes()[0] != &b[0] {
		t.Fatalf("after rereg: %+v, %v", got, ok)
	}
	if r.valid || tab.Len() != 1 {
		t.Fatalf("old region valid %v, %d regions", r.valid, tab.Len())
	}
	if err := tab.Invalidate(stag, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.Reregister(stag, 2, b, 0x9000, ibv.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if _, ok := tab.Lookup(stag); !ok {
		t.Fatal("an invalidated region reregistered is not valid")
	}
	for _, tc := range []struct {
		name   string
		stag   uint32
		addr   uint64
		access ibv.Access
	}{
		{"unknown STag", stag ^ 1, 0, ibv.AccessLocalWrite},
		{"REMOTE_WRITE without LOCAL_WRITE", stag, 0, ibv.AccessRemoteWrite},
		{"atomic access", stag, 0, ibv.AccessLocalWrite | 1<<3},
		{"wrapping", stag, ^uint64(0) - 10, ibv.AccessLocalWrite},
	} {
		if _, err := tab.Reregister(tc.stag, 3, a, tc.addr, tc.access); err == nil {
			t.Fatalf("%s: accepted", tc.name)
		}
		if got, ok := tab.Lookup(stag); !ok || got.PD() != 2 || got.Access() != ibv.AccessLocalWrite {
			t.Fatalf("%s: the region changed: %+v", tc.name, got)
		}
	}
	if err := tab.Deregister(stag); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.Reregister(stag, 2, b, 0, ibv.AccessLocalWrite); !errors.Is(err, ErrInvalidSTag) {
		t.Fatalf("rereg after dereg: %v", err)
	}
}
