package metrics

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/titan-go/titan/internal/tensorboard"
)

// TensorBoardTags maps each metrics.jsonl key to its TensorBoard tag
// (torchtitan's tag where torchtitan logs the same figure). Every figure
// of a Record is written, at every logged step; val_loss only on the
// steps that ran validation.
var TensorBoardTags = []struct{ Key, Tag string }{
	{"loss", "loss_metrics/global_avg_loss"},
	{"grad_norm", "grad_norm"},
	{"lr", "lr"},
	{"tokens_per_sec", "throughput(tps)"},
	{"tflops", "tflops"},
	{"mfu", "mfu(%)"},
	{"mem_gib", "memory/max_reserved(GiB)"},
	{"state_gib", "memory/state(GiB)"},
	{"gathered_units", "memory/gathered_units"},
	{"tokens", "tokens"},
	{"elapsed_s", "time_metrics/elapsed(s)"},
	{"val_loss", "validation_metrics/loss"},
}

// TensorBoardDir is the event folder of rank: <dump>/<folder> when only
// rank 0 writes, <dump>/<folder>/rank_<R> for every rank with
// save_for_all_ranks (torchtitan's layout).
func TensorBoardDir(dump, folder string, rank int, allRanks bool) string {
	d := filepath.Join(dump, folder)
	if allRanks {
		d = filepath.Join(d, fmt.Sprintf("rank_%d", rank))
	}
	return d
}

// scalars lists r's figures under their TensorBoard tags, in
// TensorBoardTags order.
func scalars(r Record) []tensorboard.Scalar {
	vals := map[string]float64{
		"loss": r.Loss, "grad_norm": r.GradNorm, "lr": r.LR, "tokens_per_sec": r.TokensPerSec,
		"tflops": r.TFLOPs, "mfu": r.MFU, "mem_gib": r.MemGiB, "state_gib": r.StateGiB,
		"gathered_units": float64(r.GatheredUnits), "tokens": float64(r.Tokens), "elapsed_s": r.ElapsedS,
	}
	if r.ValLoss != nil {
		vals["val_loss"] = *r.ValLoss
	}
	out := make([]tensorboard.Scalar, 0, len(vals))
	for _, t := range TensorBoardTags {
		if v, ok := vals[t.Key]; ok {
			out = append(out, tensorboard.Scalar{Tag: t.Tag, Value: float32(v)})
		}
	}
	return out
}

// logTB writes r to the event file, if there is one.
func (l *Logger) logTB(r Record, now time.Time) error {
	if l.tb == nil {
		return nil
	}
	return l.tb.Add(int64(r.Step), now, scalars(r))
}
