//go:build cgo

package aggify

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/titan-go/titan/internal/testenv"
)

// One PostgreSQL cluster per test binary, started on first use.
var (
	pgOnce sync.Once
	pgSrv  *testenv.PG
	pgErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if pgSrv != nil {
		pgSrv.Close()
	}
	os.Exit(code)
}

// server returns the shared cluster; a missing PostgreSQL skips the test,
// or fails it with CI=true.
func server(tb testing.TB) *testenv.PG {
	tb.Helper()
	pgOnce.Do(func() { pgSrv, pgErr = testenv.StartPostgres() })
	testenv.RequirePostgres(tb, pgErr)
	return pgSrv
}

// freshDB creates an empty database and returns a connection to it.
func freshDB(tb testing.TB, name string) *pgx.Conn {
	tb.Helper()
	srv := server(tb)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
		tb.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatal(err)
	}
	cfg, _ := pgx.ParseConfig(srv.URL)
	cfg.Database = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// schema is the run store's shape (internal/runstore on its own branch).
const schema = `
CREATE TABLE runs (run_id text PRIMARY KEY, recipe_path text NOT NULL);
CREATE TABLE metrics (
  run_id text NOT NULL, step bigint NOT NULL,
  loss double precision, grad_norm double precision, lr double precision,
  tokens_per_sec double precision, tflops double precision, mfu double precision,
  mem_gib double precision, state_gib double precision, elapsed_s double precision,
  val_loss double precision,
  PRIMARY KEY (run_id, step));`

// genRun describes one generated run.
type genRun struct {
	id, recipe string
	steps      int
	kind       string // normal, never, nan, nulls, ties, diverge
}

// testRuns covers the edge cases: an empty run, a single row, ties in loss
// and elapsed time, NULL and NaN values, a run that never reaches the
// targets, one that diverges.
var testRuns = []genRun{
	{"a-1", "a", 300, "normal"}, {"a-2", "a", 250, "normal"}, {"b-1", "b", 300, "normal"},
	{"empty", "b", 0, "normal"}, {"single", "c", 1, "normal"}, {"never", "c", 200, "never"},
	{"nan", "a", 200, "nan"}, {"nulls", "b", 200, "nulls"}, {"ties", "c", 200, "ties"},
	{"diverge", "c", 200, "diverge"},
}

// load creates the tables and fills them with runs (deterministic).
func load(tb testing.TB, conn *pgx.Conn, runs []genRun) {
	tb.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, schema); err != nil {
		tb.Fatal(err)
	}
	runRows, cols, rows := genRows(runs)
	loadRows(tb, conn, runRows, cols, rows)
}

// loadRows fills the created tables with generated rows.
func loadRows(tb testing.TB, conn *pgx.Conn, runRows [][]any, cols []string, rows [][]any) {
	tb.Helper()
	ctx := context.Background()
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"runs"}, []string{"run_id", "recipe_path"}, pgx.CopyFromRows(runRows)); err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"metrics"}, cols, pgx.CopyFromRows(rows)); err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ANALYZE"); err != nil {
		tb.Fatal(err)
	}
}

// genRows generates the runs' rows (deterministic): the runs table's rows,
// the metrics columns and rows.
func genRows(runs []genRun) (runRows [][]any, cols []string, rows [][]any) {
	for ri, r := range runs {
		runRows = append(runRows, []any{r.id, r.recipe})
		rng := rand.New(rand.NewSource(int64(ri + 1)))
		t := 0.0
		for s := 0; s < r.steps; s++ {
			loss := 2 + 8*math.Exp(-float64(s)/60) + 0.3*rng.NormFloat64()
			tps := 1000 + 200*rng.NormFloat64()
			gn := 1 + 0.2*rng.NormFloat64()
			if rng.Intn(40) == 0 {
				gn *= 5
			}
			dt := 0.5 + rng.Float64()
			var val any
			if s%50 == 0 {
				val = loss + 0.1
			}
			var lossV, gnV any = loss, gn
			switch r.kind {
			case "never":
				lossV = 6 + rng.Float64()
			case "nan":
				if s%37 == 5 {
					lossV = math.NaN()
				}
				if s%11 == 0 {
					gnV = nil
				}
			case "nulls":
				if s%7 == 0 {
					lossV = nil
				}
				if s%5 == 0 {
					gnV = nil
				}
			case "ties":
				lossV = math.Round(loss*2) / 2
				if s%3 != 0 {
					dt = 0
				}
			case "diverge":
				if s > 150 {
					lossV = loss * 30
				}
			}
			t += dt
			rows = append(rows, []any{r.id, int64(s), lossV, gnV, 3e-4, tps, 100.0, 0.4 + 0.01*rng.NormFloat64(), 40 + 10*rng.Float64(), 20.0, t, val})
		}
	}
	cols = []string{"run_id", "step", "loss", "grad_norm", "lr", "tokens_per_sec", "tflops", "mfu", "mem_gib", "state_gib", "elapsed_s", "val_loss"}
	return runRows, cols, rows
}

// textOf runs q and returns its single column of every row as text.
func textOf(tb testing.TB, conn *pgx.Conn, q string) []string {
	tb.Helper()
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s *string
		if err := rows.Scan(&s); err != nil {
			tb.Fatal(err)
		}
		if s == nil {
			out = append(out, "NULL")
		} else {
			out = append(out, *s)
		}
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
	return out
}

func runIDs(runs []genRun) []string {
	var ids []string
	for _, r := range runs {
		ids = append(ids, r.id)
	}
	return append(ids, "no-such-run")
}

var _ = fmt.Sprint
