package train

import (
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/config"
)

// TestCheckWorld: the recipe's layout resolves against the world an
// elastic round has; -1 takes the rest, fixed degrees that do not fit and
// a global batch that does not split are refused with the key at fault.
func TestCheckWorld(t *testing.T) {
	for _, c := range []struct {
		name    string
		world   int
		shard   int
		tp      int
		global  int
		wantErr string
	}{
		{"rest of 4", 4, -1, 1, 8, ""},
		{"rest of 2", 2, -1, 1, 8, ""},
		{"tp2 in 4", 4, -1, 2, 8, ""},
		{"fixed shard too big", 2, 4, 1, 8, "dp_shard 4"},
		{"global batch does not split", 3, -1, 1, 8, "training.global_batch_size 8 is not a multiple of training.local_batch_size 2 × 3 data-parallel ranks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			job := config.Default()
			job.Model.Flavor = "tiny_bench"
			job.Training.SeqLen = 32
			job.Training.LocalBatchSize = 2
			job.Training.GlobalBatchSize = c.global
			job.Validation.Enable = false
			job.Parallelism.DataParallelShardDegree = c.shard
			job.Parallelism.TensorParallelDegree = c.tp
			err := CheckWorld(job, c.world)
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("CheckWorld(%d): %v", c.world, err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("CheckWorld(%d): %v, want an error containing %q", c.world, err, c.wantErr)
			}
		})
	}
}
