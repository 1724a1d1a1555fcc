package cuda

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/numeric"
)

// Backend implements backend.Backend on a Device.
type Backend struct {
	dev Device
	mm  Matmuler // nil: the gemm_tiled kernel
	// TF32 lets float32 matrix products use TF32 tensor cores (cuBLASLt's
	// CUBLAS_COMPUTE_32F_FAST_TF32); off, they are full float32.
	tf32 bool

	mu      sync.Mutex
	scratch uintptr // device scratch memory (partial sums, conversions)
	scrLen  int

	// Memory that became garbage waits in garbage until the next Sync or
	// Download frees it: an op reads its tensors' addresses and then
	// launches kernels on them, and the collector may find a tensor
	// unreachable in between (its last use was the address), so freeing
	// at once could hand the memory to the op's own scratch, or free it
	// under a running kernel.
	freeMu  sync.Mutex
	garbage []uintptr
}

var _ backend.Backend = (*Backend)(nil)

// Options configure a Backend.
type Options struct {
	// TF32 allows TF32 tensor cores in float32 GEMMs.
	TF32 bool
	// NoLibraryGEMM runs the gemm_tiled kernel even where the device has
	// cuBLASLt (parity tests of the kernel on a GPU).
	NoLibraryGEMM bool
}

// NewWithDevice returns a Backend on dev.
func NewWithDevice(dev Device, opt Options) *Backend {
	b := &Backend{dev: dev, tf32: opt.TF32}
	if mm, ok := dev.(Matmuler); ok && !opt.NoLibraryGEMM {
		b.mm = mm
	}
	return b
}

// Name returns "cuda".
func (b *Backend) Name() string { return "cuda" }

// Device returns the device under b.
func (b *Backend) Device() Device { return b.dev }

func (b *Backend) must(op string, err error) {
	if err != nil {
		panic(fmt.Sprintf("cuda: %s on %s: %v", op, b.dev.Name(), err))
	}
}

func (b *Backend) launch(op, kernel string, grid, block Dim3, args ...any) {
	b.must(op, b.dev.Launch(kernel, grid, block, args...))
}

// elemBlock is the block size of the elementwise kernels; elemGrid caps
// their grid-stride grids.
const (
	elemBlock   = 256
	elemMaxGrid = 8192
	rowBlock    = 128 // one block per row (norms, cross-entropy)
	colBlock    = 128 // one thread per column (column sums)
	colRows     = 64  // rows per partial column sum
)

func elemGrid(n int) Dim3 {
	return Dim3{uint32(max(1, min((n+elemBlock-1)/elemBlock, elemMaxGrid))), 1, 1}
}

func blocks(n, per int) uint32 { return uint32(max(1, (n+per-1)/per)) }

// Alloc returns n zeroed elements of dtype in device memory, freed at
// the first Sync or Download after the Memory is garbage.
func (b *Backend) Alloc(dtype backend.DType, n int) backend.Tensor {
	if n < 0 {
		panic(fmt.Sprintf("cuda: Alloc of %d %s elements", n, dtype))
	}
	m := &backend.Memory{DType: dtype, Len: n}
	if n > 0 {
		bytes := n * dtype.Size()
		p, err := b.dev.Malloc(bytes)
		b.must(fmt.Sprintf("Alloc(%d %s)", n, dtype), err)
		b.must("Alloc", b.dev.Memset(p, bytes))
		m.Addr = p
		runtime.AddCleanup(m, b.freeLater, p)
	}
	return backend.Tensor{Mem: m, Len: n}
}

// checkView panics unless t is a valid view of dtype memory of this device.
func checkView(op, name string, t backend.Tensor, dtype backend.DType) {
	if t.Mem == nil {
		if t.Len != 0 || t.Off != 0 {
			panic(fmt.Sprintf("cuda: %s: %s has no memory but Off=%d Len=%d", op, name, t.Off, t.Len))
		}
		return
	}
	if t.Mem.DType != dtype {
		panic(fmt.Sprintf("cuda: %s: %s is %s, want %s", op, name, t.Mem.DType, dtype))
	}
	if t.Mem.Host != nil {
		panic(fmt.Sprintf("cuda: %s: %s is host memory (of another backend)", op, name))
	}
	if t.Off < 0 || t.Len < 0 || t.Off+t.Len > t.Mem.Len {
		panic(fmt.Sprintf("cuda: %s: %s view [%d:%d] outside its %d-element memory", op, name, t.Off, t.Off+t.Len, t.Mem.Len))
	}
}

// ptr returns the device address of t's first element after checking that
// t is dtype and holds at least n elements.
func ptr(op, name string, t backend.Tensor, dtype backend.DType, n int) uintptr {
	checkView(op, name, t, dtype)
	if t.Len < n {
		panic(fmt.Sprintf("cuda: %s: %s has %d elements, need %d", op, name, t.Len, n))
	}
	if t.Mem == nil {
		return 0
	}
	return t.Mem.Addr + uintptr(t.Off*dtype.Size())
}

func f32p(op, name string, t backend.Tensor, n int) uintptr {
	return ptr(op, name, t, backend.Float32, n)
}

// optF32 is f32p for a gradient that may be absent (nil Mem): 0.
func optF32(op, name string, t backend.Tensor, n int) uintptr {
	if t.Mem == nil {
		return 0
	}
	return f32p(op, name, t, n)
}

func i32p(op, name string, t backend.Tensor, n int) uintptr {
	return ptr(op, name, t, backend.Int32, n)
}

// scratchBytes returns at least n bytes of device scratch memory. The
// caller holds b.mu until the kernels using it are queued: work runs in
// stream order, so the next user cannot overwrite it early.
func (b *Backend) scratchBytes(n int) uintptr {
	if n > b.scrLen {
		if b.scratch != 0 {
			b.must("scratch", b.dev.Sync())
			b.must("scratch", b.dev.Free(b.scratch))
		}
		sz := max(n, 1<<20)
		p, err := b.dev.Malloc(sz)
		b.must("scratch", err)
		b.scratch, b.scrLen = p, sz
	}
	return b.scratch
}

// Upload copies host data ([]float32, []int32, or []uint16 for bfloat16)
// into dst; a []float32 into a bfloat16 dst is rounded to nearest even.
func (b *Backend) Upload(dst backend.Tensor, src any) {
	const op = "Upload"
	var p unsafe.Pointer
	var n int
	var dt backend.DType
	switch s := src.(type) {
	case []float32:
		if isBF16(dst) { // rounded on the host
			h := make([]uint16, len(s))
			numeric.Float32sToBF16(h, s)
			b.Upload(dst, h)
			return
		}
		p, n, dt = unsafe.Pointer(unsafe.SliceData(s)), len(s), backend.Float32
	case []int32:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(s)), len(s), backend.Int32
	case []uint16:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(s)), len(s), backend.BFloat16
	default:
		panic(fmt.Sprintf("cuda: Upload: unsupported host type %T", src))
	}
	d := ptr(op, "dst", dst, dt, 0)
	if n != dst.Len {
		panic(fmt.Sprintf("cuda: Upload: host has %d elements, device %d", n, dst.Len))
	}
	if n > 0 {
		b.must(op, b.dev.CopyHtoD(d, p, n*dt.Size()))
	}
}

// Download copies src into host data ([]float32, []int32, []uint16); a
// bfloat16 src into a []float32 is widened.
func (b *Backend) Download(dst any, src backend.Tensor) {
	const op = "Download"
	var p unsafe.Pointer
	var n int
	var dt backend.DType
	switch d := dst.(type) {
	case []float32:
		if isBF16(src) { // widened on the host
			h := make([]uint16, len(d))
			b.Download(h, src)
			numeric.BF16sToFloat32(d, h)
			return
		}
		p, n, dt = unsafe.Pointer(unsafe.SliceData(d)), len(d), backend.Float32
	case []int32:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(d)), len(d), backend.Int32
	case []uint16:
		p, n, dt = unsafe.Pointer(unsafe.SliceData(d)), len(d), backend.BFloat16
	default:
		panic(fmt.Sprintf("cuda: Download: unsupported host type %T", dst))
	}
	s := ptr(op, "src", src, dt, 0)
	if n != src.Len {
		panic(fmt.Sprintf("cuda: Download: host has %d elements, device %d", n, src.Len))
	}
	if n > 0 {
		b.must(op, b.dev.CopyDtoH(p, s, n*dt.Size()))
	}
	runtime.KeepAlive(src.Mem)
	// The copy waited for the queued work: nothing uses the garbage now.
	b.freeGarbage()
}

// Zero sets t to zero.
func (b *Backend) Zero(t backend.Tensor) {
	if t.Mem == nil || t.Len == 0 {
		return
	}
	p := ptr("Zero", "t", t, t.Mem.DType, t.Len)
	b.must("Zero", b.dev.Memset(p, t.Len*t.Mem.DType.Size()))
}

// Copy copies src into dst (same length and dtype).
func (b *Backend) Copy(dst, src backend.Tensor) {
	if dst.Len != src.Len {
		panic(fmt.Sprintf("cuda: Copy: lengths differ (dst %d, src %d)", dst.Len, src.Len))
	}
	if dst.Len == 0 {
		return
	}
	if dst.Mem != nil && src.Mem != nil && dst.Mem.DType == backend.BFloat16 && src.Mem.DType == backend.Float32 {
		b.ToBF16(dst, src)
		return
	}
	dt := src.Mem.DType
	b.must("Copy", b.dev.CopyDtoD(ptr("Copy", "dst", dst, dt, dst.Len), ptr("Copy", "src", src, dt, src.Len), dst.Len*dt.Size()))
}

// Sync waits for all queued work.
func (b *Backend) Sync() {
	b.must("Sync", b.dev.Sync())
	b.freeGarbage()
}

// freeLater queues the device memory at p, whose Memory is garbage, for
// freeGarbage.
func (b *Backend) freeLater(p uintptr) {
	b.freeMu.Lock()
	b.garbage = append(b.garbage, p)
	b.freeMu.Unlock()
}

// freeGarbage frees the queued memory; the caller has waited for the
// device, so no kernel still uses it.
func (b *Backend) freeGarbage() {
	b.freeMu.Lock()
	g := b.garbage
	b.garbage = nil
	b.freeMu.Unlock()
	for _, p := range g {
		_ = b.dev.Free(p)
	}
}

// ToBF16 rounds the float32 src into the bfloat16 dst (nearest even, as
// numeric.Float32ToBF16).
func (b *Backend) ToBF16(dst, src backend.Tensor) {
	const op = "ToBF16"
	n := src.Len
	d, s := ptr(op, "dst", dst, backend.BFloat16, n), f32p(op, "src", src, n)
	b.launch(op, "cast_f32_to_bf16", elemGrid(n), Dim3{elemBlock, 1, 1}, d, s, int64(n))
}

// FromBF16 widens the bfloat16 src into the float32 dst.
func (b *Backend) FromBF16(dst, src backend.Tensor) {
	const op = "FromBF16"
	n := src.Len
	d, s := f32p(op, "dst", dst, n), ptr(op, "src", src, backend.BFloat16, n)
	b.launch(op, "cast_bf16_to_f32", elemGrid(n), Dim3{elemBlock, 1, 1}, d, s, int64(n))
}

// Add computes out = a + c.
func (b *Backend) Add(out, a, c backend.Tensor) {
	const op = "Add"
	n := out.Len
	if a.Len != n || c.Len != n {
		panic(fmt.Sprintf("cuda: Add: lengths differ (out %d, a %d, b %d)", n, a.Len, c.Len))
	}
	b.launch(op, "add_f32", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "out", out, n), f32p(op, "a", a, n), f32p(op, "b", c, n), int64(n))
}

// Axpy computes y += alpha*x.
func (b *Backend) Axpy(y backend.Tensor, alpha float32, x backend.Tensor) {
	const op = "Axpy"
	if x.Len != y.Len {
		panic(fmt.Sprintf("cuda: Axpy: lengths differ (y %d, x %d)", y.Len, x.Len))
	}
	n := y.Len
	b.launch(op, "axpy_f32", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "y", y, n), alpha, f32p(op, "x", x, n), int64(n))
}

// Scale computes x *= alpha.
func (b *Backend) Scale(x backend.Tensor, alpha float32) {
	n := x.Len
	b.launch("Scale", "scale_f32", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p("Scale", "x", x, n), alpha, int64(n))
}

// Mul computes out = a ⊙ c.
func (b *Backend) Mul(out, a, c backend.Tensor) {
	const op = "Mul"
	n := out.Len
	if a.Len != n || c.Len != n {
		panic(fmt.Sprintf("cuda: Mul: lengths differ (out %d, a %d, b %d)", n, a.Len, c.Len))
	}
	b.launch(op, "mul_f32", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "out", out, n), f32p(op, "a", a, n), f32p(op, "b", c, n), int64(n))
}

// MulBackward accumulates da += dout ⊙ c and dc += dout ⊙ a.
func (b *Backend) MulBackward(da, dc, dout, a, c backend.Tensor) {
	const op = "MulBackward"
	n := dout.Len
	b.launch(op, "mul_bwd_f32", elemGrid(n), Dim3{elemBlock, 1, 1}, optF32(op, "da", da, n), optF32(op, "db", dc, n),
		f32p(op, "dout", dout, n), f32p(op, "a", a, n), f32p(op, "b", c, n), int64(n))
}

// SumSquares returns Σ x², accumulated in float64: fixed per-block
// partials added in order, so the result depends only on len(x).
func (b *Backend) SumSquares(x backend.Tensor) float64 {
	const op = "SumSquares"
	n := x.Len
	if n == 0 {
		return 0
	}
	g := min(blocks(n, elemBlock), 1024)
	b.mu.Lock()
	defer b.mu.Unlock()
	part := b.scratchBytes(int(g+1) * 8)
	b.launch(op, "sum_squares_partial", Dim3{g, 1, 1}, Dim3{elemBlock, 1, 1}, part, f32p(op, "x", x, n), int64(n))
	out := part + uintptr(g)*8
	b.launch(op, "sum_f64", Dim3{1, 1, 1}, Dim3{32, 1, 1}, out, part, int32(g))
	var s float64
	b.must(op, b.dev.CopyDtoH(unsafe.Pointer(&s), out, 8))
	return s
}

// AdamW performs step t of PyTorch's AdamW with the scalars formed as the
// CPU backend forms them, so both give the same bits.
func (b *Backend) AdamW(params, grads, m, v backend.Tensor, lr, beta1, beta2, eps, weightDecay, gradScale float32, t int) {
	const op = "AdamW"
	if t < 1 {
		panic(fmt.Sprintf("cuda: %s: step %d, want >= 1", op, t))
	}
	n := params.Len
	if grads.Len != n || m.Len != n || v.Len != n {
		panic(fmt.Sprintf("cuda: %s: lengths differ (params %d, grads %d, m %d, v %d)", op, n, grads.Len, m.Len, v.Len))
	}
	decay := float32(1 - float64(lr)*float64(weightDecay))
	omb1 := float32(1 - float64(beta1))
	omb2 := float32(1 - float64(beta2))
	bc1 := 1 - math.Pow(float64(beta1), float64(t))
	bc2 := 1 - math.Pow(float64(beta2), float64(t))
	negStep := float32(-(float64(lr) / bc1))
	bc2Sqrt := float32(math.Sqrt(bc2))
	b.launch(op, "adamw_f32", elemGrid(n), Dim3{elemBlock, 1, 1},
		f32p(op, "params", params, n), f32p(op, "grads", grads, n), f32p(op, "m", m, n), f32p(op, "v", v, n), int64(n),
		gradScale, decay, beta1, omb1, beta2, omb2, bc2Sqrt, eps, negStep)
}
