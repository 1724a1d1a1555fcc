package checkpoint

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// benchSetup is the state size (TITAN_BENCH_CKPT_MIB, default 64 MiB)
// and the folder (TITAN_BENCH_DIR, default a temporary one) of the
// save/load benchmarks; bench/checkpoint/compare.sh sets both to measure
// beside dd on the same disk.
func benchSetup(b *testing.B) (elems int, dir string) {
	mib := 64
	if v, err := strconv.Atoi(os.Getenv("TITAN_BENCH_CKPT_MIB")); err == nil && v > 0 {
		mib = v
	}
	dir = b.TempDir()
	if d := os.Getenv("TITAN_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "bench-ckpt-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	return mib << 18, dir
}

// benchShards is rank's quarter-by-ranks range of one big tensor.
func benchShards(data []float32, ranks, rank int) []Shard {
	n := len(data)
	lo, hi := n*rank/ranks, n*(rank+1)/ranks
	return []Shard{{Name: "w", Shape: []int{n}, Offset: lo, Data: data[lo:hi]}}
}

// saveRanks writes step's checkpoint of data as ranks writers in
// parallel, rank 0 committing, as a training job's ranks do.
func saveRanks(dir string, step int, data []float32, ranks int) error {
	session := NewSession()
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for r := 0; r < ranks; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := Begin(dir, step, session, ranks)
			if err == nil {
				err = p.WritePart(r, benchShards(data, ranks, r), nil)
			}
			if err == nil && r == 0 {
				err = p.Commit(Layout{World: ranks}, time.Minute)
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkSave is the throughput of a save (write, fsync, commit) of the
// whole state by 1 and 4 ranks writing their shards in parallel.
func BenchmarkSave(b *testing.B) {
	n, dir := benchSetup(b)
	data := make([]float32, n)
	for i := range data {
		data[i] = float32(i)
	}
	for _, ranks := range []int{1, 4} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			b.SetBytes(int64(4 * n))
			for i := 0; i < b.N; i++ {
				if err := saveRanks(dir, i, data, ranks); err != nil {
					b.Fatal(err)
				}
				if err := Purge(dir, 2); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoad is the throughput of loading the whole state by 1 and 4
// ranks, each as a trainer does: open, verify every checksum (every rank
// checks the whole checkpoint, so that all choose the same one), then
// read its own range.
func BenchmarkLoad(b *testing.B) {
	n, dir := benchSetup(b)
	data := make([]float32, n)
	if err := saveRanks(dir, 1, data, 4); err != nil {
		b.Fatal(err)
	}
	for _, ranks := range []int{1, 4} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			b.SetBytes(int64(4 * n))
			for i := 0; i < b.N; i++ {
				errs := make([]error, ranks)
				var wg sync.WaitGroup
				for r := 0; r < ranks; r++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rd, err := Open(StepDir(dir, 1))
						if err == nil {
							err = rd.Verify()
						}
						if err == nil {
							s := benchShards(data, ranks, r)[0]
							err = rd.Read("w", s.Offset, make([]float32, len(s.Data)))
						}
						if rd != nil {
							rd.Close()
						}
						errs[r] = err
					}()
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
