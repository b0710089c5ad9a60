package crc32c

import "golang.org/x/sys/cpu"

// minFold is the shortest input worth folding; shorter ones go to the
// CRC32 instruction alone (see BenchmarkUpdate).
const minFold = 256

// haveFold reports whether the CPU and the OS support the AVX-512,
// carry-less multiplication and SSE4.2 instructions updateAVX512 uses.
var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ &&
	cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// update returns the CRC32c register after p, or false if p is for
// hash/crc32.
func update(crc uint32, p []byte) (uint32, bool) {
	if !haveFold || len(p) < minFold {
		return 0, false
	}
	return ^updateAVX512(^crc, p), true
}

// updateAVX512 is in fold_amd64.s. crc is the register, not inverted.
//
//go:noescape
func updateAVX512(crc uint32, p []byte) uint32

// maxPre is the longest prefix copyUpdateAVX512 takes through the CRC32
// instruction alone; a longer one goes to Update first.
const maxPre = 64

// copyUpdate copies src into dst and returns the CRC32c register after pre
// then src, or false (copying nothing) if src is for copy and hash/crc32.
func copyUpdate(crc uint32, pre, dst, src []byte) (uint32, bool) {
	if !haveFold || len(src) < minFold {
		return 0, false
	}
	if len(pre) > maxPre {
		crc, pre = Update(crc, pre), nil
	}
	return ^copyUpdateAVX512(^crc, pre, dst[:len(src)], src), true
}

// copyUpdateAVX512 is in fold_amd64.s. crc is the register, not inverted.
//
//go:noescape
func copyUpdateAVX512(crc uint32, pre, dst, src []byte) uint32
