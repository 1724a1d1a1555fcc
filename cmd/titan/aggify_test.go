//go:build cgo

package main

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/runstore"
)

// TestAggifyCommand checks titan aggify on a file and on a built-in name,
// and that a refused loop is an error naming the construct.
func TestAggifyCommand(t *testing.T) {
	out, err := titan(t, "aggify", "loss_ema", "--dialect", "postgres")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CREATE TYPE loss_ema_agg_state", "CREATE AGGREGATE loss_ema_agg(record, float8, float8)", "CREATE OR REPLACE FUNCTION loss_ema_aggified(p_run text, p_alpha float8) RETURNS float8", "ORDER BY _q._ord1"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.sql")
	os.WriteFile(bad, []byte(`CREATE FUNCTION f(p text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE rec record; n int := 0;
BEGIN
  FOR rec IN SELECT step FROM metrics LOOP
    INSERT INTO log VALUES (rec.step);
    n := n + 1;
  END LOOP;
  RETURN n;
END $$;`), 0o644)
	if _, err := titan(t, "aggify", bad); err == nil || !strings.Contains(err.Error(), "line 5: INSERT") {
		t.Errorf("want a refusal naming line 5: INSERT, got %v", err)
	}
	out, err = titan(t, "aggify", "loss_ema", "--dialect", "sqlite")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"aggregate loss_ema_agg registered with modernc.org/sqlite", "3 arguments: loss (column), p_alpha float8 (pre-loop value), ema float8 (pre-loop value)",
		"SELECT loss_ema_agg(_q.loss, ?2, ?3 ORDER BY _q._ord1 NULLS LAST) FROM (SELECT loss, step AS _ord1 FROM metrics WHERE run_id = ?1) AS _q;"} {
		if !strings.Contains(out, want) {
			t.Errorf("--dialect sqlite output lacks %q:\n%s", want, out)
		}
	}
	if out, err := titan(t, "aggify", "leaderboard", "--dialect", "sqlite"); err != nil || !strings.Contains(out, "replaced by a common table") {
		t.Errorf("leaderboard on SQLite: %v\n%s", err, out)
	}
}

// TestAnalyzeSQLite runs titan analyze on a SQLite run store in every mode:
// loop, aggregate and auto agree, and auto records its choice.
func TestAnalyzeSQLite(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "runs.db")
	st, err := runstore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO runs (run_id, recipe_path, model, flavor, layout, world, host, titan_version, description, dump_folder, steps_planned, tokens_per_step, recipe, started_at, status)
		VALUES ('r1', 'x.toml', 'm', 'f', 'l', 1, 'h', 'v', 'd', 'o', 5, 1, '{}', '2026-12-01T00:00:00Z', 'finished')`); err != nil {
		t.Fatal(err)
	}
	for i, loss := range []any{3.0, 2.5, nil, 2.0, 2.25} {
		if _, err := db.Exec("INSERT INTO metrics (run_id, step, loss, elapsed_s) VALUES ('r1', ?, ?, ?)", i, loss, float64(i)); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	cache := filepath.Join(dir, "modes.json")
	for _, mode := range []string{"loop", "aggregate", "auto", "auto"} {
		out, err := titan(t, "analyze", "best_step", "--db", path, "--mode", mode, "--cache", cache, "r1")
		if err != nil {
			t.Fatalf("--mode %s: %v", mode, err)
		}
		if !strings.HasPrefix(out, "best_step\n3\n") {
			t.Errorf("--mode %s: %q, want best_step 3", mode, out)
		}
		out, err = titan(t, "analyze", "best_step", "--db", path, "--mode", mode, "--cache", cache, "none")
		if err != nil || !strings.HasPrefix(out, "best_step\nNULL\n") {
			t.Errorf("--mode %s, an empty run: %q, %v; want NULL", mode, out, err)
		}
	}
	// The leaderboard's own query (a function in FROM, a window function)
	// on SQLite, in both modes.
	for _, mode := range []string{"loop", "aggregate"} {
		out, err := titan(t, "analyze", "leaderboard", "--db", path, "--mode", mode)
		if err != nil {
			t.Fatalf("leaderboard --mode %s: %v", mode, err)
		}
		// EMA 0.1 over 3.0, 2.5, (NULL skipped), 2.0, 2.25: 2.95, 2.855,
		// 2.7945; best 2; 5 steps logged; first place.
		f := strings.Fields(strings.Split(out, "\n")[1])
		if len(f) != 6 || f[0] != "x.toml" || f[1] != "r1" || !strings.HasPrefix(f[2], "2.7945") || f[3] != "2" || f[4] != "5" || f[5] != "1" {
			t.Errorf("leaderboard --mode %s:\n%s", mode, out)
		}
	}
	if b, err := os.ReadFile(cache); err != nil || !strings.Contains(string(b), ":sqlite") {
		t.Errorf("auto did not record a SQLite choice: %s %v", b, err)
	}
}
