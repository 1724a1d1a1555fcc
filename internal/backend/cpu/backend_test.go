package cpu

import (
	"slices"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu/workpool"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct{ threads, want int }{
		{1, 1}, {3, 3}, {0, workpool.DefaultThreads()}, {-2, workpool.DefaultThreads()},
	} {
		b := newTestBackend(t, tc.threads)
		if b.Threads() != tc.want {
			t.Errorf("New(%d).Threads() = %d, want %d", tc.threads, b.Threads(), tc.want)
		}
		if b.Name() != "cpu" {
			t.Errorf("Name() = %q", b.Name())
		}
		b.Sync()
	}
}

// TestConcurrentUse runs attention, which uses the backend's scratch
// memory, from several goroutines at once (run with -race).
func TestConcurrentUse(t *testing.T) {
	for _, threads := range []int{1, 2} {
		b := newTestBackend(t, threads)
		b.attnTile = 8
		d := backend.AttentionDims{B: 2, Tq: 20, Tk: 20, NH: 2, NKV: 1, HD: 8}
		r := newRand(9)
		nq, nk := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD
		q, k, v := upload(b, randF32(r, nq, 1)), upload(b, randF32(r, nk, 1)), upload(b, randF32(r, nk, 1))
		const goroutines = 4
		outs := make([][]float32, goroutines)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := b.Alloc(backend.Float32, nq)
				lse := b.Alloc(backend.Float32, d.B*d.NH*d.Tq)
				for range 5 {
					b.AttentionForward(out, lse, q, k, v, d)
					b.Scale(out, 1)
				}
				outs[g] = download(b, out)
			}()
		}
		wg.Wait()
		for g := 1; g < goroutines; g++ {
			if !slices.Equal(f32bits(outs[g]), f32bits(outs[0])) {
				t.Errorf("threads=%d: goroutine %d got a different result", threads, g)
			}
		}
	}
}

// TestThreadIndependence runs the non-attention operations on problems
// large enough to be split among workers and checks that 1 and 3 threads
// give the same bits (attention has its own test).
func TestThreadIndependence(t *testing.T) {
	const N, C, V, rows = 2000, 64, 300, 50
	run := func(threads int) [][]float32 {
		b := newTestBackend(t, threads)
		r := newRand(10)
		x, w, d := upload(b, randF32(r, N*C, 1)), upload(b, randF32(r, C, 1)), upload(b, randF32(r, N*C, 1))
		tg := make([]int32, N)
		for i := range tg {
			tg[i] = int32(r.IntN(rows))
		}
		tok := uploadI32(b, tg)
		var res [][]float32

		out, rstd := b.Alloc(backend.Float32, N*C), b.Alloc(backend.Float32, N)
		dx, dw := b.Alloc(backend.Float32, N*C), b.Alloc(backend.Float32, C)
		b.RMSNormForward(out, rstd, x, w, N, C, 1e-5)
		b.RMSNormBackward(dx, dw, d, x, w, rstd, N, C)
		res = append(res, download(b, out), download(b, rstd), download(b, dx), download(b, dw))

		dtab := b.Alloc(backend.Float32, rows*C)
		b.EmbeddingBackward(dtab, d, tok, N, C)
		res = append(res, download(b, dtab))

		dg, du := b.Alloc(backend.Float32, N*C), b.Alloc(backend.Float32, N*C)
		b.SwiGLUForward(out, x, d, N*C)
		b.SwiGLUBackward(dg, du, d, x, out, N*C)
		res = append(res, download(b, out), download(b, dg), download(b, du))

		logits := upload(b, randF32(r, N*V, 5))
		stats, losses := b.Alloc(backend.Float32, 3*N), b.Alloc(backend.Float32, N)
		b.CrossEntropyReset(stats, N)
		b.CrossEntropyChunk(stats, logits, tok, N, V, 0)
		b.CrossEntropyLoss(losses, stats, tok, N)
		b.CrossEntropyChunkBackward(logits, stats, tok, N, V, 0, 0.5)
		res = append(res, download(b, losses), download(b, logits))

		m, v := b.Alloc(backend.Float32, N*C), b.Alloc(backend.Float32, N*C)
		for step := 1; step <= 2; step++ {
			b.AdamW(x, d, m, v, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.7, step)
		}
		res = append(res, download(b, x), download(b, m), download(b, v))
		return res
	}
	one, three := run(1), run(3)
	for i := range one {
		if !slices.Equal(f32bits(one[i]), f32bits(three[i])) {
			t.Errorf("result %d differs between 1 and 3 threads", i)
		}
	}
}
