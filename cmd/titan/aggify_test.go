package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	if _, err := titan(t, "aggify", "loss_ema", "--dialect", "sqlite"); err == nil {
		t.Error("--dialect sqlite: want an error (not implemented yet)")
	}
}
