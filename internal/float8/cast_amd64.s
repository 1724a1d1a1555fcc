//go:build amd64

#include "textflag.h"

// func castAVX512(dst, src, scales *float32, scale float32, n int, p *formatParams)
// Writes dst[i] = Round(src[i]·s) for n elements, n a multiple of 16,
// with s = scales[i] when scales is not nil and scale otherwise: the
// arithmetic of castScaled on the float32 bits, 16 lanes at a time.
TEXT ·castAVX512(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ scales+16(FP), DX
	VBROADCASTSS scale+24(FP), Z15
	MOVQ n+32(FP), CX
	MOVQ p+40(FP), AX
	VPBROADCASTD 0(AX), Z10      // bits of the smallest normal
	VBROADCASTSS 4(AX), Z11      // subnormal magic
	VPBROADCASTD 8(AX), Z12      // mantissa bits dropped
	VPBROADCASTD 12(AX), Z13     // half an ulp
	VPBROADCASTD 16(AX), Z14     // bits of Max
	MOVL $0x7fffffff, R8
	VPBROADCASTD R8, Z16         // abs mask
	MOVL $0x80000000, R8
	VPBROADCASTD R8, Z17         // sign
	MOVL $0x7f800000, R8
	VPBROADCASTD R8, Z18         // infinity
	MOVL $1, R8
	VPBROADCASTD R8, Z19         // 1
	VPSUBD Z19, Z13, Z20         // half - 1
	VPTERNLOGD $0xff, Z21, Z21, Z21
	VPSLLVD Z12, Z21, Z21        // ^(1<<shift - 1)
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z0
	TESTQ DX, DX
	JZ one
	VMULPS (DX), Z0, Z0
	ADDQ $64, DX
	JMP scaled
one:
	VMULPS Z15, Z0, Z0
scaled:
	VPANDD Z16, Z0, Z1           // a = |y| bits
	VPANDD Z17, Z0, Z2           // sign
	// Normal: a + half - 1 + ((a >> shift) & 1), low bits cleared, at
	// most Max.
	VPSRLVD Z12, Z1, Z3
	VPANDD Z19, Z3, Z3
	VPADDD Z20, Z3, Z3
	VPADDD Z1, Z3, Z3
	VPANDD Z21, Z3, Z3
	VPMINUD Z14, Z3, Z3
	// Subnormal (a < smallest normal): (|y| + magic) - magic.
	VPCMPUD $1, Z10, Z1, K1
	VADDPS Z11, Z1, Z4
	VSUBPS Z11, Z4, Z4
	VMOVDQA32 Z4, K1, Z3
	// NaN (a > infinity) stays.
	VPCMPUD $6, Z18, Z1, K2
	VMOVDQA32 Z1, K2, Z3
	VPORD Z2, Z3, Z3
	VMOVUPS Z3, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func amaxAVX512(x *float32, n int) uint32
// Returns the largest of the bits of |x[i]| over n elements, n a
// multiple of 64.
TEXT ·amaxAVX512(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	MOVL $0x7fffffff, R8
	VPBROADCASTD R8, Z16
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	SHRQ $6, CX
	JZ reduce
aloop:
	VPANDD 0(SI), Z16, Z4
	VPANDD 64(SI), Z16, Z5
	VPANDD 128(SI), Z16, Z6
	VPANDD 192(SI), Z16, Z7
	VPMAXUD Z4, Z0, Z0
	VPMAXUD Z5, Z1, Z1
	VPMAXUD Z6, Z2, Z2
	VPMAXUD Z7, Z3, Z3
	ADDQ $256, SI
	DECQ CX
	JNZ aloop
reduce:
	VPMAXUD Z1, Z0, Z0
	VPMAXUD Z3, Z2, Z2
	VPMAXUD Z2, Z0, Z0
	VEXTRACTI64X4 $1, Z0, Y1
	VPMAXUD Y1, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPMAXUD X1, X0, X0
	VPSHUFD $0x4e, X0, X1
	VPMAXUD X1, X0, X0
	VPSHUFD $0xb1, X0, X1
	VPMAXUD X1, X0, X0
	VMOVD X0, AX
	MOVL AX, ret+16(FP)
	VZEROUPPER
	RET

// func unscaleAVX512(out, src, ci *float32, ri, beta float32, n int)
// Writes out[j] = src[j]·(ri·ci[j]) (+ beta·out[j] when beta is not 0)
// for n elements, n a multiple of 16, each product rounded to float32 as
// Unscale's loop does (no fused multiply-add).
TEXT ·unscaleAVX512(SB), NOSPLIT, $0-40
	MOVQ out+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ci+16(FP), DX
	VBROADCASTSS ri+24(FP), Z10
	VBROADCASTSS beta+28(FP), Z11
	MOVL beta+28(FP), AX
	MOVQ n+32(FP), CX
	SHRQ $4, CX
	JZ udone
	TESTL $0x7fffffff, AX
	JZ nobeta
uloop:
	VMULPS (DX), Z10, Z0
	VMULPS (SI), Z0, Z0
	VMULPS (DI), Z11, Z1
	VADDPS Z1, Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, DX
	DECQ CX
	JNZ uloop
	JMP udone
nobeta:
	VMULPS (DX), Z10, Z0
	VMULPS (SI), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, DX
	DECQ CX
	JNZ nobeta
udone:
	VZEROUPPER
	RET

// func castE4M3AVX512(dst *byte, src *float32, scale float32, n int)
// Writes dst[i] = the e4m3fn bits of Round(src[i]·scale) (CastE4M3) for
// n elements, n a multiple of 16: castAVX512's rounding, then the value's
// code: (bits - 2^-7's bits) >> 20 for normals, the subnormal magic sum's
// low bits for subnormals, 0x7f for NaN, with the sign.
TEXT ·castE4M3AVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	VBROADCASTSS scale+16(FP), Z15
	MOVQ n+24(FP), CX
	MOVL $0x3c800000, R8
	VPBROADCASTD R8, Z10         // bits of 2^-6, the smallest normal
	MOVL $0x46800000, R8
	VPBROADCASTD R8, Z11         // 2^14, the subnormal magic
	MOVL $0x43e00000, R8
	VPBROADCASTD R8, Z14         // bits of 448
	MOVL $0x7fffffff, R8
	VPBROADCASTD R8, Z16
	MOVL $0x7f800000, R8
	VPBROADCASTD R8, Z18
	MOVL $1, R8
	VPBROADCASTD R8, Z19
	MOVL $0x7ffff, R8
	VPBROADCASTD R8, Z20         // half an ulp - 1
	MOVL $0xfff00000, R8
	VPBROADCASTD R8, Z21         // clears the 20 dropped bits
	MOVL $0x3c000000, R8
	VPBROADCASTD R8, Z22         // rebias: bits of 2^-7
	MOVL $0x7f, R8
	VPBROADCASTD R8, Z23         // NaN code
	MOVL $0x80, R8
	VPBROADCASTD R8, Z24         // sign of a code
	SHRQ $4, CX
	JZ edone
eloop:
	VMULPS (SI), Z15, Z0
	VPANDD Z16, Z0, Z1           // a = |y| bits
	VPSRLD $24, Z0, Z2
	VPANDD Z24, Z2, Z2           // sign << 7
	// Normal: round to 3 mantissa bits, saturate, rebias and shift.
	VPSRLD $20, Z1, Z3
	VPANDD Z19, Z3, Z3
	VPADDD Z20, Z3, Z3
	VPADDD Z1, Z3, Z3
	VPANDD Z21, Z3, Z3
	VPMINUD Z14, Z3, Z3
	VPSUBD Z22, Z3, Z3
	VPSRLD $20, Z3, Z3
	// Subnormal: bits(|y| + 2^14) - bits(2^14) is the code.
	VPCMPUD $1, Z10, Z1, K1
	VADDPS Z11, Z1, Z4
	VPSUBD Z11, Z4, Z4
	VMOVDQA32 Z4, K1, Z3
	// NaN.
	VPCMPUD $6, Z18, Z1, K2
	VMOVDQA32 Z23, K2, Z3
	VPORD Z2, Z3, Z3
	VPMOVDB Z3, X3
	VMOVDQU X3, (DI)
	ADDQ $64, SI
	ADDQ $16, DI
	DECQ CX
	JNZ eloop
edone:
	VZEROUPPER
	RET

// func widenE4M3AVX512(dst *float32, src *byte, n int, table *float32)
// Writes dst[i] = table[src[i]] for n elements, n a multiple of 16.
TEXT ·widenE4M3AVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ table+24(FP), AX
	SHRQ $4, CX
	JZ wdone
wloop:
	VPMOVZXBD (SI), Z0
	KXNORW K1, K1, K1
	VPGATHERDD (AX)(Z0*4), K1, Z1
	VMOVDQU32 Z1, (DI)
	ADDQ $16, SI
	ADDQ $64, DI
	DECQ CX
	JNZ wloop
wdone:
	VZEROUPPER
	RET

// func amaxColsAVX512(amax *uint32, row *float32, n int)
// Writes amax[j] = max(amax[j], bits of |row[j]|) for n elements, n a
// multiple of 16.
TEXT ·amaxColsAVX512(SB), NOSPLIT, $0-24
	MOVQ amax+0(FP), DI
	MOVQ row+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fffffff, R8
	VPBROADCASTD R8, Z16
	SHRQ $4, CX
	JZ cdone
cloop:
	VPANDD (SI), Z16, Z0
	VPMAXUD (DI), Z0, Z0
	VMOVDQU32 Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ cloop
cdone:
	VZEROUPPER
	RET
