//go:build amd64

#include "textflag.h"

// Registers shared by the two kernels:
//
//	Z16-Z27  the rows of ·expConsts, broadcast (ZEXP_CONSTS)
//	Z15      the sign bit
//	AX       element index, R12 n, K2 the current block's lanes, R9 its bits

// ZEXP_CONSTS broadcasts the rows of ·expConsts (BX) into Z16-Z27 and the
// sign bit into Z15.
#define ZEXP_CONSTS \
	VBROADCASTSS 0(BX), Z16;   \ // log2e
	VBROADCASTSS 32(BX), Z17;  \ // magic
	VBROADCASTSS 64(BX), Z18;  \ // ln2Hi
	VBROADCASTSS 96(BX), Z19;  \ // ln2Lo
	VBROADCASTSS 128(BX), Z20; \ // c6
	VBROADCASTSS 160(BX), Z21; \ // c5
	VBROADCASTSS 192(BX), Z22; \ // c4
	VBROADCASTSS 224(BX), Z23; \ // c3
	VBROADCASTSS 256(BX), Z24; \ // c2
	VBROADCASTSS 288(BX), Z25; \ // 1
	VBROADCASTSS 320(BX), Z26; \ // expMin
	VBROADCASTSS 352(BX), Z27; \ // expFast
	MOVL         $0x80000000, R8; \
	VPBROADCASTD R8, Z15

// ZBLOCK_MASK sets K2 (and R9) to the lanes of the block at AX: all 16,
// or the n-AX left. Jumps to done when none are left. Clobbers CX.
#define ZBLOCK_MASK(done) \
	MOVQ  R12, CX;    \
	SUBQ  AX, CX;     \
	JLE   done;       \
	MOVL  $0xffff, R9; \
	CMPQ  CX, $16;    \
	JGE   4(PC);      \
	MOVL  $1, R9;     \
	SHLL  CX, R9;     \
	DECL  R9;         \
	KMOVW R9, K2

// ZSIGMOID loads x = gate[AX:] into Z10 (lanes K2, zero elsewhere), jumps
// to stop unless every lane of -x is <= expFast (and not NaN), and sets
// Z6 = 1/(1 + exp(-x)) with the operations of sigmoidAVX2 (EXP_CORE in
// vec_amd64.s, then the add and the divide); -x flips the sign bit, as
// Go's negation does. Clobbers Z0-Z7, K1, K3, R8.
#define ZSIGMOID(stop) \
	VMOVUPS.Z (SI)(AX*4), K2, Z10; \
	VPXORD    Z15, Z10, Z0;        \ // z = -x
	VCMPPS    $0x12, Z27, Z0, K2, K1; \
	KMOVW     K1, R8;              \
	CMPL      R8, R9;              \
	JNE       stop;                \
	VMULPS    Z16, Z0, Z1;         \ // t = z*log2e + magic
	VADDPS    Z17, Z1, Z1;         \
	VSUBPS    Z17, Z1, Z2;         \ // n = t - magic
	VMULPS    Z18, Z2, Z3;         \ // r = (z - n*ln2Hi) - n*ln2Lo
	VSUBPS    Z3, Z0, Z3;          \
	VMULPS    Z19, Z2, Z4;         \
	VSUBPS    Z4, Z3, Z3;          \
	VMULPS    Z20, Z3, Z4;         \ // q = c2 + r*(c3 + r*(c4 + r*(c5 + r*c6)))
	VADDPS    Z21, Z4, Z4;         \
	VMULPS    Z3, Z4, Z4;          \
	VADDPS    Z22, Z4, Z4;         \
	VMULPS    Z3, Z4, Z4;          \
	VADDPS    Z23, Z4, Z4;         \
	VMULPS    Z3, Z4, Z4;          \
	VADDPS    Z24, Z4, Z4;         \
	VMULPS    Z3, Z3, Z5;          \ // p = (1 + r) + (r*r)*q
	VMULPS    Z4, Z5, Z5;          \
	VADDPS    Z25, Z3, Z6;         \
	VADDPS    Z5, Z6, Z6;          \
	VPSLLD    $23, Z1, Z7;         \ // 2^n = (bits(t) << 23) + bits(1.0)
	VPADDD    Z25, Z7, Z7;         \
	VMULPS    Z7, Z6, Z6;          \ // e = p * 2^n, 0 where z < expMin
	VCMPPS    $0x1d, Z26, Z0, K3;  \
	VMOVAPS.Z Z6, K3, Z6;          \
	VADDPS    Z25, Z6, Z6;         \ // s = 1 / (1 + e)
	VDIVPS    Z6, Z25, Z6

// func swigluFwdAVX512(out, gate, up *float32, n int) int
TEXT ·swigluFwdAVX512(SB), NOSPLIT, $0-40
	MOVQ out+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), DX
	MOVQ n+24(FP), R12
	LEAQ ·expConsts(SB), BX
	ZEXP_CONSTS
	XORQ AX, AX

fwdLoop:
	ZBLOCK_MASK(fwdDone)
	ZSIGMOID(fwdDone)
	VMULPS    Z6, Z10, Z7              // (x*s)*u
	VMOVUPS.Z (DX)(AX*4), K2, Z8
	VMULPS    Z8, Z7, Z7
	VMOVUPS   Z7, K2, (DI)(AX*4)
	ADDQ      $16, AX
	JMP       fwdLoop

fwdDone:
	CMPQ    AX, R12
	CMOVQGT R12, AX
	MOVQ    AX, ret+32(FP)
	VZEROUPPER
	RET

// func swigluBwdAVX512(dgate, dup, dout, gate, up *float32, n int) int
TEXT ·swigluBwdAVX512(SB), NOSPLIT, $0-56
	MOVQ dgate+0(FP), DI
	MOVQ dup+8(FP), R13
	MOVQ dout+16(FP), R11
	MOVQ gate+24(FP), SI
	MOVQ up+32(FP), DX
	MOVQ n+40(FP), R12
	LEAQ ·expConsts(SB), BX
	ZEXP_CONSTS
	XORQ AX, AX

bwdLoop:
	ZBLOCK_MASK(bwdDone)
	ZSIGMOID(bwdDone)
	VMOVUPS.Z (R11)(AX*4), K2, Z11     // d
	VMOVUPS.Z (DX)(AX*4), K2, Z12      // u
	VMULPS    Z12, Z11, Z7             // ((d*u)*s) * (1 + x*(1-s))
	VMULPS    Z6, Z7, Z7
	VSUBPS    Z6, Z25, Z8
	VMULPS    Z8, Z10, Z8
	VADDPS    Z25, Z8, Z8
	VMULPS    Z8, Z7, Z7
	VMOVUPS.Z (DI)(AX*4), K2, Z9       // dgate +=
	VADDPS    Z7, Z9, Z9
	VMOVUPS   Z9, K2, (DI)(AX*4)
	VMULPS    Z10, Z11, Z7             // dup += (d*x)*s
	VMULPS    Z6, Z7, Z7
	VMOVUPS.Z (R13)(AX*4), K2, Z9
	VADDPS    Z7, Z9, Z9
	VMOVUPS   Z9, K2, (R13)(AX*4)
	ADDQ      $16, AX
	JMP       bwdLoop

bwdDone:
	CMPQ    AX, R12
	CMOVQGT R12, AX
	MOVQ    AX, ret+48(FP)
	VZEROUPPER
	RET
