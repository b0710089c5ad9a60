package offload

import (
	"math/bits"
	"testing"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// TestSTagPermutations: the index permutation is a bijection of 24 bits
// that slot inverts, and a slot's keys run through all 256 values before
// one repeats.
func TestSTagPermutations(t *testing.T) {
	s := newSTagSecret()
	for _, slot := range []uint32{0, 1, 2, 3, 1000, 1<<24 - 1} {
		idx := s.index(slot)
		if idx >= 1<<24 {
			t.Fatalf("index(%d) = 0x%x: more than 24 bits", slot, idx)
		}
		if got := s.slot(idx); got != slot {
			t.Fatalf("slot(index(%d)) = %d", slot, got)
		}
	}
	seen := make(map[uint32]bool, 1<<16)
	for slot := uint32(0); slot < 1<<16; slot++ {
		idx := s.index(slot)
		if seen[idx] {
			t.Fatalf("index collision at slot %d", slot)
		}
		seen[idx] = true
	}
	for _, slot := range []uint32{1, 77} {
		var keys [256]bool
		for gen := range 256 {
			k := s.key(slot, uint8(gen))
			if keys[k] {
				t.Fatalf("slot %d: key 0x%02x repeats within 256 generations", slot, k)
			}
			keys[k] = true
		}
	}
}

// TestSTagsUnpredictable (RFC 5042 §5.1.1): a peer that has seen STags
// cannot guess others. Over many fresh tables (devices), the STag of the
// second region is spread over many values given the first's, and the
// key of a slot's next region over many values given the previous key:
// nothing a peer saw predicts the next STag.
func TestSTagsUnpredictable(t *testing.T) {
	const tables = 2000
	deltas := map[uint32]int{}
	nextKeys := map[[2]uint8]int{} // (previous key, next key)
	firsts := map[uint32]int{}
	for range tables {
		tab := NewRegions(16)
		a := mustRegister(t, tab, 1, 64, 0x1000, ibv.AccessRemoteWrite|ibv.AccessLocalWrite)
		b := mustRegister(t, tab, 1, 64, 0x2000, ibv.AccessRemoteWrite|ibv.AccessLocalWrite)
		firsts[a.STag()]++
		deltas[b.STag()-a.STag()]++
		if err := tab.Deregister(a.STag()); err != nil {
			t.Fatal(err)
		}
		c := mustRegister(t, tab, 1, 64, 0x1000, ibv.AccessRemoteWrite|ibv.AccessLocalWrite)
		if c.STag()>>8 != a.STag()>>8 || c.STag() == a.STag() {
			t.Fatalf("re-registration: STag 0x%08x after 0x%08x: want the same index, a new key", c.STag(), a.STag())
		}
		nextKeys[[2]uint8{uint8(a.STag()), uint8(c.STag())}]++
	}
	// With sequential STags (index+1, key+1) each map would hold one value.
	for name, n := range map[string]int{"first STag": len(firsts), "second - first": len(deltas), "(key, next key)": len(nextKeys)} {
		if n < tables*9/10 {
			t.Errorf("%s: %d distinct values in %d devices: predictable", name, n, tables)
		}
	}
	// The most frequent delta must be rare: a peer's best guess of the
	// second STag from the first succeeds at most a few times in 2000.
	most := 0
	for _, n := range deltas {
		most = max(most, n)
	}
	if most > 3 {
		t.Errorf("the most common STag delta occurred %d times in %d devices", most, tables)
	}
	// Index bits are spread: about half of the index bits differ between
	// two regions of one table.
	tab := NewRegions(1024)
	var prev uint32
	total := 0
	for i := range 512 {
		r := mustRegister(t, tab, 1, 8, 0, ibv.AccessLocalWrite)
		if i > 0 {
			total += bits.OnesCount32((r.STag() ^ prev) >> 8)
		}
		prev = r.STag()
	}
	if avg := float64(total) / 511; avg < 9 || avg > 15 {
		t.Errorf("consecutive STag indexes differ in %.1f of 24 bits on average, want about 12", avg)
	}
}

func TestSTagLookupNoAllocs(t *testing.T) {
	tab := NewRegions(16)
	r := mustRegister(t, tab, 1, 64, 0x1000, ibv.AccessLocalWrite)
	if n := testing.AllocsPerRun(1000, func() { tab.Lookup(r.STag()) }); n != 0 {
		t.Fatalf("Lookup: %v allocs", n)
	}
}
