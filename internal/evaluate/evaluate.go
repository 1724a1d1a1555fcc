// Package evaluate measures a model's mean next-token loss and perplexity
// on text or on sequences of token ids.
package evaluate

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/model/llama"
)

// Result is the mean loss over Tokens predicted tokens.
type Result struct {
	Loss       float64 `json:"loss"`
	Tokens     int     `json:"tokens"`
	Perplexity float64 `json:"perplexity"`
}

// Evaluator scores sequences of up to SeqLen+1 tokens.
type Evaluator struct {
	m      *llama.Model
	seqLen int
	sum    float64
	n      int
}

// New builds an evaluator for windows of seqLen predictions on be.
func New(be backend.Backend, cfg llama.Config, params []float32, seqLen int) (*Evaluator, error) {
	m, err := llama.New(be, cfg, 1, seqLen, llama.Plan{})
	if err != nil {
		return nil, err
	}
	be.Upload(m.Params, params)
	return &Evaluator{m: m, seqLen: seqLen}, nil
}

// Add scores one sequence: every token after the first is predicted from
// those before it. Sequences longer than SeqLen+1 are cut into windows that
// each start with the previous window's last token.
func (e *Evaluator) Add(seq []int32) error {
	T := e.seqLen
	for len(seq) >= 2 {
		n := min(len(seq)-1, T)
		in, tg := make([]int32, T), make([]int32, T)
		for i := range tg {
			tg[i] = -1
		}
		copy(in, seq[:n])
		copy(tg, seq[1:n+1])
		loss, err := e.m.Forward(in, tg)
		if err != nil {
			return err
		}
		e.sum += float64(loss) * float64(e.m.NumTargets())
		e.n += e.m.NumTargets()
		seq = seq[n:]
	}
	return nil
}

// Result returns the mean loss so far.
func (e *Evaluator) Result() (Result, error) {
	if e.n == 0 {
		return Result{}, fmt.Errorf("evaluate: nothing to predict (every sequence has fewer than 2 tokens)")
	}
	l := e.sum / float64(e.n)
	return Result{Loss: l, Tokens: e.n, Perplexity: math.Exp(l)}, nil
}

// ReadTokenLines parses one sequence per line of whitespace-separated
// token ids; blank lines are skipped. Errors name the line.
func ReadTokenLines(r io.Reader, vocab int) ([][]int32, error) {
	var out [][]int32
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	line := 0
	for sc.Scan() {
		line++
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		seq := make([]int32, len(fields))
		for i, f := range fields {
			v, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("line %d: %q is not a token id", line, f)
			}
			if v < 0 || v >= vocab {
				return nil, fmt.Errorf("line %d: token %d is outside the vocabulary [0, %d)", line, v, vocab)
			}
			seq[i] = int32(v)
		}
		out = append(out, seq)
	}
	return out, sc.Err()
}
