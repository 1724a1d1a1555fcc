package parallel

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/parallel/pipeline"
)

// PipelinePlan is a resolved pipeline layout: every stage's part of the
// model, the schedule and the rows of a microbatch. Without pipeline
// parallelism it is one stage (the whole model) run as one microbatch of
// the local batch.
type PipelinePlan struct {
	Stages         []model.StageSpec
	Schedule       pipeline.Schedule
	MicrobatchRows int
}

// String describes the plan: the schedule, the stages' layers, the
// microbatches and the costs a zero-bubble order was made for.
func (p PipelinePlan) String() string {
	layers := make([]string, len(p.Stages))
	for i, s := range p.Stages {
		layers[i] = strconv.Itoa(s.NumLayers)
	}
	sc := p.Schedule
	per := "1 stage per rank"
	if sc.Virtual != 1 {
		per = fmt.Sprintf("%d stages per rank", sc.Virtual)
	}
	s := fmt.Sprintf("%s on %d ranks: %d stages of %s layers (%s), %d microbatches of %d", sc.Name, sc.PP, len(p.Stages), strings.Join(layers, ", "), per, sc.Microbatches, p.MicrobatchRows)
	if per := p.rankLayers(); per != "" {
		s += ", " + per
	}
	if c := p.stageCosts(); c != "" {
		s += ", ordered for " + c
	}
	return s
}

// stageCosts describes the costs a zero-bubble order was made for: each
// stage's forward : input gradient : weight gradient in units of a
// layer's forward (that of a stage without the head, by its layers);
// "" when the order does not depend on costs.
func (p PipelinePlan) stageCosts() string {
	sc := p.Schedule
	if len(sc.Costs) != len(p.Stages) {
		return ""
	}
	unit := 0.0
	for s, spec := range p.Stages {
		if !spec.Head && spec.NumLayers > 0 && sc.Costs[s].Forward > 0 {
			unit = sc.Costs[s].Forward / float64(spec.NumLayers)
			break
		}
	}
	if unit == 0 {
		return ""
	}
	parts := make([]string, len(sc.Costs))
	for s, c := range sc.Costs {
		parts[s] = fmt.Sprintf("%.3g : %.3g : %.3g", c.Forward/unit, c.Input/unit, c.Weight/unit)
	}
	return "the stages' forward : input gradient : weight gradient (in a layer's forward) " + strings.Join(parts, "; ")
}

// rankLayers lists the layers each rank holds (with the embedding and
// the head where it holds them) when the ranks' layer counts differ, as
// the V placement makes them with the first and last stages lighter;
// "" when every rank holds as many.
func (p PipelinePlan) rankLayers() string {
	sc := p.Schedule
	if len(p.Stages) != len(sc.StageRank) {
		return ""
	}
	parts := make([]string, sc.PP)
	counts := map[int]bool{}
	for r := range sc.PP {
		n, extra := 0, ""
		for _, st := range sc.Stages(r) {
			spec := p.Stages[st]
			n += spec.NumLayers
			if spec.Embedding {
				extra += " + embedding"
			}
			if spec.Head {
				extra += " + head"
			}
		}
		counts[n] = true
		parts[r] = strconv.Itoa(n) + extra
	}
	if len(counts) < 2 {
		return ""
	}
	return "layers by rank: " + strings.Join(parts, "; ")
}

// PipelineSettings are the recipe's pipeline-parallel keys
// (parallelism.pipeline_parallel_*).
type PipelineSettings struct {
	Degree         int
	Schedule       string
	LayersPerStage *int // nil: unset
	// FirstLessLayers and LastLessLayers count the embedding and the
	// head as that many layers when the layers are split (torchtitan's
	// pipeline_parallel_first_stage_less_layers and _last_).
	FirstLessLayers, LastLessLayers int
	MicrobatchSize                  int
	// Costs prices a stage's forward, input gradient and weight
	// gradient for the zero-bubble schedules' order (PassCosts; nil:
	// every stage's passes cost the same).
	Costs func(model.StageSpec) pipeline.Costs
}

// PassCosts prices the stages of fam on sequences of T tokens for the
// zero-bubble schedules' order: each stage's FLOPs of each pass, its
// layers' and its head's (model.Family.PassFLOPs).
func PassCosts(fam model.Family, T int) func(model.StageSpec) pipeline.Costs {
	return func(s model.StageSpec) pipeline.Costs {
		f, i, w := fam.PassFLOPs(T, s)
		return pipeline.Costs{Forward: f, Input: i, Weight: w}
	}
}

// rankWork is each rank's work a step: the costs of its stages' passes
// (forward, input and weight gradient) added up.
func (p PipelinePlan) rankWork(costs []pipeline.Costs) []float64 {
	work := make([]float64, p.Schedule.PP)
	for st, c := range costs {
		work[p.Schedule.StageRank[st]] += c.Forward + c.Input + c.Weight
	}
	return work
}

// priced returns the costs p.Costs gives each of stages.
func (p PipelineSettings) priced(stages []model.StageSpec) []pipeline.Costs {
	out := make([]pipeline.Costs, len(stages))
	for st, spec := range stages {
		out[st] = p.Costs(spec)
	}
	return out
}

// Imbalance is the busiest rank's work over the mean rank's (1: even).
func Imbalance(work []float64) float64 {
	var sum, most float64
	for _, w := range work {
		sum += w
		most = max(most, w)
	}
	if sum == 0 {
		return 1
	}
	return most * float64(len(work)) / sum
}

// unevenWork is the imbalance above which BalanceWarning warns: the
// other ranks then idle over 13 % of every step waiting on the busiest.
const unevenWork = 1.15

// modelSlack is how far (relative) the model's share of a rank's work
// (p.Costs) may be from the measured share for BalanceWarning to trust
// the model with other splits of the layers.
const modelSlack = 0.10

// BalanceWarning returns a warning when the busiest rank of plan has
// more than unevenWork times the mean rank's work, as measured (each
// stage's mean times of its passes, PipelineStep.StageCosts): every rank
// waits on it at every step. It names each rank's measured compute.
// When the stage costs p.Costs gives (FLOPs) share the work out among
// the ranks as measured, within modelSlack, it also names the
// pipeline_parallel_first_stage_less_layers and _last_stage_less_layers
// (0 to 4 each) that would even the ranks out best by those costs, or
// says that none does better; otherwise it says that the FLOPs do not
// tell. It returns "" without costs or a pipeline, or when the work is
// even enough.
func BalanceWarning(numLayers, localBatch int, p PipelineSettings, plan PipelinePlan, measured []pipeline.Costs) string {
	if p.Costs == nil || p.Degree <= 1 || len(plan.Stages) < 2 || len(measured) != len(plan.Stages) {
		return ""
	}
	m := float64(plan.Schedule.Microbatches)
	work := plan.rankWork(measured)
	got := Imbalance(work)
	if got <= unevenWork {
		return ""
	}
	parts := make([]string, len(work))
	var sum float64
	for r, w := range work {
		parts[r] = fmt.Sprintf("%.0f", 1e3*m*w)
		sum += w
	}
	msg := fmt.Sprintf("pipeline ranks' work is uneven: %s ms of compute a step by rank, the busiest %.2f× the mean, so the others wait on it every step", strings.Join(parts, ", "), got)
	model := plan.rankWork(p.priced(plan.Stages))
	modelGot := Imbalance(model)
	var msum float64
	for _, w := range model {
		msum += w
	}
	for r := range work {
		if math.Abs(model[r]/msum/(work[r]/sum)-1) > modelSlack {
			return msg + fmt.Sprintf("; the stages' FLOPs share it out otherwise (the busiest %.2f×), so they cannot tell which parallelism.pipeline_parallel_first_stage_less_layers and _last_stage_less_layers would even it out", modelGot)
		}
	}
	bestIn, bestOut, best := p.FirstLessLayers, p.LastLessLayers, modelGot
	for in := 0; in <= 4; in++ {
		for out := 0; out <= 4; out++ {
			q := p
			q.FirstLessLayers, q.LastLessLayers = in, out
			alt, err := PlanPipeline(numLayers, localBatch, q)
			if err != nil {
				continue
			}
			if b := Imbalance(alt.rankWork(q.priced(alt.Stages))); b < best-1e-9 {
				bestIn, bestOut, best = in, out, b
			}
		}
	}
	if best < modelGot-0.02 {
		return msg + fmt.Sprintf("; by the stages' FLOPs, parallelism.pipeline_parallel_first_stage_less_layers = %d and pipeline_parallel_last_stage_less_layers = %d would make it %.2f×", bestIn, bestOut, best)
	}
	return msg + fmt.Sprintf("; by the stages' FLOPs no parallelism.pipeline_parallel_first_stage_less_layers or _last_stage_less_layers evens it out further (%d layers over %d stages)", numLayers, len(plan.Stages))
}

// PlanPipeline resolves the pipeline layout of a model of numLayers
// layers for local batches of localBatch rows. As torchtitan does, the
// stages per rank come from LayersPerStage when set (the stages are then
// ceil((layers + first + last) / LayersPerStage)) and are otherwise 1
// for the single-stage schedules (GPipe, 1F1B) and 2 for the others;
// the layers are dealt out as if the embedding were FirstLessLayers
// layers and the head LastLessLayers layers, so the first and last
// stages get that many fewer.
func PlanPipeline(numLayers, localBatch int, p PipelineSettings) (PipelinePlan, error) {
	whole := model.StageSpec{FirstLayer: 0, NumLayers: numLayers, Embedding: true, Head: true}
	if p.Degree <= 1 {
		s, err := pipeline.Build("1F1B", 1, 1, 1, nil)
		if err != nil {
			return PipelinePlan{}, err
		}
		return PipelinePlan{Stages: []model.StageSpec{whole}, Schedule: s, MicrobatchRows: localBatch}, nil
	}
	pp := p.Degree
	name, err := pipeline.Canonical(p.Schedule)
	if err != nil {
		return PipelinePlan{}, fmt.Errorf("parallelism.pipeline_parallel_schedule: %w", err)
	}
	in, out := p.FirstLessLayers, p.LastLessLayers
	if in < 0 || out < 0 {
		return PipelinePlan{}, fmt.Errorf("parallelism.pipeline_parallel_first_stage_less_layers %d and _last_stage_less_layers %d must be >= 0", in, out)
	}
	effective := numLayers + in + out
	var S int
	if lps := p.LayersPerStage; lps != nil {
		if *lps < 1 {
			return PipelinePlan{}, fmt.Errorf("parallelism.pipeline_parallel_layers_per_stage %d must be >= 1", *lps)
		}
		S = (effective + *lps - 1) / *lps
		if S%pp != 0 {
			return PipelinePlan{}, fmt.Errorf("parallelism.pipeline_parallel_layers_per_stage %d gives %d stages for %d layers (+%d +%d for the embedding and the head), not divisible by pipeline_parallel_degree %d", *lps, S, numLayers, in, out, pp)
		}
	} else if name == "GPipe" || name == "1F1B" {
		S = pp
	} else {
		S = 2 * pp
	}
	if name == "GPipe" || name == "1F1B" {
		if S != pp {
			return PipelinePlan{}, fmt.Errorf("parallelism: %s runs one stage per rank, but pipeline_parallel_layers_per_stage gives %d stages for pipeline_parallel_degree %d", name, S, pp)
		}
	}
	if name == "ZBVZeroBubble" && S != 2*pp {
		return PipelinePlan{}, fmt.Errorf("parallelism: %s runs two stages per rank, but pipeline_parallel_layers_per_stage gives %d stages for pipeline_parallel_degree %d", name, S, pp)
	}
	counts, err := splitLayers(numLayers, S, in, out)
	if err != nil {
		return PipelinePlan{}, err
	}
	mbs, B := p.MicrobatchSize, localBatch
	if mbs < 1 || B%mbs != 0 {
		return PipelinePlan{}, fmt.Errorf("parallelism.pipeline_parallel_microbatch_size %d does not divide training.local_batch_size %d", mbs, B)
	}
	specs := make([]model.StageSpec, S)
	first := 0
	for s, n := range counts {
		specs[s] = model.StageSpec{FirstLayer: first, NumLayers: n, Embedding: s == 0, Head: s == S-1}
		first += n
	}
	var costs []pipeline.Costs
	if p.Costs != nil {
		costs = p.priced(specs)
	}
	sched, err := pipeline.Build(name, pp, S/pp, B/mbs, costs)
	if err != nil {
		return PipelinePlan{}, fmt.Errorf("parallelism: %w (training.local_batch_size %d in parallelism.pipeline_parallel_microbatch_size %d)", err, B, mbs)
	}
	return PipelinePlan{Stages: specs, Schedule: sched, MicrobatchRows: mbs}, nil
}

// splitLayers deals numLayers layers out to S stages as evenly as
// possible when the embedding counts as in layers on the first stage and
// the head as out layers on the last.
func splitLayers(numLayers, S, in, out int) ([]int, error) {
	effective := numLayers + in + out
	per, extra := effective/S, effective%S
	counts := make([]int, S)
	for s := range counts {
		counts[s] = per
		if s < extra {
			counts[s]++
		}
	}
	counts[0] -= in
	counts[S-1] -= out
	// The first and last stages may hold only the embedding or the head;
	// the stages between get at least one layer.
	for s, n := range counts {
		if n < 0 || (n == 0 && s != 0 && s != S-1) {
			return nil, fmt.Errorf("parallelism: %d layers cannot fill %d pipeline stages with the embedding counted as %d layers (pipeline_parallel_first_stage_less_layers) and the head as %d (pipeline_parallel_last_stage_less_layers): stage %d would get %d", numLayers, S, in, out, s, n)
		}
	}
	return counts, nil
}
