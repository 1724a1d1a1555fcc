//go:build !amd64

package float8

var hasAVX512 = false

func castVec(dst, src []float32, scale float32, scales []float32, f Format) int { return 0 }

func amaxVec(x []float32) (uint32, int) { return 0, 0 }

func unscaleVec(out, src, ci []float32, ri, beta float32) int { return 0 }

func castE4M3Vec(dst []byte, src []float32, scale float32) int { return 0 }

func widenE4M3Vec(dst []float32, src []byte) int { return 0 }

func amaxColsVec(amax []uint32, row []float32) int { return 0 }
