//go:build cgo

package aggify

// A file's own query on SQLite. PostgreSQL runs a query such as
//
//	SELECT r.recipe_path, s.final_ema, rank() OVER (...)
//	  FROM runs r, LATERAL run_summary(r.run_id, 0.1) s
//
// as written; SQLite has neither PL/pgSQL nor functions in FROM. There the
// query is decorrelated from Go: for every call of one of the file's
// functions in the FROM list, the distinct argument tuples are read from
// the other FROM items, the function runs once per tuple (as the loop, or
// as its registered aggregates), and its results become a common table
// expression that replaces the call, joined on the arguments
// (IS NOT DISTINCT FROM, so NULL arguments match). The rest of the query
// (joins, window functions, ORDER BY) then runs in SQLite.

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// lateralCall is one call of a file function in the query's FROM list.
type lateralCall struct {
	index int // position in the FROM list
	fn    *Func
	alias string
	cols  []string // the result columns, as the query names them
	args  []*pg_query.Node
}

// runSQLiteQuery runs the file's last query on db in mode (loop or
// aggregate) and returns its rows as text.
func (p *Program) runSQLiteQuery(ctx context.Context, db *sql.DB, mode Mode) (*Result, error) {
	q := p.Queries[len(p.Queries)-1]
	tree, err := pg_query.Parse(q)
	if err != nil {
		return nil, err
	}
	if len(tree.Stmts) != 1 || tree.Stmts[0].Stmt.GetSelectStmt() == nil {
		return nil, fmt.Errorf("aggify: the SQLite dialect runs a file's query when it is one SELECT: %s", q)
	}
	sel := tree.Stmts[0].Stmt.GetSelectStmt()
	calls, err := p.lateralCalls(sel)
	if err != nil {
		return nil, err
	}
	tuples := make([][][]any, len(calls))
	for k, c := range calls {
		if tuples[k], err = argTuples(ctx, db, tree, sel, c); err != nil {
			return nil, err
		}
	}
	var ctes []string
	var cteArgs []any
	for k, c := range calls {
		name := fmt.Sprintf("_aggify_%d", k)
		cte, args, err := p.callTable(ctx, db, mode, c, name, tuples[k], len(cteArgs))
		if err != nil {
			return nil, err
		}
		ctes = append(ctes, cte)
		cteArgs = append(cteArgs, args...)
		replaceCall(sel, c, name)
	}
	out, err := pg_query.Deparse(tree)
	if err != nil {
		return nil, err
	}
	lq, err := SQLiteQuery(out)
	if err != nil {
		return nil, err
	}
	if len(ctes) > 0 {
		with := strings.Join(ctes, ", ")
		if rest, ok := strings.CutPrefix(lq, "WITH "); ok {
			lq = "WITH " + with + ", " + rest
		} else {
			lq = "WITH " + with + " " + lq
		}
	}
	rows, err := db.QueryContext(ctx, lq, cteArgs...)
	if err != nil {
		return nil, fmt.Errorf("aggify: the file's query on SQLite: %w: %s", err, lq)
	}
	defer rows.Close()
	res := &Result{Mode: mode}
	if res.Columns, err = rows.Columns(); err != nil {
		return nil, err
	}
	vals := make([]any, len(res.Columns))
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		row := make([]Value, len(vals))
		for i, v := range vals {
			row[i] = sqliteValue(v)
		}
		res.Rows = append(res.Rows, textRow(row))
	}
	return res, rows.Err()
}

// lateralCalls finds the calls of the file's functions in sel's FROM list.
// Any other function in FROM is left for SQLiteQuery to refuse.
func (p *Program) lateralCalls(sel *pg_query.SelectStmt) ([]lateralCall, error) {
	var out []lateralCall
	for i, item := range sel.FromClause {
		rf := item.GetRangeFunction()
		if rf == nil || len(rf.Functions) != 1 || rf.Ordinality || rf.IsRowsfrom {
			continue
		}
		parts := rf.Functions[0].GetList().GetItems()
		if len(parts) == 0 || parts[0].GetFuncCall() == nil {
			continue
		}
		fc := parts[0].GetFuncCall()
		name := fc.Funcname[len(fc.Funcname)-1].GetString_().GetSval()
		var fn *Func
		for _, f := range p.Funcs {
			if f.Name == name {
				fn = f
			}
		}
		if fn == nil {
			continue
		}
		c := lateralCall{index: i, fn: fn, alias: name, args: fc.Args}
		if rf.Alias != nil {
			c.alias = rf.Alias.Aliasname
		}
		c.cols = resultColumns(fn)
		if fn.Returns != "" {
			c.cols = []string{c.alias} // a scalar function in FROM is named by its alias
		}
		if rf.Alias != nil && len(rf.Alias.Colnames) > 0 {
			if len(rf.Alias.Colnames) > len(c.cols) {
				return nil, fmt.Errorf("aggify: %s AS %s names %d columns, the function returns %d", name, c.alias, len(rf.Alias.Colnames), len(c.cols))
			}
			for j, cn := range rf.Alias.Colnames {
				c.cols[j] = cn.GetString_().GetSval()
			}
		}
		if n := len(fn.Params) - len(fn.OutParams()); n != len(fc.Args) {
			return nil, fmt.Errorf("aggify: %s is called with %d arguments in the query, it takes %d", name, len(fc.Args), n)
		}
		out = append(out, c)
	}
	return out, nil
}

// argTuples reads the distinct argument tuples of call c: its arguments
// evaluated over the FROM list's other items (the call's correlation).
func argTuples(ctx context.Context, db *sql.DB, outer *pg_query.ParseResult, sel *pg_query.SelectStmt, c lateralCall) ([][]any, error) {
	drv := &pg_query.SelectStmt{
		DistinctClause: []*pg_query.Node{{}},
		Op:             pg_query.SetOperation_SETOP_NONE,
		LimitOption:    pg_query.LimitOption_LIMIT_OPTION_DEFAULT,
	}
	for k, a := range c.args {
		drv.TargetList = append(drv.TargetList, &pg_query.Node{Node: &pg_query.Node_ResTarget{ResTarget: &pg_query.ResTarget{
			Name: fmt.Sprintf("_a%d", k+1), Val: a,
		}}})
	}
	for i, item := range sel.FromClause {
		if i != c.index && item.GetRangeFunction() == nil {
			drv.FromClause = append(drv.FromClause, item)
		}
	}
	tree := &pg_query.ParseResult{Version: outer.Version, Stmts: []*pg_query.RawStmt{{Stmt: &pg_query.Node{Node: &pg_query.Node_SelectStmt{SelectStmt: drv}}}}}
	q, err := pg_query.Deparse(tree)
	if err != nil {
		return nil, err
	}
	lq, err := SQLiteQuery(q)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, lq)
	if err != nil {
		return nil, fmt.Errorf("aggify: the arguments of %s on SQLite: %w: %s", c.fn.Name, err, lq)
	}
	defer rows.Close()
	var out [][]any
	for rows.Next() {
		t := make([]any, len(c.args))
		ptrs := make([]any, len(t))
		for i := range t {
			ptrs[i] = &t[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		for i := range t {
			t[i] = sqliteValue(t[i])
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// callTable runs c's function once per tuple in mode and returns the common
// table expression holding the results (columns _a1…, then c.cols), with
// its values as parameters numbered from after+1.
func (p *Program) callTable(ctx context.Context, db *sql.DB, mode Mode, c lateralCall, name string, tuples [][]any, after int) (string, []any, error) {
	var names []string
	for k := range c.args {
		names = append(names, fmt.Sprintf("_a%d", k+1))
	}
	for _, col := range c.cols {
		names = append(names, ident(col))
	}
	head := name + "(" + strings.Join(names, ", ") + ") AS "
	if len(tuples) == 0 {
		nulls := strings.TrimSuffix(strings.Repeat("NULL, ", len(names)), ", ")
		return head + "(SELECT " + nulls + " WHERE 0)", nil, nil
	}
	var rows []string
	var args []any
	for _, t := range tuples {
		vals := make([]Value, len(t))
		for i, v := range t {
			vals[i] = v
		}
		res, err := p.callSQLite(ctx, db, mode, c.fn.Name, vals)
		if err != nil {
			return "", nil, err
		}
		var ph []string
		for _, v := range append(append([]Value{}, vals...), res...) {
			args = append(args, sqliteArgs([]any{v})[0])
			ph = append(ph, fmt.Sprintf("?%d", after+len(args)))
		}
		rows = append(rows, "("+strings.Join(ph, ", ")+")")
	}
	return head + "(VALUES " + strings.Join(rows, ", ") + ")", args, nil
}

// replaceCall puts the table name in place of call c in sel's FROM list
// and joins it on the arguments.
func replaceCall(sel *pg_query.SelectStmt, c lateralCall, name string) {
	sel.FromClause[c.index] = &pg_query.Node{Node: &pg_query.Node_RangeVar{RangeVar: &pg_query.RangeVar{
		Relname: name, Inh: true, Relpersistence: "p", Alias: &pg_query.Alias{Aliasname: c.alias},
	}}}
	for k, a := range c.args {
		col := &pg_query.Node{Node: &pg_query.Node_ColumnRef{ColumnRef: &pg_query.ColumnRef{Fields: []*pg_query.Node{
			{Node: &pg_query.Node_String_{String_: &pg_query.String{Sval: c.alias}}},
			{Node: &pg_query.Node_String_{String_: &pg_query.String{Sval: fmt.Sprintf("_a%d", k+1)}}},
		}}}}
		eq := &pg_query.Node{Node: &pg_query.Node_AExpr{AExpr: &pg_query.A_Expr{
			Kind:  pg_query.A_Expr_Kind_AEXPR_NOT_DISTINCT,
			Name:  []*pg_query.Node{{Node: &pg_query.Node_String_{String_: &pg_query.String{Sval: "="}}}},
			Lexpr: col, Rexpr: a,
		}}}
		if sel.WhereClause == nil {
			sel.WhereClause = eq
			continue
		}
		sel.WhereClause = &pg_query.Node{Node: &pg_query.Node_BoolExpr{BoolExpr: &pg_query.BoolExpr{
			Boolop: pg_query.BoolExprType_AND_EXPR, Args: []*pg_query.Node{sel.WhereClause, eq},
		}}}
	}
}
