package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/backend/cuda"
	"github.com/titan-go/titan/internal/backend/cuda/emu"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/cudart"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/numeric"
	"github.com/titan-go/titan/internal/testenv"
)

// The parity tests run every operation of the CUDA backend and of the CPU
// backend on the same inputs and compare. By default the CUDA backend
// runs on the emulated device (the kernels compiled for the host with
// g++); with TITAN_CUDA_PARITY=gpu it runs on GPU 0 (make gpu-check), and
// TITAN_CUDA_PARITY=gpu-kernels also replaces cuBLASLt by the gemm_tiled
// kernel there.

var (
	emuOnce sync.Once
	emuDev  *emu.Device
	emuErr  error
	emuDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if emuDir != "" {
		os.RemoveAll(emuDir)
	}
	os.Exit(code)
}

// pair is the backend under test and the CPU reference.
type pair struct {
	g *cuda.Backend
	c *cpu.Backend
	r *rand.Rand
}

func newPair(t *testing.T) *pair {
	t.Helper()
	c := cpu.New(1)
	t.Cleanup(c.Close)
	r := rand.New(rand.NewPCG(uint64(len(t.Name())), 0x636461))
	switch mode := os.Getenv("TITAN_CUDA_PARITY"); mode {
	case "gpu", "gpu-kernels":
		g, err := cuda.Open(0, cuda.Options{NoLibraryGEMM: mode == "gpu-kernels"})
		if err != nil {
			t.Fatalf("TITAN_CUDA_PARITY=%s: %v", mode, err)
		}
		return &pair{g: g, c: c, r: r}
	case "", "emu":
	default:
		t.Fatalf("TITAN_CUDA_PARITY=%q: want emu, gpu or gpu-kernels", mode)
	}
	_, err := emu.Compiler()
	testenv.Require(t, "g++ (the emulated CUDA device compiles the kernels with it)", err == nil)
	emuOnce.Do(func() {
		emuDir, emuErr = os.MkdirTemp("", "titan-emu-")
		if emuErr != nil {
			return
		}
		var lib string
		if lib, emuErr = emu.Build(emuDir); emuErr == nil {
			emuDev, emuErr = emu.Open(lib)
		}
		if emuErr == nil {
			// TITAN_EMU_ORDER picks how the threads of a block interleave
			// between barriers: a missing barrier shows under one order.
			switch o := os.Getenv("TITAN_EMU_ORDER"); o {
			case "", "alternate":
				emuDev.SetOrder(emu.Alternate)
			case "forward":
				emuDev.SetOrder(emu.Forward)
			case "reverse":
				emuDev.SetOrder(emu.Reverse)
			default:
				emuErr = fmt.Errorf("TITAN_EMU_ORDER=%q: want forward, reverse or alternate", o)
			}
		}
	})
	if errors.Is(emuErr, cudart.ErrNoCgo) {
		t.Skip("built without cgo: the emulated device needs it")
	}
	if emuErr != nil {
		t.Fatal(emuErr)
	}
	return &pair{g: cuda.NewWithDevice(emuDev, cuda.Options{}), c: c, r: r}
}

// both holds the same data on the two backends.
type both struct{ g, c backend.Tensor }

func (p *pair) f32(x []float32) both {
	g, c := p.g.Alloc(backend.Float32, len(x)), p.c.Alloc(backend.Float32, len(x))
	p.g.Upload(g, x)
	p.c.Upload(c, x)
	return both{g, c}
}

func (p *pair) i32(x []int32) both {
	g, c := p.g.Alloc(backend.Int32, len(x)), p.c.Alloc(backend.Int32, len(x))
	p.g.Upload(g, x)
	p.c.Upload(c, x)
	return both{g, c}
}

func (p *pair) rand(n int, s float64) both { return p.f32(p.randHost(n, s)) }

func (p *pair) randHost(n int, s float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32((2*p.r.Float64() - 1) * s)
	}
	return x
}

func (p *pair) zeros(n int) both { return p.f32(make([]float32, n)) }

// check compares the two copies: |g - c| <= atol + rtol |c|, NaN and
// infinities exactly. It reports the largest relative error seen.
func (p *pair) check(t *testing.T, name string, x both, atol, rtol float64) {
	t.Helper()
	g, c := make([]float32, x.g.Len), make([]float32, x.c.Len)
	p.g.Download(g, x.g)
	p.c.Download(c, x.c)
	bad, worst := 0, 0.0
	for i := range c {
		gv, cv := float64(g[i]), float64(c[i])
		if math.IsNaN(cv) || math.IsInf(cv, 0) {
			if !(math.IsNaN(cv) && math.IsNaN(gv)) && gv != cv {
				bad++
				if bad <= 5 {
					t.Errorf("%s[%d] = %v, want %v", name, i, gv, cv)
				}
			}
			continue
		}
		d := math.Abs(gv - cv)
		if d > 0 {
			worst = math.Max(worst, d/math.Max(math.Abs(cv), atol/rtol))
		}
		if !(d <= atol+rtol*math.Abs(cv)) {
			bad++
			if bad <= 5 {
				t.Errorf("%s[%d] = %v, want %v (diff %.3g)", name, i, gv, cv, d)
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d elements differ", name, bad, len(c))
	}
	if testing.Verbose() {
		t.Logf("%s: %d elements, largest relative difference %.3g", name, len(c), worst)
	}
}

const (
	exact = 0
	tight = 2e-6 // one or two float32 roundings
	loose = 2e-5 // sums in different orders
)

func TestElementwise(t *testing.T) {
	p := newPair(t)
	const n = 1237
	a, b := p.rand(n, 2), p.rand(n, 2)
	out := p.zeros(n)
	p.g.Add(out.g, a.g, b.g)
	p.c.Add(out.c, a.c, b.c)
	p.check(t, "Add", out, 0, exact)
	p.g.Axpy(out.g, -0.75, a.g)
	p.c.Axpy(out.c, -0.75, a.c)
	p.check(t, "Axpy", out, 0, exact)
	p.g.Scale(out.g, 1.5)
	p.c.Scale(out.c, 1.5)
	p.check(t, "Scale", out, 0, exact)
	p.g.Mul(out.g, a.g, b.g)
	p.c.Mul(out.c, a.c, b.c)
	p.check(t, "Mul", out, 0, exact)
	da, db, d := p.rand(n, 1), p.rand(n, 1), p.rand(n, 1)
	p.g.MulBackward(da.g, db.g, d.g, a.g, b.g)
	p.c.MulBackward(da.c, db.c, d.c, a.c, b.c)
	p.check(t, "MulBackward.da", da, 0, exact)
	p.check(t, "MulBackward.db", db, 0, exact)
	p.g.MulBackward(backend.Tensor{}, db.g, d.g, a.g, b.g)
	p.c.MulBackward(backend.Tensor{}, db.c, d.c, a.c, b.c)
	p.check(t, "MulBackward(nil da).db", db, 0, exact)

	// A view: Off and Len matter.
	p.g.Copy(out.g.Slice(100, 300), a.g.Slice(500, 300))
	p.c.Copy(out.c.Slice(100, 300), a.c.Slice(500, 300))
	p.g.Zero(out.g.Slice(7, 11))
	p.c.Zero(out.c.Slice(7, 11))
	p.check(t, "Copy/Zero", out, 0, exact)

	for _, m := range []int{1, 257, 70001} {
		x := p.rand(m, 3)
		g, c := p.g.SumSquares(x.g), p.c.SumSquares(x.c)
		if math.Abs(g-c) > 1e-12*c {
			t.Errorf("SumSquares(%d) = %v, want %v", m, g, c)
		}
	}
}

func TestBF16Conversion(t *testing.T) {
	p := newPair(t)
	vals := []float32{0, -0, 1, -1, 1.00390625, 1.01171875, 3.4e38, -3.4e38, 1e-40, -1e-40, 1.1754942e-38,
		float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), math.Float32frombits(0xff812345),
		math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000), math.Float32frombits(0x7f7fffff)}
	vals = append(vals, p.randHost(1000, 100)...)
	src := p.f32(vals)
	h := p.g.Alloc(backend.BFloat16, len(vals))
	p.g.ToBF16(h, src.g)
	got := make([]uint16, len(vals))
	p.g.Download(got, h)
	for i, v := range vals {
		if want := numeric.Float32ToBF16(v); got[i] != want {
			t.Errorf("ToBF16(%v = %#08x) = %#04x, want %#04x", v, math.Float32bits(v), got[i], want)
		}
	}
	back := p.g.Alloc(backend.Float32, len(vals))
	p.g.FromBF16(back, h)
	wide := make([]float32, len(vals))
	p.g.Download(wide, back)
	for i := range vals {
		if want := numeric.BF16ToFloat32(got[i]); math.Float32bits(wide[i]) != math.Float32bits(want) {
			t.Errorf("FromBF16(%#04x) = %v, want %v", got[i], wide[i], want)
		}
	}
	// Upload of float32 host data into a bfloat16 tensor rounds the same
	// way; Download of a bfloat16 tensor into float32 host data widens.
	up := p.g.Alloc(backend.BFloat16, len(vals))
	p.g.Upload(up, vals)
	gotUp := make([]uint16, len(vals))
	p.g.Download(gotUp, up)
	p.g.Download(wide, up)
	for i, v := range vals {
		if want := numeric.Float32ToBF16(v); gotUp[i] != want {
			t.Errorf("Upload(%#08x) into bfloat16 = %#04x, want %#04x", math.Float32bits(v), gotUp[i], want)
		}
		if want := numeric.BF16ToFloat32(gotUp[i]); math.Float32bits(wide[i]) != math.Float32bits(want) {
			t.Errorf("Download(%#04x) into float32 = %v, want %v", gotUp[i], wide[i], want)
		}
	}
}

func TestAdamW(t *testing.T) {
	p := newPair(t)
	const n = 2053
	params, m, v := p.rand(n, 1), p.zeros(n), p.zeros(n)
	for step := 1; step <= 3; step++ {
		g := p.rand(n, 0.1)
		p.g.AdamW(params.g, g.g, m.g, v.g, 3e-4, 0.9, 0.95, 1e-8, 0.1, 0.8, step)
		p.c.AdamW(params.c, g.c, m.c, v.c, 3e-4, 0.9, 0.95, 1e-8, 0.1, 0.8, step)
	}
	// The CPU's vector kernel rounds the first moment once, as the GPU's
	// fused multiply-add: equal within an ulp.
	p.check(t, "AdamW.params", params, 1e-12, 3e-7)
	p.check(t, "AdamW.m", m, 1e-12, 3e-7)
	p.check(t, "AdamW.v", v, 1e-15, 3e-7)
}

func TestNorms(t *testing.T) {
	p := newPair(t)
	for _, sh := range [][2]int{{1, 1}, {7, 37}, {130, 203}, {3, 1000}} {
		N, C := sh[0], sh[1]
		t.Run(fmt.Sprintf("N%d_C%d", N, C), func(t *testing.T) {
			x, w := p.rand(N*C, 2), p.rand(C, 1)
			out, rstd := p.zeros(N*C), p.zeros(N)
			p.g.RMSNormForward(out.g, rstd.g, x.g, w.g, N, C, 1e-5)
			p.c.RMSNormForward(out.c, rstd.c, x.c, w.c, N, C, 1e-5)
			p.check(t, "rmsnorm.out", out, 1e-6, loose)
			p.check(t, "rmsnorm.rstd", rstd, 1e-6, loose)
			// A bfloat16 output is the device's float32 one, rounded.
			outH := p.g.Alloc(backend.BFloat16, N*C)
			p.g.RMSNormForward(outH, rstd.g, x.g, w.g, N, C, 1e-5)
			checkRounded(t, "rmsnorm.out bf16", p.g, outH, out.g)
			dout, dx, dw := p.rand(N*C, 1), p.rand(N*C, 0.1), p.rand(C, 0.1)
			p.g.RMSNormBackward(dx.g, dw.g, dout.g, x.g, w.g, rstd.c2g(p), N, C)
			p.c.RMSNormBackward(dx.c, dw.c, dout.c, x.c, w.c, rstd.c, N, C)
			p.check(t, "rmsnorm.dinp", dx, 1e-5, loose)
			p.check(t, "rmsnorm.dweight", dw, 1e-5, loose)

			bias := p.rand(C, 1)
			mean := p.zeros(N)
			p.g.LayerNormForward(out.g, mean.g, rstd.g, x.g, w.g, bias.g, N, C, 1e-5)
			p.c.LayerNormForward(out.c, mean.c, rstd.c, x.c, w.c, bias.c, N, C, 1e-5)
			p.check(t, "layernorm.out", out, 1e-5, loose)
			p.check(t, "layernorm.mean", mean, 1e-6, loose)
			db := p.rand(C, 0.1)
			p.g.LayerNormBackward(dx.g, dw.g, db.g, dout.g, x.g, w.g, mean.c2g(p), rstd.c2g(p), N, C)
			p.c.LayerNormBackward(dx.c, dw.c, db.c, dout.c, x.c, w.c, mean.c, rstd.c, N, C)
			p.check(t, "layernorm.dinp", dx, 1e-4, loose)
			p.check(t, "layernorm.dweight", dw, 1e-4, loose)
			p.check(t, "layernorm.dbias", db, 1e-5, loose)
		})
	}
}

// checkRounded fails the test unless the bfloat16 tensor got on be holds
// the nearest-even rounding of every element of the float32 tensor want.
func checkRounded(t *testing.T, name string, be backend.Backend, got, want backend.Tensor) {
	t.Helper()
	h, f := make([]uint16, got.Len), make([]float32, want.Len)
	be.Download(h, got)
	be.Download(f, want)
	for i, v := range f {
		if w := numeric.Float32ToBF16(v); h[i] != w {
			t.Fatalf("%s[%d] = %#04x, want %#04x (the rounding of %v)", name, i, h[i], w, v)
		}
	}
}

// c2g uploads the CPU copy to the device, so that a backward pass reads
// the same saved statistics on both.
func (x both) c2g(p *pair) backend.Tensor {
	h := make([]float32, x.c.Len)
	p.c.Download(h, x.c)
	g := p.g.Alloc(backend.Float32, len(h))
	p.g.Upload(g, h)
	return g
}

func TestRoPE(t *testing.T) {
	p := newPair(t)
	cfg := llama.Config{Dim: 64 * 3, NHeads: 3, RoPETheta: 500000,
		RoPEScaling: llama.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}}
	const B, T, NH, pos0 = 2, 37, 3, 5000
	HD := cfg.HeadDim()
	cosAll, sinAll := cfg.RoPETables(pos0 + T)
	half := HD / 2
	cs, sn := p.f32(cosAll[pos0*half:]), p.f32(sinAll[pos0*half:])
	// The device computes the same tables (all three wave-length bands
	// of the Llama 3.1 scaling occur at HD = 64).
	gc, gs := p.g.Alloc(backend.Float32, T*half), p.g.Alloc(backend.Float32, T*half)
	p.g.RoPETables(gc, gs, T, HD, pos0, cfg.RoPETheta, cuda.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192})
	p.check(t, "RoPETables.cos", both{gc, cs.c}, 1e-6, tight)
	p.check(t, "RoPETables.sin", both{gs, sn.c}, 1e-6, tight)

	n := B * T * NH * HD
	x, out := p.rand(n, 1), p.zeros(n)
	p.g.RoPEForward(out.g, x.g, cs.g, sn.g, B, T, NH, HD)
	p.c.RoPEForward(out.c, x.c, cs.c, sn.c, B, T, NH, HD)
	p.check(t, "RoPEForward", out, 1e-7, tight)
	p.g.RoPEForward(x.g, x.g, cs.g, sn.g, B, T, NH, HD) // in place
	p.c.RoPEForward(x.c, x.c, cs.c, sn.c, B, T, NH, HD)
	p.check(t, "RoPEForward(in place)", x, 1e-7, tight)
	d, dx := p.rand(n, 1), p.rand(n, 1)
	p.g.RoPEBackward(dx.g, d.g, cs.g, sn.g, B, T, NH, HD)
	p.c.RoPEBackward(dx.c, d.c, cs.c, sn.c, B, T, NH, HD)
	p.check(t, "RoPEBackward", dx, 1e-6, tight)
}

func TestAttention(t *testing.T) {
	p := newPair(t)
	for _, d := range []backend.AttentionDims{
		{B: 2, Tq: 37, Tk: 37, NH: 4, NKV: 2, HD: 24},          // training, GQA
		{B: 1, Tq: 45, Tk: 45, NH: 3, NKV: 1, HD: 40},          // MQA, HD over one warp
		{B: 1, Tq: 70, Tk: 70, NH: 2, NKV: 2, HD: 128},         // the largest head
		{B: 2, Tq: 1, Tk: 29, NH: 4, NKV: 2, HD: 16, QPos: 28}, // decoding with a KV cache
		{B: 1, Tq: 20, Tk: 33, NH: 2, NKV: 1, HD: 8, QPos: 33}, // ring attention: an earlier chunk
		{B: 1, Tq: 21, Tk: 17, NH: 2, NKV: 2, HD: 8, KPos: 5},  // rows 0..4 see no key
	} {
		t.Run(fmt.Sprintf("%+v", d), func(t *testing.T) {
			nq, nk, nl := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD, d.B*d.NH*d.Tq
			q, k, v := p.rand(nq, 1), p.rand(nk, 1), p.rand(nk, 1)
			out, lse := p.zeros(nq), p.zeros(nl)
			p.g.AttentionForward(out.g, lse.g, q.g, k.g, v.g, d)
			p.c.AttentionForward(out.c, lse.c, q.c, k.c, v.c, d)
			p.check(t, "out", out, 1e-6, loose)
			p.check(t, "lse", lse, 1e-6, loose)
			dout := p.rand(nq, 1)
			dq, dk, dv := p.rand(nq, 0.1), p.rand(nk, 0.1), p.rand(nk, 0.1)
			og, lg := out.c2g(p), lse.c2g(p)
			p.g.AttentionBackward(dq.g, dk.g, dv.g, dout.g, q.g, k.g, v.g, og, lg, d)
			p.c.AttentionBackward(dq.c, dk.c, dv.c, dout.c, q.c, k.c, v.c, out.c, lse.c, d)
			p.check(t, "dq", dq, 1e-5, loose)
			p.check(t, "dk", dk, 1e-5, loose)
			p.check(t, "dv", dv, 1e-5, loose)
		})
	}
}

// TestAttentionBF16Inputs: with bfloat16 products, bfloat16 q, k and v
// give the device's results for their float32 values bit for bit (the
// kernels round their operands to bfloat16 anyway), and Copy and
// RoPEForward round into bfloat16 outputs.
func TestAttentionBF16Inputs(t *testing.T) {
	p := newPair(t)
	d := backend.AttentionDims{B: 2, Tq: 37, Tk: 37, NH: 4, NKV: 2, HD: 24, BF16: true}
	nq, nk, nl := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD, d.B*d.NH*d.Tq
	g := p.g
	half := func(x both) backend.Tensor {
		h := g.Alloc(backend.BFloat16, x.g.Len)
		g.Copy(h, x.g)
		checkRounded(t, "Copy", g, h, x.g)
		return h
	}
	// Values that bfloat16 holds exactly, so that both calls see the same.
	exact := func(n int) both {
		x := p.rand(n, 1)
		h := half(x)
		f := g.Alloc(backend.Float32, n)
		bits := make([]uint16, n)
		g.Download(bits, h)
		w := make([]float32, n)
		for i, b := range bits {
			w[i] = numeric.BF16ToFloat32(b)
		}
		g.Upload(f, w)
		return both{g: f}
	}
	q, k, v := exact(nq), exact(nk), exact(nk)
	dout := p.rand(nq, 1)
	run := func(q, k, v backend.Tensor) [5][]float32 {
		out, lse := g.Alloc(backend.Float32, nq), g.Alloc(backend.Float32, nl)
		g.AttentionForward(out, lse, q, k, v, d)
		dq, dk, dv := g.Alloc(backend.Float32, nq), g.Alloc(backend.Float32, nk), g.Alloc(backend.Float32, nk)
		g.Zero(dq)
		g.Zero(dk)
		g.Zero(dv)
		g.AttentionBackward(dq, dk, dv, dout.g, q, k, v, out, lse, d)
		var r [5][]float32
		for i, x := range []backend.Tensor{out, lse, dq, dk, dv} {
			r[i] = make([]float32, x.Len)
			g.Download(r[i], x)
		}
		return r
	}
	want := run(q.g, k.g, v.g)
	got := run(half(q), half(k), half(v))
	for i, name := range []string{"out", "lse", "dq", "dk", "dv"} {
		for j := range want[i] {
			if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
				t.Fatalf("%s[%d] = %v from bfloat16 inputs, %v from float32", name, j, got[i][j], want[i][j])
			}
		}
	}
	B, T, NH, HD := 2, 5, 3, 8
	n := B * T * NH * HD
	x, cs, sn := p.rand(n, 2), p.rand(T*HD/2, 1), p.rand(T*HD/2, 1)
	o, oh := g.Alloc(backend.Float32, n), g.Alloc(backend.BFloat16, n)
	g.RoPEForward(o, x.g, cs.g, sn.g, B, T, NH, HD)
	g.RoPEForward(oh, x.g, cs.g, sn.g, B, T, NH, HD)
	checkRounded(t, "RoPEForward bf16", g, oh, o)
}

// TestAttentionBF16Output: a bfloat16 out receives the rounding to
// nearest even of the float32 out (lse unchanged), and the backward
// reading it gives, bit for bit, the gradients of the float32 path fed
// its widening; with float32 and bfloat16 products, rows that see no key
// included. The CPU backend's bfloat16 out agrees within a bfloat16
// rounding (and the products' bfloat16 error).
func TestAttentionBF16Output(t *testing.T) {
	p := newPair(t)
	g := p.g
	for _, bf16 := range []bool{false, true} {
		d := backend.AttentionDims{B: 2, Tq: 21, Tk: 17, NH: 4, NKV: 2, HD: 24, KPos: 5, BF16: bf16}
		t.Run(fmt.Sprintf("BF16=%v", bf16), func(t *testing.T) {
			nq, nk, nl := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD, d.B*d.NH*d.Tq
			q, k, v, dout := p.rand(nq, 1), p.rand(nk, 1), p.rand(nk, 1), p.rand(nq, 1)
			out, lse := g.Alloc(backend.Float32, nq), g.Alloc(backend.Float32, nl)
			outH, lseH := g.Alloc(backend.BFloat16, nq), g.Alloc(backend.Float32, nl)
			g.AttentionForward(out, lse, q.g, k.g, v.g, d)
			g.AttentionForward(outH, lseH, q.g, k.g, v.g, d)
			checkRounded(t, "out", g, outH, out)
			wide := g.Alloc(backend.Float32, nq)
			g.FromBF16(wide, outH)
			run := func(o backend.Tensor) [4][]float32 {
				dq, dk, dv := g.Alloc(backend.Float32, nq), g.Alloc(backend.Float32, nk), g.Alloc(backend.Float32, nk)
				g.AttentionBackward(dq, dk, dv, dout.g, q.g, k.g, v.g, o, lse, d)
				l := lse
				if o == outH {
					l = lseH
				}
				var r [4][]float32
				for i, x := range []backend.Tensor{l, dq, dk, dv} {
					r[i] = make([]float32, x.Len)
					g.Download(r[i], x)
				}
				return r
			}
			want, got := run(wide), run(outH)
			for i, name := range []string{"lse", "dq", "dk", "dv"} {
				for j := range want[i] {
					if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
						t.Fatalf("%s[%d] = %v with a bfloat16 out, %v with its widening", name, j, got[i][j], want[i][j])
					}
				}
			}
			cH := p.c.Alloc(backend.BFloat16, nq)
			p.c.AttentionForward(cH, p.c.Alloc(backend.Float32, nl), q.c, k.c, v.c, d)
			h, w := make([]uint16, nq), make([]float32, nq)
			p.c.Download(h, cH)
			numeric.BF16sToFloat32(w, h)
			cw := p.c.Alloc(backend.Float32, nq)
			p.c.Upload(cw, w)
			atol := 1e-6
			if bf16 {
				atol = 5e-3 // the two backends' bfloat16 products round P at different points
			}
			p.check(t, "out (bfloat16, widened)", both{g: wide, c: cw}, atol, 1e-2)
		})
	}
}

func TestActivations(t *testing.T) {
	p := newPair(t)
	const n = 3001
	g, u, out := p.rand(n, 6), p.rand(n, 2), p.zeros(n)
	p.g.SwiGLUForward(out.g, g.g, u.g, n)
	p.c.SwiGLUForward(out.c, g.c, u.c, n)
	p.check(t, "SwiGLUForward", out, 1e-7, tight)
	outH := p.g.Alloc(backend.BFloat16, n)
	p.g.SwiGLUForward(outH, g.g, u.g, n)
	checkRounded(t, "SwiGLUForward bf16", p.g, outH, out.g)
	d, dg, du := p.rand(n, 1), p.rand(n, 1), p.rand(n, 1)
	p.g.SwiGLUBackward(dg.g, du.g, d.g, g.g, u.g, n)
	p.c.SwiGLUBackward(dg.c, du.c, d.c, g.c, u.c, n)
	p.check(t, "SwiGLUBackward.dgate", dg, 1e-6, tight)
	p.check(t, "SwiGLUBackward.dup", du, 1e-6, tight)
	p.g.GELUTanhForward(out.g, g.g, n)
	p.c.GELUTanhForward(out.c, g.c, n)
	p.check(t, "GELUTanhForward", out, 1e-6, tight)
	p.g.GELUTanhBackward(dg.g, d.g, g.g, n)
	p.c.GELUTanhBackward(dg.c, d.c, g.c, n)
	p.check(t, "GELUTanhBackward", dg, 1e-6, tight)
	x, f := p.rand(n, 3), p.rand(n/3, 2)
	p.g.SinForward(out.g, x.g, f.g, 3, n/3)
	p.c.SinForward(out.c, x.c, f.c, 3, n/3)
	p.check(t, "SinForward", out, 1e-6, tight)
	df := p.rand(n/3, 0.1)
	p.g.SinBackward(dg.g, df.g, d.g, x.g, f.g, 3, n/3)
	p.c.SinBackward(dg.c, df.c, d.c, x.c, f.c, 3, n/3)
	p.check(t, "SinBackward.dinp", dg, 1e-5, loose)
	p.check(t, "SinBackward.dfreq", df, 1e-5, loose)
}

func TestCrossEntropy(t *testing.T) {
	p := newPair(t)
	const N, V = 13, 301
	chunks := [][2]int{{0, 97}, {97, 131}, {228, 73}} // odd chunks of the vocabulary
	tg := make([]int32, N)
	for i := range tg {
		tg[i] = int32(p.r.IntN(V))
	}
	tg[3], tg[8] = -1, -100 // ignored rows
	targets := p.i32(tg)
	stats := p.zeros(3 * N)
	p.g.CrossEntropyReset(stats.g, N)
	p.c.CrossEntropyReset(stats.c, N)
	logits := make([]both, len(chunks))
	for i, ch := range chunks {
		logits[i] = p.rand(N*ch[1], 8)
		p.g.CrossEntropyChunk(stats.g, logits[i].g, targets.g, N, ch[1], ch[0])
		p.c.CrossEntropyChunk(stats.c, logits[i].c, targets.c, N, ch[1], ch[0])
	}
	p.check(t, "stats", stats, 1e-6, loose)
	losses := p.zeros(N)
	p.g.CrossEntropyLoss(losses.g, stats.g, targets.g, N)
	p.c.CrossEntropyLoss(losses.c, stats.c, targets.c, N)
	p.check(t, "losses", losses, 1e-6, loose)
	for i, ch := range chunks {
		p.g.CrossEntropyChunkBackward(logits[i].g, stats.c2g(p), targets.g, N, ch[1], ch[0], 1.0/11)
		p.c.CrossEntropyChunkBackward(logits[i].c, stats.c, targets.c, N, ch[1], ch[0], 1.0/11)
		p.check(t, fmt.Sprintf("dlogits[%d]", i), logits[i], 1e-8, tight)
	}
}

// TestCrossEntropyBF16Logits: bfloat16 logits give the statistics and
// losses of their float32 values bit for bit and the rounding of their
// gradient (the output layer's bfloat16 logits under mixed precision).
func TestCrossEntropyBF16Logits(t *testing.T) {
	p := newPair(t)
	g := p.g
	const N, V = 13, 301
	chunks := [][2]int{{0, 97}, {97, 204}}
	tg := make([]int32, N)
	for i := range tg {
		tg[i] = int32(p.r.IntN(V))
	}
	tg[3] = -1
	targets := p.i32(tg).g
	stats, statsH := g.Alloc(backend.Float32, 3*N), g.Alloc(backend.Float32, 3*N)
	g.CrossEntropyReset(stats, N)
	g.CrossEntropyReset(statsH, N)
	wide, half := make([]backend.Tensor, len(chunks)), make([]backend.Tensor, len(chunks))
	for i, ch := range chunks {
		wide[i], half[i] = halfPair(g, p.rand(N*ch[1], 8).g)
		g.CrossEntropyChunk(stats, wide[i], targets, N, ch[1], ch[0])
		g.CrossEntropyChunk(statsH, half[i], targets, N, ch[1], ch[0])
	}
	sameBitsOn(t, "stats", g, statsH, stats)
	losses, lossesH := g.Alloc(backend.Float32, N), g.Alloc(backend.Float32, N)
	g.CrossEntropyLoss(losses, stats, targets, N)
	g.CrossEntropyLoss(lossesH, statsH, targets, N)
	sameBitsOn(t, "losses", g, lossesH, losses)
	for i, ch := range chunks {
		g.CrossEntropyChunkBackward(wide[i], stats, targets, N, ch[1], ch[0], 1.0/11)
		g.CrossEntropyChunkBackward(half[i], statsH, targets, N, ch[1], ch[0], 1.0/11)
		checkRounded(t, fmt.Sprintf("dlogits[%d] bf16", i), g, half[i], wide[i])
	}
}

// sameBitsOn fails the test unless the float32 tensors got and want of
// be hold the same bits.
func sameBitsOn(t *testing.T, name string, be backend.Backend, got, want backend.Tensor) {
	t.Helper()
	a, b := make([]float32, got.Len), make([]float32, want.Len)
	be.Download(a, got)
	be.Download(b, want)
	for i := range b {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("%s[%d] = %v, want %v", name, i, a[i], b[i])
		}
	}
}

// halfPair returns x rounded to bfloat16 on be, as float32 (widened) and
// as bfloat16.
func halfPair(be backend.Backend, x backend.Tensor) (wide, half backend.Tensor) {
	f := make([]float32, x.Len)
	be.Download(f, x)
	h := make([]uint16, len(f))
	numeric.Float32sToBF16(h, f)
	numeric.BF16sToFloat32(f, h)
	wide, half = be.Alloc(backend.Float32, len(f)), be.Alloc(backend.BFloat16, len(h))
	be.Upload(wide, f)
	be.Upload(half, h)
	return wide, half
}

func TestGemm(t *testing.T) {
	p := newPair(t)
	for _, tc := range []struct {
		ta, tb      bool
		m, n, k     int
		alpha, beta float32
		bf16A       bool
	}{
		{false, false, 37, 29, 45, 1, 0, false},
		{true, false, 33, 17, 50, 0.5, 1, false},
		{false, true, 16, 47, 19, -1, 0.25, false},
		{true, true, 5, 3, 70, 2, 0, false},
		{false, true, 23, 31, 41, 1, 0, true},
	} {
		t.Run(fmt.Sprintf("%+v", tc), func(t *testing.T) {
			ar, ac := tc.m, tc.k
			if tc.ta {
				ar, ac = tc.k, tc.m
			}
			br, bc := tc.k, tc.n
			if tc.tb {
				br, bc = tc.n, tc.k
			}
			lda, ldb, ldc := ac+3, bc+1, tc.n+2
			const batch = 3
			sa, sb, sc := ar*lda+5, br*ldb, tc.m*ldc+1
			a, b, c := p.rand(batch*sa, 1), p.rand(batch*sb, 1), p.rand(batch*sc, 1)
			ag, ac2 := a.g, a.c
			tol := loose
			if tc.bf16A {
				h := make([]float32, a.c.Len)
				p.c.Download(h, a.c)
				u := make([]uint16, len(h))
				numeric.Float32sToBF16(u, h)
				ag, ac2 = p.g.Alloc(backend.BFloat16, len(u)), p.c.Alloc(backend.BFloat16, len(u))
				p.g.Upload(ag, u)
				p.c.Upload(ac2, u)
				tol = 1e-4
			}
			p.g.Gemm(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, ag, lda, b.g, ldb, tc.beta, c.g, ldc)
			p.c.Gemm(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, ac2, lda, b.c, ldb, tc.beta, c.c, ldc)
			p.check(t, "Gemm", c, 1e-5, tol)
			// Both operands multiplied as bfloat16 (the float32 ones
			// rounded first), on both backends.
			p.g.GemmBF16(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, ag, lda, b.g, ldb, tc.beta, c.g, ldc)
			p.c.GemmBF16(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, ac2, lda, b.c, ldb, tc.beta, c.c, ldc)
			p.check(t, "GemmBF16", c, 1e-5, 1e-4)
			// Into a bfloat16 C: the rounding of the same product into
			// the widened C, gaps between the rows kept.
			cw, ch := halfPair(p.g, c.g)
			p.g.GemmBF16(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, ag, lda, b.g, ldb, tc.beta, cw, ldc)
			p.g.GemmBF16(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, ag, lda, b.g, ldb, tc.beta, ch, ldc)
			checkRounded(t, "GemmBF16 bf16 C", p.g, ch, cw)
			if tc.bf16A {
				return // the CPU backend's strided batches are float32 only
			}
			p.g.GemmStridedBatched(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, ag, lda, sa, b.g, ldb, sb, tc.beta, c.g, ldc, sc, batch)
			p.c.GemmStridedBatched(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, ac2, lda, sa, b.c, ldb, sb, tc.beta, c.c, ldc, sc, batch)
			p.check(t, "GemmStridedBatched", c, 1e-5, tol)
		})
	}
}

func TestLayout(t *testing.T) {
	p := newPair(t)
	const N, C, rows = 19, 37, 11
	tok := make([]int32, N)
	for i := range tok {
		tok[i] = int32(p.r.IntN(rows))
	}
	tok[4], tok[9] = 3, 3 // repeated tokens accumulate in order
	tokens := p.i32(tok)
	table, out := p.rand(rows*C, 1), p.zeros(N*C)
	p.g.EmbeddingForward(out.g, table.g, tokens.g, N, C)
	p.c.EmbeddingForward(out.c, table.c, tokens.c, N, C)
	p.check(t, "EmbeddingForward", out, 0, exact)
	dout := p.rand(N*C, 1)
	p.g.EmbeddingBackward(table.g, dout.g, tokens.g, N, C)
	p.c.EmbeddingBackward(table.c, dout.c, tokens.c, N, C)
	p.check(t, "EmbeddingBackward", table, 0, exact)

	bad := p.i32([]int32{0, rows})
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "token 11 at position 1 outside the 11-row table") {
				t.Errorf("bad token: %v", r)
			}
		}()
		p.g.EmbeddingForward(out.g, table.g, bad.g, 2, C)
	}()

	row := p.rand(C, 1)
	p.g.BroadcastRows(out.g, row.g, N, C)
	p.c.BroadcastRows(out.c, row.c, N, C)
	p.check(t, "BroadcastRows", out, 0, exact)
	for _, n := range []int{N, 130} {
		src, dst := p.rand(n*C, 1), p.rand(C, 1)
		p.g.SumRows(dst.g, src.g, n, C)
		p.c.SumRows(dst.c, src.c, n, C)
		p.check(t, fmt.Sprintf("SumRows(%d)", n), dst, 1e-6, tight)
	}
	const B, R, Cc = 2, 45, 33
	x, y := p.rand(B*R*Cc, 1), p.zeros(B*R*Cc)
	p.g.Transpose(y.g, x.g, B, R, Cc)
	p.c.Transpose(y.c, x.c, B, R, Cc)
	p.check(t, "Transpose", y, 0, exact)
}

func TestHyenaOps(t *testing.T) {
	p := newPair(t)
	const B, C, L, K = 2, 5, 37, 3
	n := B * C * L
	a, x, w := p.rand(n, 1), p.rand(n, 1), p.rand(C, 1)
	out := p.zeros(n)
	p.g.ChannelScaleAdd(out.g, a.g, x.g, w.g, B, C, L)
	p.c.ChannelScaleAdd(out.c, a.c, x.c, w.c, B, C, L)
	p.check(t, "ChannelScaleAdd", out, 1e-7, tight)
	dout, dx, dw := p.rand(n, 1), p.rand(n, 1), p.rand(C, 1)
	p.g.ChannelScaleAddBackward(dx.g, dw.g, dout.g, x.g, w.g, B, C, L)
	p.c.ChannelScaleAddBackward(dx.c, dw.c, dout.c, x.c, w.c, B, C, L)
	p.check(t, "ChannelScaleAddBackward.dx", dx, 1e-6, tight)
	p.check(t, "ChannelScaleAddBackward.dw", dw, 1e-5, loose)

	cw, cb := p.rand(C*K, 1), p.rand(C, 1)
	p.g.ShortConvForward(out.g, x.g, cw.g, cb.g, B, C, L, K)
	p.c.ShortConvForward(out.c, x.c, cw.c, cb.c, B, C, L, K)
	p.check(t, "ShortConvForward", out, 1e-6, loose)
	dcw, dcb := p.rand(C*K, 1), p.rand(C, 1)
	p.g.ShortConvBackward(dx.g, dcw.g, dcb.g, dout.g, x.g, cw.g, B, C, L, K)
	p.c.ShortConvBackward(dx.c, dcw.c, dcb.c, dout.c, x.c, cw.c, B, C, L, K)
	p.check(t, "ShortConvBackward.dinp", dx, 1e-5, loose)
	p.check(t, "ShortConvBackward.dweight", dcw, 1e-5, loose)
	p.check(t, "ShortConvBackward.dbias", dcb, 1e-5, loose)

	state, in, o := p.rand(B*C*(K-1), 1), p.rand(B*C, 1), p.zeros(B*C)
	for step := 0; step < 3; step++ {
		p.g.ShortConvStep(o.g, state.g, in.g, cw.g, cb.g, B, C, K)
		p.c.ShortConvStep(o.c, state.c, in.c, cw.c, cb.c, B, C, K)
	}
	p.check(t, "ShortConvStep.out", o, 1e-6, loose)
	p.check(t, "ShortConvStep.state", state, 0, exact)
}

// TestNCCLNeedsAGPU: an NCCL group over an emulated device is refused.
func TestNCCLNeedsAGPU(t *testing.T) {
	if os.Getenv("TITAN_CUDA_PARITY") != "" && os.Getenv("TITAN_CUDA_PARITY") != "emu" {
		t.Skip("on a GPU")
	}
	p := newPair(t)
	_, err := cuda.NewNCCLGroup(context.Background(), p.g, comm.NewMemStore(), "world", 0, 1)
	if err == nil || !strings.Contains(err.Error(), "nccl group world: the backend runs on emulator, not a GPU") {
		t.Fatalf("NewNCCLGroup on the emulator: %v", err)
	}
}

func TestLongConv(t *testing.T) {
	p := newPair(t)
	const B, C, L = 2, 3, 61
	x, h, dy := p.rand(B*C*L, 1), p.rand(C*L, 0.3), p.rand(B*C*L, 1)
	y := p.zeros(B * C * L)
	p.g.CausalConv(y.g, x.g, h.g, B, C, L)
	p.c.CausalConv(y.c, x.c, h.c, B, C, L)
	p.check(t, "CausalConv", y, 1e-5, loose)
	dx, dh := p.rand(B*C*L, 0.1), p.rand(C*L, 0.1)
	p.g.CausalConvBackward(dx.g, dh.g, dy.g, x.g, h.g, B, C, L)
	p.c.CausalConvBackward(dx.c, dh.c, dy.c, x.c, h.c, B, C, L)
	p.check(t, "CausalConvBackward.dx", dx, 1e-5, loose)
	p.check(t, "CausalConvBackward.dh", dh, 1e-5, loose)
	p.g.CausalConvBackward(backend.Tensor{}, dh.g, dy.g, x.g, h.g, B, C, L)
	p.c.CausalConvBackward(backend.Tensor{}, dh.c, dy.c, x.c, h.c, B, C, L)
	p.check(t, "CausalConvBackward(no dx).dh", dh, 1e-5, loose)
}

func TestFP8Conversion(t *testing.T) {
	p := newPair(t)
	// Every float8 value and the midpoints around it, specials, and
	// random values over the formats' ranges.
	var vals []float32
	for c := 0; c < 256; c++ {
		for _, v := range []float32{numeric.E4M3ToFloat32(uint8(c)), numeric.E5M2ToFloat32(uint8(c))} {
			vals = append(vals, v, math.Nextafter32(v, float32(math.Inf(1))), math.Nextafter32(v, float32(math.Inf(-1))), v*1.0625, v*0.96875)
		}
	}
	vals = append(vals, 0, float32(math.Copysign(0, -1)), 1e-45, -1e-40, 449, 464, -480, 57344, 61440, 65536, 1e30,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()))
	vals = append(vals, p.randHost(2000, 500)...)
	src := p.f32(vals)
	n := len(vals)
	buf := p.g.AllocBytes(n)
	defer p.g.FreeBytes(buf)
	got := make([]byte, n)
	back := p.g.Alloc(backend.Float32, n)
	wide := make([]float32, n)
	for _, tc := range []struct {
		name   string
		format int
		sat    bool
		to     func(float32) uint8
		from   func(uint8) float32
	}{
		{"e4m3", cuda.E4M3, false, numeric.Float32ToE4M3, numeric.E4M3ToFloat32},
		{"e4m3 sat", cuda.E4M3, true, numeric.Float32ToE4M3Sat, numeric.E4M3ToFloat32},
		{"e5m2", cuda.E5M2, false, numeric.Float32ToE5M2, numeric.E5M2ToFloat32},
		{"e5m2 sat", cuda.E5M2, true, numeric.Float32ToE5M2Sat, numeric.E5M2ToFloat32},
	} {
		for _, scale := range []float32{1, 0.25} {
			p.g.ToFP8(buf, src.g, tc.format, tc.sat, scale)
			p.g.DownloadBytes(got, buf)
			bad := 0
			for i, v := range vals {
				if want := tc.to(v * scale); got[i] != want && bad < 5 {
					bad++
					t.Errorf("%s scale %v: fp8(%v = %#08x) = %#02x, want %#02x", tc.name, scale, v, math.Float32bits(v), got[i], want)
				}
			}
			p.g.FromFP8(back, buf, tc.format, 1/scale)
			p.g.Download(wide, back)
			for i := range vals {
				want := tc.from(got[i]) * (1 / scale)
				if math.Float32bits(wide[i]) != math.Float32bits(want) && !(math.IsNaN(float64(want)) && math.IsNaN(float64(wide[i]))) && bad < 10 {
					bad++
					t.Errorf("%s: float(%#02x)/%v = %v, want %v", tc.name, got[i], scale, wide[i], want)
				}
			}
		}
	}
}
