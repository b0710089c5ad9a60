package verbs

import "testing"

// TestNodeGUID: the GUID is the modified EUI-64 of the MAC, the MAC a
// locally administered unicast address, both stable per name.
func TestNodeGUID(t *testing.T) {
	m := NodeMAC("siwtun0")
	if m[0] != 0x02 {
		t.Fatalf("MAC %x: want a locally administered unicast first octet 0x02", m)
	}
	if m == NodeMAC("siwtun1") || m != NodeMAC("siwtun0") {
		t.Fatalf("MACs of siwtun0/siwtun1 %x/%x: want stable and distinct", m, NodeMAC("siwtun1"))
	}
	g := NodeGUID("siwtun0")
	want := [8]byte{m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]}
	for i := range want {
		if byte(g>>(56-8*i)) != want[i] {
			t.Fatalf("GUID %016x, want the EUI-64 %x of MAC %x", g, want, m)
		}
	}
}

// TestGUIDOfMAC: a golden pair, the node GUID Linux siw would have on an
// interface with that MAC.
func TestGUIDOfMAC(t *testing.T) {
	if g := GUIDOfMAC([6]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}); g != 0x505400fffe123456 {
		t.Fatalf("GUIDOfMAC(52:54:00:12:34:56) = %016x, want 505400fffe123456", g)
	}
}
