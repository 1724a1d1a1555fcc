//go:build cgo

package aggify

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// sqliteSchema is the run store's metrics shape in SQLite
// (internal/runstore/schema.go).
const sqliteSchema = `
CREATE TABLE runs (run_id TEXT PRIMARY KEY, recipe_path TEXT NOT NULL);
CREATE TABLE metrics (
  run_id TEXT NOT NULL, step INTEGER NOT NULL,
  loss REAL, grad_norm REAL, lr REAL, tokens_per_sec REAL, tflops REAL, mfu REAL,
  mem_gib REAL, state_gib REAL, elapsed_s REAL, val_loss REAL,
  PRIMARY KEY (run_id, step));`

// openSQLite creates a SQLite database in a temporary folder holding runs
// (the generator the PostgreSQL tests use). Register aggregates first.
func openSQLite(tb testing.TB, runs []genRun) *sql.DB {
	tb.Helper()
	db, err := sql.Open("sqlite", filepath.Join(tb.TempDir(), "runs.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	if _, err := db.Exec(sqliteSchema); err != nil {
		tb.Fatal(err)
	}
	runRows, cols, rows := genRows(runs)
	tx, err := db.Begin()
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range runRows {
		if _, err := tx.Exec("INSERT INTO runs VALUES (?, ?)", r...); err != nil {
			tb.Fatal(err)
		}
	}
	ins, err := tx.Prepare("INSERT INTO metrics (" + strings.Join(cols, ", ") + ") VALUES (?" + strings.Repeat(", ?", len(cols)-1) + ")")
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range rows {
		if _, err := ins.Exec(r...); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		tb.Fatal(err)
	}
	return db
}

// sqliteCase is one analysis with its argument lists ($R: the run id).
type sqliteCase struct {
	name, src string
	calls     []string
}

// sqliteCases are the built-in analyses and the extra loops of the
// PostgreSQL equivalence test.
func sqliteCases(t *testing.T) []sqliteCase {
	var out []sqliteCase
	for _, b := range Builtins() {
		p, err := CompileFile(b.Source)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, sqliteCase{b.Name, b.Source, builtinCalls[p.Rewrites[len(p.Rewrites)-1].Func.Name]})
	}
	for _, e := range extraLoops {
		out = append(out, sqliteCase{e.name, e.src, e.calls})
	}
	return out
}

// callArgs splits an argument list of equiv_test's form for run id.
func callArgs(call, id string) []string {
	var args []string
	for _, a := range strings.Split(call, ",") {
		a = strings.TrimSpace(a)
		if a == "$R" {
			a = id
		}
		args = append(args, strings.Trim(a, "'"))
	}
	return args
}

// TestSQLiteEquivalence runs every built-in analysis and extra loop on a
// SQLite run store as the client-side loop and as the registered aggregate
// (one query per loop), for every generated run and argument list, and
// requires identical results. Files SQLite refuses must say why.
func TestSQLiteEquivalence(t *testing.T) {
	ctx := context.Background()
	cases := sqliteCases(t)
	progs := map[string]*Program{}
	for _, c := range cases {
		p, err := CompileFile(c.src)
		if err != nil {
			t.Fatal(err)
		}
		progs[c.name] = p
		if err := p.RegisterSQLite(); err != nil {
			t.Logf("%s: refused on SQLite: %v", c.name, err)
		}
	}
	db := openSQLite(t, testRuns)
	compared := 0
	for _, c := range cases {
		p := progs[c.name]
		t.Run(c.name, func(t *testing.T) {
			if _, err := p.SQLiteAggregates(); err != nil {
				if !strings.Contains(err.Error(), "SQLite") {
					t.Fatalf("refusal without a reason: %v", err)
				}
				t.Fatalf("refused on SQLite: every built-in and extra loop must run there: %v", err)
			}
			if len(p.Queries) > 0 {
				loop, err := p.RunSQLite(ctx, db, ModeLoop, nil)
				if err != nil {
					t.Fatalf("loop: %v", err)
				}
				agg, err := p.RunSQLite(ctx, db, ModeAggregate, nil)
				if err != nil {
					t.Fatalf("aggregate: %v", err)
				}
				if len(loop.Rows) != len(testRuns) {
					t.Errorf("the file's query returned %d rows, want %d", len(loop.Rows), len(testRuns))
				}
				if fmt.Sprint(loop.Rows) != fmt.Sprint(agg.Rows) {
					t.Errorf("the file's query: loop %v, aggregate %v", loop.Rows, agg.Rows)
				}
				compared++
				return
			}
			if len(c.calls) == 0 {
				t.Fatal("no argument lists")
			}
			for _, call := range c.calls {
				for _, id := range runIDs(testRuns) {
					args := callArgs(call, id)
					loop, err := p.RunSQLite(ctx, db, ModeLoop, args)
					if err != nil {
						t.Fatalf("loop %v: %v", args, err)
					}
					agg, err := p.RunSQLite(ctx, db, ModeAggregate, args)
					if err != nil {
						t.Fatalf("aggregate %v: %v", args, err)
					}
					if strings.Join(loop.Rows[0], "|") != strings.Join(agg.Rows[0], "|") {
						t.Errorf("%v: loop %v, aggregate %v", args, loop.Rows, agg.Rows)
					}
					compared++
				}
			}
		})
	}
	if compared == 0 {
		t.Fatal("nothing compared")
	}
	t.Logf("%d comparisons", compared)
}

// TestSQLiteAggregateQuery checks the shape of what the SQLite dialect
// registers: the aggregate's arguments and one query with ORDER BY inside
// the call and PostgreSQL's NULL placement.
func TestSQLiteAggregateQuery(t *testing.T) {
	b, _ := LookupBuiltin("best_step")
	p, err := CompileFile(b.Source)
	if err != nil {
		t.Fatal(err)
	}
	aggs, err := p.SQLiteAggregates()
	if err != nil {
		t.Fatal(err)
	}
	if len(aggs) != 1 {
		t.Fatalf("%d aggregates", len(aggs))
	}
	q := aggs[0].Query
	t.Log(aggs[0].Name, aggs[0].Args, q)
	if !strings.HasPrefix(q, "SELECT "+aggs[0].Name+"(_q.") || !strings.Contains(q, " ORDER BY _q.step NULLS LAST) FROM (") || !strings.Contains(q, "?1") {
		t.Errorf("query %q", q)
	}
	if _, err := SQLiteQuery("SELECT loss::int FROM metrics"); err == nil || !strings.Contains(err.Error(), "cast") {
		t.Errorf("a cast was not refused: %v", err)
	}
}

// sameText compares two results' text forms: numbers by value (PostgreSQL
// and Go print floats differently), anything else exactly.
func sameText(a, b string) bool {
	if a == b {
		return true
	}
	fa, erra := strconv.ParseFloat(a, 64)
	fb, errb := strconv.ParseFloat(b, 64)
	return erra == nil && errb == nil && (fa == fb || (math.IsNaN(fa) && math.IsNaN(fb)))
}

// TestSQLiteLoopMatchesPostgres runs every analysis as the client-side loop
// on SQLite and as the PL/pgSQL function on PostgreSQL over the same stored
// data and requires the same results. SQLite stores NaN as NULL (as the run
// store does), so PostgreSQL is loaded with the NaN losses as NULL too; the
// nested loop, refused as a SQLite aggregate, is compared here as a loop.
func TestSQLiteLoopMatchesPostgres(t *testing.T) {
	ctx := context.Background()
	conn := freshDB(t, "aggify_sqlite_loop")
	if _, err := conn.Exec(ctx, schema); err != nil {
		t.Fatal(err)
	}
	runRows, cols, rows := genRows(testRuns)
	for _, r := range rows {
		for i, v := range r {
			if f, ok := v.(float64); ok && math.IsNaN(f) {
				r[i] = nil
			}
		}
	}
	loadRows(t, conn, runRows, cols, rows)
	db := openSQLite(t, testRuns)
	compared := 0
	for _, c := range sqliteCases(t) {
		p, err := CompileFile(c.src)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(c.name, func(t *testing.T) {
			if err := p.Install(ctx, conn); err != nil {
				t.Fatal(err)
			}
			if len(p.Queries) > 0 {
				lite, err := p.RunSQLite(ctx, db, ModeLoop, nil)
				if err != nil {
					t.Fatalf("SQLite loop: %v", err)
				}
				pg, err := p.Run(ctx, conn, ModeLoop, nil)
				if err != nil {
					t.Fatalf("PostgreSQL loop: %v", err)
				}
				if len(lite.Rows) != len(pg.Rows) || len(lite.Rows) != len(testRuns) {
					t.Fatalf("SQLite %d rows, PostgreSQL %d, runs %d", len(lite.Rows), len(pg.Rows), len(testRuns))
				}
				for i := range pg.Rows {
					for j := range pg.Rows[i] {
						if !sameText(lite.Rows[i][j], pg.Rows[i][j]) {
							t.Errorf("row %d, %s: SQLite %s, PostgreSQL %s", i, pg.Columns[j], lite.Rows[i][j], pg.Rows[i][j])
						}
					}
				}
				compared++
				return
			}
			for _, call := range c.calls {
				for _, id := range runIDs(testRuns) {
					args := callArgs(call, id)
					lite, err := p.RunSQLite(ctx, db, ModeLoop, args)
					if err != nil {
						t.Fatalf("SQLite loop %v: %v", args, err)
					}
					pg, err := p.Run(ctx, conn, ModeLoop, args)
					if err != nil {
						t.Fatalf("PostgreSQL loop %v: %v", args, err)
					}
					if len(lite.Rows[0]) != len(pg.Rows[0]) {
						t.Fatalf("%v: SQLite %v, PostgreSQL %v", args, lite.Rows, pg.Rows)
					}
					for i := range pg.Rows[0] {
						if !sameText(lite.Rows[0][i], pg.Rows[0][i]) {
							t.Errorf("%v, %s: SQLite %s, PostgreSQL %s", args, pg.Columns[i], lite.Rows[0][i], pg.Rows[0][i])
						}
					}
					compared++
				}
			}
		})
	}
	if compared == 0 {
		t.Fatal("nothing compared")
	}
	t.Logf("%d comparisons", compared)
}

// TestSQLiteRefusals checks that what the SQLite dialect cannot translate
// is refused with the construct, that a nested loop's outer loop is shown
// as client-side, and that LIKE stays case-sensitive.
func TestSQLiteRefusals(t *testing.T) {
	for q, want := range map[string]string{
		"SELECT loss::int FROM metrics":                                          "cast",
		"SELECT m.loss FROM runs r, LATERAL (SELECT loss FROM metrics) m":        "LATERAL",
		"SELECT DISTINCT ON (run_id) loss FROM metrics":                          "DISTINCT ON",
		"SELECT loss FROM metrics WHERE run_id ILIKE 'a%'":                       "ILIKE",
		"SELECT loss FROM metrics WHERE run_id ~ '^a'":                           "operator ~",
		"SELECT date_trunc('hour', now()) FROM metrics":                          "function date_trunc",
		"SELECT loss FROM metrics WHERE step = ANY (ARRAY[1, 2])":                "ANY",
		"SELECT loss FROM generate_series(1, 3) g, metrics":                      "function in FROM",
		"SELECT loss FROM metrics WHERE run_id LIKE $1 ORDER BY loss DESC, step": "",
	} {
		got, err := SQLiteQuery(q)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", q, err)
		case want == "" && got != "SELECT loss FROM metrics WHERE run_id LIKE ?1 ORDER BY loss DESC NULLS FIRST, step NULLS LAST":
			t.Errorf("%s: translated to %s", q, got)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: want a refusal naming %q, got %q, %v", q, want, got, err)
		}
	}
	var nested string
	for _, e := range extraLoops {
		if e.name == "nested_inner_first" {
			nested = e.src
		}
	}
	p, err := CompileFile(nested)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RegisterSQLite(); err != nil {
		t.Fatal(err)
	}
	db := openSQLite(t, testRuns[:2])
	text, err := p.SQLiteText()
	if err != nil || !strings.Contains(text, "runs client-side in Go") {
		t.Errorf("nested loop: %q, %v", text, err)
	}
	res, err := p.RunSQLite(context.Background(), db, ModeLoop, []string{"A", "0.1"})
	if err != nil || res.Rows[0][0] != "NULL" {
		t.Errorf("LIKE must stay case-sensitive: %v, %v", res, err)
	}
}
