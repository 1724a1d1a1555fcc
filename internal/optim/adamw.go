// Package optim holds the optimizer and gradient clipping over flat
// parameter and gradient buffers.
package optim

import (
	"fmt"
	"math"
	"slices"

	"github.com/titan-go/titan/internal/backend"
)

// Optimizer names (the recipe's optimizer.name).
const (
	// NameAdamW is torch.optim.AdamW: weight decay is decoupled, applied
	// to the parameters (p *= 1 - lr*weight_decay).
	NameAdamW = "AdamW"
	// NameAdam is torch.optim.Adam: weight decay is an L2 penalty added
	// to the gradient before the moments (g += weight_decay*p).
	NameAdam = "Adam"
)

// Implementations (the recipe's optimizer.implementation).
const (
	// ImplFused runs the backend's vectorised kernel over the whole
	// buffer.
	ImplFused = "fused"
	// ImplForeach is the same vectorised kernel: over one flat buffer,
	// torch's per-operation multi-tensor path has nothing more to batch.
	ImplForeach = "foreach"
	// ImplForLoop is a plain scalar Go loop, element by element.
	ImplForLoop = "for-loop"
)

// Names and Implementations list the accepted values, in recipe order.
var (
	Names           = []string{NameAdamW, NameAdam}
	Implementations = []string{ImplFused, ImplForeach, ImplForLoop}
)

// Config are the optimizer's name, implementation and torch.optim.Adam(W)
// hyperparameters. An empty Name means "AdamW", an empty Implementation
// "fused".
type Config struct {
	Name, Implementation               string
	LR, Beta1, Beta2, Eps, WeightDecay float32
}

// AdamWConfig is the name Config had when AdamW was the only optimizer.
type AdamWConfig = Config

// Optimizer is PyTorch's Adam or AdamW over one flat parameter buffer (or a
// shard of one). Its state is the first and second moments and the step
// count.
type Optimizer struct {
	Cfg  Config
	M, V backend.Tensor
	Step int
	be   backend.Backend
	// gwd is Adam's scratch buffer for grad*scale + weight_decay*p
	// (allocated on first use, only for Adam with weight decay on the
	// vectorised path).
	gwd backend.Tensor
}

// AdamW is the name Optimizer had when AdamW was the only optimizer.
type AdamW = Optimizer

// New allocates zeroed moments for n parameters and checks cfg's name and
// implementation; the error names the recipe key at fault.
func New(be backend.Backend, n int, cfg Config) (*Optimizer, error) {
	if cfg.Name == "" {
		cfg.Name = NameAdamW
	}
	if cfg.Implementation == "" {
		cfg.Implementation = ImplFused
	}
	if !slices.Contains(Names, cfg.Name) {
		return nil, fmt.Errorf("optimizer.name %q: titan has %q and %q", cfg.Name, NameAdamW, NameAdam)
	}
	if !slices.Contains(Implementations, cfg.Implementation) {
		return nil, fmt.Errorf("optimizer.implementation %q: want %q, %q or %q", cfg.Implementation, ImplFused, ImplForeach, ImplForLoop)
	}
	return &Optimizer{Cfg: cfg, M: be.Alloc(backend.Float32, n), V: be.Alloc(backend.Float32, n), be: be}, nil
}

// NewAdamW allocates zeroed moments for n parameters of an AdamW optimizer
// (cfg.Name is ignored). It panics on an unknown cfg.Implementation; use
// New to get an error instead.
func NewAdamW(be backend.Backend, n int, cfg AdamWConfig) *AdamW {
	cfg.Name = NameAdamW
	o, err := New(be, n, cfg)
	if err != nil {
		panic(err)
	}
	return o
}

// Name is the optimizer that runs: "AdamW" or "Adam".
func (o *Optimizer) Name() string { return o.Cfg.Name }

// Implementation is the implementation that runs: "fused", "foreach" or
// "for-loop".
func (o *Optimizer) Implementation() string { return o.Cfg.Implementation }

// Vectorized reports whether updates run the backend's vectorised kernel
// (fused, foreach) rather than the scalar loop (for-loop).
func (o *Optimizer) Vectorized() bool { return o.Cfg.Implementation != ImplForLoop }

// Update applies one step at learning rate lr to params with grads
// multiplied by gradScale.
func (o *Optimizer) Update(params, grads backend.Tensor, lr, gradScale float32) error {
	if params.Len != o.M.Len || grads.Len != o.M.Len {
		return fmt.Errorf("%s: state holds %d parameters, got %d parameters and %d gradients", o.Cfg.Name, o.M.Len, params.Len, grads.Len)
	}
	o.Step++
	c := o.Cfg
	if !o.Vectorized() {
		o.forLoop(params, grads, lr, gradScale)
		return nil
	}
	if c.Name == NameAdamW || c.WeightDecay == 0 {
		wd := c.WeightDecay
		if c.Name == NameAdam {
			wd = 0
		}
		o.be.AdamW(params, grads, o.M, o.V, lr, c.Beta1, c.Beta2, c.Eps, wd, gradScale, o.Step)
		return nil
	}
	// Adam with an L2 penalty: the AdamW kernel without decoupled decay,
	// on the gradient g*scale + weight_decay*p.
	if o.gwd.Len != params.Len {
		o.gwd = o.be.Alloc(backend.Float32, params.Len)
	}
	dst, ok1 := o.gwd.HostFloat32()
	gs, ok2 := grads.HostFloat32()
	ps, ok3 := params.HostFloat32()
	if ok1 && ok2 && ok3 {
		for i := range dst {
			dst[i] = l2Grad(gs[i]*gradScale, c.WeightDecay, ps[i])
		}
	} else {
		// A device backend: the same with two roundings instead of one.
		o.be.Copy(o.gwd, grads)
		if gradScale != 1 {
			o.be.Scale(o.gwd, gradScale)
		}
		o.be.Axpy(o.gwd, c.WeightDecay, params)
	}
	o.be.AdamW(params, o.gwd, o.M, o.V, lr, c.Beta1, c.Beta2, c.Eps, 0, 1, o.Step)
	return nil
}

// l2Grad is Adam's g + weight_decay*p rounded once, as the fused
// multiply-add of ATen's vectorised grad.add(param, alpha=weight_decay).
func l2Grad(g, wd, p float32) float32 {
	return float32(math.FMA(float64(wd), float64(p), float64(g)))
}

// forLoop is the for-loop implementation: torch's single-tensor Adam(W)
// arithmetic, one element at a time, in plain Go. Device tensors are
// copied to the host and back.
func (o *Optimizer) forLoop(params, grads backend.Tensor, lr, gradScale float32) {
	bufs := []backend.Tensor{params, grads, o.M, o.V}
	host := make([][]float32, len(bufs))
	copied := make([]bool, len(bufs))
	for i, t := range bufs {
		if h, ok := t.HostFloat32(); ok {
			host[i] = h
			continue
		}
		host[i] = make([]float32, t.Len)
		o.be.Download(host[i], t)
		copied[i] = true
	}
	ps, gs, ms, vs := host[0], host[1], host[2], host[3]
	c := o.Cfg
	adam := c.Name == NameAdam
	decay := float32(1)
	if !adam {
		decay = float32(1 - float64(lr)*float64(c.WeightDecay))
	}
	omb1 := float64(float32(1 - float64(c.Beta1)))
	omb2 := float32(1 - float64(c.Beta2))
	bc1 := 1 - math.Pow(float64(c.Beta1), float64(o.Step))
	bc2Sqrt := float32(math.Sqrt(1 - math.Pow(float64(c.Beta2), float64(o.Step))))
	negStep := float32(-(float64(lr) / bc1))
	for i := range ps {
		g := gs[i] * gradScale
		p := ps[i]
		if adam {
			g = l2Grad(g, c.WeightDecay, p)
		} else {
			p *= decay
		}
		// m*beta1 + (1-beta1)*g, rounded once as a fused multiply-add.
		m := float32(float64(g)*omb1 + float64(ms[i]*c.Beta1))
		v := vs[i]*c.Beta2 + omb2*g*g
		denom := float32(math.Sqrt(float64(v)))/bc2Sqrt + c.Eps
		ps[i] = p + negStep*m/denom
		ms[i], vs[i] = m, v
	}
	for i, t := range bufs {
		if copied[i] && i != 1 {
			o.be.Upload(t, host[i])
		}
	}
}

// ClipScale returns the global L2 norm of the gradients given their sum
// of squares (summed over every shard), and the factor that brings it down
// to maxNorm as torch.nn.utils.clip_grad_norm_ does (1 when the norm is
// already within maxNorm or maxNorm <= 0).
func ClipScale(sumSquares float64, maxNorm float32) (norm float64, scale float32) {
	norm = math.Sqrt(sumSquares)
	if maxNorm <= 0 {
		return norm, 1
	}
	coef := float32(maxNorm) / (float32(norm) + 1e-6)
	if coef > 1 {
		coef = 1
	}
	return norm, coef
}
