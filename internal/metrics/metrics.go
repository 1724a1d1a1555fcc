// Package metrics reports training progress: a console line per log step,
// the same figures appended to <dump_folder>/metrics.jsonl, and a progress
// bar between log steps when the console is a terminal.
//
// On a terminal the log line is coloured (each figure in its own colour,
// as torchtitan does), unless the NO_COLOR environment variable is set to
// a non-empty value (https://no-color.org) or Options.DisableColor
// (metrics.disable_color_printing) is set. Output that is not a terminal
// is coloured only when CLICOLOR_FORCE is set to a value other than "0"
// (for logs piped to a pager that shows colours).
//
// With Options.SaveForAllRanks (metrics.save_for_all_ranks) every rank
// writes its own file: rank 0 <dump_folder>/metrics.jsonl as always, rank
// R > 0 <dump_folder>/metrics_rank<R>.jsonl (RankFile). Without it only
// rank 0 writes a file.
//
// With Options.TensorBoardFolder (metrics.enable_tensorboard,
// metrics.save_tb_folder) the same records also go to a TensorBoard event
// file (package tensorboard) in TensorBoardDir, under the tags of
// TensorBoardTags; which ranks write follows the same rule.
//
// Rank 0 also keeps every step's loss, not only the logged steps', in
// <dump_folder>/loss_steps.jsonl (StepLossFile; Logger.Step): one
// {"step","loss"} line per step, buffered and flushed at every log step
// and on Close, appended to by a resumed run like metrics.jsonl. loss.svg
// (PlotRun) draws from it.
package metrics

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/titan-go/titan/internal/tensorboard"
)

// Record is one logged step. Its JSON keys are the metrics.jsonl schema.
//
// Loss, GradNorm and LR are the logged step's own; TokensPerSec (and
// TFLOPs, MFU) are measured over the steps since the previous record.
type Record struct {
	Step         int     `json:"step"`
	Loss         float64 `json:"loss"`
	GradNorm     float64 `json:"grad_norm"`
	LR           float64 `json:"lr"`
	TokensPerSec float64 `json:"tokens_per_sec"`
	TFLOPs       float64 `json:"tflops"`
	MFU          float64 `json:"mfu"` // percent of the device's peak
	MemGiB       float64 `json:"mem_gib"`
	// StateGiB is the memory of one worker's parameters, gradients and
	// optimizer state (its shards under FSDP; the largest over workers).
	StateGiB float64 `json:"state_gib"`
	// GatheredUnits is the most FSDP units whose gathered parameters
	// were alive at once on one worker (0 without parameter sharding).
	GatheredUnits int `json:"gathered_units"`
	// Tokens is the number of tokens trained on up to this step (the
	// whole job's).
	Tokens   int64   `json:"tokens"`
	ElapsedS float64 `json:"elapsed_s"`
	// ValLoss is set on steps that ran validation.
	ValLoss *float64 `json:"val_loss,omitempty"`
}

// Logger writes records to the console and to metrics.jsonl.
type Logger struct {
	console  io.Writer
	tty      bool
	color    bool
	file     *os.File
	buf      *bufio.Writer
	total    int
	barShown bool
	tb       *tensorboard.Writer // nil without TensorBoard
	// every step's loss (rank 0 with a dump folder; nil otherwise)
	stepFile *os.File
	stepBuf  *bufio.Writer
}

// StepLossFile is the name of rank 0's per-step loss file in the dump
// folder.
const StepLossFile = "loss_steps.jsonl"

// StepLoss is one step's loss, a line of StepLossFile.
type StepLoss struct {
	Step int     `json:"step"`
	Loss float64 `json:"loss"`
}

// Open appends to <dumpFolder>/metrics.jsonl (creating the folder) and
// prints to console; with dumpFolder "" it only prints. totalSteps sizes
// the progress bar.
//
// It is OpenWith with the zero Options (rank 0, colour on a terminal).
func Open(dumpFolder string, console io.Writer, totalSteps int) (*Logger, error) {
	return OpenWith(dumpFolder, console, totalSteps, Options{})
}

// Options are the per-rank and console settings of OpenWith.
type Options struct {
	// Rank is the worker's rank; rank 0 writes metrics.jsonl.
	Rank int
	// SaveForAllRanks makes ranks other than 0 write their records too,
	// to metrics_rank<R>.jsonl (metrics.save_for_all_ranks). Without it
	// they write no file.
	SaveForAllRanks bool
	// DisableColor prints the log line without terminal colours
	// (metrics.disable_color_printing).
	DisableColor bool
	// TensorBoardFolder, when not "", writes the records to TensorBoard
	// event files too, in TensorBoardDir(dumpFolder, TensorBoardFolder,
	// Rank, SaveForAllRanks) (metrics.enable_tensorboard with
	// metrics.save_tb_folder).
	TensorBoardFolder string
	// Terminal overrides whether console is taken for a terminal (nil:
	// detect it); for tests.
	Terminal *bool
}

// RankFile is the name of rank's metrics file in the dump folder:
// "metrics.jsonl" for rank 0, "metrics_rank<R>.jsonl" for rank R > 0.
func RankFile(rank int) string {
	if rank == 0 {
		return "metrics.jsonl"
	}
	return fmt.Sprintf("metrics_rank%d.jsonl", rank)
}

// OpenWith appends to <dumpFolder>/RankFile(o.Rank) (creating the folder)
// when o.Rank is 0 or o.SaveForAllRanks is set, and prints to console;
// with dumpFolder "" it only prints. totalSteps sizes the progress bar.
func OpenWith(dumpFolder string, console io.Writer, totalSteps int, o Options) (*Logger, error) {
	tty := isTerminal(console)
	if o.Terminal != nil {
		tty = *o.Terminal
	}
	l := &Logger{console: console, tty: tty, total: totalSteps,
		color: (tty || forceColor()) && !o.DisableColor && os.Getenv("NO_COLOR") == ""}
	if dumpFolder == "" || (o.Rank != 0 && !o.SaveForAllRanks) {
		return l, nil
	}
	if err := os.MkdirAll(dumpFolder, 0o755); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	path := filepath.Join(dumpFolder, RankFile(o.Rank))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	l.file, l.buf = f, bufio.NewWriter(f)
	if o.Rank == 0 {
		sf, err := os.OpenFile(filepath.Join(dumpFolder, StepLossFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("metrics: %w", err)
		}
		l.stepFile, l.stepBuf = sf, bufio.NewWriter(sf)
	}
	if o.TensorBoardFolder != "" {
		if l.tb, err = tensorboard.Create(TensorBoardDir(dumpFolder, o.TensorBoardFolder, o.Rank, o.SaveForAllRanks)); err != nil {
			f.Close()
			if l.stepFile != nil {
				l.stepFile.Close()
			}
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return l, nil
}

// Colored reports whether the log line is printed in colour.
func (l *Logger) Colored() bool { return l.color }

// forceColor reports whether CLICOLOR_FORCE asks for colour whatever the
// output.
func forceColor() bool {
	v := os.Getenv("CLICOLOR_FORCE")
	return v != "" && v != "0"
}

// IsTerminal reports whether w is a terminal (a character device).
func IsTerminal(w io.Writer) bool { return isTerminal(w) }

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// ANSI colours of the log line's figures.
const (
	ansiReset   = "\033[0m"
	ansiRed     = "\033[31m"
	ansiGreen   = "\033[32m"
	ansiYellow  = "\033[33m"
	ansiBlue    = "\033[34m"
	ansiMagenta = "\033[35m"
	ansiCyan    = "\033[36m"
	ansiGray    = "\033[90m"
)

// Line formats a record the way the console shows it, without colour.
func Line(r Record) string { return line(r, false) }

// ColorLine is Line with each figure in its own terminal colour.
func ColorLine(r Record) string { return line(r, true) }

func line(r Record, color bool) string {
	c := func(code string) string {
		if color {
			return code
		}
		return ""
	}
	s := fmt.Sprintf("%sstep %5d  %sloss %7.4f  %sgrad_norm %7.4f  %slr %.3e  %stokens/s %8.0f  %stflops %7.4f  %smfu %5.2f%%  %smem %6.3f GiB  state %6.3f GiB",
		c(ansiRed), r.Step, c(ansiGreen), r.Loss, c(ansiYellow), r.GradNorm, c(ansiGray), r.LR, c(ansiBlue), r.TokensPerSec,
		c(ansiCyan), r.TFLOPs, c(ansiMagenta), r.MFU, c(ansiGray), r.MemGiB, r.StateGiB)
	if r.ValLoss != nil {
		s += fmt.Sprintf("  %sval_loss %7.4f", c(ansiGreen), *r.ValLoss)
	}
	return s + c(ansiReset)
}

// Log prints r and appends it to metrics.jsonl (and the TensorBoard
// event file).
func (l *Logger) Log(r Record) error {
	l.clearBar()
	fmt.Fprintln(l.console, line(r, l.color))
	if l.file == nil {
		return nil
	}
	if err := l.flushSteps(); err != nil {
		return err
	}
	if err := l.logTB(r, time.Now()); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	l.buf.Write(b)
	l.buf.WriteByte('\n')
	if err := l.buf.Flush(); err != nil {
		return fmt.Errorf("metrics: writing %s: %w", l.file.Name(), err)
	}
	return nil
}

// Step records step's loss in StepLossFile (rank 0; flushed at the next
// Log or on Close) and redraws the progress bar.
func (l *Logger) Step(step int, loss float64) error {
	if l.stepBuf != nil {
		b, err := json.Marshal(StepLoss{Step: step, Loss: loss})
		if err != nil {
			return fmt.Errorf("metrics: step %d: %w", step, err)
		}
		l.stepBuf.Write(b)
		l.stepBuf.WriteByte('\n')
	}
	l.Progress(step, loss)
	return nil
}

func (l *Logger) flushSteps() error {
	if l.stepBuf == nil {
		return nil
	}
	if err := l.stepBuf.Flush(); err != nil {
		return fmt.Errorf("metrics: writing %s: %w", l.stepFile.Name(), err)
	}
	return nil
}

// Printf writes an informational line to the console.
func (l *Logger) Printf(format string, args ...any) {
	l.clearBar()
	fmt.Fprintf(l.console, format+"\n", args...)
}

// Progress redraws the progress bar (terminals only).
func (l *Logger) Progress(step int, loss float64) {
	if !l.tty || l.total <= 0 {
		return
	}
	const width = 30
	done := width * step / l.total
	fmt.Fprintf(l.console, "\r[%s%s] %d/%d loss %.4f", strings.Repeat("#", done), strings.Repeat(".", width-done), step, l.total, loss)
	l.barShown = true
}

func (l *Logger) clearBar() {
	if l.barShown {
		fmt.Fprint(l.console, "\r\033[K")
		l.barShown = false
	}
}

// Close flushes and closes metrics.jsonl (and StepLossFile). Calling it again does nothing.
func (l *Logger) Close() error {
	l.clearBar()
	if l.file == nil {
		return nil
	}
	f := l.file
	l.file = nil // Close is idempotent; Printf keeps working on the console
	var tbErr error
	if l.tb != nil {
		tbErr = l.tb.Close()
		l.tb = nil
	}
	if l.stepFile != nil {
		err := l.flushSteps()
		if cerr := l.stepFile.Close(); err == nil {
			err = cerr
		}
		l.stepFile, l.stepBuf = nil, nil
		if tbErr == nil {
			tbErr = err
		}
	}
	if err := l.buf.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return tbErr
}

// PeakRSSGiB is the process's peak resident memory (VmHWM on Linux), or 0
// where unknown.
func PeakRSSGiB() float64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			var kb float64
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:")), "%f", &kb)
			return kb / (1 << 20)
		}
	}
	return 0
}
