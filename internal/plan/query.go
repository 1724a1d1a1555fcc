package plan

import (
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/titan-go/titan/internal/bytesize"
	"github.com/titan-go/titan/internal/cluster"
	"github.com/titan-go/titan/internal/config"
)

// ThisMachine is the cluster name of the host titan runs on: the CPU
// host its calibration file was made on.
const ThisMachine = "this"

// Query is one question `titan plan` answers about a recipe: how its own
// layout does on a cluster, or, with Search, which layouts of its world
// do best.
type Query struct {
	// World is the number of ranks: 0 takes the recipe's degrees, or
	// the whole cluster when its data_parallel_shard_degree is -1; a
	// recipe whose explicit degrees make another number is refused.
	World int
	// Compile and AsyncTP are torchtitan's torch.compile and async
	// tensor parallelism (GPU clusters; AsyncTP needs Compile).
	Compile, AsyncTP bool
	// Search ranks the layouts of the world instead of predicting the
	// recipe's own; Options bound it (its World is filled in).
	Search  bool
	Options SearchOptions
	// JSON writes the answer as JSON instead of text.
	JSON bool
}

// NotFitError is the error of a query whose recipe's own layout does not
// fit the device: Answer has written its prediction, which says how much
// it needs, before returning it.
type NotFitError struct {
	Prediction Prediction
}

func (e NotFitError) Error() string {
	p := e.Prediction
	return fmt.Sprintf("plan: %s does not fit on %s: it needs %s of the device's %s, %s of tensors and the allocator's reserve as calibrated (--search proposes layouts that fit)",
		p.Job.Layout, p.Cluster.Name, bytesize.Human(int64(p.MemoryBytes)), bytesize.Human(int64(p.Capacity)), bytesize.Human(int64(p.needed())))
}

// Answer answers q about recipe job on cluster c under calibration cal
// and writes the answer to w: the prediction of the recipe's layout with
// its caveats, or the search's top layouts with the recipe's own among
// them. A predicted layout that does not fit the device is written and
// then returned as a NotFitError, so that scripts can stop on it; a
// search reports the recipe's layout as "does not fit" and proposes
// others.
func Answer(w io.Writer, job *config.Job, c cluster.Cluster, cal Calibration, q Query) error {
	if err := q.check(c); err != nil {
		return err
	}
	// The recipe's device must be the cluster's kind, or left to detect.
	switch d := job.Training.Device; {
	case d == "cpu" && !c.CPU():
		return fmt.Errorf("plan: training.device = \"cpu\", but cluster %s is of GPUs: the prediction would be of a run the recipe does not ask for (set it to \"cuda\", or leave it empty)", c.Name)
	case d == "cuda" && c.CPU():
		return fmt.Errorf("plan: training.device = \"cuda\", but cluster %s is a CPU host (set it to \"cpu\", or leave it empty)", c.Name)
	}
	world, filled := q.World, false
	if world == 0 && job.Parallelism.DataParallelShardDegree == -1 {
		world, filled = c.World(), true
	}
	j, err := FromRecipe(job, world)
	if filled && err != nil {
		return fmt.Errorf("plan: the recipe's data_parallel_shard_degree = -1 fills cluster %s's %d devices (--world sets another number): %w", c.Name, world, err)
	}
	if err != nil {
		return err
	}
	if got := j.Layout.World(); q.World > 0 && got != q.World {
		return fmt.Errorf("plan: --world %d, but the recipe's degrees (%s) make %d ranks: set parallelism.data_parallel_shard_degree = -1 to fill --world, or give --world %d", q.World, j.Layout.Degrees, got, got)
	}
	j.Layout.Compile = q.Compile
	j.Layout.AsyncTP = j.Layout.AsyncTP || q.AsyncTP
	if j.Layout.AsyncTP && !q.Search && j.Layout.Degrees.TP < 2 {
		return fmt.Errorf("plan: --async-tp overlaps tensor-parallel collectives, and the layout (%s) has none: set parallelism.tensor_parallel_degree", j.Layout.Degrees)
	}
	if q.Search {
		o := q.Options
		o.World = j.Layout.World()
		r, err := Search(j, c, cal, o)
		if err != nil {
			return err
		}
		return writeSearchAnswer(w, r, cal, q.JSON)
	}
	p, err := Predict(j, c, cal)
	if err != nil {
		return err
	}
	caveats, err := Caveats(cal, p)
	if err != nil {
		return err
	}
	if q.JSON {
		err = WriteJSON(w, map[string]any{"prediction": p.JSON(), "calibration": cal, "caveats": caveats})
	} else {
		WriteTable(w, p, cal)
		WriteCaveats(w, caveats)
	}
	if err == nil && !p.Fits() {
		err = NotFitError{p}
	}
	return err
}

// check refuses the query's bounds and flags that cannot mean anything
// on cluster c.
func (q Query) check(c cluster.Cluster) error {
	switch o := q.Options; {
	case q.World < 0:
		return fmt.Errorf("plan: --world %d: want a number of ranks, or 0 for the recipe's", q.World)
	case q.World > c.World():
		return fmt.Errorf("plan: --world %d: cluster %s has %d devices (%d per node × %d)", q.World, c.Name, c.World(), c.DevicesPerNode, c.Nodes)
	case q.Search && o.Top < 1:
		return fmt.Errorf("plan: --top %d: show at least one layout", o.Top)
	case o.MaxTP < 0:
		return fmt.Errorf("plan: --max-tp %d: want a degree, or 0 for the default", o.MaxTP)
	case o.MaxCP < 0:
		return fmt.Errorf("plan: --max-cp %d: want a degree, or 0 for the default", o.MaxCP)
	case o.MaxTP > c.DevicesPerNode:
		return fmt.Errorf("plan: --max-tp %d: the search keeps tensor parallelism within a node, and cluster %s has %d devices a node", o.MaxTP, c.Name, c.DevicesPerNode)
	}
	return nil
}

// writeSearchAnswer writes a search's top layouts, the recipe's own
// layout with its rank, and the caveats of the top ones.
func writeSearchAnswer(w io.Writer, r SearchResult, cal Calibration, asJSON bool) error {
	var top []Prediction
	for _, t := range r.Top {
		top = append(top, t.Prediction)
	}
	caveats, err := Caveats(cal, top...)
	if err != nil {
		return err
	}
	if !asJSON {
		WriteSearch(w, r, cal)
		WriteCaveats(w, caveats)
		return nil
	}
	var rows []JSONPrediction
	for _, t := range r.Top {
		rows = append(rows, t.json())
	}
	doc := map[string]any{"tried": r.Tried, "fit": r.Fit, "global_batch": r.GlobalBatch, "headroom": r.Headroom, "calibration": cal, "top": rows, "caveats": caveats}
	// The recipe's own layout: why it cannot run, or its rank among those
	// that fit (0: it does not fit) and why it loses to the best.
	switch {
	case r.GivenErr != nil:
		doc["given"] = map[string]any{"layout": r.GivenLayout.String(), "error": r.GivenErr.Error()}
	case r.Given.Prediction.Step.Step > 0:
		doc["given"] = map[string]any{"rank": r.GivenRank, "prediction": r.Given.json()}
	}
	return WriteJSON(w, doc)
}

// json is the candidate's prediction as JSON with why it loses.
func (c Candidate) json() JSONPrediction {
	p := c.Prediction.JSON()
	p.Why = c.Why
	return p
}

// LoadCluster loads cluster ref (a name from configs/clusters, a .toml
// path, or ThisMachine) with its calibration: for a CPU host the file
// `titan plan --calibrate` wrote (CalibrationPath(calPath)), which must
// have been made on that host; for a GPU cluster the published reference
// row (CalibrateGPU) under priors pr (AssumedPriors, or a GPU's measured:
// LoadPriors), which a CPU host refuses.
func LoadCluster(ref, calPath string, pr Priors) (cluster.Cluster, Calibration, error) {
	if ref == "" {
		return cluster.Cluster{}, Calibration{}, fmt.Errorf("--cluster: give one of %v, %q or a .toml path", cluster.Names(), ThisMachine)
	}
	var c cluster.Cluster
	if ref != ThisMachine {
		var err error
		if c, err = cluster.Load(ref); err != nil {
			return cluster.Cluster{}, Calibration{}, err
		}
		if !c.CPU() {
			if calPath != "" {
				return cluster.Cluster{}, Calibration{}, fmt.Errorf("plan: --calibration %s: the option names a CPU host's calibration file, and cluster %s is a GPU cluster, calibrated from the published reference row", calPath, c.Name)
			}
			cal, err := CalibrateGPU(c, pr)
			return c, cal, err
		}
	}
	if pr != AssumedPriors {
		return cluster.Cluster{}, Calibration{}, fmt.Errorf("plan: --priors: a GPU's priors (%s), and cluster %s is a CPU host, calibrated by measuring it (titan plan --calibrate)", pr.Source, ref)
	}
	path, err := CalibrationPath(calPath)
	if err != nil {
		return cluster.Cluster{}, Calibration{}, err
	}
	cal, err := LoadCalibration(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cluster.Cluster{}, Calibration{}, fmt.Errorf("%w: run `titan plan --calibrate` first", err)
	} else if err != nil {
		return cluster.Cluster{}, Calibration{}, err
	}
	if ref == ThisMachine {
		if c, err = cluster.Load(cal.Cluster); err != nil {
			return cluster.Cluster{}, Calibration{}, err
		}
	}
	if !c.CPU() {
		return cluster.Cluster{}, Calibration{}, fmt.Errorf("plan: the calibration %s names cluster %q, which is not a CPU host: run `titan plan --calibrate` again", path, c.Name)
	}
	if err := cal.ValidateHost(); err != nil {
		return cluster.Cluster{}, Calibration{}, fmt.Errorf("%s: %w", path, err)
	}
	if cal.Cluster != c.Name {
		return cluster.Cluster{}, Calibration{}, fmt.Errorf("plan: the calibration %s was made on cluster %q, not %q", path, cal.Cluster, c.Name)
	}
	return cal.OnHost(c), cal, nil
}
