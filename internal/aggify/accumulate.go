//go:build cgo

package aggify

import (
	"context"
	"fmt"
)

// Accumulator runs one rewritten cursor loop as an aggregate in Go: the
// transition step is the loop body (after EXIT/CONTINUE/RETURN became guard
// flags) evaluated by the IR interpreter, the state is the analysis' state
// fields, the final value its results. It is what the SQLite dialect will
// register through the driver; PostgreSQL's CREATE AGGREGATE is its twin.
type Accumulator struct {
	a       *LoopAnalysis
	in      *interp
	started bool
}

// Aggregate returns the name of the loop's CREATE AGGREGATE.
func (a *LoopAnalysis) Aggregate() string { return a.aggregate }

// NewAccumulator starts the loop's aggregate with the pre-loop values of
// its parameters and state fields, by variable name (the aggregate's extra
// arguments). Loops whose body runs queries (nested loops) are refused.
func (a *LoopAnalysis) NewAccumulator(ctx context.Context, pre map[string]Value) (*Accumulator, error) {
	if a.loop == nil {
		return nil, fmt.Errorf("aggify: loop at line %d: not compiled", a.Line)
	}
	if runsQueries(a.loop.Body) {
		return nil, &Error{Func: a.fn.Name, Line: a.Line, Construct: "nested query", Reason: "the loop body runs queries; the Go accumulator has no connection"}
	}
	in := &interp{ctx: ctx, f: a.fn, env: map[*Var]Value{}, recs: map[*Var]map[string]Value{}}
	for _, v := range append(append([]*Var{}, a.params...), a.init...) {
		x, ok := pre[v.Name]
		if !ok && v.Kind == Synth && v.Default != nil {
			var err error
			if x, err = in.eval(v.Default); err != nil {
				return nil, err
			}
		}
		var err error
		if in.env[v], err = coerce(x, v.Type); err != nil {
			return nil, fmt.Errorf("aggify: pre-loop value of %s: %w", v.Name, err)
		}
	}
	return &Accumulator{a: a, in: in}, nil
}

// Step feeds one row (column name → value), in the loop's order.
func (acc *Accumulator) Step(row map[string]Value) error {
	acc.started = true
	if d := acc.a.done; d != nil && acc.in.env[d] == true {
		return nil // the loop has exited: later rows are ignored
	}
	for _, v := range acc.a.locals {
		acc.in.env[v] = nil
	}
	acc.in.recs[acc.a.loop.Rec] = row
	c, err := acc.in.list(acc.a.loop.Body)
	if err == nil && c.kind != ctlNone {
		err = &Error{Func: acc.a.fn.Name, Line: acc.a.Line, Construct: "loop body", Reason: "unexpected jump out of the rewritten body"}
	}
	return err
}

// Results returns the loop's live-out values (LoopAnalysis.Results order);
// with no rows they are the pre-loop values, as after a loop that never ran.
func (acc *Accumulator) Results() []Value {
	var out []Value
	for _, v := range acc.a.results {
		out = append(out, acc.in.env[v])
	}
	return out
}
