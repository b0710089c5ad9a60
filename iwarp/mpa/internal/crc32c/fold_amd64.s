#include "textflag.h"

// Folding constants, one 128-bit lane each: to move a 128-bit lane F bits
// towards the end of the input, its first (low) quadword is multiplied by
// x^(F+32) mod P and its second by x^(F-32) mod P, both bit-reflected and
// shifted left by one (gen_test.go computes and checks them).
DATA k2048<>+0(SB)/8, $0x0dcb17aa4
DATA k2048<>+8(SB)/8, $0x0b9e02b86
GLOBL k2048<>(SB), RODATA|NOPTR, $16

DATA k512<>+0(SB)/8, $0x0740eef02
DATA k512<>+8(SB)/8, $0x09e4addf8
GLOBL k512<>(SB), RODATA|NOPTR, $16

DATA k128<>+0(SB)/8, $0x0f20c0dfe
DATA k128<>+8(SB)/8, $0x14cd00bd6
GLOBL k128<>(SB), RODATA|NOPTR, $16

// FOLD moves each lane of acc by the distance of the constants in k and
// adds (XOR) src: acc = lo(acc)*lo(k) ^ hi(acc)*hi(k) ^ src.
#define FOLD(k, acc, tmp, src) \
	VPCLMULQDQ $0x00, k, acc, tmp \
	VPCLMULQDQ $0x11, k, acc, acc \
	VPTERNLOGQ $0x96, src, tmp, acc

// FOLD4 folds the four accumulators Z0-Z3 into Z0, 512 bits at a time
// (the constants in Z9).
#define FOLD4 \
	FOLD(Z9, Z0, Z4, Z1) \
	FOLD(Z9, Z0, Z4, Z2) \
	FOLD(Z9, Z0, Z4, Z3)

// LANES folds the four lanes of Z0 into one, 128 bits at a time, and sets
// AX to the CRC32c from a zero register of the 128 bits left, which are
// congruent to the folded input, register included: AX is the register.
#define LANES \
	VMOVDQU       k128<>(SB), X9 \
	VEXTRACTI32X4 $1, Z0, X1     \
	VEXTRACTI32X4 $2, Z0, X2     \
	VEXTRACTI32X4 $3, Z0, X3     \
	FOLD(X9, X0, X4, X1)         \
	FOLD(X9, X0, X4, X2)         \
	FOLD(X9, X0, X4, X3)         \
	VMOVQ         X0, DX         \
	VPEXTRQ       $1, X0, BX     \
	VZEROUPPER                   \
	XORL          AX, AX         \
	CRC32Q        DX, AX         \
	CRC32Q        BX, AX

// func updateAVX512(crc uint32, p []byte) uint32
// crc is the register (not inverted); len(p) is at least 256.
TEXT ·updateAVX512(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX

	VBROADCASTI32X4 k2048<>(SB), Z8
	VBROADCASTI32X4 k512<>(SB), Z9

	// The first 256 octets, with the register added to the first 32 bits.
	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVD     AX, X4
	VPXORQ    Z4, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX

loop256:
	CMPQ CX, $256
	JB   fold4
	FOLD(Z8, Z0, Z4, 0(SI))
	FOLD(Z8, Z1, Z5, 64(SI))
	FOLD(Z8, Z2, Z6, 128(SI))
	FOLD(Z8, Z3, Z7, 192(SI))
	ADDQ $256, SI
	SUBQ $256, CX
	JMP  loop256

fold4:
	FOLD4

loop64:
	CMPQ CX, $64
	JB   lanes
	FOLD(Z9, Z0, Z4, 0(SI))
	ADDQ $64, SI
	SUBQ $64, CX
	JMP  loop64

lanes:
	LANES

	// The tail, under 64 octets.
tail8:
	CMPQ   CX, $8
	JB     tail1
	CRC32Q (SI), AX
	ADDQ   $8, SI
	SUBQ   $8, CX
	JMP    tail8

tail1:
	// Under 8 octets: 4, 2 and 1 at a time.
	TESTQ  $4, CX
	JZ     tail2
	CRC32L (SI), AX
	ADDQ   $4, SI

tail2:
	TESTQ  $2, CX
	JZ     tail3
	CRC32W (SI), AX
	ADDQ   $2, SI

tail3:
	TESTQ  $1, CX
	JZ     done
	CRC32B (SI), AX

done:
	MOVL AX, ret+32(FP)
	RET

// func copyUpdateAVX512(crc uint32, pre, dst, src []byte) uint32
// updateAVX512 over pre then src that also stores every octet of src it
// loads to dst: one pass over the data for the copy and the CRC. crc is the
// register (not inverted); pre is short (the CRC32 instruction takes it);
// len(src) is at least 256 and len(dst) at least len(src).
TEXT ·copyUpdateAVX512(SB), NOSPLIT, $0-84
	MOVL crc+0(FP), AX
	MOVQ pre_base+8(FP), SI
	MOVQ pre_len+16(FP), CX

cpre8:
	CMPQ   CX, $8
	JB     cpre1
	CRC32Q (SI), AX
	ADDQ   $8, SI
	SUBQ   $8, CX
	JMP    cpre8

cpre1:
	// Under 8 octets: 4, 2 and 1 at a time.
	TESTQ  $4, CX
	JZ     cpre2
	CRC32L (SI), AX
	ADDQ   $4, SI

cpre2:
	TESTQ  $2, CX
	JZ     cpre3
	CRC32W (SI), AX
	ADDQ   $2, SI

cpre3:
	TESTQ  $1, CX
	JZ     cbody
	CRC32B (SI), AX

cbody:
	MOVQ dst_base+32(FP), DI
	MOVQ src_base+56(FP), SI
	MOVQ src_len+64(FP), CX

	VBROADCASTI32X4 k2048<>(SB), Z8
	VBROADCASTI32X4 k512<>(SB), Z9

	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVDQU64 Z0, 0(DI)
	VMOVDQU64 Z1, 64(DI)
	VMOVDQU64 Z2, 128(DI)
	VMOVDQU64 Z3, 192(DI)
	VMOVD     AX, X4
	VPXORQ    Z4, Z0, Z0
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX

cloop256:
	CMPQ      CX, $256
	JB        cfold4
	VMOVDQU64 0(SI), Z10
	VMOVDQU64 64(SI), Z11
	VMOVDQU64 128(SI), Z12
	VMOVDQU64 192(SI), Z13
	VMOVDQU64 Z10, 0(DI)
	VMOVDQU64 Z11, 64(DI)
	VMOVDQU64 Z12, 128(DI)
	VMOVDQU64 Z13, 192(DI)
	FOLD(Z8, Z0, Z4, Z10)
	FOLD(Z8, Z1, Z5, Z11)
	FOLD(Z8, Z2, Z6, Z12)
	FOLD(Z8, Z3, Z7, Z13)
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX
	JMP       cloop256

cfold4:
	FOLD4

cloop64:
	CMPQ      CX, $64
	JB        clanes
	VMOVDQU64 0(SI), Z10
	VMOVDQU64 Z10, 0(DI)
	FOLD(Z9, Z0, Z4, Z10)
	ADDQ      $64, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JMP       cloop64

clanes:
	LANES

ctail8:
	CMPQ   CX, $8
	JB     ctail1
	MOVQ   (SI), DX
	MOVQ   DX, (DI)
	CRC32Q DX, AX
	ADDQ   $8, SI
	ADDQ   $8, DI
	SUBQ   $8, CX
	JMP    ctail8

ctail1:
	// Under 8 octets: 4, 2 and 1 at a time.
	TESTQ  $4, CX
	JZ     ctail2
	MOVL   (SI), DX
	MOVL   DX, (DI)
	CRC32L DX, AX
	ADDQ   $4, SI
	ADDQ   $4, DI

ctail2:
	TESTQ  $2, CX
	JZ     ctail3
	MOVW   (SI), DX
	MOVW   DX, (DI)
	CRC32W (SI), AX
	ADDQ   $2, SI
	ADDQ   $2, DI

ctail3:
	TESTQ  $1, CX
	JZ     cdone
	MOVB   (SI), DX
	MOVB   DX, (DI)
	CRC32B (SI), AX

cdone:
	MOVL AX, ret+80(FP)
	RET
