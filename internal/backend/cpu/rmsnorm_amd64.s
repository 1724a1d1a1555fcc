//go:build amd64

#include "textflag.h"

// LANESUM leaves in X0 the sum of the 16 lanes of Z0 folded as laneSum
// does: lane l adds lane l+w for w = 8, 4, 2, 1.
#define LANESUM \
	VEXTRACTF64X4 $1, Z0, Y1 \
	VADDPS        Y1, Y0, Y0 \
	VEXTRACTF128  $1, Y0, X1 \
	VADDPS        X1, X0, X0 \
	VMOVHLPS      X0, X0, X1 \
	VADDPS        X1, X0, X0 \
	VMOVSHDUP     X0, X1 \
	VADDSS        X1, X0, X0

// TAILMASK sets K1 to the low CX bits (CX < 16) and jumps to done when
// CX is 0.
#define TAILMASK(done) \
	TESTQ CX, CX \
	JZ    done \
	MOVL  $1, AX \
	SHLL  CX, AX \
	DECL  AX \
	KMOVW AX, K1

// func rmsSumSquaresAVX512(x *float32, n int) float32
//
// Returns rmsSumSquares of the n elements at x (n positive): lane l of Z0
// adds x[j]*x[j] for j ≡ l (mod 16) in order of j, the last partial
// block under the mask K1 (the other lanes unchanged), then LANESUM.
TEXT ·rmsSumSquaresAVX512(SB), NOSPLIT, $0-20
	MOVQ   x+0(FP), SI
	MOVQ   n+8(FP), CX
	MOVQ   CX, R9
	SHRQ   $4, R9
	ANDQ   $15, CX
	VPXORD Z0, Z0, Z0
	TESTQ  R9, R9
	JZ     sstail

ssloop:
	VMOVUPS (SI), Z1
	VMULPS  Z1, Z1, Z1 // x*x
	VADDPS  Z1, Z0, Z0 // acc + x*x
	ADDQ    $64, SI
	DECQ    R9
	JNZ     ssloop

sstail:
	TAILMASK(sssum)
	VMOVUPS.Z (SI), K1, Z1
	VMULPS    Z1, Z1, Z1
	VADDPS    Z1, Z0, K1, Z0

sssum:
	LANESUM
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func rmsDot3AVX512(a, b, c *float32, n int) float32
//
// Returns rmsDot3 of the n elements at a, b and c (n positive): lane l of
// Z0 adds (a[j]*b[j])*c[j] for j ≡ l (mod 16) in order of j, the last
// partial block under the mask K1, then LANESUM.
TEXT ·rmsDot3AVX512(SB), NOSPLIT, $0-36
	MOVQ   a+0(FP), SI
	MOVQ   b+8(FP), DI
	MOVQ   c+16(FP), R8
	MOVQ   n+24(FP), CX
	MOVQ   CX, R9
	SHRQ   $4, R9
	ANDQ   $15, CX
	VPXORD Z0, Z0, Z0
	TESTQ  R9, R9
	JZ     d3tail

d3loop:
	VMOVUPS (SI), Z1
	VMULPS  (DI), Z1, Z1 // a*b
	VMULPS  (R8), Z1, Z1 // (a*b)*c
	VADDPS  Z1, Z0, Z0   // acc + (a*b)*c
	ADDQ    $64, SI
	ADDQ    $64, DI
	ADDQ    $64, R8
	DECQ    R9
	JNZ     d3loop

d3tail:
	TAILMASK(d3sum)
	VMOVUPS.Z (SI), K1, Z1
	VMOVUPS.Z (DI), K1, Z2
	VMOVUPS.Z (R8), K1, Z3
	VMULPS    Z2, Z1, Z1
	VMULPS    Z3, Z1, Z1
	VADDPS    Z1, Z0, K1, Z0

d3sum:
	LANESUM
	VMOVSS X0, ret+32(FP)
	VZEROUPPER
	RET

// func rmsScaleAVX512(out, x, w *float32, r float32, n int)
//
// Writes out[j] = (x[j]*r)*w[j] for j < n (a multiple of 16), 16 at a
// time; each block is read before it is written, so out may alias x.
TEXT ·rmsScaleAVX512(SB), NOSPLIT, $0-40
	MOVQ         out+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         w+16(FP), DX
	VBROADCASTSS r+24(FP), Z15
	MOVQ         n+32(FP), CX
	SHRQ         $4, CX
	JZ           scdone

scloop:
	VMULPS  (SI), Z15, Z0 // x*r
	VMULPS  (DX), Z0, Z0  // (x*r)*w
	VMOVUPS Z0, (DI)
	ADDQ    $64, SI
	ADDQ    $64, DX
	ADDQ    $64, DI
	DECQ    CX
	JNZ     scloop

scdone:
	VZEROUPPER
	RET

// func rmsBackRowAVX512(dx, d, x, w *float32, r, k float32, n int)
//
// Writes dx[j] = dx[j] + ((r*w[j])*d[j] - k*x[j]) for j < n (a multiple
// of 16), 16 at a time: RMSNormBackward's row update.
TEXT ·rmsBackRowAVX512(SB), NOSPLIT, $0-48
	MOVQ         dx+0(FP), DI
	MOVQ         d+8(FP), SI
	MOVQ         x+16(FP), R8
	MOVQ         w+24(FP), DX
	VBROADCASTSS r+32(FP), Z14
	VBROADCASTSS k+36(FP), Z15
	MOVQ         n+40(FP), CX
	SHRQ         $4, CX
	JZ           brdone

brloop:
	VMULPS  (DX), Z14, Z0 // r*w
	VMULPS  (SI), Z0, Z0  // (r*w)*d
	VMULPS  (R8), Z15, Z1 // k*x
	VSUBPS  Z1, Z0, Z0    // (r*w)*d - k*x
	VADDPS  (DI), Z0, Z0  // dx + ...
	VMOVUPS Z0, (DI)
	ADDQ    $64, SI
	ADDQ    $64, R8
	ADDQ    $64, DX
	ADDQ    $64, DI
	DECQ    CX
	JNZ     brloop

brdone:
	VZEROUPPER
	RET

// DWGROUP adds (float64(d)*float64(x))*r (r in Z16) for the eight
// columns at byte offset off of the current rows of d (SI) and x (DI) to
// the accumulator acc.
#define DWGROUP(off, acc) \
	VCVTPS2PD off(SI), Z17 \
	VCVTPS2PD off(DI), Z18 \
	VMULPD    Z18, Z17, Z17 \
	VMULPD    Z16, Z17, Z17 \
	VADDPD    Z17, acc, acc

// DWNEXT leaves the row after g groups.
#define DWNEXT(g) \
	CMPQ BX, $g \
	JEQ  dwnext

// func rmsDweightAVX512(acc *[rmsStrip]float64, d, x, rs *float32, rows, stride, groups int)
//
// For rows i = 0, ..., rows-1 in order, adds
// (float64(d[i*stride+j])*float64(x[i*stride+j]))*float64(rs[i]) to
// acc[j] for the columns j < 8*groups (groups 1 to 16), eight float64
// lanes per register, acc held in Z0-Z15 across the rows: the scalar
// column loop of RMSNormBackward's weight gradient, column by column.
TEXT ·rmsDweightAVX512(SB), NOSPLIT, $0-56
	MOVQ    acc+0(FP), DX
	MOVQ    d+8(FP), SI
	MOVQ    x+16(FP), DI
	MOVQ    rs+24(FP), R8
	MOVQ    rows+32(FP), CX
	MOVQ    stride+40(FP), R9
	SHLQ    $2, R9
	MOVQ    groups+48(FP), BX
	VMOVUPD 0(DX), Z0
	VMOVUPD 64(DX), Z1
	VMOVUPD 128(DX), Z2
	VMOVUPD 192(DX), Z3
	VMOVUPD 256(DX), Z4
	VMOVUPD 320(DX), Z5
	VMOVUPD 384(DX), Z6
	VMOVUPD 448(DX), Z7
	VMOVUPD 512(DX), Z8
	VMOVUPD 576(DX), Z9
	VMOVUPD 640(DX), Z10
	VMOVUPD 704(DX), Z11
	VMOVUPD 768(DX), Z12
	VMOVUPD 832(DX), Z13
	VMOVUPD 896(DX), Z14
	VMOVUPD 960(DX), Z15
	TESTQ   CX, CX
	JZ      dwstore

dwrow:
	VBROADCASTSS (R8), Z16
	VCVTPS2PD    Y16, Z16 // r in float64
	DWGROUP(0, Z0)
	DWNEXT(1)
	DWGROUP(32, Z1)
	DWNEXT(2)
	DWGROUP(64, Z2)
	DWNEXT(3)
	DWGROUP(96, Z3)
	DWNEXT(4)
	DWGROUP(128, Z4)
	DWNEXT(5)
	DWGROUP(160, Z5)
	DWNEXT(6)
	DWGROUP(192, Z6)
	DWNEXT(7)
	DWGROUP(224, Z7)
	DWNEXT(8)
	DWGROUP(256, Z8)
	DWNEXT(9)
	DWGROUP(288, Z9)
	DWNEXT(10)
	DWGROUP(320, Z10)
	DWNEXT(11)
	DWGROUP(352, Z11)
	DWNEXT(12)
	DWGROUP(384, Z12)
	DWNEXT(13)
	DWGROUP(416, Z13)
	DWNEXT(14)
	DWGROUP(448, Z14)
	DWNEXT(15)
	DWGROUP(480, Z15)

dwnext:
	ADDQ $4, R8
	ADDQ R9, SI
	ADDQ R9, DI
	DECQ CX
	JNZ  dwrow

dwstore:
	VMOVUPD Z0, 0(DX)
	VMOVUPD Z1, 64(DX)
	VMOVUPD Z2, 128(DX)
	VMOVUPD Z3, 192(DX)
	VMOVUPD Z4, 256(DX)
	VMOVUPD Z5, 320(DX)
	VMOVUPD Z6, 384(DX)
	VMOVUPD Z7, 448(DX)
	VMOVUPD Z8, 512(DX)
	VMOVUPD Z9, 576(DX)
	VMOVUPD Z10, 640(DX)
	VMOVUPD Z11, 704(DX)
	VMOVUPD Z12, 768(DX)
	VMOVUPD Z13, 832(DX)
	VMOVUPD Z14, 896(DX)
	VMOVUPD Z15, 960(DX)
	VZEROUPPER
	RET
