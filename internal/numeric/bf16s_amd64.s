//go:build amd64

#include "textflag.h"

// func float32sToBF16AVX512(dst *uint16, src *float32, n int)
// Converts n float32 values, n a multiple of 16, as Float32ToBF16 does
// (round to nearest even in integer arithmetic; NaNs keep sign and
// leading payload with the quiet bit set), 16 at a time.
TEXT ·float32sToBF16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ done
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z10     // rounding bias
	MOVL $1, AX
	VPBROADCASTD AX, Z11     // lsb mask
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z12     // abs mask
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z13     // infinity
	MOVL $0x00400000, AX
	VPBROADCASTD AX, Z14     // quiet bit, before the shift
loop:
	VMOVDQU32 (SI), Z0
	VPSRLD $16, Z0, Z1
	VPANDD Z11, Z1, Z1       // lsb of the result
	VPADDD Z10, Z1, Z1       // 0x7fff + lsb
	VPADDD Z0, Z1, Z1        // u + bias
	VPANDD Z12, Z0, Z2
	VPCMPUD $6, Z13, Z2, K1  // |u| > inf: NaN
	VPORD Z14, Z0, K1, Z1    // NaN lanes: u | quiet bit
	VPSRLD $16, Z1, Z1
	VPMOVDW Z1, Y1
	VMOVDQU Y1, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func bf16sToFloat32AVX512(dst *float32, src *uint16, n int)
// Widens n bfloat16 values, n a multiple of 16, 16 at a time.
TEXT ·bf16sToFloat32AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ wdone
wloop:
	VPMOVZXWD (SI), Z0
	VPSLLD $16, Z0, Z0
	VMOVDQU32 Z0, (DI)
	ADDQ $32, SI
	ADDQ $64, DI
	DECQ CX
	JNZ wloop
wdone:
	VZEROUPPER
	RET
