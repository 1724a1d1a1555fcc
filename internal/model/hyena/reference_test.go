package hyena

import (
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/testenv"
)

// reference is a golden file written by testdata/reference.py.
type reference struct {
	cfg  Config
	B, T int
	f32  map[string][]float32
	i32  map[string][]int32
}

// loadReference reads a TITANREF file (the format of
// testdata/reference.py).
func loadReference(t *testing.T, path string) *reference {
	t.Helper()
	r := testenv.ReadRef(t, path)
	var hdr struct {
		DModel               int     `json:"d_model"`
		NLayer               int     `json:"n_layer"`
		DInner               int     `json:"d_inner"`
		VocabSize            int     `json:"vocab_size"`
		PadVocabSizeMultiple int     `json:"pad_vocab_size_multiple"`
		Order                int     `json:"order"`
		EmbDim               int     `json:"emb_dim"`
		FilterOrder          int     `json:"filter_order"`
		ShortFilterOrder     int     `json:"short_filter_order"`
		NumInnerMLPs         int     `json:"num_inner_mlps"`
		LMax                 int     `json:"l_max"`
		W                    float64 `json:"w"`
		Modulate             bool    `json:"modulate"`
		NormEps              float64 `json:"layer_norm_epsilon"`
		Batch                int     `json:"batch"`
		SeqLen               int     `json:"seq_len"`
	}
	if err := json.Unmarshal(r.Config, &hdr); err != nil {
		t.Fatalf("%s: config: %v", path, err)
	}
	h := hdr
	ref := &reference{
		cfg: Config{
			DModel: h.DModel, NLayer: h.NLayer, DInner: h.DInner, VocabSize: h.VocabSize,
			PadVocabSizeMultiple: h.PadVocabSizeMultiple, Order: h.Order, EmbDim: h.EmbDim,
			FilterOrder: h.FilterOrder, ShortFilterOrder: h.ShortFilterOrder, NumInnerMLPs: h.NumInnerMLPs,
			LMax: h.LMax, W: h.W, Modulate: h.Modulate, NormEps: h.NormEps, InitializerRange: 0.02,
		},
		B: h.Batch, T: h.SeqLen,
		f32: r.F32, i32: r.I32,
	}
	return ref
}

// flat returns the tensors prefix+<parameter> as a whole-model flat
// buffer.
func (r *reference) flat(t *testing.T, prefix string) []float32 {
	t.Helper()
	out := make([]float32, r.cfg.NumParams())
	for _, p := range r.cfg.Layout() {
		v, ok := r.f32[prefix+p.Name]
		if !ok || len(v) != p.Size {
			t.Fatalf("golden file lacks %s%s with %d elements", prefix, p.Name, p.Size)
		}
		copy(out[p.Offset:], v)
	}
	return out
}

// relErr returns ‖got−want‖₂/‖want‖₂ and max|got−want| / max|want|.
func relErr(got, want []float32) (l2, maxRel float64) {
	var d2, w2, dmax, wmax float64
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		w := math.Abs(float64(want[i]))
		d2, w2 = d2+d*d, w2+w*w
		dmax, wmax = math.Max(dmax, d), math.Max(wmax, w)
	}
	if w2 == 0 {
		return math.Sqrt(d2), dmax
	}
	return math.Sqrt(d2 / w2), dmax / wmax
}

// goldenFiles are the reference files of orders 2 and 3.
var goldenFiles = []string{"testdata/hyena_o2_reference.bin", "testdata/hyena_o3_reference.bin"}

// TestPyTorchParity: the logits, the mean loss and every parameter's
// gradient of the float32 Go model equal the float64 PyTorch reference's
// (testdata/reference.py, an independent implementation from the
// definition) within float32 accuracy, for orders 2 and 3.
func TestPyTorchParity(t *testing.T) {
	be := newBackend(t)
	for _, path := range goldenFiles {
		t.Run(filepath.Base(path), func(t *testing.T) {
			ref := loadReference(t, path)
			cfg := ref.cfg
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			m, err := New(be, cfg, ref.B, ref.T, Options{LogitChunk: cfg.PaddedVocab()})
			if err != nil {
				t.Fatal(err)
			}
			be.Upload(m.Params, ref.flat(t, "params/"))
			loss, err := m.Forward(ref.i32["tokens"], ref.i32["targets"])
			if err != nil {
				t.Fatal(err)
			}
			logits := make([]float32, ref.B*ref.T*cfg.PaddedVocab())
			if err := m.Logits(logits); err != nil {
				t.Fatal(err)
			}
			worst := map[string]float64{}
			check := func(what string, got, want []float32, tol float64) {
				t.Helper()
				l2, mx := relErr(got, want)
				cat := strings.Fields(what)[0]
				worst[cat] = math.Max(worst[cat], math.Max(l2, mx))
				if l2 > tol || mx > 10*tol || math.IsNaN(l2) {
					t.Errorf("%s: relative error %.3g (L2), %.3g (max); want <= %.0g and <= %.0g", what, l2, mx, tol, 10*tol)
				}
			}
			check("logits", logits, ref.f32["logits"], 1e-5)
			check("loss", []float32{loss}, ref.f32["loss"], 1e-6)
			m.ZeroGrad()
			if err := m.Backward(1 / float32(m.NumTargets())); err != nil {
				t.Fatal(err)
			}
			grads := make([]float32, m.LocalSize())
			be.Download(grads, m.Grads)
			want := ref.flat(t, "grads/")
			for _, p := range cfg.Layout() {
				check("grads "+p.Name, grads[p.Offset:p.Offset+p.Size], want[p.Offset:p.Offset+p.Size], 1e-5)
			}
			t.Logf("largest relative errors (max of L2 and max-norm): logits %.2g, loss %.2g, gradients %.2g", worst["logits"], worst["loss"], worst["grads"])
		})
	}
}

// TestReferenceScriptReproducesGolden runs testdata/reference.py (with
// its self-checks: FFT against direct convolution, the operator against
// a loop implementation, causality, finite differences) into a temporary
// folder and requires the committed golden files to be what it writes.
// It needs PyTorch: it is skipped without it, and fails in CI.
func TestReferenceScriptReproducesGolden(t *testing.T) {
	py := testenv.Torch(t)
	testenv.PythonModule(t, "numpy")
	dir := t.TempDir()
	out, err := exec.Command(py, "testdata/reference.py", "--out", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("reference.py: %v\n%s", err, out)
	}
	for _, path := range goldenFiles {
		got := loadReference(t, filepath.Join(dir, filepath.Base(path)))
		want := loadReference(t, path)
		for name, w := range want.f32 {
			g := got.f32[name]
			if l2, mx := relErr(g, w); len(g) != len(w) || l2 > 1e-6 || mx > 1e-6 {
				t.Errorf("%s: %s differs from the regenerated file (%d vs %d elements, relative error %.2g, %.2g)", path, name, len(g), len(w), l2, mx)
			}
		}
		if fmt.Sprint(got.i32) != fmt.Sprint(want.i32) || len(got.f32) != len(want.f32) {
			t.Errorf("%s: tokens, targets or tensor list differ from the regenerated file", path)
		}
	}
}
