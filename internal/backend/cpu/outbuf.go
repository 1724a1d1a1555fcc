package cpu

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/numeric"
)

// bf16Run is the length of the runs of float32 results that an operation
// with a bfloat16 output computes in a stack buffer before rounding them
// into it.
const bf16Run = 256

// outBuf is the output of an operation that writes float32 or bfloat16
// (mixed precision's activations read only by matrix products, see
// backend.Backend.RMSNormForward, and attention's output, which
// AttentionBackward reads back through one too).
type outBuf struct {
	f32 []float32
	h   []uint16
}

// outF32OrBF16 returns the first n elements of out, float32 or bfloat16.
func outF32OrBF16(op string, out backend.Tensor, n int) outBuf {
	if out.Mem == nil || out.DType() != backend.BFloat16 {
		return outBuf{f32: f32n(op, "out", out, n)}
	}
	h := u16(op, "out", out)
	if n < 0 || len(h) < n {
		panic(fmt.Sprintf("cpu: %s: out has %d elements, need %d", op, len(h), n))
	}
	return outBuf{h: h[:n:n]}
}

// each computes the n outputs from off with fill(dst, j), which writes
// the outputs j, j+1, ... (counted from off) into dst: the float32
// output itself in one call, or runs of buf rounded to nearest even into
// the bfloat16 output after each call.
func (o outBuf) each(off, n int, buf []float32, fill func(dst []float32, j int)) {
	if o.h == nil {
		fill(o.f32[off:off+n], 0)
		return
	}
	for j := 0; j < n; j += len(buf) {
		k := min(len(buf), n-j)
		fill(buf[:k], j)
		numeric.Float32sToBF16(o.h[off+j:off+j+k], buf[:k])
	}
}
