package netstack

import (
	"testing"
)

// TestImpairDeviceLink runs a bulk transfer between two device links, one of
// them wrapped by Impair: every byte arrives, and both directions of the
// wrapped link show the impairments.
func TestImpairDeviceLink(t *testing.T) {
	const n = 8 << 20
	imp, err := ParseImpairments("loss=0.5%,reorder=2%,dup=0.5%,delay=100us,seed=7")
	if err != nil {
		t.Fatal(err)
	}
	da, db := devicePair(1500)
	la := Impair(NewDeviceLink(da), imp)
	a, b := newPair(t, pairOpts{linkA: la, linkB: NewDeviceLink(db)})
	ca, cb := connect(t, a, b, addrB4.Addr())
	bulk(t, ca, cb, n)
	ls := la.Stats()
	t.Logf("impaired link: %+v", ls)
	for _, d := range []struct {
		name string
		s    DirectionStats
	}{{"tx", ls.Tx}, {"rx", ls.Rx}} {
		if d.s.Dropped == 0 || d.s.Reordered == 0 {
			t.Errorf("%s: impairments not applied: %+v", d.name, d.s)
		}
	}
	if ls.Tx.Duplicated == 0 {
		t.Errorf("tx: no duplicates: %+v", ls.Tx)
	}
	if a.Stats().RetransSegs == 0 {
		t.Error("no retransmissions despite loss")
	}
}

// TestImpairCorrupt checks that Impair's corruption reaches the receiving
// application through TCP (the checksum is fixed up).
func TestImpairCorrupt(t *testing.T) {
	const n = 2 << 20
	da, db := devicePair(1500)
	la := Impair(NewDeviceLink(da), Impairments{Seed: 3, Corrupt: 0.01})
	a, b := newPair(t, pairOpts{linkA: la, linkB: NewDeviceLink(db)})
	ca, cb := connect(t, a, b, addrB4.Addr())
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ca, n, ca.MSS()) }()
	v, err := receivePattern(cb)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if v.off != n {
		t.Fatalf("got %d bytes, want %d", v.off, n)
	}
	if c := la.Stats().Tx.Corrupted; c == 0 || v.mismatches == 0 || uint64(v.mismatches) > c {
		t.Fatalf("corrupted %d segments, %d bytes mismatched at the application", c, v.mismatches)
	}
	if cs := b.Stats().InCsumErrors; cs != 0 {
		t.Errorf("TCP saw %d checksum errors", cs)
	}
}

// TestImpairNone returns the link itself when nothing is impaired.
func TestImpairNone(t *testing.T) {
	da, _ := devicePair(1500)
	l := NewDeviceLink(da)
	defer l.Close()
	if got := Impair(l, Impairments{Seed: 9}); got != l {
		t.Error("Impair with no impairment wrapped the link")
	}
}
