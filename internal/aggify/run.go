//go:build cgo

package aggify

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Program is a compiled SQL file: its functions as written, their rewrites,
// and its outer queries in both forms.
type Program struct {
	Source   string
	Funcs    []*Func    // as parsed (their IR is consumed by Compile)
	Rewrites []*Rewrite // one per function that has a cursor loop
	// Originals are the functions as CREATE OR REPLACE statements.
	Originals []string
	// Queries and AggQueries are the file's other statements, calling the
	// original and the _aggified functions.
	Queries, AggQueries []string
}

// CompileFile parses src and compiles every function in it that holds a
// cursor loop. A function without one is kept as written (it may be a
// helper); a loop that cannot be rewritten fails the whole file.
func CompileFile(src string) (*Program, error) {
	file, err := ParseFile(src)
	if err != nil {
		return nil, err
	}
	p := &Program{Source: src, Funcs: file.Funcs, Queries: file.Queries}
	rename := map[string]string{}
	for _, f := range file.Funcs {
		orig, err := orReplace(f.Source)
		if err != nil {
			return nil, err
		}
		p.Originals = append(p.Originals, orig)
		if countLoops(f.Body) == 0 {
			continue
		}
		r, err := Compile(f)
		if err != nil {
			return nil, err
		}
		p.Rewrites = append(p.Rewrites, r)
		rename[f.Name] = r.Aggified
	}
	if len(p.Rewrites) == 0 {
		return nil, errors.New("aggify: no function with a FOR … IN query LOOP in the file")
	}
	for _, q := range file.Queries {
		aq, err := renameCalls(q, rename)
		if err != nil {
			return nil, err
		}
		p.AggQueries = append(p.AggQueries, aq)
	}
	return p, nil
}

// SQL returns the PostgreSQL script of the rewrite: every aggregate and
// _aggified function, then the outer queries calling them.
func (p *Program) SQL() string {
	var parts []string
	for _, r := range p.Rewrites {
		parts = append(parts, r.SQL())
	}
	for _, q := range p.AggQueries {
		parts = append(parts, q+";\n")
	}
	return strings.Join(parts, "\n")
}

func orReplace(src string) (string, error) {
	tree, err := pg_query.Parse(src)
	if err != nil {
		return "", err
	}
	tree.Stmts[0].Stmt.GetCreateFunctionStmt().Replace = true
	return pg_query.Deparse(tree)
}

// renameCalls rewrites calls of the functions in names inside query q.
func renameCalls(q string, names map[string]string) (string, error) {
	tree, err := pg_query.Parse(q)
	if err != nil {
		return "", err
	}
	walk(tree.ProtoReflect(), func(m protoreflect.Message) {
		fc, ok := m.Interface().(*pg_query.FuncCall)
		if !ok || len(fc.Funcname) == 0 {
			return
		}
		last := fc.Funcname[len(fc.Funcname)-1].GetString_()
		if last != nil && names[last.Sval] != "" {
			last.Sval = names[last.Sval]
		}
	})
	return pg_query.Deparse(tree)
}

// Mode selects what Analyze runs.
type Mode string

const (
	ModeLoop      Mode = "loop"      // the functions as written
	ModeAggregate Mode = "aggregate" // the _aggified functions
	ModeAuto      Mode = "auto"      // the faster of the two, measured once and cached
)

// Result is what one analysis run returned.
type Result struct {
	Mode    Mode
	Columns []string
	Rows    [][]string // text form; NULL as "NULL"
	Elapsed time.Duration
	// Note explains an auto choice.
	Note string
}

// Install creates the original functions and the rewrites on conn.
func (p *Program) Install(ctx context.Context, conn *pgx.Conn) error {
	for _, s := range p.Originals {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("aggify: installing the original function: %w", err)
		}
	}
	for _, r := range p.Rewrites {
		for _, s := range r.Objects {
			if _, err := conn.Exec(ctx, s); err != nil {
				return fmt.Errorf("aggify: installing %s: %w\n%s", r.Aggified, err, s)
			}
		}
	}
	return nil
}

// Query returns the statement Analyze runs in mode: the file's last outer
// query, or else a call of its last compiled function with args (SQL
// literals, cast to the parameter types).
func (p *Program) Query(mode Mode, args []string) (string, error) {
	if len(p.Queries) > 0 {
		if len(args) > 0 {
			return "", errors.New("aggify: the file has its own query; it takes no arguments")
		}
		if mode == ModeAggregate {
			return p.AggQueries[len(p.AggQueries)-1], nil
		}
		return p.Queries[len(p.Queries)-1], nil
	}
	r := p.Rewrites[len(p.Rewrites)-1]
	name := r.Func.Name
	if mode == ModeAggregate {
		name = r.Aggified
	}
	in, err := r.Func.inputs(len(args))
	if err != nil {
		return "", err
	}
	var lits []string
	for i, a := range args {
		lits = append(lits, "'"+strings.ReplaceAll(a, "'", "''")+"'::"+in[i].Type)
	}
	return fmt.Sprintf("SELECT * FROM %s(%s) AS %s", name, strings.Join(lits, ", "), ident(r.Func.Name)), nil
}

// Run executes the program's query in mode (loop or aggregate) on conn.
func (p *Program) Run(ctx context.Context, conn *pgx.Conn, mode Mode, args []string) (*Result, error) {
	q, err := p.Query(mode, args)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	rows, err := conn.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	res := &Result{Mode: mode}
	for _, fd := range rows.FieldDescriptions() {
		res.Columns = append(res.Columns, fd.Name)
	}
	for rows.Next() {
		raw := rows.RawValues()
		row := make([]string, len(raw))
		for i, b := range raw {
			if b == nil {
				row[i] = "NULL"
			} else {
				row[i] = string(b)
			}
		}
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// Analyze runs the program in mode. ModeAuto runs both forms the first time
// a file (by content hash) is analysed, checks that they agree, keeps the
// faster one's result and records the choice in cacheFile; later runs use
// the recorded choice. The choice reflects the data at the time it was
// measured; delete the cache file to measure again.
func (p *Program) Analyze(ctx context.Context, conn *pgx.Conn, mode Mode, args []string, cacheFile string) (*Result, error) {
	if mode != ModeAuto {
		return p.Run(ctx, conn, mode, args)
	}
	return p.auto("", cacheFile, func(m Mode) (*Result, error) { return p.Run(ctx, conn, m, args) })
}

// AnalyzeSQLite is Analyze on a SQLite database (RunSQLite); auto's choice
// is recorded apart from PostgreSQL's for the same file.
func (p *Program) AnalyzeSQLite(ctx context.Context, db *sql.DB, mode Mode, args []string, cacheFile string) (*Result, error) {
	if mode != ModeAuto {
		return p.RunSQLite(ctx, db, mode, args)
	}
	return p.auto(":sqlite", cacheFile, func(m Mode) (*Result, error) { return p.RunSQLite(ctx, db, m, args) })
}

// auto runs ModeAuto: the recorded choice for the file (key suffix dialect),
// or both forms, checked to agree, the faster one recorded.
func (p *Program) auto(dialect, cacheFile string, run func(Mode) (*Result, error)) (*Result, error) {
	sum := sha256.Sum256([]byte(p.Source))
	key := hex.EncodeToString(sum[:8]) + dialect
	cache := map[string]Mode{}
	if b, err := os.ReadFile(cacheFile); err == nil {
		json.Unmarshal(b, &cache)
	}
	if m, ok := cache[key]; ok {
		r, err := run(m)
		if err == nil {
			r.Note = fmt.Sprintf("auto: %s, chosen by an earlier measurement (%s)", m, cacheFile)
		}
		return r, err
	}
	loop, err := run(ModeLoop)
	if err != nil {
		return nil, err
	}
	agg, err := run(ModeAggregate)
	if err != nil {
		return nil, err
	}
	if fmt.Sprint(loop.Rows) != fmt.Sprint(agg.Rows) {
		return nil, fmt.Errorf("aggify: the loop and the aggregate disagree: %v vs %v", loop.Rows, agg.Rows)
	}
	best := loop
	if agg.Elapsed < loop.Elapsed {
		best = agg
	}
	cache[key] = best.Mode
	if err := os.MkdirAll(filepath.Dir(cacheFile), 0o755); err == nil {
		b, _ := json.MarshalIndent(cache, "", "  ")
		os.WriteFile(cacheFile, b, 0o644)
	}
	best.Note = fmt.Sprintf("auto: measured loop %v, aggregate %v (same result); chose %s and recorded it in %s", loop.Elapsed.Round(time.Microsecond), agg.Elapsed.Round(time.Microsecond), best.Mode, cacheFile)
	return best, nil
}

// PgxRows returns a Rows that runs cursor queries on conn.
func PgxRows(conn *pgx.Conn) Rows {
	return func(ctx context.Context, sql string, args []any, buffer bool, yield func(map[string]Value) bool) error {
		rows, err := conn.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		fds := rows.FieldDescriptions()
		return feed(rows.Next, rows.Err, rows.Close, func() (map[string]Value, error) {
			vals, err := rows.Values()
			if err != nil {
				return nil, err
			}
			row := make(map[string]Value, len(vals))
			for i, v := range vals {
				row[fds[i].Name] = normalize(v)
			}
			return row, nil
		}, buffer, yield)
	}
}

// feed hands the rows of a result set (next advances, read decodes the
// current row) to yield, stopping when yield returns false. With buffer
// it reads them all and closes the result set first, so that yield may
// run queries of its own on the same connection.
func feed(next func() bool, rowsErr func() error, closeRows func(), read func() (map[string]Value, error), buffer bool, yield func(map[string]Value) bool) error {
	var buf []map[string]Value
	for next() {
		row, err := read()
		if err != nil {
			return err
		}
		if buffer {
			buf = append(buf, row)
		} else if !yield(row) {
			break
		}
	}
	if err := rowsErr(); err != nil {
		return err
	}
	closeRows()
	for _, row := range buf {
		if !yield(row) {
			break
		}
	}
	return nil
}

// normalize maps pgx's Go values onto the interpreter's (int64, float64,
// string, bool, nil).
func normalize(v any) Value {
	switch x := v.(type) {
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	}
	return v
}

// Client runs the file's last compiled function in Go (Interpret) over
// rows fetched from conn: the cursor loop executed client-side. args are
// SQL literals, cast to the parameter types by the server.
func (p *Program) Client(ctx context.Context, conn *pgx.Conn, args []string) (*Result, error) {
	if len(p.Queries) > 0 {
		return nil, errors.New("aggify: client mode runs a function, not the file's own query")
	}
	file, err := ParseFile(p.Source) // a fresh IR: Compile consumed the first
	if err != nil {
		return nil, err
	}
	f := file.Funcs[len(file.Funcs)-1]
	r := p.Rewrites[len(p.Rewrites)-1]
	q, err := p.Query(ModeLoop, args)
	if err != nil {
		return nil, err
	}
	// The argument literals, evaluated and typed by the server.
	lits := strings.TrimSuffix(strings.SplitN(q, "(", 2)[1], ") AS "+ident(r.Func.Name))
	start := time.Now()
	var vals []Value
	if len(args) > 0 {
		row, err := conn.Query(ctx, "SELECT "+lits)
		if err != nil {
			return nil, err
		}
		for row.Next() {
			raw, err := row.Values()
			if err != nil {
				row.Close()
				return nil, err
			}
			for _, v := range raw {
				vals = append(vals, normalize(v))
			}
		}
		row.Close()
	}
	out, err := Interpret(ctx, f, vals, PgxRows(conn))
	if err != nil {
		return nil, err
	}
	return &Result{Mode: "client", Elapsed: time.Since(start), Columns: resultColumns(f), Rows: [][]string{textRow(out)}}, nil
}

// resultColumns names f's results as a query of it does: the function's
// name for a RETURNS function, else its OUT parameters.
func resultColumns(f *Func) []string {
	if f.Returns != "" {
		return []string{f.Name}
	}
	var cols []string
	for _, o := range f.OutParams() {
		cols = append(cols, o.Name)
	}
	return cols
}

// textRow is vals as text, NULL for nil.
func textRow(vals []Value) []string {
	row := make([]string, len(vals))
	for i, v := range vals {
		if v == nil {
			row[i] = "NULL"
		} else {
			row[i] = textOfValue(v)
		}
	}
	return row
}
