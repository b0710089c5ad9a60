package crc32c

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCopyUpdateMatches checks CopyUpdate against copy and hash/crc32 for
// every length up to a jumbo FPDU's and beyond, at every alignment of
// source and destination, behind prefixes of every length to beyond what
// the CRC32 instruction takes alone (maxPre): the CRC is the same, dst
// holds src, and the octets of dst outside it are untouched.
func TestCopyUpdateMatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	src := randomBytes(rng, 9100+64)
	dst := make([]byte, 9100+64+16)
	for n := 0; n <= 9100; n++ {
		so, do := n%64, (n*7)%64
		p := src[so : so+n]
		for i := range dst {
			dst[i] = 0xa5
		}
		init := rng.Uint32()
		pre := src[len(src)-n%(maxPre+9):]
		got := CopyUpdate(init, pre, dst[do:], p)
		if want := crc32.Update(crc32.Update(init, table, pre), table, p); got != want {
			t.Fatalf("CopyUpdate(%#x, %d octets of prefix, %d octets, src offset %d, dst offset %d) = %#x, want %#x", init, len(pre), n, so, do, got, want)
		}
		if !bytes.Equal(dst[do:do+n], p) {
			t.Fatalf("CopyUpdate of %d octets (src offset %d, dst offset %d): dst differs from src", n, so, do)
		}
		for i, b := range dst {
			if (i < do || i >= do+n) && b != 0xa5 {
				t.Fatalf("CopyUpdate of %d octets at dst offset %d wrote dst[%d]", n, do, i)
			}
		}
	}
}

// TestCopyUpdateShortDst checks that a destination shorter than the source
// is refused before anything is written.
func TestCopyUpdateShortDst(t *testing.T) {
	dst := make([]byte, 300)
	defer func() {
		if recover() == nil {
			t.Fatal("CopyUpdate with a short dst did not panic")
		}
		if !bytes.Equal(dst, make([]byte, 300)) {
			t.Fatal("CopyUpdate with a short dst wrote to it")
		}
	}()
	CopyUpdate(0, nil, dst, bytes.Repeat([]byte{1}, 301))
}

func FuzzCopyUpdate(f *testing.F) {
	f.Add(uint32(0), []byte{}, []byte("123456789"))
	f.Add(uint32(0xffffffff), make([]byte, 18), make([]byte, 1448))
	f.Fuzz(func(t *testing.T, crc uint32, pre, p []byte) {
		dst := make([]byte, len(p))
		if got, want := CopyUpdate(crc, pre, dst, p), crc32.Update(crc32.Update(crc, table, pre), table, p); got != want {
			t.Fatalf("CopyUpdate(%#x, %d octets of prefix, %d octets) = %#x, want %#x", crc, len(pre), len(p), got, want)
		}
		if !bytes.Equal(dst, p) {
			t.Fatalf("CopyUpdate of %d octets: dst differs from src", len(p))
		}
	})
}

// BenchmarkCopyUpdate compares CopyUpdate with a copy followed by one
// Update over the 18-octet header and the copy (what the MPA sender did
// before) on the FPDU sizes of a 1500 and a 9000 octet MTU.
func BenchmarkCopyUpdate(b *testing.B) {
	for _, n := range []int{1448, 8948} {
		const hdr = 18
		src, buf := make([]byte, n-hdr), make([]byte, n)
		b.Run(itoa(n)+"/fused", func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				sink = CopyUpdate(sink, buf[:hdr], buf[hdr:], src)
			}
		})
		b.Run(itoa(n)+"/copy-then-update", func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(buf[hdr:], src)
				sink = Update(sink, buf)
			}
		})
	}
}
