package cpu

import (
	"math"
	"testing"

	"github.com/titan-go/titan/internal/backend"
)

// refCrossEntropy returns each row's -log softmax(logits)[target] (0 for
// negative targets) and the gradient of scale*sum(losses), in float64.
func refCrossEntropy(logits []float64, targets []int32, N, V int, scale float64) (loss, grad []float64) {
	loss = make([]float64, N)
	grad = make([]float64, N*V)
	for i := 0; i < N; i++ {
		if targets[i] < 0 {
			continue
		}
		row := logits[i*V : (i+1)*V]
		m := math.Inf(-1)
		for _, x := range row {
			m = math.Max(m, x)
		}
		var s float64
		for _, x := range row {
			s += math.Exp(x - m)
		}
		lse := m + math.Log(s)
		loss[i] = lse - row[targets[i]]
		for j, x := range row {
			grad[i*V+j] = scale * math.Exp(x-lse)
		}
		grad[i*V+int(targets[i])] -= scale
	}
	return loss, grad
}

// chunkBounds splits V columns into n nearly equal chunks.
func chunkBounds(V, n int) []int {
	b := make([]int, n+1)
	for c := 0; c <= n; c++ {
		b[c] = V * c / n
	}
	return b
}

// runCrossEntropy computes losses and the logits gradient on the backend
// with the vocabulary split into chunks chunks.
func runCrossEntropy(b *Backend, logits []float32, targets []int32, N, V, chunks int, scale float32) (loss, grad []float32) {
	bounds := chunkBounds(V, chunks)
	tg := uploadI32(b, targets)
	stats := upload(b, randF32(newRand(1), 3*N, 100)) // Reset must overwrite
	b.CrossEntropyReset(stats, N)
	parts := make([]backend.Tensor, chunks)
	for c := range parts {
		lo, hi := bounds[c], bounds[c+1]
		part := make([]float32, 0, N*(hi-lo))
		for i := 0; i < N; i++ {
			part = append(part, logits[i*V+lo:i*V+hi]...)
		}
		parts[c] = upload(b, part)
		b.CrossEntropyChunk(stats, parts[c], tg, N, hi-lo, lo)
	}
	lt := b.Alloc(backend.Float32, N)
	b.CrossEntropyLoss(lt, stats, tg, N)
	grad = make([]float32, N*V)
	for c, p := range parts {
		lo, hi := bounds[c], bounds[c+1]
		b.CrossEntropyChunkBackward(p, stats, tg, N, hi-lo, lo, scale)
		g := download(b, p)
		for i := 0; i < N; i++ {
			copy(grad[i*V+lo:i*V+hi], g[i*(hi-lo):(i+1)*(hi-lo)])
		}
	}
	return download(b, lt), grad
}

func TestCrossEntropy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		N, V    int
		spread  float64 // logits uniform in [-spread, spread)
		offset  float32 // added to every logit
		threads int
	}{
		{"small", 5, 11, 3, 0, 1},
		{"wide", 9, 301, 8, 0, 3},
		{"large offset", 4, 40, 20, 3000, 2},
		{"very peaked", 6, 23, 150, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.threads)
			r := newRand(11)
			logits := randF32(r, tc.N*tc.V, tc.spread)
			for i := range logits {
				logits[i] += tc.offset
			}
			targets := make([]int32, tc.N)
			for i := range targets {
				targets[i] = int32(r.IntN(tc.V))
			}
			targets[1] = -1 // ignored
			targets[tc.N-1] = int32(tc.V - 1)
			const scale = 0.37
			l64 := f64s(logits)
			wantLoss, wantGrad := refCrossEntropy(l64, targets, tc.N, tc.V, scale)
			var first []float32
			for _, chunks := range []int{1, 3, 7} {
				loss, grad := runCrossEntropy(b, logits, targets, tc.N, tc.V, chunks, scale)
				checkClose(t, "loss", loss, wantLoss, 2e-5, 1e-5)
				checkClose(t, "grad", grad, wantGrad, 1e-7, 1e-5)
				if first == nil {
					first = loss
					checkGrads(t, r, func() float64 {
						l, _ := refCrossEntropy(l64, targets, tc.N, tc.V, scale)
						var s float64
						for _, v := range l {
							s += scale * v
						}
						return s
					}, []gradInput{{"logits", l64, grad}}, 60)
				} else {
					// Chunking changes only the rounding.
					checkClose(t, "chunked loss", loss, f64s(first), 1e-5, 1e-6)
				}
				if loss[1] != 0 {
					t.Errorf("%d chunks: ignored row has loss %v", chunks, loss[1])
				}
				for j := 0; j < tc.V; j++ {
					if grad[tc.V+j] != 0 {
						t.Fatalf("%d chunks: ignored row has gradient %v at %d", chunks, grad[tc.V+j], j)
					}
				}
			}
		})
	}
}

func TestCrossEntropyMissingTarget(t *testing.T) {
	b := newTestBackend(t, 1)
	// The target (5) lies outside the only chunk (columns 0..3).
	loss, _ := runCrossEntropy(b, []float32{1, 2, 3, 4}, []int32{5}, 1, 4, 1, 1)
	if !math.IsNaN(float64(loss[0])) {
		t.Errorf("loss = %v, want NaN for a target no chunk covers", loss[0])
	}
}

// TestCrossEntropyBF16Logits: on bfloat16 logits (mixed precision's
// output layer) the statistics after every chunk and the losses are bit
// for bit those of the same values in float32, and the gradient written
// over each chunk is the nearest-even rounding of the float32 gradient:
// one to three chunks, ignored rows and targets outside a chunk, 1 to 3
// threads, rows around the widening's vector blocks.
func TestCrossEntropyBF16Logits(t *testing.T) {
	for _, tc := range []struct{ N, V, chunks, threads int }{
		{5, 11, 1, 1}, {9, 301, 3, 3}, {4, 1000, 2, 2}, {33, 17, 1, 2},
	} {
		b := newTestBackend(t, tc.threads)
		r := newRand(uint64(tc.V))
		logits := roundBF16s(randF32(r, tc.N*tc.V, 6))
		targets := make([]int32, tc.N)
		for i := range targets {
			targets[i] = int32(r.IntN(tc.V))
		}
		targets[1] = -1
		tg := uploadI32(b, targets)
		bounds := chunkBounds(tc.V, tc.chunks)
		stats, statsH := b.Alloc(backend.Float32, 3*tc.N), b.Alloc(backend.Float32, 3*tc.N)
		b.CrossEntropyReset(stats, tc.N)
		b.CrossEntropyReset(statsH, tc.N)
		parts, partsH := make([]backend.Tensor, tc.chunks), make([]backend.Tensor, tc.chunks)
		for c := range parts {
			lo, hi := bounds[c], bounds[c+1]
			var part []float32
			for i := 0; i < tc.N; i++ {
				part = append(part, logits[i*tc.V+lo:i*tc.V+hi]...)
			}
			parts[c], partsH[c] = upload(b, part), uploadBF16(b, part)
			b.CrossEntropyChunk(stats, parts[c], tg, tc.N, hi-lo, lo)
			b.CrossEntropyChunk(statsH, partsH[c], tg, tc.N, hi-lo, lo)
			sameBits(t, "stats", download(b, statsH), download(b, stats))
		}
		loss, lossH := b.Alloc(backend.Float32, tc.N), b.Alloc(backend.Float32, tc.N)
		b.CrossEntropyLoss(loss, stats, tg, tc.N)
		b.CrossEntropyLoss(lossH, statsH, tg, tc.N)
		sameBits(t, "loss", download(b, lossH), download(b, loss))
		for c := range parts {
			lo, hi := bounds[c], bounds[c+1]
			b.CrossEntropyChunkBackward(parts[c], stats, tg, tc.N, hi-lo, lo, 0.37)
			b.CrossEntropyChunkBackward(partsH[c], statsH, tg, tc.N, hi-lo, lo, 0.37)
			sameRounding(t, "gradient", b, partsH[c], download(b, parts[c]))
		}
	}
}
