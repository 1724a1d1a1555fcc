//go:build cgo

package aggify

// The SQLite dialect. SQLite has no PL/pgSQL, so both forms run from Go:
//
//   - loop: the function as written, interpreted in Go (Interpret) over the
//     cursor queries' rows, each query translated to SQLite SQL;
//   - aggregate: the compiled function (its loops replaced by aggregate
//     calls) interpreted in Go, each rewritten loop one query
//     SELECT <aggregate>(fetch columns…, pre-loop values… ORDER BY …)
//     FROM (cursor query) AS _q, where <aggregate> is registered with the
//     modernc.org/sqlite driver (sqlite.RegisterFunction with
//     FunctionImpl.MakeAggregate) and its step runs the loop's Accumulator.
//     An outer loop whose body runs queries (its inner loops) cannot be a
//     step without a connection: it runs client-side (sqliteOuter), its
//     inner loops as their aggregates.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"modernc.org/sqlite"
)

// sqliteFuncs are the SQL functions a cursor query may call on SQLite: those
// with the same meaning in both databases.
var sqliteFuncs = map[string]bool{
	"abs": true, "coalesce": true, "count": true, "sum": true, "min": true, "max": true,
	"avg": true, "lower": true, "upper": true, "length": true, "nullif": true, "round": true,
	"rank": true, "dense_rank": true, "row_number": true,
}

var (
	paramRef = regexp.MustCompile(`\$([0-9]+)`)
	likeRE   = regexp.MustCompile(`(?i)\bLIKE\b`)
)

// SQLiteQuery translates a cursor query (PostgreSQL SQL whose variables are
// $n parameters) to SQLite SQL: $n become ?n and ORDER BY keys get
// PostgreSQL's NULL placement (ASC NULLS LAST, DESC NULLS FIRST; SQLite's
// default is the opposite). LIKE is kept (SQLiteRows runs it with
// case_sensitive_like on, as PostgreSQL's LIKE is case-sensitive; a
// backslash in the pattern is not an escape on SQLite). Casts, LATERAL, DISTINCT ON, arrays, row
// constructors, ILIKE, regular expressions, SIMILAR TO and functions outside
// a small common set are refused with the construct.
func SQLiteQuery(q string) (string, error) {
	if t, ok := sqliteCache.Load(q); ok {
		return t.(string), nil
	}
	t, err := sqliteQuery(q)
	if err == nil {
		sqliteCache.Store(q, t)
	}
	return t, err
}

// sqliteCache holds the translations made (a process runs few distinct
// cursor queries, each many times).
var sqliteCache sync.Map

func sqliteQuery(q string) (string, error) {
	tree, err := pg_query.Parse(q)
	if err != nil {
		return "", err
	}
	var bad string
	walkNodes(tree, func(n *pg_query.Node) {
		if bad != "" {
			return
		}
		switch x := n.Node.(type) {
		case *pg_query.Node_TypeCast:
			bad = "a cast (::)"
		case *pg_query.Node_RangeSubselect:
			if x.RangeSubselect.Lateral {
				bad = "LATERAL"
			}
		case *pg_query.Node_RangeFunction:
			bad = "a function in FROM"
		case *pg_query.Node_SelectStmt:
			if len(x.SelectStmt.DistinctClause) > 0 && x.SelectStmt.DistinctClause[0] != nil && x.SelectStmt.DistinctClause[0].Node != nil {
				bad = "DISTINCT ON"
			}
			if x.SelectStmt.WithClause != nil && x.SelectStmt.WithClause.Recursive {
				bad = "WITH RECURSIVE"
			}
		case *pg_query.Node_AArrayExpr:
			bad = "an array"
		case *pg_query.Node_RowExpr:
			bad = "a row constructor"
		case *pg_query.Node_AExpr:
			switch x.AExpr.Kind {
			case pg_query.A_Expr_Kind_AEXPR_ILIKE:
				bad = "ILIKE"
			case pg_query.A_Expr_Kind_AEXPR_SIMILAR:
				bad = "SIMILAR TO"
			case pg_query.A_Expr_Kind_AEXPR_OP_ANY:
				bad = "ANY (…)"
			case pg_query.A_Expr_Kind_AEXPR_OP_ALL:
				bad = "ALL (…)"
			}
			for _, o := range x.AExpr.Name {
				if s := o.GetString_(); s != nil && strings.ContainsAny(s.Sval, "~") && x.AExpr.Kind != pg_query.A_Expr_Kind_AEXPR_LIKE {
					bad = "the operator " + s.Sval
				}
			}
		case *pg_query.Node_FuncCall:
			fn := x.FuncCall.Funcname[len(x.FuncCall.Funcname)-1].GetString_().GetSval()
			if !sqliteFuncs[strings.ToLower(fn)] || len(x.FuncCall.Funcname) > 1 {
				bad = "the function " + fn
			}
		case *pg_query.Node_SortBy:
			if x.SortBy.SortbyNulls == pg_query.SortByNulls_SORTBY_NULLS_DEFAULT {
				if x.SortBy.SortbyDir == pg_query.SortByDir_SORTBY_DESC {
					x.SortBy.SortbyNulls = pg_query.SortByNulls_SORTBY_NULLS_FIRST
				} else {
					x.SortBy.SortbyNulls = pg_query.SortByNulls_SORTBY_NULLS_LAST
				}
			}
			if x.SortBy.SortbyDir == pg_query.SortByDir_SORTBY_USING {
				bad = "ORDER BY … USING"
			}
		}
	})
	if bad != "" {
		return "", fmt.Errorf("aggify: the query uses %s, which the SQLite dialect does not translate: %s", bad, q)
	}
	out, err := pg_query.Deparse(tree)
	if err != nil {
		return "", err
	}
	return paramRef.ReplaceAllString(out, "?$1"), nil
}

// SQLiteRows returns a Rows that runs cursor queries on db, translated by
// SQLiteQuery. Values come back as int64, float64, string or nil (a NaN
// stored in SQLite reads back as NULL).
func SQLiteRows(db *sql.DB) Rows {
	return func(ctx context.Context, q string, args []any, buffer bool, yield func(map[string]Value) bool) error {
		lq, err := SQLiteQuery(q)
		if err != nil {
			return err
		}
		var rows *sql.Rows
		if likeRE.MatchString(lq) {
			// PostgreSQL's LIKE is case-sensitive, SQLite's is not by default.
			c, err := db.Conn(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.ExecContext(ctx, "PRAGMA case_sensitive_like = ON"); err != nil {
				return err
			}
			defer c.ExecContext(context.Background(), "PRAGMA case_sensitive_like = OFF")
			rows, err = c.QueryContext(ctx, lq, sqliteArgs(args)...)
			if err != nil {
				return err
			}
		} else if rows, err = db.QueryContext(ctx, lq, sqliteArgs(args)...); err != nil {
			return err
		}
		defer rows.Close()
		cols, err := rows.Columns()
		if err != nil {
			return err
		}
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		closeRows := func() { rows.Close() }
		return feed(rows.Next, rows.Err, closeRows, func() (map[string]Value, error) {
			if err := rows.Scan(ptrs...); err != nil {
				return nil, err
			}
			row := make(map[string]Value, len(cols))
			for i, c := range cols {
				row[c] = sqliteValue(vals[i])
			}
			return row, nil
		}, buffer, yield)
	}
}

// sqliteArgs binds interpreter values: booleans become 0/1 as in SQLite.
func sqliteArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if b, ok := a.(bool); ok {
			if b {
				a = int64(1)
			} else {
				a = int64(0)
			}
		}
		out[i] = a
	}
	return out
}

// sqliteValue maps a driver value onto the interpreter's.
func sqliteValue(v any) Value {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case int:
		return int64(x)
	case time.Time:
		return x.Format(time.RFC3339Nano)
	}
	return v
}

// The aggregates registered with the driver, by name. Registration is
// process-wide and reaches connections opened afterwards; the loop an
// aggregate runs is the one of the program whose query runs it (RunSQLite
// sets it before each query), so two programs with a function of the same
// name must not run concurrently.
var (
	sqliteMu   sync.Mutex
	sqliteAggs = map[string]*LoopAnalysis{}
)

// SQLiteAggregate describes one registered aggregate: its name, its
// arguments (the fetched columns, then the pre-loop values of the loop's
// parameters and state) and the single query that replaces the loop
// (its cursor query's variables as ?n, then the pre-loop values).
type SQLiteAggregate struct {
	Func, Name string
	Line       int
	Args       []string
	Query      string
	// Client is set for an outer loop whose body runs queries (its inner
	// loops): it runs client-side in Go over Query's rows, its inner loops
	// as their aggregates, and nothing is registered for it.
	Client bool
}

// sqliteAgg builds the aggregate's query for loop a; q is the translated
// derived cursor query with nq parameters.
func sqliteAgg(a *LoopAnalysis, q string, nq int) (call string, pre []*Var) {
	var args []string
	for _, c := range a.Fetch {
		args = append(args, "_q."+ident(c))
	}
	for _, v := range append(append([]*Var{}, a.params...), a.init...) {
		if v.Kind == Synth {
			continue // guard flags start from their defaults
		}
		pre = append(pre, v)
		args = append(args, fmt.Sprintf("?%d", nq+len(pre)))
	}
	call = a.aggregate + "(" + strings.Join(args, ", ")
	if len(a.OrderBy) > 0 {
		call += " ORDER BY " + strings.Join(a.OrderBy, ", ")
	}
	return fmt.Sprintf("SELECT %s) FROM (%s) AS _q", call, q), pre
}

// sqliteLoop returns loop a's cursor query translated, with its number of
// parameters, or why the loop cannot run as a SQLite aggregate.
func sqliteLoop(a *LoopAnalysis) (string, int, error) {
	in := &interp{f: a.fn, env: map[*Var]Value{}, recs: map[*Var]map[string]Value{}}
	q, args, err := in.bind(&Expr{Text: a.loop.Query.Derived})
	if err != nil {
		return "", 0, err
	}
	lq, err := SQLiteQuery(q)
	if err != nil {
		return "", 0, err
	}
	return lq, len(args), nil
}

// sqliteOrder translates the aggregate's ORDER BY keys (PostgreSQL NULL
// placement made explicit).
func sqliteOrder(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	q, err := SQLiteQuery("SELECT 1 FROM _q ORDER BY " + strings.Join(keys, ", "))
	if err != nil {
		return nil, err
	}
	k := strings.Index(q, " ORDER BY ")
	if k < 0 {
		return nil, fmt.Errorf("aggify: translating ORDER BY %v", keys)
	}
	return []string{q[k+len(" ORDER BY "):]}, nil
}

// SQLiteAggregates compiles the program's aggregates for SQLite: what
// RegisterSQLite registers and the query each rewritten loop runs. A loop
// that cannot run as a SQLite aggregate is refused with the reason.
func (p *Program) SQLiteAggregates() ([]SQLiteAggregate, error) {
	var out []SQLiteAggregate
	for _, r := range p.Rewrites {
		for _, a := range r.Loops {
			if a.loop == nil {
				continue
			}
			q, nq, err := sqliteLoop(a)
			if err != nil {
				return nil, err
			}
			keys, err := sqliteOrder(a.OrderBy)
			if err != nil {
				return nil, err
			}
			if runsQueries(a.loop.Body) {
				order := ""
				if len(keys) > 0 {
					order = " ORDER BY " + strings.Join(keys, ", ")
				}
				out = append(out, SQLiteAggregate{Func: r.Func.Name, Line: a.Line, Client: true, Query: "SELECT * FROM (" + q + ") AS _q" + order})
				continue
			}
			b := *a
			b.OrderBy = keys
			call, pre := sqliteAgg(&b, q, nq)
			var args []string
			for _, c := range a.Fetch {
				args = append(args, c+" (column)")
			}
			for _, v := range pre {
				args = append(args, v.Name+" "+v.Type+" (pre-loop value)")
			}
			out = append(out, SQLiteAggregate{Func: r.Func.Name, Name: a.aggregate, Line: a.Line, Args: args, Query: call})
		}
	}
	return out, nil
}

// RegisterSQLite registers the program's aggregates with the modernc.org/
// sqlite driver (sqlite.RegisterFunction). Call it before opening the
// database: registration reaches the connections opened afterwards.
func (p *Program) RegisterSQLite() error {
	aggs, err := p.SQLiteAggregates()
	if err != nil {
		return err
	}
	sqliteMu.Lock()
	defer sqliteMu.Unlock()
	for _, r := range p.Rewrites {
		for _, a := range r.Loops {
			if a.loop == nil || runsQueries(a.loop.Body) {
				continue // client-side outer loop
			}
			_, known := sqliteAggs[a.aggregate]
			sqliteAggs[a.aggregate] = a
			if known {
				continue
			}
			var n int
			for _, g := range aggs {
				if g.Name == a.aggregate {
					n = len(g.Args)
				}
			}
			name := a.aggregate
			if err := sqlite.RegisterFunction(name, &sqlite.FunctionImpl{
				NArgs: int32(n),
				MakeAggregate: func(ctx sqlite.FunctionContext) (sqlite.AggregateFunction, error) {
					sqliteMu.Lock()
					a := sqliteAggs[name]
					sqliteMu.Unlock()
					return &sqliteStep{a: a}, nil
				},
			}); err != nil {
				return fmt.Errorf("aggify: registering %s: %w", name, err)
			}
		}
	}
	return nil
}

// sqliteStep is one evaluation of a registered aggregate: the loop's
// Accumulator, started on the first row from the pre-loop values (the
// trailing arguments, as text). With no rows it returns NULL and the caller
// keeps the pre-loop values, as after a loop that never ran.
type sqliteStep struct {
	a   *LoopAnalysis
	acc *Accumulator
}

func (s *sqliteStep) Step(_ *sqlite.FunctionContext, args []driver.Value) error {
	nf := len(s.a.Fetch)
	if s.acc == nil {
		pre := map[string]Value{}
		i := nf
		for _, v := range append(append([]*Var{}, s.a.params...), s.a.init...) {
			if v.Kind == Synth {
				continue
			}
			pre[v.Name] = sqliteValue(args[i])
			i++
		}
		acc, err := s.a.NewAccumulator(context.Background(), pre)
		if err != nil {
			return err
		}
		s.acc = acc
	}
	row := make(map[string]Value, nf)
	for i, c := range s.a.Fetch {
		row[c] = sqliteValue(args[i])
	}
	return s.acc.Step(row)
}

func (s *sqliteStep) WindowInverse(*sqlite.FunctionContext, []driver.Value) error {
	return errors.New("aggify: a rewritten loop is not a window function")
}

// WindowValue returns the loop's results as a JSON array of their text
// forms (null for NULL), or NULL when no row was stepped.
func (s *sqliteStep) WindowValue(*sqlite.FunctionContext) (driver.Value, error) {
	if s.acc == nil {
		return nil, nil
	}
	var out []*string
	for _, v := range s.acc.Results() {
		if v == nil {
			out = append(out, nil)
			continue
		}
		t := textOfValue(v)
		out = append(out, &t)
	}
	b, err := json.Marshal(out)
	return string(b), err
}

func (s *sqliteStep) Final(*sqlite.FunctionContext) {}

// RunSQLite runs the file on a SQLite database in mode (loop or
// aggregate): its own query when it has one (see runSQLiteQuery; args must
// then be empty), else its last compiled function with args as text
// converted to the parameter types. The aggregate mode needs RegisterSQLite
// before db was opened.
func (p *Program) RunSQLite(ctx context.Context, db *sql.DB, mode Mode, args []string) (*Result, error) {
	if mode != ModeLoop && mode != ModeAggregate {
		return nil, fmt.Errorf("aggify: mode %q on SQLite: want loop or aggregate", mode)
	}
	if mode == ModeAggregate {
		if _, err := p.SQLiteAggregates(); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	if len(p.Queries) > 0 {
		if len(args) > 0 {
			return nil, fmt.Errorf("aggify: the file runs its own query, which takes no arguments (got %d)", len(args))
		}
		res, err := p.runSQLiteQuery(ctx, db, mode)
		if err != nil {
			return nil, err
		}
		res.Elapsed = time.Since(start)
		return res, nil
	}
	r := p.Rewrites[len(p.Rewrites)-1]
	if _, err := r.Func.inputs(len(args)); err != nil {
		return nil, err
	}
	vals := make([]Value, len(args))
	for i, a := range args {
		vals[i] = a
	}
	out, err := p.callSQLite(ctx, db, mode, r.Func.Name, vals)
	if err != nil {
		return nil, err
	}
	return &Result{Mode: mode, Elapsed: time.Since(start), Columns: resultColumns(r.Func), Rows: [][]string{textRow(out)}}, nil
}

// callSQLite runs the file's function name on db in mode with vals (the
// IN parameters, coerced to their types) and returns its results: the
// return value, or the OUT parameters in order.
func (p *Program) callSQLite(ctx context.Context, db *sql.DB, mode Mode, name string, vals []Value) ([]Value, error) {
	if mode == ModeLoop {
		file, err := ParseFile(p.Source) // a fresh IR: Compile consumed the first
		if err != nil {
			return nil, err
		}
		for _, f := range file.Funcs {
			if f.Name == name {
				return Interpret(ctx, f, vals, SQLiteRows(db))
			}
		}
		return nil, fmt.Errorf("aggify: no function %s in the file", name)
	}
	for _, r := range p.Rewrites {
		if r.Func.Name == name {
			return interpret(ctx, r.Func, vals, SQLiteRows(db), sqliteCall(db, r))
		}
	}
	return nil, fmt.Errorf("aggify: %s has no cursor loop to run as an aggregate", name)
}

// sqliteCall runs a rewritten loop as its registered aggregate's query.
func sqliteCall(db *sql.DB, r *Rewrite) func(*interp, *AggCall) error {
	return func(in *interp, s *AggCall) error {
		var a *LoopAnalysis
		for _, l := range r.Loops {
			if l.Line == s.Line && l.loop != nil {
				a = l
			}
		}
		if a == nil {
			return nil // a loop without live-out variables: removed
		}
		if runsQueries(a.loop.Body) {
			return sqliteOuter(in, a)
		}
		// The aggregate runs this program's loop (another file may have
		// registered a function of the same name).
		sqliteMu.Lock()
		_, known := sqliteAggs[a.aggregate]
		if known {
			sqliteAggs[a.aggregate] = a
		}
		sqliteMu.Unlock()
		if !known {
			return in.fail(s.Line, "aggregate "+a.aggregate, "not registered: call RegisterSQLite (or OpenSQLite) before opening the database")
		}
		q, args, err := in.bind(&Expr{Text: a.loop.Query.Derived})
		if err != nil {
			return err
		}
		lq, err := SQLiteQuery(q)
		if err != nil {
			return err
		}
		keys, err := sqliteOrder(a.OrderBy)
		if err != nil {
			return err
		}
		b := *a
		b.OrderBy = keys
		call, pre := sqliteAgg(&b, lq, len(args))
		args = sqliteArgs(args)
		for _, v := range pre {
			if x := in.env[v]; x == nil {
				args = append(args, nil)
			} else {
				args = append(args, textOfValue(x))
			}
		}
		var res sql.NullString
		if err := db.QueryRowContext(in.ctx, call, args...).Scan(&res); err != nil {
			return in.fail(s.Line, "aggregate query", err.Error()+": "+call)
		}
		if !res.Valid {
			return nil // no rows: the state keeps its pre-loop values
		}
		var texts []*string
		if err := json.Unmarshal([]byte(res.String), &texts); err != nil {
			return err
		}
		for i, v := range a.results {
			if texts[i] == nil {
				in.env[v] = nil
				continue
			}
			x, err := coerce(*texts[i], v.Type)
			if err != nil {
				return err
			}
			in.env[v] = x
		}
		return nil
	}
}

// OpenSQLite registers the program's aggregates (RegisterSQLite) and opens
// the existing SQLite database at path read-only, on one connection. For
// a loop SQLite cannot aggregate only the loop mode is available, and
// registration is skipped.
func (p *Program) OpenSQLite(path string) (*sql.DB, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("aggify: SQLite run store: %w", err)
	}
	if _, err := p.SQLiteAggregates(); err == nil {
		if err := p.RegisterSQLite(); err != nil {
			return nil, err
		}
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

// SQLiteText is what `titan aggify --dialect sqlite` prints: per rewritten
// loop the aggregate registered with the driver (name, arguments, the Go
// step) and the one query that replaces the loop.
func (p *Program) SQLiteText() (string, error) {
	aggs, err := p.SQLiteAggregates()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, g := range aggs {
		if g.Client {
			fmt.Fprintf(&b, "-- %s, loop at line %d: its body runs queries (inner loops), so it runs client-side in Go over the rows of\n%s;\n--   its inner loops as the aggregates above, one query per row\n\n", g.Func, g.Line, g.Query)
			continue
		}
		fmt.Fprintf(&b, "-- %s, loop at line %d: aggregate %s registered with modernc.org/sqlite (sqlite.RegisterFunction, MakeAggregate)\n", g.Func, g.Line, g.Name)
		fmt.Fprintf(&b, "--   %d arguments: %s\n", len(g.Args), strings.Join(g.Args, ", "))
		b.WriteString("--   step: the loop body run by the Go interpreter (Accumulator); value: the results as a JSON array of text; NULL for no rows (the pre-loop values are kept)\n")
		b.WriteString("--   ?n: the cursor query's variables, then the pre-loop values, bound by titan analyze\n")
		b.WriteString(g.Query + ";\n\n")
	}
	if len(p.Queries) > 0 {
		fmt.Fprintf(&b, "-- the file's query runs in SQLite with each call of a file function in FROM replaced by a common table\n"+
			"-- expression of its results: the function runs once per distinct argument tuple of the other FROM items\n"+
			"-- (as the aggregates above), joined on the arguments (IS NOT DISTINCT FROM):\n%s;\n", p.Queries[len(p.Queries)-1])
	}
	return b.String(), nil
}

// sqliteOuter runs an outer loop (its body runs queries) client-side: the
// rewritten body (guard flags instead of EXIT/CONTINUE/RETURN, inner loops
// as aggregate calls) for each row of the cursor query in the loop's order,
// as the Accumulator does, but on the function's own variables.
func sqliteOuter(in *interp, a *LoopAnalysis) error {
	q, args, err := in.bind(&Expr{Text: a.loop.Query.Derived})
	if err != nil {
		return err
	}
	if len(a.OrderBy) > 0 {
		q = "SELECT * FROM (" + q + ") AS _q ORDER BY " + strings.Join(a.OrderBy, ", ")
	}
	for _, v := range a.init {
		if v.Kind == Synth {
			in.env[v] = nil
			if v.Default != nil {
				x, err := in.eval(v.Default)
				if err != nil {
					return err
				}
				if in.env[v], err = coerce(x, v.Type); err != nil {
					return err
				}
			}
		}
	}
	var bodyErr error
	err = in.rows(in.ctx, q, args, true, func(row map[string]Value) bool {
		if d := a.done; d != nil && in.env[d] == true {
			return false
		}
		for _, v := range a.locals {
			in.env[v] = nil
		}
		in.recs[a.loop.Rec] = row
		c, err := in.list(a.loop.Body)
		if err == nil && c.kind != ctlNone {
			err = in.fail(a.Line, "loop body", "unexpected jump out of the rewritten body")
		}
		bodyErr = err
		return err == nil
	})
	if bodyErr != nil {
		return bodyErr
	}
	return err
}
