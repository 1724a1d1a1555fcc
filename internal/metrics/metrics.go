// Package metrics reports training progress: a console line per log step,
// the same figures appended to <dump_folder>/metrics.jsonl, and a progress
// bar between log steps when the console is a terminal.
package metrics

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Record is one logged step. Its JSON keys are the metrics.jsonl schema.
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
	ElapsedS float64 `json:"elapsed_s"`
	// ValLoss is set on steps that ran validation.
	ValLoss *float64 `json:"val_loss,omitempty"`
}

// Logger writes records to the console and to metrics.jsonl.
type Logger struct {
	console  io.Writer
	tty      bool
	file     *os.File
	buf      *bufio.Writer
	total    int
	barShown bool
}

// Open appends to <dumpFolder>/metrics.jsonl (creating the folder) and
// prints to console; with dumpFolder "" it only prints. totalSteps sizes
// the progress bar.
func Open(dumpFolder string, console io.Writer, totalSteps int) (*Logger, error) {
	if dumpFolder == "" {
		return &Logger{console: console, tty: isTerminal(console), total: totalSteps}, nil
	}
	if err := os.MkdirAll(dumpFolder, 0o755); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	path := filepath.Join(dumpFolder, "metrics.jsonl")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &Logger{console: console, tty: isTerminal(console), file: f, buf: bufio.NewWriter(f), total: totalSteps}, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Line formats a record the way the console shows it.
func Line(r Record) string {
	s := fmt.Sprintf("step %5d  loss %7.4f  grad_norm %7.4f  lr %.3e  tokens/s %8.0f  tflops %7.4f  mfu %5.2f%%  mem %6.3f GiB  state %6.3f GiB",
		r.Step, r.Loss, r.GradNorm, r.LR, r.TokensPerSec, r.TFLOPs, r.MFU, r.MemGiB, r.StateGiB)
	if r.ValLoss != nil {
		s += fmt.Sprintf("  val_loss %7.4f", *r.ValLoss)
	}
	return s
}

// Log prints r and appends it to metrics.jsonl.
func (l *Logger) Log(r Record) error {
	l.clearBar()
	fmt.Fprintln(l.console, Line(r))
	if l.file == nil {
		return nil
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

// Close flushes and closes metrics.jsonl. Calling it again does nothing.
func (l *Logger) Close() error {
	l.clearBar()
	if l.file == nil {
		return nil
	}
	f := l.file
	l.file = nil // Close is idempotent; Printf keeps working on the console
	if err := l.buf.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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
