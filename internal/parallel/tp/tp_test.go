package tp

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/mesh"
)

// world runs f on cp×tp in-process ranks, each with its Comm.
func world(t *testing.T, cp, tp int, f func(rank int, c *Comm) error) {
	t.Helper()
	n := cp * tp
	msh, err := mesh.New(n, mesh.Degrees{PP: 1, DPReplicate: 1, DPShard: 1, CP: cp, TP: tp})
	if err != nil {
		t.Fatal(err)
	}
	st := comm.NewMemStore()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			g, err := comm.NewWorld(ctx, st, r, n, comm.Options{})
			if err != nil {
				errs[r] = err
				return
			}
			defer g.Close()
			c := &Comm{}
			for _, d := range []struct {
				dim string
				g   *comm.Group
			}{{"tp", &c.TP}, {"cp", &c.CP}} {
				ranks, _ := msh.Group(r, d.dim)
				if len(ranks) > 1 {
					if *d.g, err = g.NewGroup(ctx, ranks, d.dim); err != nil {
						errs[r] = err
						return
					}
				}
			}
			errs[r] = f(r, c)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestCommCollectives checks each operation against its definition on a
// 2 (cp) × 2 (tp) mesh, where tp peers are neighbouring ranks.
func TestCommCollectives(t *testing.T) {
	const cp, tp = 2, 2
	world(t, cp, tp, func(rank int, c *Comm) error {
		tr, cr := rank%tp, rank/tp
		x := []float32{float32(rank), float32(10 + rank)}
		all := make([]float32, 2*tp)
		if err := c.AllGatherSeq(x, all); err != nil {
			return err
		}
		base := float32(cr * tp)
		if want := []float32{base, 10 + base, base + 1, 11 + base}; !slices.Equal(all, want) {
			t.Errorf("rank %d: all-gather %v, want %v", rank, all, want)
		}
		send := []float32{1, 2, float32(rank), 4}
		recv := make([]float32, 2)
		if err := c.ReduceScatterSeq(send, recv); err != nil {
			return err
		}
		want := []float32{2, 4}
		if tr == 1 {
			want = []float32{2*base + 1, 8}
		}
		if !slices.Equal(recv, want) {
			t.Errorf("rank %d: reduce-scatter %v, want %v", rank, recv, want)
		}
		m := []float32{float32(tr), -float32(tr)}
		if err := c.AllReduceTP(m, true); err != nil {
			return err
		}
		if !slices.Equal(m, []float32{1, 0}) {
			t.Errorf("rank %d: max %v, want [1 0]", rank, m)
		}
		got := make([]float32, 1)
		if err := c.RingShiftAsync([]float32{float32(cr)}, got)(); err != nil {
			return err
		}
		if want := float32((cr + cp - 1) % cp); got[0] != want {
			t.Errorf("rank %d: ring received %v, want %v", rank, got[0], want)
		}
		return nil
	})
}
