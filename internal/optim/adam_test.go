package optim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/titan-go/titan/internal/testenv"
	"math"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
)

const python = testenv.Python

// case of the optimizer tests: hyperparameters and a few steps of
// gradients with their clipping scales.
type optCase struct {
	Name        string      `json:"name"`
	LR          float32     `json:"lr"`
	Beta1       float32     `json:"beta1"`
	Beta2       float32     `json:"beta2"`
	Eps         float32     `json:"eps"`
	WeightDecay float32     `json:"weight_decay"`
	Params      []float32   `json:"params"`
	Grads       [][]float32 `json:"grads"`
	Scales      []float32   `json:"scales"`
}

func newCase(name string, n, steps int, wd float32, seed uint64) optCase {
	r := rand.New(rand.NewPCG(seed, 7))
	c := optCase{Name: name, LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: wd}
	for i := 0; i < n; i++ {
		c.Params = append(c.Params, float32(r.NormFloat64()))
	}
	for s := 0; s < steps; s++ {
		g := make([]float32, n)
		for i := range g {
			g[i] = float32(r.NormFloat64() * 0.3)
		}
		c.Grads = append(c.Grads, g)
		c.Scales = append(c.Scales, []float32{1, 0.5, 0.8125}[s%3])
	}
	return c
}

// state is the optimizer state after the steps.
type state struct{ P, M, V []float32 }

func runTitan(t *testing.T, c optCase, impl string, threads int) state {
	t.Helper()
	be := cpu.New(threads)
	n := len(c.Params)
	o, err := New(be, n, Config{Name: c.Name, Implementation: impl, LR: c.LR, Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, WeightDecay: c.WeightDecay})
	if err != nil {
		t.Fatal(err)
	}
	p, g := be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, n)
	be.Upload(p, c.Params)
	for s, gs := range c.Grads {
		be.Upload(g, gs)
		if err := o.Update(p, g, c.LR, c.Scales[s]); err != nil {
			t.Fatal(err)
		}
	}
	out := state{make([]float32, n), make([]float32, n), make([]float32, n)}
	be.Download(out.P, p)
	be.Download(out.M, o.M)
	be.Download(out.V, o.V)
	return out
}

// torchScript runs torch.optim.Adam or AdamW (single-tensor path) on the
// case read from stdin, scaling the gradients as clip_grad_norm_ does.
const torchScript = `
import json, sys, torch
c = json.load(sys.stdin)
p = torch.tensor(c["params"], dtype=torch.float32, requires_grad=True)
cls = {"Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}[c["name"]]
opt = cls([p], lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"], weight_decay=c["weight_decay"], foreach=False)
for g, s in zip(c["grads"], c["scales"]):
    p.grad = torch.tensor(g, dtype=torch.float32)
    p.grad.mul_(s)
    opt.step()
st = opt.state[p]
json.dump({"P": p.detach().tolist(), "M": st["exp_avg"].tolist(), "V": st["exp_avg_sq"].tolist()}, sys.stdout)
`

func runTorch(t *testing.T, c optCase) state {
	t.Helper()
	in, _ := json.Marshal(c)
	cmd := exec.Command(python, "-c", torchScript)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("torch: %v\n%s", err, stderr.String())
	}
	var s state
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// closeTo reports the first element of got and want that differ by more
// than rel relative to want's element plus its mean magnitude: an element
// that a cancellation brought near zero (Adam's g + weight_decay*p, with g
// close to -weight_decay*p) is compared at the scale of its terms, since a
// one-ulp difference in p moves it by more than rel of itself.
func closeTo(got, want []float32, rel float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d elements, want %d", len(got), len(want))
	}
	var mean float64
	for _, w := range want {
		mean += math.Abs(float64(w)) / float64(len(want))
	}
	for i := range got {
		a, b := float64(got[i]), float64(want[i])
		if math.Abs(a-b) > rel*(math.Abs(b)+mean) {
			return fmt.Errorf("element %d: %.9g, want %.9g (relative %.3g)", i, a, b, math.Abs(a-b)/math.Abs(b))
		}
	}
	return nil
}

func compare(t *testing.T, what string, got, want state, rel float64) {
	t.Helper()
	for _, x := range []struct {
		name      string
		got, want []float32
	}{{"params", got.P, want.P}, {"exp_avg", got.M, want.M}, {"exp_avg_sq", got.V, want.V}} {
		if err := closeTo(x.got, x.want, rel); err != nil {
			t.Errorf("%s %s: %v", what, x.name, err)
		}
	}
}

// TestMatchesPyTorch: Adam (L2 weight decay) and AdamW (decoupled weight
// decay), with every implementation, follow torch.optim.Adam and
// torch.optim.AdamW within 1e-6 relative over a few clipped steps.
func TestMatchesPyTorch(t *testing.T) {
	testenv.Torch(t)
	for _, name := range Names {
		for _, wd := range []float32{0, 0.1} {
			// 77 elements: vector blocks and a scalar tail.
			c := newCase(name, 77, 5, wd, 3)
			want := runTorch(t, c)
			for _, impl := range Implementations {
				compare(t, fmt.Sprintf("%s wd=%g %s", name, wd, impl), runTitan(t, c, impl, 2), want, 1e-6)
			}
		}
	}
}

// TestAdamAndAdamWDiffer: with weight decay the two optimizers give
// different parameters (so optimizer.name does something), and without it
// the same ones.
func TestAdamAndAdamWDiffer(t *testing.T) {
	for _, wd := range []float32{0, 0.1} {
		c := newCase(NameAdamW, 40, 4, wd, 5)
		w := runTitan(t, c, ImplFused, 1)
		c.Name = NameAdam
		a := runTitan(t, c, ImplFused, 1)
		err := closeTo(a.P, w.P, 1e-7)
		if wd == 0 && err != nil {
			t.Errorf("no weight decay: Adam and AdamW differ: %v", err)
		}
		if wd != 0 && err == nil {
			t.Error("weight decay 0.1: Adam and AdamW give the same parameters")
		}
	}
}

// TestImplementationsAgree: the for-loop scalar loop and the vectorised
// fused and foreach kernels agree within 1e-6 relative, on a buffer large
// enough to be split over threads; each reports which one it runs.
func TestImplementationsAgree(t *testing.T) {
	for _, name := range Names {
		c := newCase(name, 70001, 3, 0.1, 9)
		ref := runTitan(t, c, ImplForLoop, 2)
		for _, impl := range []string{ImplFused, ImplForeach} {
			compare(t, name+" "+impl+" vs for-loop", runTitan(t, c, impl, 2), ref, 1e-6)
		}
	}
	be := cpu.New(1)
	for _, tc := range []struct {
		name, impl string
		wantName   string
		wantImpl   string
		vectorized bool
	}{
		{"", "", NameAdamW, ImplFused, true},
		{"Adam", "foreach", NameAdam, ImplForeach, true},
		{"AdamW", "for-loop", NameAdamW, ImplForLoop, false},
	} {
		o, err := New(be, 4, Config{Name: tc.name, Implementation: tc.impl})
		if err != nil {
			t.Fatal(err)
		}
		if o.Name() != tc.wantName || o.Implementation() != tc.wantImpl || o.Vectorized() != tc.vectorized {
			t.Errorf("New(%q, %q): runs %s %s vectorized=%v, want %s %s %v", tc.name, tc.impl,
				o.Name(), o.Implementation(), o.Vectorized(), tc.wantName, tc.wantImpl, tc.vectorized)
		}
	}
}

// TestNewRefusesUnknown: an unknown name or implementation is an error
// naming the recipe key.
func TestNewRefusesUnknown(t *testing.T) {
	be := cpu.New(1)
	for _, tc := range []struct {
		cfg Config
		key string
	}{
		{Config{Name: "SGD"}, "optimizer.name"},
		{Config{Name: "adamw"}, "optimizer.name"},
		{Config{Implementation: "forloop"}, "optimizer.implementation"},
	} {
		_, err := New(be, 4, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.key)
		}
	}
}

// TestForLoopDeviceFallback: the for-loop implementation also works on
// tensors that are not host slices (copied through Download/Upload).
func TestForLoopDeviceFallback(t *testing.T) {
	c := newCase(NameAdam, 33, 3, 0.1, 11)
	ref := runTitan(t, c, ImplForLoop, 1)
	be := deviceLike{cpu.New(1)}
	o, _ := New(be, 33, Config{Name: c.Name, Implementation: ImplForLoop, LR: c.LR, Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, WeightDecay: c.WeightDecay})
	p, g := be.Alloc(backend.Float32, 33), be.Alloc(backend.Float32, 33)
	be.Upload(p, c.Params)
	for s, gs := range c.Grads {
		be.Upload(g, gs)
		o.Update(p, g, c.LR, c.Scales[s])
	}
	got := make([]float32, 33)
	be.Download(got, p)
	if err := closeTo(got, ref.P, 0); err != nil {
		t.Error(err)
	}
}

// deviceLike hides host memory behind a wrapper, as a device backend would.
type deviceLike struct{ *cpu.Backend }

type devMem struct{ data []float32 }

func (d deviceLike) Alloc(dt backend.DType, n int) backend.Tensor {
	return backend.Tensor{Mem: &backend.Memory{DType: dt, Len: n, Host: &devMem{make([]float32, n)}}, Len: n}
}
func (d deviceLike) Upload(dst backend.Tensor, src any) {
	copy(dst.Mem.Host.(*devMem).data[dst.Off:dst.Off+dst.Len], src.([]float32))
}
func (d deviceLike) Download(dst any, src backend.Tensor) {
	copy(dst.([]float32), src.Mem.Host.(*devMem).data[src.Off:src.Off+src.Len])
}
