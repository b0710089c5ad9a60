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
