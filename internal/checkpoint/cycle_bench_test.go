package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// debugShards is the state one rank of recipes/llama3_debug.toml saves
// (model, exp_avg and exp_avg_sq of Llama 3's "debug" flavor: dim 256,
// 6 layers, ffn 768, vocabulary 2048), laid out as internal/parallel
// hands it over: whole tensors, except the row-parallel wo and w2, which
// arrive one row per shard, 9216 of the 9351 shards. With interleave,
// the rows of each layer's wo and w2 alternate, so that none continues
// the shard before it: each is a chunk of its own, as the rows of a
// tensor-parallel run's shards are (and as every row was before
// contiguous shards were written as one chunk).
func debugShards(interleave bool) []Shard {
	const dim, ffn, vocab, layers = 256, 768, 2048, 6
	type tensor struct {
		name       string
		shape      []int
		rowsShards bool
	}
	var model []tensor
	model = append(model, tensor{"tok_embeddings.weight", []int{vocab, dim}, false})
	for l := 0; l < layers; l++ {
		p := fmt.Sprintf("layers.%d.", l)
		model = append(model,
			tensor{p + "attention.wq.weight", []int{dim, dim}, false},
			tensor{p + "attention.wk.weight", []int{dim, dim}, false},
			tensor{p + "attention.wv.weight", []int{dim, dim}, false},
			tensor{p + "attention.wo.weight", []int{dim, dim}, true},
			tensor{p + "feed_forward.w1.weight", []int{ffn, dim}, false},
			tensor{p + "feed_forward.w2.weight", []int{dim, ffn}, true},
			tensor{p + "feed_forward.w3.weight", []int{ffn, dim}, false},
			tensor{p + "attention_norm.weight", []int{dim}, false},
			tensor{p + "ffn_norm.weight", []int{dim}, false},
		)
	}
	model = append(model, tensor{"norm.weight", []int{dim}, false}, tensor{"output.weight", []int{vocab, dim}, false})
	total := 0
	for _, t := range model {
		total += numel(t.shape)
	}
	data := make([]float32, 3*total)
	for i := range data {
		data[i] = float32(i%1000) / 1000
	}
	var shards []Shard
	at := 0
	for _, prefix := range []string{"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"} {
		var rows [][]Shard // a layer's row shards of wo and w2, to interleave
		for _, t := range model {
			n, row := numel(t.shape), numel(t.shape)
			if t.rowsShards {
				row = t.shape[len(t.shape)-1]
			}
			var ts []Shard
			for off := 0; off < n; off += row {
				ts = append(ts, Shard{Name: prefix + t.name, Shape: t.shape, Offset: off, Data: data[at : at+row]})
				at += row
			}
			if !t.rowsShards || !interleave {
				shards = append(shards, ts...)
				continue
			}
			if rows = append(rows, ts); len(rows) == 2 {
				for r := range max(len(rows[0]), len(rows[1])) {
					for _, rs := range rows {
						if r < len(rs) {
							shards = append(shards, rs[r])
						}
					}
				}
				rows = nil
			}
		}
	}
	return shards
}

// debugBlobs are the small states rank 0 saves with a full checkpoint of
// the debug recipe, at about their sizes.
func debugBlobs() map[string][]byte {
	return map[string][]byte{
		TrainStateBlob:        []byte(`{"step":50,"opt_step":50,"seed":42,"flavor":"debug","elapsed_s":12.5}`),
		"model_config.json":   []byte(`{"name":"llama3","flavor":"debug"` + strings.Repeat(" ", 320) + `}`),
		"dataloader.json":     []byte(`{"pos":"` + strings.Repeat("0", 64<<10) + `"}`),
		"val_dataloader.json": []byte(`{"pos":"` + strings.Repeat("0", 2<<10) + `"}`),
	}
}

// saveCycle is what rank 0 of a one-rank training run does at every
// save (internal/train's snapshot): Begin, WritePart, Commit, then Purge
// down to keep checkpoints.
func saveCycle(dir string, step int, session string, shards []Shard, blobs map[string][]byte, keep int) error {
	p, err := Begin(dir, step, session, 1)
	if err != nil {
		return err
	}
	if err := p.WritePart(0, shards, blobs); err != nil {
		return err
	}
	if err := p.Commit(Layout{World: 1, PP: 1, DPReplicate: 1, DPShard: 1, CP: 1, TP: 1}, time.Minute); err != nil {
		p.Abort()
		return err
	}
	return Purge(dir, keep)
}

// BenchmarkSaveCycle is one save of the debug recipe's full state as a
// training run makes it, purge included (keep_latest_k = 2), in steady
// state: the allocations per op are the garbage every save leaves. It
// reports the sizes of the metadata and part files it writes. With
// rows=in-order the shards come as the debug recipe hands them over;
// rows=interleaved keeps every row a chunk of its own (see debugShards):
// a metadata of 9351 chunks.
func BenchmarkSaveCycle(b *testing.B) {
	for _, interleave := range []bool{false, true} {
		name := "rows=in-order"
		if interleave {
			name = "rows=interleaved"
		}
		b.Run(name, func(b *testing.B) { benchSaveCycle(b, debugShards(interleave)) })
	}
}

func benchSaveCycle(b *testing.B, shards []Shard) {
	dir := b.TempDir()
	if d := os.Getenv("TITAN_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "bench-ckpt-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	blobs, session := debugBlobs(), NewSession()
	const keep = 2
	step := 0
	for ; step < keep; step++ { // steady state: keep checkpoints already there
		if err := saveCycle(dir, step, session, shards, blobs, keep); err != nil {
			b.Fatal(err)
		}
	}
	n := 0
	for _, s := range shards {
		n += len(s.Data)
	}
	b.ReportAllocs()
	b.SetBytes(int64(4 * n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := saveCycle(dir, step, session, shards, blobs, keep); err != nil {
			b.Fatal(err)
		}
		step++
	}
	b.StopTimer()
	last := StepDir(dir, step-1)
	for _, f := range []struct{ file, unit string }{{"metadata.json", "metadata-B"}, {PartFile(0), "part-B"}} {
		st, err := os.Stat(filepath.Join(last, f.file))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(st.Size()), f.unit)
	}
}

// BenchmarkScanDebug is the Scan that a purge of the debug recipe's
// checkpoints makes (three full checkpoints, each metadata.json parsed
// and validated): the part of a save that reads metadata. Its rows are
// interleaved (see debugShards): 9351 chunks a checkpoint.
func BenchmarkScanDebug(b *testing.B) {
	dir := b.TempDir()
	shards, blobs, session := debugShards(true), debugBlobs(), NewSession()
	for step := 0; step < 3; step++ {
		if err := saveCycle(dir, step, session, shards, blobs, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		infos, problems, err := Scan(dir)
		if err != nil || len(infos) != 3 || len(problems) != 0 {
			b.Fatalf("scan: %d checkpoints, problems %v, %v", len(infos), problems, err)
		}
	}
}
