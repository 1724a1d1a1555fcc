package plan

import (
	"fmt"
	"math"
	"strings"
)

// caveat is a kind of GPU layout whose published rows the step model
// predicts worst: a layout of that kind carries the published rows'
// errors as a warning beside its prediction.
type caveat struct {
	// what names the kind in the warning.
	what string
	// applies reports whether a layout (of a model) is of the kind.
	applies func(j Job) bool
}

// caveats are the kinds bench/plan/README.md lists under "Rows outside
// 15 %": context parallelism (8B CP2 aside, every published row of it
// reads high, by more the larger the degree) and tensor parallelism that
// leaves a rank 512 columns of the model's width or fewer.
var caveats = []caveat{
	{"context parallelism", func(j Job) bool { return j.Layout.Degrees.CP > 1 }},
	{"tensor parallelism down to 512 columns of the model's width a rank or fewer", func(j Job) bool {
		tp := j.Layout.Degrees.TP
		return tp > 1 && j.Model.Dim/tp <= 512
	}},
}

// Caveats returns, for each kind of layout among ps that the step model
// is known to predict poorly on a GPU cluster, one line naming the kind
// and torchtitan's published rows of that kind with their errors, as
// titan plan --reference computes them now under the priors of cal (the
// calibration ps were made with). CPU predictions have none: this
// machine's layouts are checked by bench/plan/measure.sh.
func Caveats(cal Calibration, ps ...Prediction) ([]string, error) {
	var kinds []caveat
	for _, k := range caveats {
		for _, p := range ps {
			if !p.Cluster.CPU() && k.applies(p.Job) {
				kinds = append(kinds, k)
				break
			}
		}
	}
	if len(kinds) == 0 {
		return nil, nil
	}
	rs, _, err := CompareReference(cal.gpuPriors())
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range kinds {
		var rows []string
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range rs {
			if k.applies(r.Prediction.Job) {
				rows = append(rows, fmt.Sprintf("%s %+.1f%%", r.Row.Name, 100*r.TPSErr))
				lo, hi = min(lo, r.TPSErr), max(hi, r.TPSErr)
			}
		}
		if len(rows) == 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%s: tokens/s of torchtitan's published rows of this kind predicted %+.0f%% to %+.0f%% off (%s; bench/plan/README.md)",
			k.what, 100*lo, 100*hi, strings.Join(rows, ", ")))
	}
	return out, nil
}
