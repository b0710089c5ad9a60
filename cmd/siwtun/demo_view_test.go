package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/web"
)

// TestDemoViewImpaired runs the in-process demo over a lossy, reordering
// link with --html and checks what the view says about it: segments one
// end sent and the other never received are marked dropped, and the
// octets of each dropped data segment reached the receiver in another copy
// (sent again, or an earlier copy the sender had given up on too soon);
// out-of-order placements happen and
// are placed again in order when the gap fills; every byte of the Write
// and the Read lands in its region.
func TestDemoViewImpaired(t *testing.T) {
	page := filepath.Join(t.TempDir(), "demo.html")
	var out strings.Builder
	o := demoOptions{mtu: 1500, size: 262144, rev: 2, crc: true, inProc: true, html: page, imp: "loss=3%,reorder=5%,seed=7"}
	if err := runDemo(&out, o); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	v := readView(t, page)
	var drops, dataDrops, ooo, again int
	for i, s := range v.Segments {
		if !s.Drop {
			continue
		}
		drops++
		if s.Len == 0 {
			continue
		}
		dataDrops++
		// Its octets reached the receiver in another copy: one sent again
		// later, or an earlier one (this was a spurious retransmission).
		delivered := false
		for _, r := range v.Segments {
			received := (r.Out && r.PT >= 0) || (!r.Out && r.T >= 0)
			if r.N != i && r.A == s.A && received && r.Seq <= s.Seq && s.Seq < r.Seq+uint32(r.Len) {
				delivered = true
				break
			}
		}
		if !delivered {
			t.Errorf("dropped segment %d (seq %d, %d octets, out %v, t %d pt %d): no copy of it reached the receiver", i, s.Seq, s.Len, s.Out, s.T, s.PT)
			for _, r := range v.Segments {
				if r.A == s.A && r.Seq == s.Seq {
					t.Logf("  same seq: %d len %d drop %v t %d pt %d ack %d", r.N, r.Len, r.Drop, r.T, r.PT, r.Ack)
				}
			}
		}
	}
	placed := make([]map[uint64]bool, len(v.Regions))
	for _, p := range v.Places {
		if p.OOO {
			ooo++
		}
		if p.Again {
			again++
		}
		if p.Region < 0 {
			continue
		}
		if placed[p.Region] == nil {
			placed[p.Region] = map[uint64]bool{}
		}
		for k := uint64(0); k < uint64(p.Len); k++ {
			placed[p.Region][p.Offset+k] = true
		}
	}
	if drops == 0 || dataDrops == 0 || ooo == 0 || again == 0 {
		t.Errorf("%d drops (%d with data), %d out-of-order placements, %d placed again: the impairments should show", drops, dataDrops, ooo, again)
	}
	if len(v.Regions) != 2 {
		t.Fatalf("regions %+v", v.Regions)
	}
	for i, r := range v.Regions {
		if !r.Known || r.Len != o.size || len(placed[i]) != r.Len {
			t.Errorf("region %+v: %d octets placed", r, len(placed[i]))
		}
	}
	t.Logf("%d segments: %d dropped (%d with data), %d out-of-order placements, %d placed again", len(v.Segments), drops, dataDrops, ooo, again)
}

// readView reads the view a page written with --html holds.
func readView(t *testing.T, page string) web.View {
	t.Helper()
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	v, err := web.ReadPage(data)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
