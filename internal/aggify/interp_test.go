//go:build cgo

package aggify

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func sameValue(a, b Value) bool {
	fa, oka := a.(float64)
	fb, okb := b.(float64)
	if oka && okb {
		return fa == fb || (math.IsNaN(fa) && math.IsNaN(fb))
	}
	return a == b
}

// TestInterpreterMatchesPostgres runs every built-in analysis and extra loop
// through the Go interpreter of the IR (rows fetched from PostgreSQL) and
// compares with the PL/pgSQL function on the server, value for value.
func TestInterpreterMatchesPostgres(t *testing.T) {
	conn := freshDB(t, "aggify_interp")
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
	calls := map[string][]string{"run_summary": {"$R, 0.1"}}
	for k, v := range builtinCalls {
		calls[k] = v
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := CompileFile(c.src)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Install(ctx, conn); err != nil {
				t.Fatal(err)
			}
			file, _ := ParseFile(c.src)
			f := file.Funcs[len(file.Funcs)-1]
			cl := c.calls
			if cl == nil {
				cl = calls[f.Name]
			}
			var in []*Var
			for _, v := range f.Params {
				if v.Kind == Param {
					in = append(in, v)
				}
			}
			for _, call := range cl {
				for _, id := range runIDs(testRuns) {
					lits := strings.Split(strings.ReplaceAll(call, "$R", "'"+id+"'"), ", ")
					for i := range lits {
						lits[i] += "::" + in[i].Type
					}
					args := rowValues(t, ctx, conn, "SELECT "+strings.Join(lits, ", "))
					want := rowValues(t, ctx, conn, fmt.Sprintf("SELECT * FROM %s(%s)", f.Name, strings.Join(lits, ", ")))
					ff, _ := ParseFile(c.src)
					got, err := Interpret(ctx, ff.Funcs[len(ff.Funcs)-1], args, PgxRows(conn))
					if err != nil {
						t.Fatalf("%s(%s): %v", f.Name, strings.Join(lits, ", "), err)
					}
					if len(got) != len(want) {
						t.Fatalf("%s: %d values, want %d", f.Name, len(got), len(want))
					}
					for i := range got {
						if !sameValue(got[i], want[i]) {
							t.Errorf("%s(%s)[%d]: Go %v (%T), PostgreSQL %v (%T)", f.Name, strings.Join(lits, ", "), i, got[i], got[i], want[i], want[i])
						}
					}
					if !strings.Contains(call, "$R") {
						break
					}
				}
			}
		})
	}
}

func rowValues(t *testing.T, ctx context.Context, conn *pgx.Conn, q string) []Value {
	t.Helper()
	rows, err := conn.Query(ctx, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []Value
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			out = append(out, normalize(v))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return out
}

func rowValuesArgs(t *testing.T, ctx context.Context, conn *pgx.Conn, q string, args []any) []Value {
	t.Helper()
	rows, err := conn.Query(ctx, q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []Value
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			out = append(out, normalize(v))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return out
}

// TestCoerceIntegerRange: as in PostgreSQL, a value past a 16- or 32-bit
// integer type is an error ("integer out of range"), not a wider number,
// in the interpreted loop and the SQLite aggregates alike (both coerce).
func TestCoerceIntegerRange(t *testing.T) {
	for _, tc := range []struct {
		v    Value
		typ  string
		want string // "" for no error
	}{
		{int64(2147483647), "int", ""},
		{int64(2147483691), "int", "integer out of range"},
		{int64(-2147483649), "integer", "integer out of range"},
		{float64(3e9), "int4", "integer out of range"},
		{int64(32768), "smallint", "smallint out of range"},
		{int64(1 << 40), "bigint", ""},
		{"2147483648", "int", "integer out of range"},
	} {
		_, err := coerce(tc.v, tc.typ)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("coerce(%v, %s): %v, want %q", tc.v, tc.typ, err, tc.want)
		}
	}
}
