package offload

import (
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/siwtun/siwtun/verbs/ibv"
)

func mustRegister(t *testing.T, tab *Regions, pd uint32, n int, addr uint64, access ibv.Access) *Region {
	t.Helper()
	r, err := tab.Register(pd, make([]byte, n), addr, access)
	if err != nil {
		t.Fatalf("Register(pd %d, %d bytes at 0x%x, %v): %v", pd, n, addr, access, err)
	}
	return r
}

func TestRegisterAccessRules(t *testing.T) {
	tests := []struct {
		name   string
		access ibv.Access
		ok     bool
	}{
		{"none", 0, true},
		{"local-write", ibv.AccessLocalWrite, true},
		{"remote-read", ibv.AccessRemoteRead, true},
		{"local-and-remote-write", ibv.AccessLocalWrite | ibv.AccessRemoteWrite, true},
		{"all", ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead, true},
		{"remote-write-alone", ibv.AccessRemoteWrite, false},
		{"remote-write-and-read", ibv.AccessRemoteWrite | ibv.AccessRemoteRead, false},
		{"unknown-bit", ibv.Access(8), false},
		{"unknown-with-valid", ibv.AccessLocalWrite | ibv.Access(0x100), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab := NewRegions(8)
			r, err := tab.Register(1, make([]byte, 16), 0x1000, tt.access)
			if (err == nil) != tt.ok {
				t.Fatalf("Register with %v = %v, want ok=%v", tt.access, err, tt.ok)
			}
			if !tt.ok {
				if !errors.Is(err, errRegion) || tab.Len() != 0 {
					t.Fatalf("error %v (want an errRegion), %d regions", err, tab.Len())
				}
				return
			}
			if r.Access() != tt.access || r.PD() != 1 || r.Addr() != 0x1000 || r.Len() != 16 {
				t.Fatalf("region %v pd %d addr 0x%x len %d", r.Access(), r.PD(), r.Addr(), r.Len())
			}
			if got, ok := tab.Lookup(r.STag()); !ok || got != r {
				t.Fatalf("Lookup(0x%08x) = %v, %v", r.STag(), got, ok)
			}
		})
	}
}

// TestRegisterAddressRange: the region's tagged offsets may lie anywhere in
// the 64-bit space as long as [addr, addr+len) does not wrap.
func TestRegisterAddressRange(t *testing.T) {
	const top = math.MaxUint64
	tests := []struct {
		name string
		addr uint64
		n    int
		ok   bool
	}{
		{"zero", 0, 16, true},
		{"high", 1 << 63, 16, true},
		{"last-byte-below-top", top - 15, 15, true}, // ends at 2^64-1
		// Like Linux (ib_umem_get refuses addr + size < addr), a region
		// whose end wraps to 2^64 or beyond is refused.
		{"last-byte-is-top", top - 15, 16, false},
		{"wraps", top - 7, 16, false},
		{"top-one-byte", top, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab := NewRegions(8)
			_, err := tab.Register(1, make([]byte, tt.n), tt.addr, ibv.AccessLocalWrite)
			if (err == nil) != tt.ok {
				t.Fatalf("Register(0x%x, %d) = %v, want ok=%v", tt.addr, tt.n, err, tt.ok)
			}
			if !tt.ok && (!errors.Is(err, errRegion) || tab.Len() != 0) {
				t.Fatalf("refused with %v, %d regions", err, tab.Len())
			}
		})
	}
}

// TestRegionSlice: the base-and-bounds check of every placement, including
// offsets and lengths near 2^64 that would overflow a naive addr+len check.
func TestRegionSlice(t *testing.T) {
	const top = math.MaxUint64
	tests := []struct {
		name   string
		base   uint64
		size   int
		to, n  uint64
		ok     bool
		offset int
	}{
		{"whole", 0x1000, 64, 0x1000, 64, true, 0},
		{"inside", 0x1000, 64, 0x1010, 16, true, 16},
		{"empty-at-start", 0x1000, 64, 0x1000, 0, true, 0},
		{"empty-at-end", 0x1000, 64, 0x1040, 0, true, 64},
		{"last-byte", 0x1000, 64, 0x103f, 1, true, 63},
		{"one-past-end", 0x1000, 64, 0x1040, 1, false, 0},
		{"overlaps-end", 0x1000, 64, 0x1030, 17, false, 0},
		{"below-base", 0x1000, 64, 0xfff, 1, false, 0},
		{"below-base-covering", 0x1000, 64, 0xff0, 32, false, 0},
		{"far-beyond", 0x1000, 64, 0x100000, 1, false, 0},
		{"huge-length", 0x1000, 64, 0x1000, top, false, 0},
		{"length-wraps-to-inside", 0x1000, 64, 0x1010, top - 0xf, false, 0},
		{"offset-near-top", 0x1000, 64, top, 1, false, 0},
		{"offset-and-length-wrap", 0x1000, 64, top - 8, 0x1010, false, 0},
		{"region-at-top-whole", top - 64, 64, top - 64, 64, true, 0},
		{"region-at-top-tail", top - 64, 64, top - 1, 1, true, 63},
		{"region-at-top-past", top - 64, 64, top - 1, 2, false, 0},
		{"region-at-top-wrap-len", top - 64, 64, top - 32, top, false, 0},
		{"region-at-zero-below", 0, 64, top, 2, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab := NewRegions(4)
			r := mustRegister(t, tab, 1, tt.size, tt.base, ibv.AccessLocalWrite)
			for i := range r.buf {
				r.buf[i] = byte(i)
			}
			b, ok := r.slice(tt.to, tt.n)
			if ok != tt.ok {
				t.Fatalf("slice(0x%x, %d) of [0x%x, +%d) ok=%v, want %v", tt.to, tt.n, tt.base, tt.size, ok, tt.ok)
			}
			if !ok {
				if b != nil {
					t.Fatal("a refused slice returned bytes")
				}
				return
			}
			if uint64(len(b)) != tt.n {
				t.Fatalf("slice has %d bytes, want %d", len(b), tt.n)
			}
			if tt.n > 0 && b[0] != byte(tt.offset) {
				t.Fatalf("slice starts at offset %d, want %d", b[0], tt.offset)
			}
			if cap(b) > len(r.buf)-tt.offset {
				t.Fatalf("slice capacity %d reaches past the region", cap(b))
			}
		})
	}
}

// TestSTagReuse: a reused slot gets a new key, so the old STag names
// nothing: Lookup, Deregister and Invalidate of it fail.
func TestSTagReuse(t *testing.T) {
	tests := []struct {
		name   string
		cycles int
	}{
		{"once", 1},
		{"few", 5},
		{"255", 255}, // every key but one used
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab := NewRegions(4)
			keep := mustRegister(t, tab, 1, 8, 0x100, ibv.AccessLocalWrite) // another slot, untouched
			seen := map[uint32]bool{}
			var old []uint32
			for i := 0; i <= tt.cycles; i++ {
				r := mustRegister(t, tab, 1, 8, 0x1000, ibv.AccessRemoteRead)
				if seen[r.STag()] {
					t.Fatalf("cycle %d: STag 0x%08x reused", i, r.STag())
				}
				seen[r.STag()] = true
				if len(old) > 0 && r.STag()>>8 != old[0]>>8 {
					t.Fatalf("cycle %d: slot %d, want the freed slot %d", i, r.STag()>>8, old[0]>>8)
				}
				for _, o := range old {
					if _, ok := tab.Lookup(o); ok {
						t.Fatalf("stale STag 0x%08x still names a region", o)
					}
					if err := tab.Deregister(o); !errors.Is(err, ErrInvalidSTag) {
						t.Fatalf("Deregister(stale 0x%08x) = %v", o, err)
					}
					if err := tab.Invalidate(o, 1); !errors.Is(err, ErrInvalidSTag) {
						t.Fatalf("Invalidate(stale 0x%08x) = %v", o, err)
					}
				}
				if got, ok := tab.Lookup(r.STag()); !ok || got != r {
					t.Fatalf("new STag 0x%08x not found", r.STag())
				}
				if err := tab.Deregister(r.STag()); err != nil {
					t.Fatal(err)
				}
				old = append(old, r.STag())
			}
			if got, ok := tab.Lookup(keep.STag()); !ok || got != keep {
				t.Fatal("the other region was disturbed")
			}
			if tab.Len() != 1 {
				t.Fatalf("%d regions, want 1", tab.Len())
			}
		})
	}
}

func TestLookupInvalid(t *testing.T) {
	tab := NewRegions(4)
	r := mustRegister(t, tab, 1, 8, 0, ibv.AccessLocalWrite)
	tests := []struct {
		name string
		stag uint32
	}{
		{"zero", 0},
		{"slot-zero-any-key", 0x000000ff},
		{"wrong-key", r.STag() ^ 1},
		{"unused-slot", r.STag() + 1<<8},
		{"max", math.MaxUint32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, ok := tab.Lookup(tt.stag); ok {
				t.Fatalf("Lookup(0x%08x) found a region", tt.stag)
			}
			if err := tab.Deregister(tt.stag); !errors.Is(err, ErrInvalidSTag) {
				t.Fatalf("Deregister(0x%08x) = %v", tt.stag, err)
			}
			if err := tab.Invalidate(tt.stag, 1); !errors.Is(err, ErrInvalidSTag) {
				t.Fatalf("Invalidate(0x%08x) = %v", tt.stag, err)
			}
		})
	}
	if _, ok := tab.Lookup(r.STag()); !ok {
		t.Fatal("the valid region was disturbed")
	}
}

// TestInvalidate: remote invalidation (Send with Invalidate) needs the
// region's PD, works once, and leaves the region to be deregistered.
func TestInvalidate(t *testing.T) {
	tests := []struct {
		name  string
		pd    uint32 // PD given to Invalidate; the region is in PD 1
		twice bool
		ok    bool
	}{
		{"same-pd", 1, false, true},
		{"other-pd", 2, false, false},
		{"twice", 1, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab := NewRegions(4)
			r := mustRegister(t, tab, 1, 8, 0x1000, ibv.AccessLocalWrite|ibv.AccessRemoteWrite)
			if tt.twice {
				if err := tab.Invalidate(r.STag(), tt.pd); err != nil {
					t.Fatal(err)
				}
			}
			err := tab.Invalidate(r.STag(), tt.pd)
			if (err == nil) != tt.ok {
				t.Fatalf("Invalidate = %v, want ok=%v", err, tt.ok)
			}
			switch {
			case tt.twice && !errors.Is(err, ErrInvalidSTag):
				t.Fatalf("second Invalidate = %v, want ErrInvalidSTag", err)
			case tt.pd != 1 && (errors.Is(err, ErrInvalidSTag) || !errors.Is(err, errRegion)):
				t.Fatalf("Invalidate from another PD = %v, want a PD error", err)
			}
			_, valid := tab.Lookup(r.STag())
			if wantValid := tt.pd != 1; valid != wantValid {
				t.Fatalf("region valid=%v, want %v", valid, wantValid)
			}
			if tab.Len() != 1 {
				t.Fatalf("%d regions, want 1 (invalidated regions stay registered)", tab.Len())
			}
			// Deregistration works whether or not the STag was invalidated.
			if err := tab.Deregister(r.STag()); err != nil {
				t.Fatalf("Deregister: %v", err)
			}
			if tab.Len() != 0 {
				t.Fatalf("%d regions after Deregister", tab.Len())
			}
		})
	}
}

func TestRegionsFull(t *testing.T) {
	const max = 3
	tab := NewRegions(max)
	var rs []*Region
	for i := 0; i < max; i++ {
		rs = append(rs, mustRegister(t, tab, 1, 8, 0, ibv.AccessLocalWrite))
	}
	if _, err := tab.Register(1, make([]byte, 8), 0, ibv.AccessLocalWrite); err == nil || !errors.Is(err, errRegion) {
		t.Fatalf("Register beyond %d regions = %v", max, err)
	}
	if err := tab.Deregister(rs[1].STag()); err != nil {
		t.Fatal(err)
	}
	r := mustRegister(t, tab, 1, 8, 0, ibv.AccessLocalWrite)
	if r.STag()>>8 != rs[1].STag()>>8 || r.STag() == rs[1].STag() {
		t.Fatalf("re-registration got STag 0x%08x, want slot %d with a new key", r.STag(), rs[1].STag()>>8)
	}
	if tab.Len() != max {
		t.Fatalf("%d regions, want %d", tab.Len(), max)
	}
}

// TestRegionsConcurrent registers, looks up, invalidates and deregisters
// from many goroutines (for the race detector): every STag stays unique
// while registered.
func TestRegionsConcurrent(t *testing.T) {
	tab := NewRegions(1024)
	var wg sync.WaitGroup
	var mu sync.Mutex
	live := map[uint32]bool{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				r, err := tab.Register(uint32(g), make([]byte, 8), uint64(i), ibv.AccessLocalWrite|ibv.AccessRemoteWrite)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if live[r.STag()] {
					t.Errorf("STag 0x%08x handed out twice", r.STag())
				}
				live[r.STag()] = true
				mu.Unlock()
				if got, ok := tab.Lookup(r.STag()); !ok || got != r {
					t.Errorf("Lookup of a live STag failed")
				}
				if i%2 == 0 {
					if err := tab.Invalidate(r.STag(), uint32(g)); err != nil {
						t.Error(err)
					}
				}
				mu.Lock()
				delete(live, r.STag())
				mu.Unlock()
				if err := tab.Deregister(r.STag()); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if tab.Len() != 0 {
		t.Fatalf("%d regions left", tab.Len())
	}
}
