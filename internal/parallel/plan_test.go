package parallel

import (
	"slices"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/parallel/pipeline"
)

// TestSplitLayers checks the layer split against torchtitan's rule
// (generate_llm_fqn_per_model_part): the layers plus first+last
// "layer-equivalents" dealt out evenly, the remainder to the first
// stages, then the weights taken off the first and the last stage.
func TestSplitLayers(t *testing.T) {
	for _, c := range []struct {
		layers, stages, in, out int
		want                    []int
	}{
		{8, 2, 1, 1, []int{4, 4}},
		{8, 4, 1, 1, []int{2, 3, 2, 1}}, // 10 = 3+3+2+2
		{8, 4, 0, 0, []int{2, 2, 2, 2}},
		{4, 4, 1, 1, []int{1, 2, 1, 0}},  // the last stage holds only the head
		{16, 4, 2, 0, []int{3, 5, 4, 4}}, // 18 = 5+5+4+4
		{32, 8, 1, 1, []int{4, 5, 4, 4, 4, 4, 4, 3}},
	} {
		got, err := splitLayers(c.layers, c.stages, c.in, c.out)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("splitLayers(%d, %d, %d, %d) = %v, %v; want %v", c.layers, c.stages, c.in, c.out, got, err, c.want)
		}
		sum := 0
		for _, n := range got {
			sum += n
		}
		if sum != c.layers {
			t.Errorf("splitLayers(%d, %d, %d, %d) = %v: %d layers", c.layers, c.stages, c.in, c.out, got, sum)
		}
	}
	if _, err := splitLayers(2, 4, 2, 0); err == nil || !strings.Contains(err.Error(), "pipeline_parallel_first_stage_less_layers") {
		t.Errorf("2 layers in 4 stages, the embedding as 2: %v, want an error naming the keys", err)
	}
}

// TestPlanPipeline checks the stage count and the stage specs.
func TestPlanPipeline(t *testing.T) {
	one, four := 1, 4
	for _, c := range []struct {
		name string
		s    PipelineSettings
		want []int // layers per stage
		err  string
	}{
		{"one stage", PipelineSettings{Degree: 1}, []int{8}, ""},
		{"1F1B", PipelineSettings{Degree: 2, Schedule: "1F1B", FirstLessLayers: 1, LastLessLayers: 1, MicrobatchSize: 1}, []int{4, 4}, ""},
		{"ZBV", PipelineSettings{Degree: 2, Schedule: "ZBVZeroBubble", FirstLessLayers: 1, LastLessLayers: 1, MicrobatchSize: 1}, []int{2, 3, 2, 1}, ""},
		{"layers per stage", PipelineSettings{Degree: 2, Schedule: "Interleaved1F1B", LayersPerStage: &four, MicrobatchSize: 1}, nil, "virtual >= 2"},
		{"bad microbatch", PipelineSettings{Degree: 2, Schedule: "1F1B", MicrobatchSize: 3}, nil, "pipeline_parallel_microbatch_size"},
		{"ZBV with 4 stages a rank", PipelineSettings{Degree: 2, Schedule: "ZBVZeroBubble", LayersPerStage: &one, MicrobatchSize: 1}, nil, "ZBVZeroBubble runs two stages per rank, but pipeline_parallel_layers_per_stage gives 8 stages"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := PlanPipeline(8, 4, c.s)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v (plan %+v), want an error containing %q", err, p.Stages, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			first := 0
			for i, s := range p.Stages {
				got = append(got, s.NumLayers)
				if s.FirstLayer != first || s.Embedding != (i == 0) || s.Head != (i == len(p.Stages)-1) {
					t.Errorf("stage %d: %+v", i, s)
				}
				first += s.NumLayers
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("layers per stage %v, want %v", got, c.want)
			}
		})
	}
}

// TestPipelinePlanString: the plan's description lists the layers by rank
// when they differ (ZBV's V placement puts both light end stages on rank
// 0) and not when they agree.
func TestPipelinePlanString(t *testing.T) {
	for _, c := range []struct {
		schedule string
		want     string
		absent   bool
	}{
		{"ZBVZeroBubble", "layers by rank: 2 + embedding + head; 4", false},
		{"1F1B", "layers by rank", true},
	} {
		p, err := PlanPipeline(6, 4, PipelineSettings{Degree: 2, Schedule: c.schedule, FirstLessLayers: 1, LastLessLayers: 1, MicrobatchSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.String(); strings.Contains(got, c.want) == c.absent {
			t.Errorf("%s: %q, want it %s %q", c.schedule, got, map[bool]string{false: "to contain", true: "not to contain"}[c.absent], c.want)
		}
	}
}

// TestBalanceWarning: a pipeline whose busiest rank carries over 1.15×
// the mean rank's measured work is warned of, with each rank's compute;
// when the stages' priced costs (layers plus a head of 0.57 layers)
// share the work out as measured, with the first/last-stage-less-layers
// that even it out best, or the note that none does; when they do not
// (the head measured far lighter than priced), with no setting. An even
// enough pipeline, or one without costs, is not warned of.
func TestBalanceWarning(t *testing.T) {
	price := func(head float64) func(s model.StageSpec) pipeline.Costs {
		return func(s model.StageSpec) pipeline.Costs {
			w := float64(s.NumLayers)
			if s.Head {
				w += head
			}
			return pipeline.Costs{Forward: w, Input: w, Weight: w}
		}
	}
	const ms = 1e-3 // a layer's pass measured at 1 ms
	for _, c := range []struct {
		name     string
		layers   int
		s        PipelineSettings
		measured float64 // the head's measured cost in layers
		want     []string
		noCosts  bool
	}{
		{name: "ZBV, less 1/1: stages of 2, 3, 2, 1 layers, rank 0 holding the first and the last",
			layers: 8, measured: 0.57,
			s:    PipelineSettings{Degree: 2, Schedule: "ZBVZeroBubble", FirstLessLayers: 1, LastLessLayers: 1, MicrobatchSize: 1},
			want: []string{"86, 120 ms of compute a step by rank", "the busiest 1.17× the mean", "first_stage_less_layers = 0 and pipeline_parallel_last_stage_less_layers = 0 would make it 1.07×"}},
		{name: "1F1B, less 0/0: 4 against 4.57, even enough",
			layers: 8, measured: 0.57,
			s: PipelineSettings{Degree: 2, Schedule: "1F1B", MicrobatchSize: 1}},
		{name: "1F1B, less 0/3: 6 layers against 2 and the head; 0/0 evens it best",
			layers: 8, measured: 0.57,
			s:    PipelineSettings{Degree: 2, Schedule: "1F1B", LastLessLayers: 3, MicrobatchSize: 1},
			want: []string{"the busiest 1.40× the mean", "= 0 and pipeline_parallel_last_stage_less_layers = 0 would make it 1.07×"}},
		{name: "ZBV on 6 layers over 4 ranks: no split does better",
			layers: 6, measured: 0.57,
			s:    PipelineSettings{Degree: 4, Schedule: "ZBVZeroBubble", FirstLessLayers: 1, LastLessLayers: 1, MicrobatchSize: 1},
			want: []string{"the busiest 1.22× the mean", "no parallelism.pipeline_parallel_first_stage_less_layers or _last_stage_less_layers evens it out further (6 layers over 8 stages)"}},
		{name: "the head measured at a tenth of its price: the FLOPs cannot tell",
			layers: 8, measured: 0.057,
			s:    PipelineSettings{Degree: 2, Schedule: "1F1B", LastLessLayers: 3, MicrobatchSize: 1},
			want: []string{"the stages' FLOPs share it out otherwise (the busiest 1.40×), so they cannot tell"}},
		{name: "no costs", noCosts: true, layers: 8, measured: 0.57,
			s: PipelineSettings{Degree: 2, Schedule: "ZBVZeroBubble", FirstLessLayers: 1, LastLessLayers: 1, MicrobatchSize: 1}},
	} {
		if !c.noCosts {
			c.s.Costs = price(0.57)
		}
		p, err := PlanPipeline(c.layers, 8, c.s)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		measured := make([]pipeline.Costs, len(p.Stages))
		for st, spec := range p.Stages {
			k := price(c.measured)(spec)
			measured[st] = pipeline.Costs{Forward: k.Forward * ms, Input: k.Input * ms, Weight: k.Weight * ms}
		}
		got := BalanceWarning(c.layers, 8, c.s, p, measured)
		if (got == "") != (len(c.want) == 0) {
			t.Errorf("%s: warning %q, want one: %v", c.name, got, len(c.want) > 0)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: warning %q lacks %q", c.name, got, w)
			}
		}
	}
}
