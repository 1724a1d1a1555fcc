// Package parallel lays one rank's share of a model out on the device
// mesh and drives it: Groups builds every communication group of the
// mesh once, and an Engine is what the trainer runs — one train step, one
// evaluation, one gradient norm, one state save and load path — whatever
// the layout, for any model family (internal/model). PlanPipeline
// resolves the recipe's pipeline keys into stages and a schedule once.
// The parallelisms themselves live in the subpackages: fsdp (FSDP, HSDP,
// DDP by unit hooks), tp (the tensor- and context-parallel collectives
// the model calls) and pipeline (schedules and their executor).
package parallel

import (
	"context"
	"fmt"
	"strings"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/mesh"
)

// commCtx is the context of the engines' collectives: not a run's
// context, which Ctrl-C cancels while ranks still have to agree to stop.
var commCtx = context.Background()

// Groups are one rank's communication groups on the mesh pp ×
// dp_replicate × dp_shard × cp × tp, each nil when it has one rank.
type Groups struct {
	Mesh *mesh.Mesh
	Rank int
	// World holds every rank of the job.
	World comm.Group
	// TP and CP are the tensor and context parallel groups, PP the
	// pipeline.
	TP, CP, PP comm.Group
	// Shard is the group parameters are sharded over (dp_shard × cp,
	// torchtitan's dp_shard_cp mesh: the cp ranks' gradients are summed by
	// the reduce-scatter) and Replicate the group whose gradients are
	// all-reduced (dp_replicate).
	Shard, Replicate comm.Group
}

// NewGroups creates rank's groups over world (nil for one process); every
// rank creates its groups in the same order.
func NewGroups(world comm.Group, m *mesh.Mesh, rank int) (*Groups, error) {
	g := &Groups{Mesh: m, Rank: rank, World: world}
	if world == nil || world.Size() == 1 {
		g.World = nil
		return g, nil
	}
	shard, repl := []string{"dp_shard", "cp"}, []string{"dp_replicate"}
	for _, d := range []struct {
		dims []string
		g    *comm.Group
	}{{[]string{"pp"}, &g.PP}, {[]string{"tp"}, &g.TP}, {[]string{"cp"}, &g.CP}, {shard, &g.Shard}, {repl, &g.Replicate}} {
		ranks, err := m.Group(rank, d.dims...)
		if err != nil {
			return nil, err
		}
		if len(ranks) == 1 {
			continue
		}
		name := strings.Join(d.dims, "_")
		if *d.g, err = comm.NewGroup(commCtx, world, ranks, name); err != nil {
			return nil, fmt.Errorf("%s group %v: %w", name, ranks, err)
		}
	}
	return g, nil
}

// coord is this rank's coordinate along mesh dimension i (pp,
// dp_replicate, dp_shard, cp, tp).
func (g *Groups) coord(i int) int { return g.Mesh.Coords(g.Rank)[i] }

// DataRank and DataRanks place this rank among the ranks that read
// different rows of the global batch (dp_replicate × dp_shard; pipeline,
// tp and cp ranks read the same rows).
func (g *Groups) DataRank() int  { return g.coord(1)*g.Mesh.DPShard + g.coord(2) }
func (g *Groups) DataRanks() int { return g.Mesh.DPReplicate * g.Mesh.DPShard }

// TPRank and CPRank are this rank's places in its tp and cp groups.
func (g *Groups) TPRank() int { return g.coord(4) }
func (g *Groups) CPRank() int { return g.coord(3) }

// SumWorld adds x over every rank, in place.
func (g *Groups) SumWorld(x []float64) error {
	if g.World == nil {
		return nil
	}
	return g.World.AllReduce(commCtx, comm.F64(x), comm.Sum)
}

func size(g comm.Group) int {
	if g == nil {
		return 1
	}
	return g.Size()
}
