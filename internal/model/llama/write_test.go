package llama

import (
	"testing"
)

// TestWriteLocalInvertsShardFlat: every tp rank's flat buffer, written in
// uneven ranges (as FSDP shards cut it) with WriteLocal, puts every
// element of the whole model exactly once and at its place; replicated
// parameters come from tp rank 0 only.
func TestWriteLocalInvertsShardFlat(t *testing.T) {
	cfg, err := Flavor("tiny_bench")
	if err != nil {
		t.Fatal(err)
	}
	n := int(cfg.NumParams())
	full := make([]float32, n)
	for i := range full {
		full[i] = float32(i)
	}
	offsets := map[string]int{}
	for _, p := range cfg.Layout() {
		offsets[p.Name] = p.Offset
	}
	for _, tp := range []int{1, 2, 4} {
		got := make([]float32, n)
		seen := make([]int, n)
		for r := 0; r < tp; r++ {
			local := ShardFlat(cfg, tp, r, full)
			lay := cfg.ShardLayout(tp)
			for lo := 0; lo < len(local); {
				hi := min(len(local), lo+977) // ranges that cross tensors and rows
				WriteLocal(lay, tp, r, lo, local[lo:hi], func(name string, shape []int, off int, data []float32) {
					base := offsets[name]
					for j, v := range data {
						got[base+off+j] = v
						seen[base+off+j]++
					}
				})
				lo = hi
			}
		}
		for i := range full {
			if seen[i] != 1 || got[i] != full[i] {
				t.Fatalf("tp %d: element %d put %d times, value %v want %v", tp, i, seen[i], got[i], full[i])
			}
		}
	}
}
