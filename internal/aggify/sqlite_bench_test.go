//go:build cgo

package aggify

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"
)

// SQLite benchmarks, (c): the loop interpreted in Go over rows fetched from
// SQLite against the registered aggregate (one query per run), for 1,000
// runs × 1,000 steps. Run with
//
//	go test -run '^$' -bench AggifySQLite -benchtime 1x ./internal/aggify

var (
	liteBenchOnce sync.Once
	liteBenchDB   *sql.DB
	liteBenchProg = map[string]*Program{}
)

func liteBench(b *testing.B) *sql.DB {
	b.Helper()
	liteBenchOnce.Do(func() {
		for _, name := range []string{"loss_ema", "improving_streak"} {
			p, err := CompileFile(mustBuiltin(name))
			if err != nil {
				b.Fatal(err)
			}
			if err := p.RegisterSQLite(); err != nil {
				b.Fatal(err)
			}
			liteBenchProg[name] = p
		}
		var runs []genRun
		for i := 0; i < benchRuns; i++ {
			runs = append(runs, genRun{fmt.Sprintf("run-%04d", i), fmt.Sprintf("recipe-%d", i%10), benchSteps, "normal"})
		}
		start := time.Now()
		liteBenchDB = openSQLite(b, runs)
		liteBenchDB.SetMaxOpenConns(1)
		b.Logf("loaded %d rows into SQLite in %v", benchRuns*benchSteps, time.Since(start))
	})
	if liteBenchDB == nil {
		b.Fatal("no benchmark database")
	}
	return liteBenchDB
}

// BenchmarkAggifySQLite compares, per analysis, the client loop (RunSQLite
// loop: Interpret over the rows of each run's cursor query) with the
// registered aggregate (RunSQLite aggregate: one aggregate query per run),
// both called for every run, and the aggregate over all runs in one
// GROUP BY query. Results are checked to agree.
func BenchmarkAggifySQLite(b *testing.B) {
	db := liteBench(b)
	ctx := context.Background()
	args := map[string][]string{"loss_ema": {"0.1"}, "improving_streak": nil}
	for _, name := range []string{"loss_ema", "improving_streak"} {
		p := liteBenchProg[name]
		var ref []string
		for _, mode := range []Mode{ModeLoop, ModeAggregate} {
			b.Run(name+"/"+string(mode)+"-per-run", func(b *testing.B) {
				var got []string
				for i := 0; i < b.N; i++ {
					got = got[:0]
					for r := 0; r < benchRuns; r++ {
						res, err := p.RunSQLite(ctx, db, mode, append([]string{fmt.Sprintf("run-%04d", r)}, args[name]...))
						if err != nil {
							b.Fatal(err)
						}
						got = append(got, res.Rows[0][0])
					}
				}
				if ref == nil {
					ref = append([]string{}, got...)
				}
				for i := range ref {
					if got[i] != ref[i] {
						b.Fatalf("run %d: %s, loop %s", i, got[i], ref[i])
					}
				}
			})
		}
		if name != "loss_ema" {
			continue
		}
		b.Run(name+"/aggregate-group-by", func(b *testing.B) {
			agg := p.Rewrites[0].Loops[0].Aggregate()
			q := "SELECT run_id, " + agg + "(loss, 0.1, NULL ORDER BY step NULLS LAST) FROM metrics GROUP BY run_id ORDER BY run_id"
			for i := 0; i < b.N; i++ {
				rows, err := db.QueryContext(ctx, q)
				if err != nil {
					b.Fatal(err)
				}
				j := 0
				for rows.Next() {
					var id, v string
					if err := rows.Scan(&id, &v); err != nil {
						b.Fatal(err)
					}
					want, _ := strconv.ParseFloat(ref[j], 64)
					var texts []string
					json.Unmarshal([]byte(v), &texts)
					var got float64
					if len(texts) == 1 {
						got, _ = strconv.ParseFloat(texts[0], 64)
					}
					if len(texts) != 1 || math.Abs(got-want) > 1e-12*math.Abs(want) {
						b.Fatalf("%s: %s, loop %s", id, v, ref[j])
					}
					j++
				}
				rows.Close()
				if j != benchRuns {
					b.Fatalf("%d runs", j)
				}
			}
		})
	}
}
