//go:build cgo

package aggify

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
)

// builtinCalls are the argument lists each built-in analysis is checked
// with; $R is the run id.
var builtinCalls = map[string][]string{
	"best_step":                {"$R"},
	"divergence_step":          {"$R, 3.0", "$R, 1.5"},
	"grad_spike_count":         {"$R, 2.0", "$R, 4.0"},
	"longest_improving_streak": {"$R"},
	"loss_ema":                 {"$R, 0.1", "$R, 0.9"},
	"throughput_drawdown":      {"$R"},
	"time_to_target":           {"$R, 3.0", "$R, 2.2", "$R, -1"},
}

// extraLoops are loops written for the test from the paper's categories
// (not among the built-ins), with their argument lists.
var extraLoops = []struct {
	name, src string
	calls     []string
}{
	{"tuple_state_no_order", `
CREATE FUNCTION steady_state_summary(p_run text, p_warmup bigint, p_budget_gib float8,
    OUT avg_mfu float8, OUT peak_mem float8, OUT n_over_budget int) LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; n int := 0; s float8 := 0;
BEGIN
  peak_mem := 0; n_over_budget := 0;
  FOR rec IN SELECT mfu, mem_gib FROM metrics WHERE run_id = p_run AND step >= p_warmup LOOP
    n := n + 1; s := s + rec.mfu;
    IF rec.mem_gib > peak_mem THEN peak_mem := rec.mem_gib; END IF;
    IF rec.mem_gib > p_budget_gib THEN n_over_budget := n_over_budget + 1; END IF;
  END LOOP;
  avg_mfu := CASE WHEN n > 0 THEN s / n END;
END $$;`, []string{"$R, 10, 45.0", "$R, 1000, 45.0"}},
	{"early_return", `
CREATE FUNCTION first_nan_step(p_run text) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE rec record;
BEGIN
  FOR rec IN SELECT step, loss FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF rec.loss = 'NaN'::float8 THEN
      RETURN rec.step;
    END IF;
  END LOOP;
  RETURN -1;
END $$;`, []string{"$R"}},
	{"patience_exit_when", `
CREATE FUNCTION early_stop_step(p_run text, p_patience int, p_min_delta float8) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; best float8 := NULL; since int := 0; stop_step bigint := NULL;
BEGIN
  FOR rec IN SELECT step, loss FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF best IS NULL OR rec.loss < best - p_min_delta THEN best := rec.loss; since := 0;
    ELSE since := since + 1; END IF;
    stop_step := rec.step;
    EXIT WHEN since >= p_patience;
    stop_step := NULL;
  END LOOP;
  RETURN stop_step;
END $$;`, []string{"$R, 5, 0.0", "$R, 40, 0.01"}},
	{"nested_inner_first", `
CREATE FUNCTION best_run_by_ema(p_prefix text, p_alpha float8) RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE r record; m record; ema float8; best_ema float8 := NULL; best_run text := NULL;
BEGIN
  FOR r IN SELECT DISTINCT run_id FROM metrics WHERE run_id LIKE p_prefix || '%' ORDER BY run_id LOOP
    ema := NULL;
    FOR m IN SELECT loss FROM metrics WHERE run_id = r.run_id ORDER BY step LOOP
      IF ema IS NULL THEN ema := m.loss; ELSE ema := p_alpha * m.loss + (1 - p_alpha) * ema; END IF;
    END LOOP;
    IF ema IS NOT NULL AND (best_ema IS NULL OR ema < best_ema) THEN best_ema := ema; best_run := r.run_id; END IF;
  END LOOP;
  RETURN best_run;
END $$;`, []string{"'a', 0.1", "'', 0.5", "'zzz', 0.1"}},
	{"ties_broken_by_second_key_desc_limit", `
CREATE FUNCTION kth_best_step(p_run text, p_k int) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; i int := 0; at bigint;
BEGIN
  FOR rec IN SELECT step FROM metrics WHERE run_id = p_run AND loss IS NOT NULL ORDER BY loss DESC, step LIMIT 50 LOOP
    i := i + 1;
    IF i = p_k THEN at := rec.step; END IF;
  END LOOP;
  RETURN at;
END $$;`, []string{"$R, 1", "$R, 7"}},
	{"nulls_and_inner_int_loop", `
CREATE FUNCTION val_summary(p_run text, OUT n_missing int, OUT last_val float8, OUT weighted float8)
LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; w float8; k int;
BEGIN
  n_missing := 0; weighted := 0;
  FOR rec IN SELECT val_loss, grad_norm FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF rec.val_loss IS NULL THEN
      n_missing := n_missing + 1;
      CONTINUE;
    END IF;
    last_val := rec.val_loss;
    w := 1;
    FOR k IN 1..3 LOOP w := w * 0.5; END LOOP;
    k := 0;
    WHILE k < 2 LOOP k := k + 1; END LOOP;
    weighted := weighted + w * k * coalesce(rec.grad_norm, 0);
  END LOOP;
END $$;`, []string{"$R"}},
	{"order_by_expression_and_position", `
CREATE FUNCTION elapsed_order_check(p_run text) RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE rec record; acc text := '';
BEGIN
  FOR rec IN SELECT step, elapsed_s FROM metrics WHERE run_id = p_run AND step < 20 ORDER BY -step, 2 LOOP
    acc := acc || rec.step || ',';
  END LOOP;
  RETURN acc;
END $$;`, []string{"$R"}},
}

// TestEquivalence checks, on a real PostgreSQL server, that every built-in
// analysis and every extra loop gives the same result as its rewrite, for
// every generated run (empty, single row, ties, NULL, NaN, never reaching
// the target, diverging) and an unknown run id.
func TestEquivalence(t *testing.T) {
	conn := freshDB(t, "aggify_equiv")
	load(t, conn, testRuns)
	ctx := context.Background()
	type tc struct {
		name, src string
		calls     []string
	}
	var cases []tc
	for _, b := range Builtins() {
		cases = append(cases, tc{b.Name, b.Source, nil})
	}
	for _, e := range extraLoops {
		cases = append(cases, tc{e.name, e.src, e.calls})
	}
	checked := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := CompileFile(c.src)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Install(ctx, conn); err != nil {
				t.Fatal(err)
			}
			if len(p.Queries) > 0 {
				for i := range p.Queries {
					want := sorted(textOf(t, conn, "SELECT q::text FROM ("+p.Queries[i]+") q"))
					got := sorted(textOf(t, conn, "SELECT q::text FROM ("+p.AggQueries[i]+") q"))
					if strings.Join(want, "\n") != strings.Join(got, "\n") {
						t.Errorf("outer query differs:\nloop:\n%s\naggregate:\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
					}
					if len(want) != len(testRuns) {
						t.Errorf("outer query returned %d rows, want %d", len(want), len(testRuns))
					}
					checked++
				}
				return
			}
			r := p.Rewrites[len(p.Rewrites)-1]
			calls := c.calls
			if calls == nil {
				calls = builtinCalls[r.Func.Name]
			}
			if len(calls) == 0 {
				t.Fatalf("no argument lists for %s", r.Func.Name)
			}
			distinct := map[string]bool{}
			defer func() {
				if len(distinct) < 2 {
					t.Errorf("every call returned the same value %v: the data do not exercise the loop", distinct)
				}
			}()
			for _, call := range calls {
				ids := runIDs(testRuns)
				if !strings.Contains(call, "$R") {
					ids = ids[:1]
				}
				for _, id := range ids {
					args := strings.ReplaceAll(call, "$R", "'"+id+"'")
					want := textOf(t, conn, fmt.Sprintf("SELECT t::text FROM %s(%s) t", r.Func.Name, args))
					got := textOf(t, conn, fmt.Sprintf("SELECT t::text FROM %s(%s) t", r.Aggified, args))
					if fmt.Sprint(want) != fmt.Sprint(got) {
						t.Errorf("%s(%s): loop %v, aggregate %v", r.Func.Name, args, want, got)
					}
					distinct[fmt.Sprint(want)] = true
					checked++
				}
			}
		})
	}
	t.Logf("%d comparisons", checked)
}

func sorted(s []string) []string { sort.Strings(s); return s }

// TestAnalyzeModes runs a built-in analysis through Program.Analyze in each
// mode: loop and aggregate agree, and auto measures once, then follows its
// recorded choice.
func TestAnalyzeModes(t *testing.T) {
	conn := freshDB(t, "aggify_modes")
	load(t, conn, testRuns[:3])
	ctx := context.Background()
	b, _ := LookupBuiltin("loss_ema")
	p, err := CompileFile(b.Source)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Install(ctx, conn); err != nil {
		t.Fatal(err)
	}
	args := []string{"a-1", "0.1"}
	loop, err := p.Analyze(ctx, conn, ModeLoop, args, "")
	if err != nil {
		t.Fatal(err)
	}
	agg, err := p.Analyze(ctx, conn, ModeAggregate, args, "")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(loop.Rows) != fmt.Sprint(agg.Rows) || len(loop.Rows) != 1 || loop.Rows[0][0] == "NULL" {
		t.Fatalf("loop %v, aggregate %v", loop.Rows, agg.Rows)
	}
	cache := t.TempDir() + "/modes.json"
	first, err := p.Analyze(ctx, conn, ModeAuto, args, cache)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(first.Note, "measured") {
		t.Errorf("first auto run: note %q, want a measurement", first.Note)
	}
	second, err := p.Analyze(ctx, conn, ModeAuto, args, cache)
	if err != nil {
		t.Fatal(err)
	}
	if second.Mode != first.Mode || !strings.Contains(second.Note, "earlier measurement") {
		t.Errorf("second auto run: %s %q, want %s from the cache", second.Mode, second.Note, first.Mode)
	}
	if fmt.Sprint(second.Rows) != fmt.Sprint(loop.Rows) {
		t.Errorf("auto %v, loop %v", second.Rows, loop.Rows)
	}
	want := fmt.Sprintf("takes %d arguments", len(args))
	if _, err := p.Query(ModeLoop, []string{"a-1"}); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "got 1") {
		t.Errorf("wrong number of arguments: error %v, want one saying it %s and got 1", err, want)
	}
}
