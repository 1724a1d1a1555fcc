package memplan

import (
	"fmt"
	"sort"
	"strings"
)

// maxRanks bounds the search for the number of ranks a model needs.
const maxRanks = 1 << 16

// Check refuses a plan whose estimate exceeds the available bytes: the
// error lists the estimate by part against the memory available and
// suggests what would fit — activation checkpointing settings and layouts
// of the same world size (larger dp_shard, tp or pp degrees that divide
// it), or else the number of ranks of this size needed with FSDP. It
// returns nil when the estimate fits or available is not positive
// (unknown).
func Check(r Report, available int64) error {
	if available <= 0 || r.Total() <= available {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "memplan: this run needs about %s per rank but only %s is available:\n", Human(r.Total()), Human(available))
	for _, p := range r.parts() {
		if p.n > 0 {
			fmt.Fprintf(&b, "  %-36s %s\n", p.name, Human(p.n))
		}
	}
	fits := Suggest(r.Plan, available)
	if len(fits) > 0 {
		b.WriteString("settings that would fit:")
		for _, s := range fits {
			fmt.Fprintf(&b, "\n  %s", s)
		}
	} else if n, s := RanksNeeded(r.Plan, available); n > 0 {
		fmt.Fprintf(&b, "no layout of this job's %s fits: needs at least %d ranks of this size with FSDP (%s)", ranks(r.Plan.Degrees.World()), n, s)
	} else {
		fmt.Fprintf(&b, "no layout of up to %d ranks of this size fits: lower training.seq_len or training.local_batch_size", maxRanks)
	}
	return fmt.Errorf("%s", strings.TrimRight(b.String(), "\n"))
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
// fits in available bytes, the fewest changes first, each spelled as
// --set overrides with its estimate. It keeps dp_replicate and cp and
// tries every pp, dp_shard and tp that divide the rest of the world (tp
// dividing the heads, pp the layers) with each checkpointing policy.
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
		if cands[i].changes != cands[j].changes {
			return cands[i].changes < cands[j].changes
		}
		return cands[i].total < cands[j].total
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

// RanksNeeded returns the smallest number of ranks (a power of two times
// plan's non-shard degrees) for which plan, with dp_shard taking the extra
// ranks and full activation checkpointing, fits in available bytes per
// rank, with the setting; 0 when none up to maxRanks does.
func RanksNeeded(plan Plan, available int64) (int, string) {
	if plan.normalize() != nil {
		return 0, ""
	}
	for shard := 2; shard <= maxRanks; shard *= 2 {
		for _, ac := range []Checkpoint{plan.Checkpoint, {Mode: "full"}} {
			p := plan
			p.Degrees.DPShard = shard
			p.Checkpoint = ac
			if c, ok := try(plan, p, available); ok {
				return p.Degrees.World(), c.text
			}
		}
	}
	return 0, ""
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
	return candidate{plan: p, total: r.Total(), changes: len(sets), text: fmt.Sprintf("%s (about %s per rank)", text, Human(r.Total()))}, true
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
