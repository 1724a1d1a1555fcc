//go:build amd64

#include "textflag.h"

// Both kernels walk one row in blocks of eight pairs (16 elements); each
// block's cc and ss serve every head. Registers:
//
//	DI out/dinp, SI x/dout, DX cos, R8 sin, R9 nh, R10 half
//	R14 head stride (2*half elements), AX pair index
//	K3, K4 full masks (8 cos lanes, 16 x lanes), K5, K6 the last block's
//	Z15 sign bits to flip in ss

// ROPE_SETUP sets the stride, the masks and Z15 (sign is the 64-bit
// pattern whose broadcast gives it) once the arguments are loaded.
#define ROPE_SETUP(sign) \
	LEAQ  (R10*8), R14;   \
	MOVQ  $sign, R11;     \
	VPBROADCASTQ R11, Z15; \
	MOVL  $0xff, R11;     \
	KMOVW R11, K3;        \
	MOVL  $0xffff, R11;   \
	KMOVW R11, K4;        \
	MOVQ  R10, CX;        \
	ANDQ  $7, CX;         \
	MOVL  $1, R11;        \
	SHLL  CX, R11;        \
	DECL  R11;            \
	KMOVW R11, K5;        \
	ADDL  CX, CX;         \
	MOVL  $1, R11;        \
	SHLL  CX, R11;        \
	DECL  R11;            \
	KMOVW R11, K6;        \
	XORQ  AX, AX

// ROPE_BLOCK sets K1, K2 to the block at AX (full or the last, partial
// one), Z1 = cc and Z2 = ss, and R13, R11 to the block in head 0 of x and
// out. Jumps to done past the last block.
#define ROPE_BLOCK(done) \
	CMPQ      AX, R10;          \
	JGE       done;             \
	KMOVW     K3, K1;           \
	KMOVW     K4, K2;           \
	LEAQ      8(AX), CX;        \
	CMPQ      CX, R10;          \
	JLE       3(PC);            \
	KMOVW     K5, K1;           \
	KMOVW     K6, K2;           \
	VMOVUPS.Z (DX)(AX*4), K1, Z1; \
	VPMOVZXDQ Y1, Z1;           \
	VMOVSLDUP Z1, Z1;           \
	VMOVUPS.Z (R8)(AX*4), K1, Z2; \
	VPMOVZXDQ Y2, Z2;           \
	VMOVSLDUP Z2, Z2;           \
	VPXORD    Z15, Z2, Z2;      \
	LEAQ      (SI)(AX*8), R13;  \
	LEAQ      (DI)(AX*8), R11;  \
	MOVQ      R9, CX

// ROPE_ROTATE sets Z0 = x*cc + sw(x)*ss for the block at R13.
#define ROPE_ROTATE \
	VMOVUPS.Z (R13), K2, Z0; \
	VPERMILPS $0xb1, Z0, Z3; \
	VMULPS    Z1, Z0, Z0;    \
	VMULPS    Z2, Z3, Z3;    \
	VADDPS    Z3, Z0, Z0

// func ropeFwdAVX512(out, x, cos, sin *float32, nh, half int)
TEXT ·ropeFwdAVX512(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ cos+16(FP), DX
	MOVQ sin+24(FP), R8
	MOVQ nh+32(FP), R9
	MOVQ half+40(FP), R10
	ROPE_SETUP(0x80000000)      // ss = (-s0, s0, ...)

fwdBlock:
	ROPE_BLOCK(fwdDone)

fwdHead:
	ROPE_ROTATE
	VMOVUPS Z0, K2, (R11)
	ADDQ    R14, R13
	ADDQ    R14, R11
	DECQ    CX
	JNZ     fwdHead
	ADDQ    $8, AX
	JMP     fwdBlock

fwdDone:
	VZEROUPPER
	RET

// func ropeBwdAVX512(dinp, dout, cos, sin *float32, nh, half int)
TEXT ·ropeBwdAVX512(SB), NOSPLIT, $0-48
	MOVQ dinp+0(FP), DI
	MOVQ dout+8(FP), SI
	MOVQ cos+16(FP), DX
	MOVQ sin+24(FP), R8
	MOVQ nh+32(FP), R9
	MOVQ half+40(FP), R10
	ROPE_SETUP(0x8000000000000000) // ss = (s0, -s0, ...)

bwdBlock:
	ROPE_BLOCK(bwdDone)

bwdHead:
	ROPE_ROTATE
	VMOVUPS.Z (R11), K2, Z4
	VADDPS    Z0, Z4, Z4
	VMOVUPS   Z4, K2, (R11)
	ADDQ      R14, R13
	ADDQ      R14, R11
	DECQ      CX
	JNZ       bwdHead
	ADDQ      $8, AX
	JMP       bwdBlock

bwdDone:
	VZEROUPPER
	RET
