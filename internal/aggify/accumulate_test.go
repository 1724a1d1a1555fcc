//go:build cgo

package aggify

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestAccumulatorMatchesAggregate feeds the rows of every single-loop
// analysis to the Go accumulator (the loop IR as an aggregate, the future
// SQLite dialect) and compares with the generated PostgreSQL aggregate
// called on the same rows and the same pre-loop values.
func TestAccumulatorMatchesAggregate(t *testing.T) {
	conn := freshDB(t, "aggify_accum")
	load(t, conn, testRuns)
	ctx := context.Background()
	srcs := map[string]string{}
	for _, b := range Builtins() {
		srcs[b.Name] = b.Source
	}
	for _, e := range extraLoops {
		srcs[e.name] = e.src
	}
	tested := 0
	for name, src := range srcs {
		p, err := CompileFile(src)
		if err != nil {
			t.Fatal(err)
		}
		r := p.Rewrites[len(p.Rewrites)-1]
		if len(r.Loops) != 1 || runsQueries(r.Loops[0].loop.Body) {
			continue // nested: the accumulator needs a connection
		}
		t.Run(name, func(t *testing.T) {
			if err := p.Install(ctx, conn); err != nil {
				t.Fatal(err)
			}
			a := r.Loops[0]
			for _, id := range runIDs(testRuns) {
				// Parameters: the run, and 2.5 for every other one.
				env := map[string]Value{}
				in := &interp{ctx: ctx, f: a.fn, env: map[*Var]Value{}, recs: map[*Var]map[string]Value{}}
				for _, v := range a.fn.Params {
					if v.Kind != Param {
						continue
					}
					val := Value(2.5)
					if v.Type == "text" {
						val = id
					}
					in.env[v], _ = coerce(val, v.Type)
					env[v.Name] = in.env[v]
				}
				for _, v := range a.init {
					if v.Kind == Synth {
						continue
					}
					var val Value
					if v.Default != nil {
						val, _ = in.eval(v.Default)
					} else if v.Type != "text" {
						val = int64(0)
					}
					env[v.Name], _ = coerce(val, v.Type)
				}
				q, args, err := in.bind(&Expr{Text: a.loop.Query.Derived})
				if err != nil {
					t.Fatal(err)
				}
				// Go: rows in the loop's order through the accumulator.
				acc, err := a.NewAccumulator(ctx, env)
				if err != nil {
					t.Fatal(err)
				}
				order := ""
				if len(a.OrderBy) > 0 {
					order = " ORDER BY " + strings.Join(a.OrderBy, ", ")
				}
				var stepErr error
				err = PgxRows(conn)(ctx, "SELECT * FROM ("+q+") AS _q"+order, args, false, func(row map[string]Value) bool {
					stepErr = acc.Step(row)
					return stepErr == nil
				})
				if err != nil || stepErr != nil {
					t.Fatal(err, stepErr)
				}
				got := acc.Results()
				nq := len(args) // the cursor query's own parameters
				// PostgreSQL: the generated aggregate on the same rows.
				call := []string{"_q"}
				for _, v := range append(append([]*Var{}, a.params...), a.init...) {
					if v.Kind == Synth && v.Default != nil {
						call = append(call, v.Default.Text)
						continue
					}
					args = append(args, env[v.Name])
					call = append(call, fmt.Sprintf("$%d::%s", len(args), v.Type))
				}
				aggSQL := fmt.Sprintf("SELECT %s(%s%s) AS x FROM (%s) AS _q", a.Aggregate(), strings.Join(call, ", "), order, q)
				if len(a.Results) > 1 {
					aggSQL = "SELECT (x).* FROM (" + aggSQL + ") AS s"
				}
				want := rowValuesArgs(t, ctx, conn, aggSQL, args)
				empty := rowValuesArgs(t, ctx, conn, "SELECT count(*) FROM ("+q+") AS _q", args[:nq])
				if empty[0] == int64(0) {
					continue // PostgreSQL returns NULL for no rows; the wrapper's CASE supplies the pre-loop values
				}
				for i := range got {
					if !sameValue(got[i], want[i]) {
						t.Errorf("run %s, %s: Go %v (%T), PostgreSQL %v (%T)", id, a.Results[i], got[i], got[i], want[i], want[i])
					}
				}
				tested++
			}
		})
	}
	if tested == 0 {
		t.Fatal("nothing compared")
	}
	t.Logf("%d comparisons", tested)
}
