//go:build cgo

package aggify

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func compileOne(t *testing.T, src string) (*Rewrite, error) {
	t.Helper()
	file, err := ParseFile(src)
	if err != nil {
		return nil, err
	}
	if len(file.Funcs) != 1 {
		t.Fatalf("want one function, got %d", len(file.Funcs))
	}
	return Compile(file.Funcs[0])
}

func fn(decl, body string) string {
	return "CREATE FUNCTION f(p_run text, p_x float8) RETURNS float8 LANGUAGE plpgsql STABLE AS $$\nDECLARE rec record; " +
		decl + "\nBEGIN\n" + body + "\nEND $$;"
}

// TestDataflowSets checks the paper's sets (V_fetch, V_F, V_init, extra
// parameters, V_local, V_term) for loops of each kind.
func TestDataflowSets(t *testing.T) {
	empty := []string{}
	cases := []struct {
		name                                         string
		src                                          string
		fetch, state, params, locals, results, order []string
		early                                        bool
	}{
		{"streak (paper L4)", `CREATE FUNCTION s(p_run text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE rec record; prev_loss float8 := NULL; cur int := 0; best int := 0;
BEGIN
  FOR rec IN SELECT loss FROM metrics WHERE run_id = p_run ORDER BY step LOOP
    IF prev_loss IS NOT NULL AND rec.loss < prev_loss THEN cur := cur + 1; ELSE cur := 0; END IF;
    IF cur > best THEN best := cur; END IF;
    prev_loss := rec.loss;
  END LOOP;
  RETURN best;
END $$;`, []string{"loss"}, []string{"best", "cur", "prev_loss"}, empty, empty, []string{"best"}, []string{"_q._ord1"}, false},
		{"local dd is V_local, p_x a parameter", fn("peak float8 := 0; dd float8; m float8 := 0;", `
  FOR rec IN SELECT v FROM t ORDER BY k DESC LOOP
    IF rec.v > peak THEN peak := rec.v; END IF;
    IF peak > p_x THEN dd := peak - rec.v; IF dd > m THEN m := dd; END IF; END IF;
  END LOOP;
  RETURN m;`), []string{"v"}, []string{"m", "peak"}, []string{"p_x"}, []string{"dd"}, []string{"m"}, []string{"_q._ord1 DESC"}, false},
		{"assigned, dead, conditionally used: state", fn("a float8; b float8 := 0;", `
  FOR rec IN SELECT v FROM t LOOP
    IF rec.v > 0 THEN b := b + a; END IF;
    a := rec.v;
  END LOOP;
  RETURN b;`), []string{"v"}, []string{"a", "b"}, empty, empty, []string{"b"}, empty, false},
		{"EXIT adds a done flag", fn("r float8;", `
  FOR rec IN SELECT v, k FROM t ORDER BY k LOOP
    IF rec.v < p_x THEN r := rec.k; EXIT; END IF;
  END LOOP;
  RETURN r;`), []string{"v", "k"}, []string{"_done_5", "r"}, []string{"p_x"}, empty, []string{"r"}, []string{"_q.k"}, true},
		{"RETURN inside: flag, value and done", fn("", `
  FOR rec IN SELECT v FROM t ORDER BY 1 LOOP
    IF rec.v > p_x THEN RETURN rec.v; END IF;
  END LOOP;
  RETURN 0;`), []string{"v"}, []string{"_done_5", "_ret_5", "_returned_5"}, []string{"p_x"}, empty, []string{"_ret_5", "_returned_5"}, []string{"_q.v"}, true},
		{"CONTINUE is a per-row local flag", fn("n float8 := 0;", `
  FOR rec IN SELECT v FROM t LOOP
    CONTINUE WHEN rec.v IS NULL;
    n := n + 1;
  END LOOP;
  RETURN n;`), []string{"v"}, []string{"n"}, empty, []string{"_skip_5"}, []string{"n"}, empty, false},
		{"variable dead after the loop is not a result", fn("n float8 := 0; s float8 := 0;", `
  FOR rec IN SELECT v FROM t LOOP
    n := n + 1; s := s + rec.v;
  END LOOP;
  RETURN s;`), []string{"v"}, []string{"n", "s"}, empty, empty, []string{"s"}, empty, false},
		{"redefined before use after the loop: not live-out", fn("n float8 := 0; s float8 := 0;", `
  FOR rec IN SELECT v FROM t LOOP
    n := n + 1; s := s + rec.v;
  END LOOP;
  n := 5;
  RETURN s + n;`), []string{"v"}, []string{"n", "s"}, empty, empty, []string{"s"}, empty, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := compileOne(t, c.src)
			if err != nil {
				t.Fatal(err)
			}
			a := r.Loops[len(r.Loops)-1]
			got := map[string][]string{"fetch": a.Fetch, "state": a.State, "init": a.Init, "params": a.Params, "locals": a.Locals, "results": a.Results, "order": a.OrderBy}
			want := map[string][]string{"fetch": c.fetch, "state": c.state, "init": c.state, "params": c.params, "locals": c.locals, "results": c.results, "order": c.order}
			for k := range want {
				g, w := got[k], want[k]
				if len(g) == 0 && len(w) == 0 {
					continue
				}
				if !reflect.DeepEqual(g, w) {
					t.Errorf("%s = %v, want %v", k, g, w)
				}
			}
			if a.EarlyExit != c.early {
				t.Errorf("EarlyExit = %v, want %v", a.EarlyExit, c.early)
			}
		})
	}
}

// TestNestedInnerFirst checks that the inner loop is rewritten first and the
// outer aggregate's transition function calls the inner aggregate.
func TestNestedInnerFirst(t *testing.T) {
	r, err := compileOne(t, extraLoops[3].src)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Loops) != 2 || r.Loops[0].Record != "m" || r.Loops[1].Record != "r" {
		t.Fatalf("loops = %+v, want inner (m) then outer (r)", r.Loops)
	}
	if got := r.Loops[1].Locals; !reflect.DeepEqual(got, []string{"ema"}) {
		t.Errorf("outer locals = %v, want [ema] (the inner result, reset every row)", got)
	}
	sql := r.SQL()
	step := sql[strings.Index(sql, "CREATE FUNCTION best_run_by_ema_l5_agg_step"):]
	if !strings.Contains(step, "best_run_by_ema_l7_agg(_q, p_alpha, ema ORDER BY") {
		t.Errorf("outer transition function does not call the inner aggregate:\n%s", step)
	}
}

// TestRefusals checks that loops that cannot be rewritten are refused with
// the construct and its line.
func TestRefusals(t *testing.T) {
	cases := []struct {
		name, body, decl string
		line             int
		want             string
	}{
		{"insert", "FOR rec IN SELECT v FROM t LOOP\n INSERT INTO log VALUES (rec.v);\nEND LOOP;\nRETURN 0;", "", 5, "INSERT: cannot rewrite the loop at line 4: writes to table log"},
		{"update", "FOR rec IN SELECT v FROM t LOOP\n UPDATE runs SET x = rec.v;\nEND LOOP;\nRETURN 0;", "", 5, "writes to table runs"},
		{"delete", "FOR rec IN SELECT v FROM t LOOP\n DELETE FROM runs;\nEND LOOP;\nRETURN 0;", "", 5, "writes to table runs"},
		{"execute", "FOR rec IN SELECT v FROM t LOOP\n EXECUTE 'SELECT 1';\nEND LOOP;\nRETURN 0;", "", 5, "EXECUTE: cannot rewrite the loop at line 4: dynamic SQL"},
		{"for in execute", "FOR rec IN EXECUTE 'SELECT 1' LOOP\n NULL;\nEND LOOP;\nRETURN 0;", "", 4, "dynamic SQL"},
		{"exception block", "FOR rec IN SELECT v FROM t LOOP\n BEGIN n := 1 / rec.v; EXCEPTION WHEN others THEN n := 0; END;\nEND LOOP;\nRETURN n;", "n float8;", 5, "EXCEPTION block"},
		{"fetch cursor", "FOR rec IN SELECT v FROM t LOOP\n FETCH c INTO n;\nEND LOOP;\nRETURN n;", "n float8; c refcursor;", 5, "FETCH: cannot rewrite the loop at line 4: explicit cursors"},
		{"raise", "FOR rec IN SELECT v FROM t LOOP\n RAISE NOTICE 'x';\nEND LOOP;\nRETURN 0;", "", 5, "RAISE"},
		{"record after loop", "FOR rec IN SELECT v FROM t LOOP\n n := rec.v;\nEND LOOP;\nRETURN rec.v;", "n float8;", 4, "record rec: cannot rewrite the loop at line 4: it is read after the loop"},
		{"found after loop", "FOR rec IN SELECT v FROM t LOOP\n n := rec.v;\nEND LOOP;\nIF found THEN RETURN n; END IF;\nRETURN 0;", "n float8;", 4, "FOUND is read after the loop"},
		{"exit to enclosing loop", "<<outer>> LOOP\nFOR rec IN SELECT v FROM t LOOP\n EXIT outer;\nEND LOOP;\nEND LOOP;\nRETURN 0;", "", 6, "EXIT outer: leaves the cursor loop"},
		{"return from a nested while", "FOR rec IN SELECT v FROM t LOOP\n WHILE true LOOP RETURN 1; END LOOP;\nEND LOOP;\nRETURN 0;", "", 5, "RETURN inside a loop nested"},
		{"locking cursor query", "FOR rec IN SELECT v FROM t FOR UPDATE LOOP\n NULL;\nEND LOOP;\nRETURN 0;", "", 4, "FOR UPDATE in a cursor query"},
		{"name clash with a column", "FOR rec IN SELECT v FROM t LOOP\n v := rec.v;\nEND LOOP;\nRETURN v;", "v float8;", 4, "variable v: cannot rewrite the loop at line 4: it has the name of a column"},
		{"no loop", "RETURN 1;", "", 3, "no FOR … IN query LOOP"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := compileOne(t, fn(c.decl, c.body))
			if err == nil {
				t.Fatal("compiled; want a refusal")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
			var ae *Error
			if errors.As(err, &ae) && ae.Line != c.line {
				t.Errorf("line %d, want %d (%v)", ae.Line, c.line, err)
			}
		})
	}
}

// TestParseErrors checks that a syntax error or a non-PL/pgSQL function is
// reported, not compiled.
func TestParseErrors(t *testing.T) {
	for _, src := range []string{
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;",
		"CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN FOR LOOP END $$;",
		"CREATE FUNCTION f(int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END $$;",
	} {
		if _, err := compileOne(t, src); err == nil {
			t.Errorf("%s: no error", src)
		}
	}
}
