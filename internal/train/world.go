package train

import (
	"fmt"

	"github.com/titan-go/titan/internal/config"
)

// accumSteps is the number of micro-batches accumulated per step: as
// torchtitan, training.global_batch_size / (local_batch_size × data-parallel
// ranks) when the global batch is set, else
// training.gradient_accumulation_steps (at least 1).
func accumSteps(job *config.Job, dataRanks int) (int, error) {
	B := job.Training.LocalBatchSize
	if g := job.Training.GlobalBatchSize; g > 0 {
		per := B * dataRanks
		if g%per != 0 {
			return 0, fmt.Errorf("training.global_batch_size %d is not a multiple of training.local_batch_size %d × %d data-parallel ranks", g, B, dataRanks)
		}
		return g / per, nil
	}
	return max(job.Training.GradientAccumulationSteps, 1), nil
}

// CheckWorld reports whether job can train on world ranks: its
// [parallelism] degrees resolve to a mesh of that many ranks (-1 taking
// the rest) that the model admits, and training.global_batch_size splits
// over the mesh's data-parallel ranks. An elastic launcher checks each new
// world size with it before it starts the workers of a round.
func CheckWorld(job *config.Job, world int) error {
	fam, err := ModelFamily(job)
	if err != nil {
		return err
	}
	m, _, err := checkParallelism(job, fam, world)
	if err != nil {
		return fmt.Errorf("world size %d: %w", world, err)
	}
	if _, err := accumSteps(job, m.DPReplicate*m.DPShard); err != nil {
		return fmt.Errorf("world size %d: %w", world, err)
	}
	return nil
}
