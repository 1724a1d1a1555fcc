package train

import (
	"fmt"

	"github.com/titan-go/titan/internal/config"
)

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
	if _, err := job.AccumSteps(m.DPReplicate * m.DPShard); err != nil {
		return fmt.Errorf("world size %d: %w", world, err)
	}
	return nil
}
