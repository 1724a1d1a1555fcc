package hyena

import (
	"fmt"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// TestStepperMatchesForward: running the model position by position with
// the Stepper, the long convolutions computed lazily from each layer's
// history of convolution inputs, gives the full forward's logits at every
// position, for orders 2 and 3 and a length short of l_max.
func TestStepperMatchesForward(t *testing.T) {
	be := newBackend(t)
	for _, order := range []int{2, 3} {
		t.Run(fmt.Sprintf("order %d", order), func(t *testing.T) {
			c := testConfig(order)
			const B, T = 2, 9 // l_max is 11
			D, V, O := c.DModel, c.PaddedVocab(), order-1
			m, err := New(be, c, B, T, Options{LogitChunk: V})
			if err != nil {
				t.Fatal(err)
			}
			be.Upload(m.Params, randomParams(c, 41))
			tokens, _ := batch(c, B*T, 6)
			if _, err := m.Forward(tokens, nil); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, B*T*V)
			if err := m.Logits(want); err != nil {
				t.Fatal(err)
			}

			s, err := NewStepper(be, c, m.P, B)
			if err != nil {
				t.Fatal(err)
			}
			state := s.NewState()
			filters := make([][]float32, c.NLayer) // [O, D, T] per layer
			for l := range filters {
				h := be.Alloc(backend.Float32, O*D*T)
				if err := s.Filters(l, T, h, backend.Tensor{}); err != nil {
					t.Fatal(err)
				}
				filters[l] = make([]float32, h.Len)
				be.Download(filters[l], h)
			}
			// hist[l][o][t] holds the o-th convolution's inputs [B, D] at position t.
			hist := make([][][][]float32, c.NLayer)
			for l := range hist {
				hist[l] = make([][][]float32, O)
			}
			a, u, y := be.Alloc(backend.Float32, B*D), be.Alloc(backend.Float32, B*D), be.Alloc(backend.Float32, B*D)
			logits := be.Alloc(backend.Float32, B*V)
			conv := func(l, o, t int) []float32 {
				out := make([]float32, B*D)
				for b := 0; b < B; b++ {
					for d := 0; d < D; d++ {
						var sum float64
						for j := 0; j <= t; j++ {
							sum += float64(filters[l][(o*D+d)*T+t-j]) * float64(hist[l][o][j][b*D+d])
						}
						out[b*D+d] = float32(sum)
					}
				}
				return out
			}
			var worst float64
			for pos := 0; pos < T; pos++ {
				tok := []int32{tokens[pos], tokens[T+pos]}
				if err := s.Embed(tok, a); err != nil {
					t.Fatal(err)
				}
				for l := 0; l < c.NLayer; l++ {
					s.Pre(l, &state[l], a, u)
					for o := 0; o < O; o++ {
						in := make([]float32, B*D)
						be.Download(in, u)
						hist[l][o] = append(hist[l][o], in)
						be.Upload(y, conv(l, o, pos))
						if o < O-1 {
							s.Mid(l, o, y, u)
						} else {
							s.Post(l, y, u, a)
						}
					}
				}
				s.Logits(a, logits)
				got := make([]float32, B*V)
				be.Download(got, logits)
				for b := 0; b < B; b++ {
					w := want[(b*T+pos)*V : (b*T+pos+1)*V]
					l2, mx := relErr(got[b*V:(b+1)*V], w)
					worst = max(worst, l2, mx)
					if l2 > 1e-5 || mx > 1e-5 {
						t.Errorf("position %d, sequence %d: logits relative error %.3g (L2), %.3g (max)", pos, b, l2, mx)
					}
				}
			}
			t.Logf("largest relative error of the stepped logits: %.2g", worst)
		})
	}
	s, _ := NewStepper(be, testConfig(2), newParams(testConfig(2), 2), 1)
	if err := s.Filters(0, testConfig(2).LMax+1, backend.Tensor{}, backend.Tensor{}); err == nil {
		t.Error("Filters accepted a length beyond l_max")
	}
}
