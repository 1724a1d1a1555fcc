//go:build amd64

#include "textflag.h"

// func adamwAVX2(params, grads, m, v *float32, n int, k *[adamwConsts][8]float32)
//
// One AdamW step over n elements (a multiple of eight), eight lanes at a
// time, with the operations of the scalar loop in adamw.go in the same
// order (the first moment with one fused multiply-add, as ATen does).
// Constant rows of k: gradScale, decay, beta1, 1-beta1, beta2, 1-beta2,
// sqrt(bc2), eps, -lr/bc1.
TEXT ·adamwAVX2(SB), NOSPLIT, $0-48
	MOVQ params+0(FP), DI
	MOVQ grads+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), BX
	VMOVUPS 0(BX), Y8
	VMOVUPS 32(BX), Y9
	VMOVUPS 64(BX), Y10
	VMOVUPS 96(BX), Y11
	VMOVUPS 128(BX), Y12
	VMOVUPS 160(BX), Y13
	VMOVUPS 192(BX), Y14
	VMOVUPS 224(BX), Y15
	XORQ AX, AX

loop:
	CMPQ AX, CX
	JGE  done
	VMULPS      (SI)(AX*4), Y8, Y0  // g = grad * gradScale
	VMULPS      (DI)(AX*4), Y9, Y1  // p * decay
	VMULPS      (R8)(AX*4), Y10, Y2 // m * beta1
	VFMADD231PS Y0, Y11, Y2         // m = g*(1-beta1) + m*beta1
	VMULPS      (R9)(AX*4), Y12, Y3 // v * beta2
	VMULPS      Y0, Y13, Y4         // (1-beta2) * g
	VMULPS      Y0, Y4, Y4          // * g
	VADDPS      Y4, Y3, Y3          // v
	VSQRTPS     Y3, Y5
	VDIVPS      Y14, Y5, Y5         // sqrt(v) / sqrt(bc2)
	VADDPS      Y15, Y5, Y5         // + eps
	VMULPS      256(BX), Y2, Y6     // -lr/bc1 * m
	VDIVPS      Y5, Y6, Y6          // / denom
	VADDPS      Y6, Y1, Y1          // p
	VMOVUPS     Y1, (DI)(AX*4)
	VMOVUPS     Y2, (R8)(AX*4)
	VMOVUPS     Y3, (R9)(AX*4)
	ADDQ        $8, AX
	JMP         loop

done:
	VZEROUPPER
	RET
