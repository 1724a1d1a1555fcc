package runstore

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/titan-go/titan/internal/metrics"
)

// This file is `titan runs`: List, Show and Compare print aligned tables,
// or with JSON one JSON object per line.

// ListOptions are the settings of List.
type ListOptions struct {
	// Limit is the most runs shown, newest first (<= 0: all).
	Limit int
	// JSON prints one Summary object per line instead of a table.
	JSON bool
}

// List prints the newest runs: ID, recipe, model, layout, status, steps,
// final loss, mean tokens/s and start time.
func List(ctx context.Context, w io.Writer, s *Store, o ListOptions) error {
	runs, err := s.List(ctx, o.Limit)
	if err != nil {
		return err
	}
	if o.JSON {
		return jsonLines(w, runs)
	}
	if len(runs) == 0 {
		_, err := fmt.Fprintf(w, "no runs recorded in %s\n", Redact(s.Target()))
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tRECIPE\tMODEL\tLAYOUT\tSTATUS\tSTEPS\tFINAL LOSS\tTOKENS/S\tSTARTED")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", r.ID, recipeName(r.RecipePath), r.Model, r.Flavor,
			CompactLayout(r.Layout), r.Status, r.LastStep, r.StepsPlanned, num(r.FinalLoss, "%.4f"), num(r.MeanTokensPerSec, "%.0f"),
			r.StartedAt.Local().Format("2006-01-02 15:04"))
	}
	return tw.Flush()
}

// ShowOptions are the settings of Show.
type ShowOptions struct {
	// JSON prints one object {"run": ..., "steps": [...]}.
	JSON bool
	// Recipe prints only the run's resolved recipe (TOML), which
	// titan train --recipe trains again.
	Recipe bool
}

// Show prints run id's metadata and a table of its logged steps.
func Show(ctx context.Context, w io.Writer, s *Store, id string, o ShowOptions) error {
	r, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	if o.Recipe {
		_, err := io.WriteString(w, r.Recipe)
		return err
	}
	steps, err := s.Steps(ctx, r.ID)
	if err != nil {
		return err
	}
	var lineage []Summary
	if lineage, err = s.Lineage(ctx, r.ID); err != nil {
		return err
	}
	if o.JSON {
		js := make([]jsonStep, len(steps))
		for i, st := range steps {
			js[i] = toJSONStep(st)
		}
		ids := make([]string, len(lineage))
		for i, l := range lineage {
			ids[i] = l.ID
		}
		return jsonLines(w, []any{struct {
			Run   Run        `json:"run"`
			Steps []jsonStep `json:"steps"`
			// Lineage is the IDs of the runs of the run's job (its dump
			// folder's runs that continued one another, Store.Lineage),
			// oldest first, itself included.
			Lineage []string `json:"lineage"`
		}{r, js, ids}})
	}
	tw := newTable(w)
	status := string(r.Status)
	if r.Error != "" {
		status += ": " + r.Error
	}
	ended := "-"
	if r.EndedAt != nil {
		ended = fmt.Sprintf("%s (%s)", r.EndedAt.Local().Format("2006-01-02 15:04:05"), r.EndedAt.Sub(r.StartedAt).Round(time.Millisecond))
	}
	recipe := r.RecipePath
	if recipe == "" {
		recipe = "(built-in defaults)"
	}
	last := 0
	if len(steps) > 0 {
		last = steps[len(steps)-1].Step
	}
	for _, kv := range [][2]string{
		{"run", r.ID},
		{"status", status},
		{"recipe", recipe},
		{"model", r.Model + " " + r.Flavor},
		{"layout", fmt.Sprintf("%s (%s)", r.Layout, plural(r.World, "rank"))},
		{"host", r.Host},
		{"titan", r.Version},
		{"description", r.Description},
		{"dump folder", r.DumpFolder},
		{"started", r.StartedAt.Local().Format("2006-01-02 15:04:05 MST")},
		{"ended", ended},
		{"tokens/step", strconv.FormatInt(r.TokensPerStep, 10)},
		{"steps", stepsLine(r, last, len(steps))},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(lineage) > 1 {
		if err := showLineage(w, lineage, r.ID); err != nil {
			return err
		}
	}
	if len(steps) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "STEP\tLOSS\tGRAD_NORM\tLR\tTOKENS/S\tTFLOPS\tMFU%\tMEM_GIB\tSTATE_GIB\tUNITS\tELAPSED_S\tVAL_LOSS")
	for _, st := range steps {
		val := "-"
		if st.ValLoss != nil {
			val = fmt.Sprintf("%.4f", *st.ValLoss)
		}
		fmt.Fprintf(tw, "%d\t%.4f\t%.4f\t%.3e\t%.0f\t%.4f\t%.2f\t%.3f\t%.3f\t%d\t%.1f\t%s\n", st.Step, st.Loss, st.GradNorm, st.LR,
			st.TokensPerSec, st.TFLOPs, st.MFU, st.MemGiB, st.StateGiB, st.GatheredUnits, st.ElapsedS, val)
	}
	return tw.Flush()
}

// stepsLine is runs show's "steps" line: how far the run trained of
// training.steps, from which checkpoint when it resumed, and how many
// steps it logged.
func stepsLine(r Run, last, logged int) string {
	if r.ResumedFrom != nil && *r.ResumedFrom > 0 {
		return fmt.Sprintf("%d-%d of %d trained (resumed from step %d), %d logged", *r.ResumedFrom+1, last, r.StepsPlanned, *r.ResumedFrom, logged)
	}
	return fmt.Sprintf("%d of %d trained, %d logged", last, r.StepsPlanned, logged)
}

// trainedSteps is the steps run l trained: from the one after its resume
// step (its first logged step when that is not recorded) to its last
// logged one; "-" when it logged none.
func trainedSteps(l Summary) string {
	if l.Steps == 0 {
		return "-"
	}
	first := l.FirstStep
	if l.ResumedFrom != nil {
		first = *l.ResumedFrom + 1
	}
	return fmt.Sprintf("%d-%d", first, l.LastStep)
}

// showLineage prints the runs of one dump folder (a job's resumes and
// elastic rounds), oldest first, marking run id.
func showLineage(w io.Writer, lineage []Summary, id string) error {
	fmt.Fprintf(w, "\nthe job's %d runs in this dump folder, oldest first (each resume and elastic round is a run):\n", len(lineage))
	tw := newTable(w)
	fmt.Fprintln(tw, "RUN\tSTATUS\tSTEPS\tSTARTED")
	for _, l := range lineage {
		line := fmt.Sprintf("%s\t%s\t%s\t%s", l.ID, l.Status, trainedSteps(l), l.StartedAt.Local().Format("2006-01-02 15:04:05"))
		if l.ID == id {
			line += "\t(this run)"
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// Comparison is one run's column of Compare.
type Comparison struct {
	Summary
	// Tokens is the token count at which LossAtTokens is read: the
	// fewest tokens any of the compared runs trained (its last logged
	// step × its tokens per step).
	Tokens int64 `json:"tokens"`
	// LossAtTokens is the loss of the run's last logged step at or before
	// Tokens, which is AtStep; nil when it has none.
	LossAtTokens *float64 `json:"loss_at_tokens"`
	AtStep       int      `json:"loss_at_step"`
}

// CompareOptions are the settings of Compare.
type CompareOptions struct {
	// JSON prints one Comparison object per run, per line.
	JSON bool
}

// Compare prints the runs ids side by side: final loss, loss at equal
// tokens, mean tokens/s, mean MFU and peak memory.
func Compare(ctx context.Context, w io.Writer, s *Store, ids []string, o CompareOptions) error {
	cs, err := Comparisons(ctx, s, ids)
	if err != nil {
		return err
	}
	if o.JSON {
		return jsonLines(w, cs)
	}
	tw := newTable(w)
	row := func(name string, f func(c Comparison) string) {
		fmt.Fprint(tw, name)
		for _, c := range cs {
			fmt.Fprint(tw, "\t"+f(c))
		}
		fmt.Fprintln(tw)
	}
	row("RUN", func(c Comparison) string { return c.ID })
	row("recipe", func(c Comparison) string { return recipeName(c.RecipePath) })
	row("model", func(c Comparison) string { return c.Model + "/" + c.Flavor })
	row("layout", func(c Comparison) string { return CompactLayout(c.Layout) })
	row("status", func(c Comparison) string { return string(c.Status) })
	row("steps", func(c Comparison) string { return fmt.Sprintf("%d/%d", c.LastStep, c.StepsPlanned) })
	row("final loss", func(c Comparison) string { return num(c.FinalLoss, "%.4f") })
	tokens := int64(0)
	if len(cs) > 0 {
		tokens = cs[0].Tokens
	}
	row("loss at "+humanTokens(tokens)+" tokens", func(c Comparison) string {
		if c.LossAtTokens == nil {
			return "-"
		}
		return fmt.Sprintf("%.4f (step %d)", *c.LossAtTokens, c.AtStep)
	})
	row("mean tokens/s", func(c Comparison) string { return num(c.MeanTokensPerSec, "%.0f") })
	row("mean MFU %", func(c Comparison) string { return num(c.MeanMFU, "%.2f") })
	row("peak mem GiB", func(c Comparison) string { return num(c.PeakMemGiB, "%.3f") })
	return tw.Flush()
}

// Comparisons computes Compare's figures for the runs ids (IDs or unique
// prefixes), in the order given.
func Comparisons(ctx context.Context, s *Store, ids []string) ([]Comparison, error) {
	sums, err := s.Summaries(ctx, ids)
	if err != nil {
		return nil, err
	}
	cs := make([]Comparison, len(sums))
	steps := make([][]metrics.Record, len(sums))
	budget := int64(-1)
	for i, sm := range sums {
		cs[i].Summary = sm
		if steps[i], err = s.Steps(ctx, sm.ID); err != nil {
			return nil, err
		}
		if sm.Steps > 0 && sm.TokensPerStep > 0 {
			if t := int64(sm.LastStep) * sm.TokensPerStep; budget < 0 || t < budget {
				budget = t
			}
		}
	}
	for i := range cs {
		cs[i].Tokens = max(budget, 0)
		for _, st := range steps[i] {
			if budget < 0 || int64(st.Step)*cs[i].TokensPerStep > budget {
				break
			}
			if !math.IsNaN(st.Loss) {
				l := st.Loss
				cs[i].LossAtTokens, cs[i].AtStep = &l, st.Step
			}
		}
	}
	return cs, nil
}

// CompactLayout shortens a mesh string to its dimensions of degree above
// one ("dp_shard 2 × tp 2"), or "1 rank".
func CompactLayout(layout string) string {
	var keep []string
	for _, part := range strings.Split(layout, " × ") {
		if f := strings.Fields(part); len(f) == 2 && f[1] == "1" {
			continue
		}
		keep = append(keep, part)
	}
	if len(keep) == 0 {
		return "1 rank"
	}
	return strings.Join(keep, " × ")
}

// recipeName is the recipe file's name without folder and .toml.
func recipeName(path string) string {
	if path == "" {
		return "(defaults)"
	}
	return strings.TrimSuffix(filepath.Base(path), ".toml")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func num(x *float64, format string) string {
	if x == nil {
		return "-"
	}
	return fmt.Sprintf(format, *x)
}

func humanTokens(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.3gG", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.3gM", float64(n)/1e6)
	case n >= 1e4:
		return fmt.Sprintf("%.3gk", float64(n)/1e3)
	}
	return strconv.FormatInt(n, 10)
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// jsonLines writes each element of xs as one line of JSON.
func jsonLines[T any](w io.Writer, xs []T) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for i := range xs {
		if err := enc.Encode(&xs[i]); err != nil {
			return err
		}
	}
	return nil
}

// jsonStep is a metrics.Record for JSON output: a figure that is NaN or
// infinite (which JSON cannot hold) is null.
type jsonStep struct {
	Step          int      `json:"step"`
	Loss          *float64 `json:"loss"`
	GradNorm      *float64 `json:"grad_norm"`
	LR            *float64 `json:"lr"`
	TokensPerSec  *float64 `json:"tokens_per_sec"`
	TFLOPs        *float64 `json:"tflops"`
	MFU           *float64 `json:"mfu"`
	MemGiB        *float64 `json:"mem_gib"`
	StateGiB      *float64 `json:"state_gib"`
	GatheredUnits int      `json:"gathered_units"`
	Tokens        int64    `json:"tokens"`
	ElapsedS      *float64 `json:"elapsed_s"`
	ValLoss       *float64 `json:"val_loss"`
}

func toJSONStep(r metrics.Record) jsonStep {
	f := func(x float64) *float64 {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
		return &x
	}
	j := jsonStep{Step: r.Step, Loss: f(r.Loss), GradNorm: f(r.GradNorm), LR: f(r.LR), TokensPerSec: f(r.TokensPerSec),
		TFLOPs: f(r.TFLOPs), MFU: f(r.MFU), MemGiB: f(r.MemGiB), StateGiB: f(r.StateGiB), GatheredUnits: r.GatheredUnits,
		Tokens: r.Tokens, ElapsedS: f(r.ElapsedS)}
	if r.ValLoss != nil {
		j.ValLoss = f(*r.ValLoss)
	}
	return j
}
