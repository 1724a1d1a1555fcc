package memplan_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/memplan"
	"github.com/titan-go/titan/internal/mesh"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/parallel"
	"github.com/titan-go/titan/internal/parallel/fsdp"
)

// TestEstimateIsTheEnginesAccounting runs one training step of the debug
// model's shapes on in-process ranks under each layout and precision and
// checks memplan's estimate, part by part, against what the engine
// allocated: the parameter and gradient shards, the activations the
// model planned (ring attention's and the pipeline's sets included, with
// a split backward's copies under activation checkpointing), and
// FSDP's unit buffers with its bfloat16 copies under mixed precision
// and its float8 all-gather's receive buffers (fsdp.Runtime.BufferBytes,
// the trainer's accounting).
func TestEstimateIsTheEnginesAccounting(t *testing.T) {
	cfg, err := llama.Flavor("debug")
	if err != nil {
		t.Fatal(err)
	}
	const B, T = 2, 64
	for _, tc := range []struct {
		name          string
		d             memplan.Degrees
		sched         string
		param, reduce bool
		f8            *float8.Config    // model.converters float8
		eval          memplan.EvalShape // validation's own shape
		ac            memplan.Checkpoint
	}{
		{"one", memplan.Degrees{}, "", false, false, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"one bf16", memplan.Degrees{}, "", true, false, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"FSDP2", memplan.Degrees{DPShard: 2}, "", false, false, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"FSDP2 bf16", memplan.Degrees{DPShard: 2}, "", true, false, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"FSDP2 bf16 reduce bf16", memplan.Degrees{DPShard: 2}, "", true, true, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"FSDP2 float8 all-gather", memplan.Degrees{DPShard: 2}, "", false, false, f8Gather, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"FSDP2 bf16 float8 all-gather", memplan.Degrees{DPShard: 2}, "", true, false, f8Gather, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"DDP2 bf16 reduce bf16", memplan.Degrees{DPReplicate: 2}, "", true, true, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"CP2", memplan.Degrees{CP: 2}, "", false, false, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"TP2", memplan.Degrees{TP: 2}, "", false, false, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"TP2 bf16 float8", memplan.Degrees{TP: 2}, "", true, false, f8TP, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"FSDP2xTP2 bf16 float8 all-gather", memplan.Degrees{DPShard: 2, TP: 2}, "", true, false, f8Gather, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"PP2 Interleaved1F1B", memplan.Degrees{PP: 2}, "Interleaved1F1B", false, false, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"one validation 3x32", memplan.Degrees{}, "", false, false, nil, memplan.EvalShape{Rows: 3, SeqLen: 32}, memplan.Checkpoint{}},
		{"one validation same shape", memplan.Degrees{}, "", false, false, nil, memplan.EvalShape{Rows: B, SeqLen: T}, memplan.Checkpoint{}},
		{"FSDP2 bf16 validation 1x128", memplan.Degrees{DPShard: 2}, "", true, false, nil, memplan.EvalShape{Rows: 1, SeqLen: 128}, memplan.Checkpoint{}},
		{"CP2 validation 4x32", memplan.Degrees{CP: 2}, "", false, false, nil, memplan.EvalShape{Rows: 4, SeqLen: 32}, memplan.Checkpoint{}},
		{"PP2 Interleaved1F1B validation 2x128", memplan.Degrees{PP: 2}, "Interleaved1F1B", false, false, nil, memplan.EvalShape{Rows: 2, SeqLen: 128}, memplan.Checkpoint{}},
		// Split backwards of recomputed layers keep copies of their inputs.
		{"PP2 ZBVZeroBubble full AC", memplan.Degrees{PP: 2}, "ZBVZeroBubble", false, false, nil, memplan.EvalShape{}, memplan.Checkpoint{Mode: "full"}},
		{"PP2 InterleavedZeroBubble op AC bf16", memplan.Degrees{PP: 2}, "InterleavedZeroBubble", true, false, nil, memplan.EvalShape{}, memplan.Checkpoint{Mode: "selective", Option: "op"}},
		// A stage's units stay gathered and hold their gradients over the
		// step's microbatches (no gradient sync before the last backward).
		{"PP2xFSDP2 1F1B", memplan.Degrees{PP: 2, DPShard: 2}, "1F1B", false, false, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"PP2xFSDP2 GPipe resharded after forward", memplan.Degrees{PP: 2, DPShard: 2}, "GPipe", false, false, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"PP2xDDP2 Interleaved1F1B bf16 reduce bf16", memplan.Degrees{PP: 2, DPReplicate: 2}, "Interleaved1F1B", true, true, nil, memplan.EvalShape{}, memplan.Checkpoint{}},
		{"PP2xFSDP2 ZBVZeroBubble full AC bf16", memplan.Degrees{PP: 2, DPShard: 2}, "ZBVZeroBubble", true, false, nil, memplan.EvalShape{}, memplan.Checkpoint{Mode: "full"}},
		{"PP2xTP2 ZBVZeroBubble every 2nd layer bf16", memplan.Degrees{PP: 2, TP: 2}, "ZBVZeroBubble", true, false, nil, memplan.EvalShape{}, memplan.Checkpoint{Mode: "selective", Option: "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reshard := "default"
			if strings.Contains(tc.name, "resharded after forward") {
				reshard = "always"
			}
			plan := memplan.Plan{Model: cfg, Batch: B, SeqLen: T, MicrobatchRows: 1, Degrees: tc.d, Reshard: reshard,
				Precision: memplan.Precision{ParamBF16: tc.param, ReduceBF16: tc.reduce, Float8: tc.f8}, Eval: tc.eval, Checkpoint: tc.ac}
			if tc.d.PP > 1 {
				plan.Pipeline = &parallel.PipelineSettings{Schedule: tc.sched, MicrobatchSize: 1}
			}
			want, err := memplan.Estimate(plan)
			if err != nil {
				t.Fatal(err)
			}
			d := want.Plan.Degrees
			pp, err := want.Plan.ResolvePipeline()
			if err != nil {
				t.Fatal(err)
			}
			ranks := d.World()
			mems := make([]parallel.Memory, ranks)
			errs := make([]error, ranks)
			st := comm.NewMemStore()
			var wg sync.WaitGroup
			for r := range ranks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					mems[r], errs[r] = step(st, r, ranks, cfg, d, pp, B, T, reshard, tc.param, tc.reduce, tc.f8, tc.eval, tc.ac)
				}()
			}
			wg.Wait()
			var got parallel.Memory
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				m := mems[r]
				if m.StateBytes+m.ActivationBytes+m.UnitBufferBytes > got.StateBytes+got.ActivationBytes+got.UnitBufferBytes {
					got = m
				}
			}
			for _, p := range []struct {
				what      string
				got, want int64
			}{
				{"parameter and gradient shards", got.StateBytes, want.Params + want.Grads},
				{"activations", got.ActivationBytes, want.Activations},
				{"FSDP unit buffers", got.UnitBufferBytes, want.FSDPBuffers},
			} {
				if p.got != p.want {
					t.Errorf("%s: the engine holds %d bytes, memplan estimates %d", p.what, p.got, p.want)
				}
				t.Logf("%s: %d bytes", p.what, p.got)
			}
		})
	}
}

// f8Gather is tensorwise float8 with its FSDP all-gather (the output
// projection left in float32, as its logits are chunked).
var f8Gather = &float8.Config{Recipe: float8.Tensorwise, FilterFQNs: []string{"output"}, FSDPAllGather: true}

// f8TP is rowwise float8 with the output projection too (one logits
// chunk under tp).
var f8TP = &float8.Config{Recipe: float8.Rowwise}

// step builds rank r's engine, runs one forward and backward and returns
// its memory accounting.
func step(st comm.Store, r, ranks int, cfg llama.Config, d memplan.Degrees, pp parallel.PipelinePlan, B, T int, reshard string, param, reduce bool, f8 *float8.Config, eval memplan.EvalShape, ac memplan.Checkpoint) (parallel.Memory, error) {
	world, err := comm.NewWorld(context.Background(), st, r, ranks, comm.Options{})
	if err != nil {
		return parallel.Memory{}, err
	}
	defer world.Close()
	m, err := mesh.New(ranks, mesh.Degrees{PP: d.PP, DPReplicate: d.DPReplicate, DPShard: d.DPShard, CP: d.CP, TP: d.TP})
	if err != nil {
		return parallel.Memory{}, err
	}
	g, err := parallel.NewGroups(world, m, r)
	if err != nil {
		return parallel.Memory{}, err
	}
	be := cpu.New(1)
	defer be.Close()
	rs, err := fsdp.ParseReshard(reshard)
	if err != nil {
		return parallel.Memory{}, err
	}
	o := parallel.Options{Pipeline: pp, T: T, Reshard: rs, Precision: model.Precision{Param: backend.Float32, Float8: f8}, Reduce: backend.Float32,
		EvalRows: eval.Rows, EvalT: eval.SeqLen}
	if param {
		o.Precision.Param = backend.BFloat16
	}
	if reduce {
		o.Reduce = backend.BFloat16
	}
	eng, err := parallel.New(be, llama.Family{Cfg: cfg, Checkpoint: llama.ActivationCheckpoint{Mode: ac.Mode, SelectiveOption: ac.Option}}, g, o)
	if err != nil {
		return parallel.Memory{}, err
	}
	eng.Init(1)
	n := B * T // this data rank's tokens
	in, lab := make([]int32, n), make([]int32, n)
	for i := range in {
		in[i], lab[i] = int32((i*7+r)%cfg.VocabSize), int32((i*5+3)%cfg.VocabSize)
	}
	if _, err := eng.ForwardBackward(in, lab, 1, 1/float32(n)); err != nil {
		return parallel.Memory{}, fmt.Errorf("step: %w", err)
	}
	return eng.Memory(), nil
}
