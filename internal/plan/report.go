package plan

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/titan-go/titan/internal/bytesize"
	"github.com/titan-go/titan/internal/parallel"
)

// JSONPrediction is a prediction as --json writes it.
type JSONPrediction struct {
	Flavor  string `json:"flavor"`
	Layout  string `json:"layout"`
	Cluster string `json:"cluster"`
	World   int    `json:"world"`
	Degrees struct {
		PP          int `json:"pp"`
		DPReplicate int `json:"dp_replicate"`
		DPShard     int `json:"dp_shard"`
		CP          int `json:"cp"`
		TP          int `json:"tp"`
	} `json:"degrees"`
	Schedule       string `json:"schedule,omitempty"`
	Microbatches   int    `json:"microbatches"`
	MicrobatchRows int    `json:"microbatch_rows,omitempty"`
	LocalBatch     int    `json:"local_batch"`
	SeqLen         int    `json:"seq_len"`
	Checkpoint     string `json:"activation_checkpoint"`
	Memory         struct {
		Params      int64 `json:"params"`
		Grads       int64 `json:"grads"`
		Optimizer   int64 `json:"optimizer"`
		FSDPBuffers int64 `json:"fsdp_buffers"`
		Activations int64 `json:"activations"`
		Comm        int64 `json:"comm"`
		Total       int64 `json:"memplan_total"`
		// What PyTorch holds beyond memplan's estimate on a GPU runtime.
		Loss          float64   `json:"pytorch_loss,omitempty"`
		PipelineGrads float64   `json:"pytorch_pipeline_grads,omitempty"`
		PipelineSets  float64   `json:"pytorch_pipeline_sets,omitempty"`
		SAC           float64   `json:"pytorch_sac_saved,omitempty"`
		Predicted     float64   `json:"predicted"`
		PerRank       []float64 `json:"predicted_per_pipeline_rank,omitempty"`
		Capacity      float64   `json:"capacity"`
		Fits          bool      `json:"fits"`
		// FitsHeadroom: it also leaves the DefaultHeadroom free that
		// --search keeps against the memory prediction's error.
		FitsHeadroom bool `json:"fits_with_search_headroom"`
	} `json:"memory_bytes"`
	Step            []namedTime `json:"step_seconds"`
	StepTotal       float64     `json:"step_total_seconds"`
	FSDPTotal       float64     `json:"fsdp_comm_total_seconds"`
	DPTotal         float64     `json:"dp_comm_total_seconds"`
	BubbleFraction  float64     `json:"bubble_fraction"`
	RankCompute     []float64   `json:"compute_seconds_per_pipeline_rank,omitempty"`
	TokensPerDevice float64     `json:"tokens_per_sec_per_device"`
	MFU             float64     `json:"mfu"`
	Why             string      `json:"why_slower,omitempty"`
}

// JSONReferenceRow is a published row against its prediction, the form
// of titan plan --reference --json: published memory and its error are
// null where the row publishes none.
type JSONReferenceRow struct {
	Table        string         `json:"table"`
	Row          string         `json:"row"`
	Note         string         `json:"note,omitempty"`
	PublishedTPS float64        `json:"published_tokens_per_sec_per_gpu"`
	TPSError     float64        `json:"tokens_per_sec_error"`
	PublishedGiB *float64       `json:"published_memory_gib"`
	MemoryError  *float64       `json:"memory_error"`
	Prediction   JSONPrediction `json:"prediction"`
}

// ReferenceJSON returns the rows in their --json form.
func ReferenceJSON(rs []RowResult) []JSONReferenceRow {
	var out []JSONReferenceRow
	for _, r := range rs {
		j := JSONReferenceRow{Table: r.Row.Table, Row: r.Row.Name, Note: r.Row.Note, PublishedTPS: r.Row.TPS, TPSError: r.TPSErr, Prediction: r.Prediction.JSON()}
		if r.Row.HasMemory() {
			gib, e := r.Row.MemGiB, r.MemErr
			j.PublishedGiB, j.MemoryError = &gib, &e
		}
		out = append(out, j)
	}
	return out
}

// JSON returns the prediction's --json form.
func (p Prediction) JSON() JSONPrediction {
	l := p.Job.Layout
	var j JSONPrediction
	j.Flavor, j.Layout, j.Cluster, j.World = p.Job.Flavor, l.String(), p.Cluster.Name, l.World()
	d := l.Degrees
	j.Degrees.PP, j.Degrees.DPReplicate, j.Degrees.DPShard, j.Degrees.CP, j.Degrees.TP = d.PP, d.DPReplicate, d.DPShard, d.CP, d.TP
	if d.PP > 1 {
		j.Schedule, j.MicrobatchRows = l.Schedule, l.MicrobatchRows
	}
	j.Microbatches, j.LocalBatch, j.SeqLen, j.Checkpoint = p.Microbatches, l.LocalBatch, l.SeqLen, l.Checkpoint.String()
	m := p.Memory
	j.Memory.Params, j.Memory.Grads, j.Memory.Optimizer = m.Params, m.Grads, m.Optimizer
	j.Memory.FSDPBuffers, j.Memory.Activations, j.Memory.Comm, j.Memory.Total = m.FSDPBuffers, m.Activations, m.Comm, m.Total()
	j.Memory.Predicted, j.Memory.Capacity, j.Memory.Fits = p.MemoryBytes, p.Capacity, p.Fits()
	j.Memory.FitsHeadroom = p.fitsWithin(DefaultHeadroom)
	j.Memory.PerRank = p.RankMemoryBytes
	j.Memory.Loss, j.Memory.PipelineGrads, j.Memory.PipelineSets, j.Memory.SAC = p.LossBytes, p.PipelineGradBytes, p.PipelineSetBytes, p.SACBytes
	j.Step, j.StepTotal, j.FSDPTotal, j.DPTotal = p.Step.parts(), p.Step.Step, p.Step.FSDPTotal, p.Step.DPTotal
	j.BubbleFraction, j.TokensPerDevice, j.MFU = p.BubbleFraction, p.TokensPerDevice, p.MFU
	j.RankCompute = p.RankCompute
	return j
}

// WriteJSON writes v indented.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteTable writes the prediction with its memory and step breakdowns.
func WriteTable(w io.Writer, p Prediction, cal Calibration) {
	l := p.Job.Layout
	fmt.Fprintf(w, "llama3 %s on %d × %s (%s)\n", p.Job.Flavor, l.World(), p.Cluster.Device.Model, p.Cluster.Name)
	fmt.Fprintf(w, "layout: %s, seq %d\n", l, l.SeqLen)
	fmt.Fprintf(w, "calibration: %s\n", cal.Source)
	if n := p.Runtime.Shared; n > 1 {
		speedup, measured := cal.sharedSpeedup(n)
		how := "measured side by side"
		switch {
		case measured:
		case p.Cluster.Device.Cores > 0 && n > p.Cluster.Device.Cores:
			how = "not measured: more ranks than cores get no speedup"
		default:
			how = fmt.Sprintf("not measured: this calibration has no figure for %d ranks (titan plan --calibrate measures it)", n)
		}
		fmt.Fprintf(w, "  %d ranks share the host: each computes at %.3f× 1/%d of it (%s)\n", n, speedup, n, how)
	}
	if ac := l.Checkpoint; p.Cluster.CPU() && ac.Mode != "" && ac.Mode != "none" {
		if f := cal.acSpeedup(ac); f != 1 {
			fmt.Fprintf(w, "  activation checkpointing %s: compute at %.3f× the rates without it (measured by the calibration)\n", ac, f)
		} else {
			fmt.Fprintf(w, "  activation checkpointing %s: compute at the rates without it (this calibration measured no speedup for it)\n", ac)
		}
	}
	fmt.Fprintf(w, "\nmemory per rank (busiest)\n")
	m := p.Memory
	for _, x := range []struct {
		n string
		v int64
	}{{"parameters", m.Params}, {"gradients", m.Grads}, {"optimizer state", m.Optimizer}, {"FSDP unit buffers", m.FSDPBuffers}, {"activations", m.Activations}, {"communication buffers", m.Comm}, {"memplan total", m.Total()}} {
		fmt.Fprintf(w, "  %-36s %12s\n", x.n, bytesize.Human(x.v))
		if e := l.Eval; x.n == "activations" && (e.Rows > 0 || e.SeqLen > 0) && (e.Rows != l.LocalBatch || e.SeqLen != l.SeqLen) {
			fmt.Fprintf(w, "    (with validation's own forward sets: its batch %d × %d is not the step's %d × %d; validation.enable = false, or the step's shape, drops them)\n",
				e.Rows, e.SeqLen, l.LocalBatch, l.SeqLen)
		}
	}
	for _, x := range []struct {
		n string
		v float64
	}{{"+ PyTorch loss (float32 copies)", p.LossBytes}, {"+ PyTorch pipeline gradients", p.PipelineGradBytes}, {"- activation sets not alive at the peak", -p.PipelineSetBytes}, {"+ PyTorch SAC (w2 outputs)", p.SACBytes}} {
		if x.v > 0 {
			fmt.Fprintf(w, "  %-36s %12s\n", x.n, bytesize.Human(int64(x.v)))
		}
	}
	fits := "fits"
	switch {
	case !p.Fits():
		fits = "DOES NOT FIT"
	case !p.fitsWithin(DefaultHeadroom):
		fits = fmt.Sprintf("fits, %.1f%% free: less than the %.0f%% --search keeps against the memory prediction's error", 100*(1-p.MemoryBytes/p.Capacity), 100*DefaultHeadroom)
	}
	fmt.Fprintf(w, "  %-36s %12s  of %s: %s\n", fmt.Sprintf("device (×%.3g + %s)", cal.MemoryFactor, bytesize.Human(int64(cal.MemoryBase))), bytesize.Human(int64(p.MemoryBytes)), bytesize.Human(int64(p.Capacity)), fits)
	if len(p.RankMemoryBytes) > 1 {
		ranks := make([]string, len(p.RankMemoryBytes))
		for i, b := range p.RankMemoryBytes {
			ranks[i] = bytesize.Human(int64(b))
		}
		fmt.Fprintf(w, "  %-36s %s\n", fmt.Sprintf("device, pipeline ranks 0-%d", len(ranks)-1), strings.Join(ranks, ", "))
	}
	fmt.Fprintf(w, "step time (busiest rank)\n")
	for _, x := range p.Step.parts() {
		if x.Seconds == 0 {
			continue
		}
		fmt.Fprintf(w, "  %-36s %12s  %5.1f%%\n", x.Name, seconds(x.Seconds), 100*x.Seconds/p.Step.Step)
	}
	fmt.Fprintf(w, "  %-36s %12s\n", "step", seconds(p.Step.Step))
	if l.Degrees.ShardGroup() > 1 || l.Degrees.ReplicateGroup() > 1 {
		fmt.Fprintf(w, "data-parallel communication before overlap: FSDP %s, all-reduce %s\n", seconds(p.Step.FSDPTotal), seconds(p.Step.DPTotal))
	}
	if l.Degrees.PP > 1 {
		note := ""
		if p.Step.Bubble > 0 {
			note = " (\"pipeline bubble\" above is the busiest rank's idle time)"
		}
		fmt.Fprintf(w, "pipeline: %s over %d microbatches of %d, simulated bubble %.1f%% of all ranks' time%s\n", l.Schedule, p.Microbatches, l.MicrobatchRows, 100*p.BubbleFraction, note)
		if len(p.RankCompute) > 1 {
			busy := make([]string, len(p.RankCompute))
			for r, t := range p.RankCompute {
				busy[r] = seconds(t)
			}
			fmt.Fprintf(w, "pipeline ranks' compute: %s (the busiest %.2f× the mean)\n", strings.Join(busy, ", "), parallel.Imbalance(p.RankCompute))
		}
		if c := p.Cluster; c.CPU() && p.Runtime.Shared > c.Device.Cores {
			fmt.Fprintf(w, "the %d ranks outnumber the host's %d cores: a rank idle in the bubble leaves its share of them to the others, so the step runs through the ranks' mean compute\n", p.Runtime.Shared, c.Device.Cores)
		}
	}
	fmt.Fprintf(w, "tokens/s per device %s, MFU %.1f%%\n", rate(p.TokensPerDevice), 100*p.MFU)
}

// WriteSearch writes a search's top layouts.
func WriteSearch(w io.Writer, r SearchResult, cal Calibration) {
	if len(r.Top) == 0 {
		return
	}
	p0 := r.Top[0].Prediction
	fmt.Fprintf(w, "llama3 %s on %d × %s (%s), global batch %d × seq %d: %d layouts predicted, %d fit\n",
		p0.Job.Flavor, p0.Job.Layout.World(), p0.Cluster.Device.Model, p0.Cluster.Name, r.GlobalBatch, p0.Job.Layout.SeqLen, r.Tried, r.Fit)
	fmt.Fprintf(w, "calibration: %s\n\n", cal.Source)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "#\tlayout\ttokens/s/dev\tMFU\tmemory\tstep\tbubble\twhy slower than #1\n")
	for i, c := range r.Top {
		p := c.Prediction
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.1f%%\t%s\t%s\t%.1f%%\t%s\n", i+1, p.Job.Layout, rate(p.TokensPerDevice), 100*p.MFU,
			bytesize.Human(int64(p.MemoryBytes)), seconds(p.Step.Step), 100*p.Step.idle(), c.Why)
	}
	if r.GivenErr != nil {
		fmt.Fprintf(tw, "given\t%s\t\t\t\t\t\tcannot run: %v\n", r.GivenLayout, r.GivenErr)
	}
	if g := r.Given.Prediction; g.Step.Step > 0 {
		rank := "does not fit"
		if r.GivenRank > 0 {
			rank = fmt.Sprintf("#%d", r.GivenRank)
		}
		if r.Given.Why != "" {
			rank += ": " + r.Given.Why
		}
		fmt.Fprintf(tw, "given\t%s\t%s\t%.1f%%\t%s\t%s\t%.1f%%\t%s\n", g.Job.Layout, rate(g.TokensPerDevice), 100*g.MFU,
			bytesize.Human(int64(g.MemoryBytes)), seconds(g.Step.Step), 100*g.Step.idle(), rank)
	}
	tw.Flush()
	fmt.Fprintln(w, "bubble: the busiest pipeline rank's idle share of its step (its breakdown's \"pipeline bubble\"; --json: bubble_fraction is over all ranks)")
}

// WriteReference writes the published rows against their predictions,
// each with the settings its table states (batch, sequence,
// checkpointing, compile, float8, async TP, the pipeline's schedule and
// microbatch) and a numbered footnote where titan's layout differs from
// torchtitan's or the source is silent.
func WriteReference(w io.Writer, rs []RowResult, cal Calibration) {
	fmt.Fprintf(w, "calibration: %s\n  matmul %.3f, float8 matmul %.3f, attention %.3f, elementwise %.2f, comm %.2f, memory ×%.3f\n\n",
		cal.Source, cal.Matmul, cal.MatmulFP8, cal.Attention, cal.Elementwise, cal.Comm, cal.MemoryFactor)
	fmt.Fprintf(w, "| table | row | settings | published tok/s/GPU | predicted | error | published GiB | predicted | error |\n|---|---|---|--:|--:|--:|--:|--:|--:|\n")
	var notes []string // distinct footnotes, numbered in order
	for _, r := range rs {
		note := ""
		switch n := r.Row.Note; {
		case n == "calibration row":
			note = " (calibration)"
		case n != "":
			i := slices.Index(notes, n)
			if i < 0 {
				notes, i = append(notes, n), len(notes)
			}
			note = " " + superscript(i+1)
		}
		mem := fmt.Sprintf("— | %.1f | —", r.Prediction.MemoryBytes/(1<<30))
		if r.Row.HasMemory() {
			mem = fmt.Sprintf("%.1f | %.1f | %+.1f%%", r.Row.MemGiB, r.Prediction.MemoryBytes/(1<<30), 100*r.MemErr)
		}
		fmt.Fprintf(w, "| %s | %s%s | %s | %.0f | %.0f | %+.1f%% | %s |\n", r.Row.Table, r.Row.Name, note, settings(r.Row.Job.Layout),
			r.Row.TPS, r.Prediction.TokensPerDevice, 100*r.TPSErr, mem)
	}
	for i, n := range notes {
		fmt.Fprintf(w, "\n%s %s.", superscript(i+1), n)
	}
	fmt.Fprintln(w)
}

// settings is a layout without its degrees, with its sequence length.
func settings(l Layout) string {
	return fmt.Sprintf("%s, seq %dK", l.options(), l.SeqLen/1024)
}

// rate is a throughput: whole units from 1000 up, four figures below.
func rate(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.4g", v)
}

// superscripts are the footnote marks' digits.
var superscripts = [10]string{"⁰", "¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹"}

// superscript writes n in superscript digits (footnote marks).
func superscript(n int) string {
	var b strings.Builder
	for _, d := range strconv.Itoa(n) {
		b.WriteString(superscripts[d-'0'])
	}
	return b.String()
}

// WriteCaveats writes a prediction's caveats (see Caveats), if any.
func WriteCaveats(w io.Writer, caveats []string) {
	for _, c := range caveats {
		fmt.Fprintf(w, "caveat: %s\n", c)
	}
}

// seconds writes a duration in s or ms.
func seconds(s float64) string {
	switch {
	case s >= 100:
		return fmt.Sprintf("%.0f s", s)
	case s >= 1:
		return fmt.Sprintf("%.3g s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.3g ms", s*1e3)
	}
	return strings.TrimSpace(fmt.Sprintf("%.3g µs", s*1e6))
}
