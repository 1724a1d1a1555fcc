//go:build amd64

#include "textflag.h"

// Offsets of the rows of ·expConsts.
#define LOG2E 0
#define MAGIC 32
#define LN2HI 64
#define LN2LO 96
#define C6 128
#define C5 160
#define C4 192
#define C3 224
#define C2 256
#define ONE 288
#define MINARG 320
#define FASTARG 352

// EXP_CHECK jumps to label unless every lane of Y0 is <= expFast (and
// not NaN). Clobbers Y8 and R8.
#define EXP_CHECK(label) \
	VCMPPS    $0x12, FASTARG(BX), Y0, Y8; \
	VMOVMSKPS Y8, R8;                     \
	CMPQ      R8, $0xff;                  \
	JNE       label

// EXP_CORE sets Y6 = exp(Y0) for lanes with Y0 <= expFast: the
// operations, in order, of expf in fastexp.go (no fused multiply-adds),
// so both give the same bits. Lanes below expMin give zero. BX points at
// ·expConsts; clobbers Y1-Y8. Step by step:
//
//	Y1 = t = z*log2e + magic
//	Y2 = n = t - magic
//	Y3 = r = (z - n*ln2Hi) - n*ln2Lo
//	Y4 = q = c2 + r*(c3 + r*(c4 + r*(c5 + r*c6)))
//	Y6 = p = (1 + r) + (r*r)*q
//	Y7 = 2^n = (bits(t) << 23) + bits(1.0)
//	Y6 = p * 2^n, and 0 where z < expMin
#define EXP_CORE \
	VMULPS LOG2E(BX), Y0, Y1;            \
	VADDPS MAGIC(BX), Y1, Y1;            \
	VSUBPS MAGIC(BX), Y1, Y2;            \
	VMULPS LN2HI(BX), Y2, Y3;            \
	VSUBPS Y3, Y0, Y3;                   \
	VMULPS LN2LO(BX), Y2, Y4;            \
	VSUBPS Y4, Y3, Y3;                   \
	VMULPS C6(BX), Y3, Y4;               \
	VADDPS C5(BX), Y4, Y4;               \
	VMULPS Y3, Y4, Y4;                   \
	VADDPS C4(BX), Y4, Y4;               \
	VMULPS Y3, Y4, Y4;                   \
	VADDPS C3(BX), Y4, Y4;               \
	VMULPS Y3, Y4, Y4;                   \
	VADDPS C2(BX), Y4, Y4;               \
	VMULPS Y3, Y3, Y5;                   \
	VMULPS Y4, Y5, Y5;                   \
	VADDPS ONE(BX), Y3, Y6;              \
	VADDPS Y5, Y6, Y6;                   \
	VPSLLD $23, Y1, Y7;                  \
	VPADDD ONE(BX), Y7, Y7;              \
	VMULPS Y7, Y6, Y6;                   \
	VCMPPS $0x1d, MINARG(BX), Y0, Y8;    \
	VANDPS Y8, Y6, Y6

// func expAffineAVX2(dst, src *float32, n int, a, c float32, acc *[8]float32) int
TEXT ·expAffineAVX2(SB), NOSPLIT, $0-48
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS a+24(FP), Y15
	VBROADCASTSS c+28(FP), Y14
	MOVQ         acc+32(FP), DX
	VMOVUPS      (DX), Y13
	LEAQ         ·expConsts(SB), BX
	XORQ         AX, AX

expLoop:
	CMPQ    AX, CX
	JGE     expDone
	VMOVUPS (SI)(AX*4), Y0
	VMULPS  Y15, Y0, Y0      // z = a*x + c
	VADDPS  Y14, Y0, Y0
	EXP_CHECK(expDone)
	EXP_CORE
	VMOVUPS Y6, (DI)(AX*4)
	VADDPS  Y6, Y13, Y13
	ADDQ    $8, AX
	JMP     expLoop

expDone:
	VMOVUPS Y13, (DX)
	MOVQ    AX, ret+40(FP)
	VZEROUPPER
	RET

// func sigmoidAVX2(dst, src *float32, n int) int
TEXT ·sigmoidAVX2(SB), NOSPLIT, $0-32
	MOVQ   dst+0(FP), DI
	MOVQ   src+8(FP), SI
	MOVQ   n+16(FP), CX
	LEAQ   ·expConsts(SB), BX
	VXORPS Y15, Y15, Y15
	XORQ   AX, AX

sigLoop:
	CMPQ    AX, CX
	JGE     sigDone
	VMOVUPS (SI)(AX*4), Y0
	VSUBPS  Y0, Y15, Y0      // z = -x
	EXP_CHECK(sigDone)
	EXP_CORE
	VADDPS  ONE(BX), Y6, Y6  // 1 / (1 + exp(-x))
	VMOVUPS ONE(BX), Y7
	VDIVPS  Y6, Y7, Y6
	VMOVUPS Y6, (DI)(AX*4)
	ADDQ    $8, AX
	JMP     sigLoop

sigDone:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

// func maxAVX2(x *float32, n int) float32
//
// n is a positive multiple of 8. NaNs are not propagated reliably.
TEXT ·maxAVX2(SB), NOSPLIT, $0-20
	MOVQ    x+0(FP), SI
	MOVQ    n+8(FP), CX
	VMOVUPS (SI), Y0
	VMOVAPS Y0, Y1
	MOVQ    $8, AX

maxLoop2:
	LEAQ    16(AX), DX
	CMPQ    DX, CX
	JGT     maxTail
	VMAXPS  (SI)(AX*4), Y0, Y0
	VMAXPS  32(SI)(AX*4), Y1, Y1
	ADDQ    $16, AX
	JMP     maxLoop2

maxTail:
	CMPQ    AX, CX
	JGE     maxReduce
	VMAXPS  (SI)(AX*4), Y0, Y0

maxReduce:
	VMAXPS       Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0x4e, X0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0xb1, X0, X1
	VMAXPS       X1, X0, X0
	MOVSS        X0, ret+16(FP)
	VZEROUPPER
	RET
