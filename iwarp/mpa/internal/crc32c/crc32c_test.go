package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestUpdateMatchesHashCRC32 compares Update with hash/crc32 for every
// length up to a jumbo FPDU's and beyond, at every alignment of the start,
// from random registers.
func TestUpdateMatchesHashCRC32(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := randomBytes(rng, 9100+64)
	for n := 0; n <= 9100; n++ {
		off := n % 64
		p := buf[off : off+n]
		init := rng.Uint32()
		if got, want := Update(init, p), crc32.Update(init, table, p); got != want {
			t.Fatalf("Update(%#x, %d octets at offset %d) = %#x, want %#x", init, n, off, got, want)
		}
	}
}

// TestChecksumGolden checks the CRC32c check value and RFC 3720's
// (iSCSI's, the same polynomial) examples, B.4.
func TestChecksumGolden(t *testing.T) {
	ones := make([]byte, 32)
	incr := make([]byte, 32)
	for i := range ones {
		ones[i] = 0xff
		incr[i] = byte(i)
	}
	long := make([]byte, 1448) // long enough to fold
	for i := range long {
		long[i] = byte(i * 7)
	}
	tests := []struct {
		name string
		in   []byte
		want uint32
	}{
		{"check value", []byte("123456789"), 0xe3069283},
		{"32 zeros", make([]byte, 32), 0x8a9136aa},
		{"32 ones", ones, 0x62a8ab43},
		{"32 incrementing", incr, 0x46dd794e},
		{"1448 octets", long, crc32.Checksum(long, table)},
		{"1448 zeros", make([]byte, 1448), crc32.Checksum(make([]byte, 1448), table)},
	}
	for _, tt := range tests {
		if got := Checksum(tt.in); got != tt.want {
			t.Errorf("%s: Checksum = %#08x, want %#08x", tt.name, got, tt.want)
		}
	}
}

// TestUpdateInPieces checks that a CRC carried over pieces, as the MPA
// receiver carries it over the segments of an FPDU, is the CRC of the whole.
func TestUpdateInPieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	p := randomBytes(rng, 8960)
	want := crc32.Checksum(p, table)
	for range 200 {
		crc, rest := uint32(0), p
		for len(rest) > 0 {
			n := min(len(rest), rng.IntN(3000))
			crc, rest = Update(crc, rest[:n]), rest[n:]
		}
		if crc != want {
			t.Fatalf("in pieces: %#x, want %#x", crc, want)
		}
	}
}

// randomBytes returns n octets from rng.
func randomBytes(rng *rand.Rand, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p
}

func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), []byte("123456789"))
	f.Add(uint32(0xffffffff), make([]byte, 300))
	f.Fuzz(func(t *testing.T, crc uint32, p []byte) {
		if got, want := Update(crc, p), crc32.Update(crc, table, p); got != want {
			t.Fatalf("Update(%#x, %d octets) = %#x, want %#x", crc, len(p), got, want)
		}
	})
}

var sink uint32

func benchmarkUpdate(b *testing.B, n int, f func(uint32, []byte) uint32) {
	p := make([]byte, n)
	b.SetBytes(int64(n))
	for b.Loop() {
		sink = f(sink, p)
	}
}

func stdUpdate(crc uint32, p []byte) uint32 { return crc32.Update(crc, table, p) }

// BenchmarkUpdate compares Update with hash/crc32 on the FPDU sizes of a
// 1500 and a 9000 octet MTU, and on a short one.
func BenchmarkUpdate(b *testing.B) {
	for _, n := range []int{64, 512, 1448, 8948} {
		b.Run(itoa(n)+"/crc32c", func(b *testing.B) { benchmarkUpdate(b, n, Update) })
		b.Run(itoa(n)+"/hash-crc32", func(b *testing.B) { benchmarkUpdate(b, n, stdUpdate) })
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// TestCanonicalTable guards the short-input path: hash/crc32 uses the
// CRC32 instructions (SSE4.2, ARMv8) only for the very table
// crc32.MakeTable(crc32.Castagnoli) returns, never for a copy.
func TestCanonicalTable(t *testing.T) {
	if table != crc32.MakeTable(crc32.Castagnoli) {
		t.Fatal("table is not the canonical Castagnoli table")
	}
}

// TestFoldPathRuns makes sure the comparisons above exercised the folding
// code, not only hash/crc32, and says so when this CPU cannot run it.
func TestFoldPathRuns(t *testing.T) {
	p := make([]byte, 1448)
	got, ok := update(0, p)
	if !ok {
		t.Skip("no AVX-512 VPCLMULQDQ on this CPU (or not amd64): Update is hash/crc32 here, the folding path is untested")
	}
	if want := crc32.Checksum(p, table); got != want {
		t.Fatalf("folding path: %#x, want %#x", got, want)
	}
}
