// Package crc32c computes the CRC32c (Castagnoli) checksum that MPA puts
// at the end of every FPDU (RFC 5044, section 4.1).
//
// Update has the meaning of hash/crc32's Update with the Castagnoli table.
// On amd64 machines with AVX-512 carry-less multiplication it folds the
// input 256 octets at a time (the method of Intel's "Fast CRC Computation
// for Generic Polynomials Using PCLMULQDQ Instruction"), and finishes with
// the SSE4.2 CRC32 instruction; elsewhere, and for short inputs, it is
// hash/crc32. CopyUpdate does the same while copying the input, in one
// pass over it, as an RNIC's DMA engine computes the CRC of the data it
// moves.
package crc32c

import "hash/crc32"

// table is the canonical Castagnoli table: hash/crc32 recognises it and
// uses the CRC32 instruction where there is one.
var table = crc32.MakeTable(crc32.Castagnoli)

// Update returns the CRC32c of p appended to data whose CRC32c is crc.
func Update(crc uint32, p []byte) uint32 {
	if c, ok := update(crc, p); ok {
		return c
	}
	return crc32.Update(crc, table, p)
}

// Checksum returns the CRC32c of p.
func Checksum(p []byte) uint32 { return Update(0, p) }

// CopyUpdate copies src into dst and returns Update(crc, pre ++ src): the
// CRC32c of pre then src appended to data whose CRC32c is crc (pre is
// typically a few header octets already in place in front of dst). Where
// the folding code runs it reads src once for both the copy and the CRC.
// dst must be at least as long as src and must not overlap it; it panics
// if dst is shorter.
func CopyUpdate(crc uint32, pre, dst, src []byte) uint32 {
	if len(dst) < len(src) {
		panic("crc32c: CopyUpdate: dst shorter than src")
	}
	if c, ok := copyUpdate(crc, pre, dst, src); ok {
		return c
	}
	n := copy(dst, src)
	// Over dst, not src: hash/crc32 lets its input escape, and src is
	// often a caller's stack array.
	return Update(Update(crc, pre), dst[:n])
}
