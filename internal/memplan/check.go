package memplan

import (
	"fmt"
	"sort"
	"strings"

	"github.com/titan-go/titan/internal/bytesize"
)

// maxRanks bounds the search for the number of ranks a model needs.
const maxRanks = 1 << 16

// Check refuses a plan whose estimate exceeds the available bytes: the
// error lists the estimate by part against the memory available and
// suggests what would fit, spelled as --set overrides of titan train:
// first activation checkpointing settings and layouts of the same world
// size (larger dp_shard, tp or pp degrees that divide it), checkpointing
// alone first; or else the smallest number of ranks of this size that
// fits with FSDP (see RanksNeeded), with a layout using tensor
// parallelism too when that needs fewer ranks. It returns nil when the
// estimate fits or available is not positive (unknown).
func Check(r Report, available int64) error {
	if available <= 0 || r.Total() <= available {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "memplan: this run needs about %s per rank but only %s is available:\n", bytesize.Human(r.Total()), bytesize.Human(available))
	for _, p := range r.parts() {
		if p.n > 0 {
			fmt.Fprintf(&b, "  %-36s %s\n", p.name, bytesize.Human(p.n))
		}
	}
	plan := r.Plan
	if plan.normalize() != nil {
		// Not a plan Estimate returned: nothing to search from.
		return fmt.Errorf("%s", strings.TrimRight(b.String(), "\n"))
	}
	if fits := Suggest(plan, available); len(fits) > 0 {
		b.WriteString("settings that would fit:")
		for _, s := range fits {
			fmt.Fprintf(&b, "\n  %s", s)
		}
		return fmt.Errorf("%s", b.String())
	}
	fmt.Fprintf(&b, "no layout of this job's %s fits", ranks(plan.Degrees.World()))
	if plan.Checkpoint.Mode != "full" {
		p := plan
		p.Checkpoint = Checkpoint{Mode: "full"}
		if full, err := Estimate(p); err == nil {
			fmt.Fprintf(&b, "; activation checkpointing alone is not enough (--set activation_checkpoint.mode=full: about %s per rank)", bytesize.Human(full.Total()))
		}
	}
	g, ok := grow(plan, available, batchSizes(plan.Batch), []int{plan.Degrees.TP})
	limit := maxRanks + 1 // fewest ranks found so far, +1
	if ok {
		limit = g.world
		fmt.Fprintf(&b, ".\nneeds at least %d ranks of this size (%s each) with FSDP:\n  %s", g.world, bytesize.Human(available), g.cand.text)
	}
	if ok && g.plan.Batch != plan.Batch {
		if k, kept := grow(plan, available, []int{plan.Batch}, []int{plan.Degrees.TP}); kept {
			fmt.Fprintf(&b, "\nor, keeping training.local_batch_size=%d, %d ranks:\n  %s", plan.Batch, k.world, k.cand.text)
		} else {
			p := plan
			p.Degrees.DPShard, p.Checkpoint = maxRanks, Checkpoint{Mode: "full"}
			if floor, err := Estimate(p); err == nil {
				fmt.Fprintf(&b, "\nat training.local_batch_size=%d no number of ranks fits with FSDP alone: with full activation checkpointing, %s", plan.Batch, fixed(floor))
			}
		}
	}
	// Tensor parallelism splits the activations and the vocabulary units,
	// which FSDP does not: offer it when it needs fewer ranks.
	if t, tpFits := grow(plan, available, batchSizes(plan.Batch), tensorDegrees(plan, limit)); tpFits {
		if ok {
			fmt.Fprintf(&b, "\nor %d ranks with tensor parallelism:\n  %s", t.world, t.cand.text)
		} else {
			fmt.Fprintf(&b, ".\nneeds at least %d ranks of this size (%s each) with tensor parallelism:\n  %s", t.world, bytesize.Human(available), t.cand.text)
		}
		ok = true
	}
	if !ok {
		p := plan
		p.Batch, p.Degrees.DPShard, p.Checkpoint = 1, maxRanks, Checkpoint{Mode: "full"}
		fmt.Fprintf(&b, ".\nno layout of up to %d ranks of this size fits, even with training.local_batch_size=1 and full activation checkpointing", maxRanks)
		if floor, err := Estimate(p); err == nil {
			fmt.Fprintf(&b, ": %s", fixed(floor))
		}
		fmt.Fprintf(&b, ".\nlower training.seq_len (now %d)", plan.SeqLen)
	}
	return fmt.Errorf("%s", b.String())
}

// fixed describes the parts of r's estimate that more FSDP ranks do not
// shrink.
func fixed(r Report) string {
	s := fmt.Sprintf("the activations (%s) and FSDP unit buffers (%s, whole units gathered for compute and for their gradients)", bytesize.Human(r.Activations), bytesize.Human(r.FSDPBuffers))
	if r.Comm > 0 {
		s += fmt.Sprintf(" and communication buffers (%s)", bytesize.Human(r.Comm))
	}
	return s + fmt.Sprintf(" alone take %s per rank", bytesize.Human(r.Activations+r.FSDPBuffers+r.Comm))
}

// checkpoints are the activation checkpointing policies the suggestions
// try, least recomputation first.
var checkpoints = []Checkpoint{{Mode: "none"}, {Mode: "selective", Option: "op"}, {Mode: "selective", Option: "2"}, {Mode: "full"}}

// candidate is one alternative setting and its estimate.
type candidate struct {
	plan    Plan
	total   int64
	changes int
	text    string
}

// Suggest returns up to three settings of plan's world size whose estimate
// fits in available bytes, each spelled as --set overrides with its
// estimate: those changing only the activation checkpointing first, then
// the fewest changes, then the smallest estimate. It keeps dp_replicate
// and cp and tries every pp, dp_shard and tp that divide the rest of the
// world (tp dividing the heads, pp the layers) with each checkpointing
// policy.
func Suggest(plan Plan, available int64) []string {
	if plan.normalize() != nil {
		return nil
	}
	d := plan.Degrees
	rest := d.World() / (d.DPReplicate * d.CP)
	var cands []candidate
	for _, pp := range divisors(rest) {
		if plan.Model.NLayers%pp != 0 {
			continue
		}
		for _, tp := range divisors(rest / pp) {
			if plan.Model.NHeads%tp != 0 || plan.Model.KVHeads()%tp != 0 {
				continue
			}
			shard := rest / pp / tp
			for _, ac := range checkpoints {
				p := plan
				p.Degrees.PP, p.Degrees.TP, p.Degrees.DPShard = pp, tp, shard
				p.Checkpoint = ac
				if c, ok := try(plan, p, available); ok {
					cands = append(cands, c)
				}
			}
		}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if la, lb := a.plan.Degrees != plan.Degrees, b.plan.Degrees != plan.Degrees; la != lb {
			return lb
		}
		if a.changes != b.changes {
			return a.changes < b.changes
		}
		return a.total < b.total
	})
	var out []string
	for _, c := range cands {
		if len(out) == 3 {
			break
		}
		out = append(out, c.text)
	}
	return out
}

// RanksNeeded returns the smallest number of ranks, plan's non-shard
// degrees times a power-of-two dp_shard above plan's, for which plan fits
// in available bytes per rank with dp_shard taking the extra ranks, and
// the setting as --set overrides with its estimate; 0 and "" when none up
// to a dp_shard of maxRanks does. Each rank count tries plan's local
// batch size and then, since the activations and the FSDP unit buffers
// do not shrink with more ranks, halves of it down to 1, each with every
// checkpointing policy, least recomputation first.
func RanksNeeded(plan Plan, available int64) (int, string) {
	if plan.normalize() != nil {
		return 0, ""
	}
	g, ok := grow(plan, available, batchSizes(plan.Batch), []int{plan.Degrees.TP})
	if !ok {
		return 0, ""
	}
	return g.world, g.cand.text
}

// growth is a layout of more ranks than a plan's that fits.
type growth struct {
	world int
	plan  Plan
	cand  candidate
}

// grow returns the layout of fewest ranks, more than plan's, that fits in
// available bytes per rank among plan's with each tensor parallel degree
// of tps and a power-of-two dp_shard up to maxRanks, each local batch size
// of batches and each checkpointing policy. Of layouts of as many ranks it
// prefers the earlier batch size, then the fewest changes, then the
// earlier policy.
func grow(plan Plan, available int64, batches, tps []int) (growth, bool) {
	if plan.normalize() != nil {
		return growth{}, false
	}
	d := plan.Degrees
	others := d.World() / (d.DPShard * d.TP)
	var best growth
	found := false
	for _, tp := range tps {
		for shard := 1; shard <= maxRanks; shard *= 2 {
			world := others * tp * shard
			if found && world > best.world {
				break
			}
			if world <= d.World() {
				continue
			}
			if g, ok := fitAt(plan, available, batches, tp, shard); ok {
				if !found || g.world < best.world || g.plan.Batch > best.plan.Batch ||
					g.plan.Batch == best.plan.Batch && g.cand.changes < best.cand.changes {
					best, found = g, true
				}
				break
			}
		}
	}
	return best, found
}

// fitAt returns the first of plan's settings with tensor parallel degree
// tp and dp_shard shard, over batches and the checkpointing policies,
// that fits in available bytes.
func fitAt(plan Plan, available int64, batches []int, tp, shard int) (growth, bool) {
	for _, b := range batches {
		for _, ac := range checkpoints {
			p := plan
			p.Degrees.TP, p.Degrees.DPShard = tp, shard
			p.Batch, p.Checkpoint = b, ac
			if c, ok := try(plan, p, available); ok {
				return growth{world: p.Degrees.World(), plan: p, cand: c}, true
			}
		}
	}
	return growth{}, false
}

// batchSizes returns b and its halves down to 1.
func batchSizes(b int) []int {
	out := []int{b}
	for b > 1 {
		b /= 2
		out = append(out, max(b, 1))
	}
	return out
}

// tensorDegrees lists the tensor parallel degrees above plan's, doubling,
// that divide the model's heads and leave room for a world of fewer than
// limit ranks.
func tensorDegrees(plan Plan, limit int) []int {
	d := plan.Degrees
	others := d.World() / (d.DPShard * d.TP)
	var out []int
	for tp := d.TP * 2; others*tp < limit; tp *= 2 {
		if plan.Model.NHeads%tp == 0 && plan.Model.KVHeads()%tp == 0 {
			out = append(out, tp)
		}
	}
	return out
}

// try estimates p and describes it against base when it fits.
func try(base, p Plan, available int64) (candidate, bool) {
	r, err := Estimate(p)
	if err != nil || r.Total() > available {
		return candidate{}, false
	}
	var sets []string
	set := func(key string, v any) { sets = append(sets, fmt.Sprintf("--set %s=%v", key, v)) }
	if p.Degrees.PP != base.Degrees.PP {
		set("parallelism.pipeline_parallel_degree", p.Degrees.PP)
	}
	if p.Degrees.DPShard != base.Degrees.DPShard {
		set("parallelism.data_parallel_shard_degree", p.Degrees.DPShard)
	}
	if p.Degrees.TP != base.Degrees.TP {
		set("parallelism.tensor_parallel_degree", p.Degrees.TP)
	}
	if p.Batch != base.Batch {
		set("training.local_batch_size", p.Batch)
	}
	if p.Checkpoint.String() != base.Checkpoint.String() {
		set("activation_checkpoint.mode", p.Checkpoint.Mode)
		if p.Checkpoint.Mode == "selective" {
			set("activation_checkpoint.selective_ac_option", p.Checkpoint.Option)
		}
	}
	text := strings.Join(sets, " ")
	if text == "" {
		text = "the current settings"
	}
	return candidate{plan: p, total: r.Total(), changes: len(sets), text: fmt.Sprintf("%s (about %s per rank)", text, bytesize.Human(r.Total()))}, true
}

// divisors returns the divisors of n in increasing order.
func divisors(n int) []int {
	var ds []int
	for i := 1; i <= n; i++ {
		if n%i == 0 {
			ds = append(ds, i)
		}
	}
	return ds
}

// ranks spells a rank count.
func ranks(n int) string {
	if n == 1 {
		return "1 rank"
	}
	return fmt.Sprintf("%d ranks", n)
}
