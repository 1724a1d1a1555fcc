package memplan

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/config"
)

// Warnings returns the recipe's settings that are valid but almost
// certainly not what was meant, one message each (nil: none).
func Warnings(job *config.Job) []string {
	var out []string
	if w, s := job.LRScheduler.WarmupSteps, job.Training.Steps; w > s {
		out = append(out, fmt.Sprintf("lr_scheduler.warmup_steps %d exceeds training.steps %d: the warmup is cut to %d steps (as torchtitan does), so the learning rate reaches optimizer.lr only at the last step", w, s, s))
	}
	return out
}

// LossWatch watches the training loss for divergence: fed every step's
// loss, it warns once when the loss exceeds its first value by 50%, or
// rises above ln(vocab)+2 (worse than guessing uniformly) after step 10.
// The zero value is not usable; use NewLossWatch.
type LossWatch struct {
	ceiling float64 // ln(vocab) + 2
	lr      float64
	first   float64
	seen    bool
	warned  bool
}

// lossWatchGrace is the number of steps before the ln(vocab)+2 ceiling
// applies.
const lossWatchGrace = 10

// NewLossWatch returns a watch for a model with vocab output classes
// trained at peak learning rate lr (optimizer.lr, quoted in the warning).
func NewLossWatch(vocab int, lr float64) *LossWatch {
	return &LossWatch{ceiling: math.Log(float64(max(vocab, 1))) + 2, lr: lr}
}

// Observe records the loss of step (counted from 1) and returns a warning
// the first time the loss diverges, "" otherwise.
func (w *LossWatch) Observe(step int, loss float64) string {
	if w.warned || math.IsNaN(loss) {
		return ""
	}
	if !w.seen {
		w.first, w.seen = loss, true
		return ""
	}
	var why string
	switch {
	case loss > 1.5*w.first:
		why = fmt.Sprintf("is %.4g, more than 1.5× its first value %.4g", loss, w.first)
	case step > lossWatchGrace && loss > w.ceiling:
		why = fmt.Sprintf("is %.4g, above ln(vocab)+2 = %.4g, worse than a uniform guess", loss, w.ceiling)
	default:
		return ""
	}
	w.warned = true
	return fmt.Sprintf("warning: step %d: the loss %s; training is diverging: try a lower optimizer.lr (now %g, e.g. --set optimizer.lr=%g)", step, why, w.lr, w.lr/3)
}
