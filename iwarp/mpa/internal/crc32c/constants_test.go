package crc32c

import (
	"math/bits"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// castagnoli is the CRC32c polynomial without its x^32 term, not reflected.
const castagnoli = 0x1edc6f41

// xPowMod returns x^n modulo the Castagnoli polynomial.
func xPowMod(n int) uint32 {
	r := uint32(1)
	for range n {
		carry := r&0x80000000 != 0
		r <<= 1
		if carry {
			r ^= castagnoli
		}
	}
	return r
}

// foldConstant is the multiplier, in the reflected domain of the CRC32
// instruction, for x^n mod P.
func foldConstant(n int) uint64 { return uint64(bits.Reverse32(xPowMod(n))) << 1 }

// TestFoldConstants checks the DATA lines of fold_amd64.s against the
// constants computed from the polynomial: a lane moved F bits has its
// first quadword multiplied by x^(F+32) and its second by x^(F-32).
func TestFoldConstants(t *testing.T) {
	src, err := os.ReadFile("fold_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`DATA k(\d+)<>\+(\d+)\(SB\)/8, \$(0x[0-9a-f]+)`)
	found := 0
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		f, _ := strconv.Atoi(m[1])
		off, _ := strconv.Atoi(m[2])
		got, err := strconv.ParseUint(m[3], 0, 64)
		if err != nil {
			t.Fatalf("%s: %v", m[0], err)
		}
		n := f + 32
		if off == 8 {
			n = f - 32
		}
		if want := foldConstant(n); got != want {
			t.Errorf("k%d+%d = %#x, want x^%d mod P = %#x", f, off, got, n, want)
		}
		found++
	}
	if found != 6 {
		t.Errorf("found %d constants in fold_amd64.s, want 6", found)
	}
}
