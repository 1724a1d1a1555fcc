package llama

import (
	"bytes"
	"encoding/json"
	"github.com/titan-go/titan/internal/testenv"
	"math"
	"strings"
	"testing"
)

// reference is the PyTorch golden file written by testdata/reference.py.
type reference struct {
	Config struct {
		Dim, NLayers, NHeads, NKVHeads, VocabSize int
		FFNHidden, MultipleOf                     int
		NormEps, RoPETheta                        float64
		RoPEScaling                               struct {
			Factor, LowFreqFactor, HighFreqFactor float64
			OriginalMaxPositionEmbeddings         int
		}
		Batch, SeqLen                               int
		LR, Beta1, Beta2, Eps, WeightDecay, MaxNorm float64
		Steps                                       int
	}
	f32 map[string][]float32
	i32 map[string][]int32
}

func loadReference(t *testing.T, path string) *reference {
	t.Helper()
	r := testenv.ReadRef(t, path)
	ref := &reference{f32: r.F32, i32: r.I32}
	// The JSON uses snake_case keys; map them onto the struct.
	if err := json.NewDecoder(bytes.NewReader(snakeToCamel(r.Config))).Decode(&ref.Config); err != nil {
		t.Fatalf("%s: config: %v", path, err)
	}
	return ref
}

// snakeToCamel rewrites the JSON object keys of a flat-ish object from
// snake_case to the field names above (encoding/json matches case-insensitively).
func snakeToCamel(js []byte) []byte {
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		return js
	}
	var conv func(v any) any
	conv = func(v any) any {
		obj, ok := v.(map[string]any)
		if !ok {
			return v
		}
		out := map[string]any{}
		for k, x := range obj {
			key := ""
			for _, part := range bytes.Split([]byte(k), []byte("_")) {
				key += string(part)
			}
			out[key] = conv(x)
		}
		return out
	}
	out, _ := json.Marshal(conv(m))
	return out
}

// relErr returns the normwise relative differences of got from want:
// ‖got−want‖₂/‖want‖₂ and max|got−want| / max|want|.
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

func (r *reference) llamaConfig() Config {
	c := r.Config
	return Config{
		Dim: c.Dim, NLayers: c.NLayers, NHeads: c.NHeads, NKVHeads: c.NKVHeads,
		VocabSize: c.VocabSize, MultipleOf: c.MultipleOf, NormEps: c.NormEps,
		RoPETheta: c.RoPETheta, MaxSeqLen: c.SeqLen,
		RoPEScaling: RoPEScaling{
			Factor: c.RoPEScaling.Factor, LowFreqFactor: c.RoPEScaling.LowFreqFactor,
			HighFreqFactor: c.RoPEScaling.HighFreqFactor, OriginalMaxPositionEmbeddings: c.RoPEScaling.OriginalMaxPositionEmbeddings,
		},
	}
}

func (r *reference) flatParams(t *testing.T, cfg Config, prefix string) []float32 {
	t.Helper()
	flat := make([]float32, cfg.NumParams())
	for _, p := range cfg.Layout() {
		v, ok := r.f32[prefix+p.Name]
		if !ok || len(v) != p.Size {
			t.Fatalf("golden file lacks %s%s with %d elements", prefix, p.Name, p.Size)
		}
		copy(flat[p.Offset:], v)
	}
	return flat
}

// checkClose requires the L2 relative error to be within tol and the
// max-norm relative error within 10·tol. The looser outlier bound is for
// AdamW: an element whose gradient is a millionth of the tensor's largest
// has a float32 gradient with only a few correct digits, and Adam's
// normalisation turns that into a full-size difference in its update.
func checkClose(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	l2, maxRel := relErr(got, want)
	cat := strings.Fields(what)[0]
	w := worst[cat]
	worst[cat] = [2]float64{math.Max(w[0], l2), math.Max(w[1], maxRel)}
	if l2 > tol || maxRel > 10*tol || math.IsNaN(l2) || math.IsNaN(maxRel) {
		t.Errorf("%s: relative error %.3g (L2), %.3g (max); want <= %.0g and <= %.0g", what, l2, maxRel, tol, 10*tol)
	}
}

// worst holds the largest errors seen per check category (first word).
var worst = map[string][2]float64{}

func paramSlice(flat []float32, p Param) []float32 { return flat[p.Offset : p.Offset+p.Size] }
