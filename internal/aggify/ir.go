//go:build cgo

// Package aggify compiles PL/pgSQL cursor loops into custom aggregates,
// following Gupta, Purandare and Ramachandra, "Aggify: Lifting the Curse of
// Cursor Loops using Custom Aggregates" (SIGMOD 2020).
//
// The input is a CREATE FUNCTION … LANGUAGE plpgsql whose body iterates a
// query with FOR rec IN SELECT … LOOP … END LOOP. Parse turns it into a
// small typed IR (Func, Var, Stmt, Expr), using the real PostgreSQL parser
// (libpg_query through pg_query_go) for the function header, the PL/pgSQL
// body and every embedded expression and query. Analyze runs the paper's
// dataflow analysis on each cursor loop (liveness and reaching definitions
// over the structured IR), Compile rewrites each loop into a state type, a
// transition function, a final function and CREATE AGGREGATE, and the
// function itself into <name>_aggified, which runs the aggregate in one
// query instead of the loop.
//
// The IR keeps each expression's source text, its resolved variable uses and
// its parse tree, so that a second back end sits beside the PL/pgSQL
// emitter without changing the analysis: the SQLite dialect (sqlite.go).
// SQLite has no PL/pgSQL, so its loop form is Interpret over the cursor
// queries' rows (translated to SQLite SQL by SQLiteQuery) and its aggregate
// form is the loop body as an Accumulator registered with the
// modernc.org/sqlite driver (RegisterSQLite), each loop one query
// SELECT <name>_agg(columns…, pre-loop values… ORDER BY …) FROM (…) AS _q;
// an outer loop whose body runs queries (nested loops) runs client-side,
// its inner loops as aggregates. Files with their own outer query and
// cursor queries using PostgreSQL-only SQL are refused with the reason.
package aggify

import (
	"fmt"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// VarKind says where a variable comes from.
type VarKind int

const (
	// Local is a variable declared in DECLARE.
	Local VarKind = iota
	// Param is an IN parameter of the function.
	Param
	// OutParam is an OUT (or INOUT) parameter: live at every RETURN.
	OutParam
	// Record is a variable of type record (a cursor loop's row).
	Record
	// Found is PL/pgSQL's implicit FOUND.
	Found
	// Implicit is a variable PL/pgSQL declares itself (an integer FOR
	// loop's counter, SQLSTATE/SQLERRM); it is never declared by the emitter.
	Implicit
	// Synth is a variable the rewrite adds (early-exit flags).
	Synth
)

// Var is one PL/pgSQL datum that holds a value.
type Var struct {
	Name    string
	Type    string // PostgreSQL type name as written (trimmed); "record" for records
	Kind    VarKind
	Default *Expr // DECLARE x t := Default; nil when absent
	Const   bool
	NotNull bool
	Line    int
}

func (v *Var) String() string { return v.Name }

// Ref is one use of a variable in an expression: a plain variable, or a field
// of a record (rec.loss).
type Ref struct {
	Var   *Var
	Field string // "" for a plain variable
}

// Expr is an SQL expression or query embedded in the body.
type Expr struct {
	Text string // source text, as PL/pgSQL would evaluate it
	Uses []Ref  // variables it reads, resolved against the function's datums
	Line int
	// Tree is the expression's parse tree (the SELECT it is evaluated as);
	// the PL/pgSQL emitter prints Text, a Go interpreter would walk Tree.
	Tree *pg_query.ParseResult
}

// Stmt is a statement of the body.
type Stmt interface{ line() int }

// Assign is target := expr (Field set for rec.f := expr).
type Assign struct {
	Line   int
	Target *Var
	Field  string
	Text   string // the whole "x := e" as written
	Value  *Expr  // the right-hand side
}

// If is IF … THEN … ELSIF … ELSE … END IF.
type If struct {
	Line  int
	Cond  *Expr
	Then  []Stmt
	Elifs []Elif
	Else  []Stmt
}

// Elif is one ELSIF branch.
type Elif struct {
	Cond *Expr
	Body []Stmt
}

// ForQuery is FOR rec IN query LOOP body END LOOP: the cursor loop.
type ForQuery struct {
	Line  int
	Label string
	Rec   *Var
	Query *Query
	Body  []Stmt
}

// ForInt is FOR i IN [REVERSE] lo..hi [BY step] LOOP body END LOOP.
type ForInt struct {
	Line               int
	Label              string
	Var                *Var
	Lower, Upper, Step *Expr
	Reverse            bool
	Body               []Stmt
}

// While is WHILE cond LOOP body END LOOP, or a bare LOOP when Cond is nil.
type While struct {
	Line  int
	Label string
	Cond  *Expr
	Body  []Stmt
}

// Exit is EXIT [label] [WHEN cond], or CONTINUE when Continue is set.
type Exit struct {
	Line     int
	Continue bool
	Label    string
	Cond     *Expr
}

// Return is RETURN [expr].
type Return struct {
	Line int
	Expr *Expr
}

// SelectInto is SELECT … INTO [STRICT] targets ….
type SelectInto struct {
	Line    int
	Query   *Expr // the query with INTO removed
	Targets []*Var
	Strict  bool
}

// Block is a nested BEGIN … END without declarations or handlers.
type Block struct {
	Line int
	Body []Stmt
}

// Opaque is a statement the IR does not model; Kind names it (for example
// "INSERT" or "EXECUTE") and Reason says why a loop holding it is refused.
type Opaque struct {
	Line   int
	Kind   string
	Reason string
}

// AggCall is a rewritten cursor loop: one statement (Text, possibly several
// lines) that defines Defs from Uses. Nested loops are rewritten inner first,
// so an outer loop's body can hold AggCalls.
type AggCall struct {
	Line int
	Text string
	Defs []*Var
	Uses []Ref
}

func (s *Assign) line() int     { return s.Line }
func (s *If) line() int         { return s.Line }
func (s *ForQuery) line() int   { return s.Line }
func (s *ForInt) line() int     { return s.Line }
func (s *While) line() int      { return s.Line }
func (s *Exit) line() int       { return s.Line }
func (s *Return) line() int     { return s.Line }
func (s *SelectInto) line() int { return s.Line }
func (s *Block) line() int      { return s.Line }
func (s *Opaque) line() int     { return s.Line }
func (s *AggCall) line() int    { return s.Line }

// Query is a cursor loop's query, split for the rewrite.
type Query struct {
	*Expr
	// Derived is the query to put in FROM (…) AS q: the original with ORDER BY
	// removed (kept when LIMIT/OFFSET need it) and the sort keys that are not
	// output columns added as _ord1, _ord2, ….
	Derived string
	// OrderBy is the ORDER BY for the aggregate call, over q (for example
	// "q.step" or "q._ord1 DESC NULLS LAST"); empty when the query has none.
	OrderBy []string
}

// Func is a parsed PL/pgSQL function.
type Func struct {
	Name       string
	Params     []*Var // IN and OUT parameters in declaration order
	Returns    string // the RETURNS type; "" when the function has OUT parameters
	Volatility string // "IMMUTABLE", "STABLE" or "VOLATILE"
	Vars       []*Var // all value datums (parameters first)
	Body       []Stmt
	Source     string // the CREATE FUNCTION statement as written
	Line       int    // line of the body's BEGIN
	vars       map[string]*Var
}

// OutParams reports the function's OUT parameters.
func (f *Func) OutParams() []*Var {
	var out []*Var
	for _, p := range f.Params {
		if p.Kind == OutParam {
			out = append(out, p)
		}
	}
	return out
}

// Error is a refusal or a parse error that names the construct and line.
type Error struct {
	Func      string
	Line      int
	Construct string
	Reason    string
}

func (e *Error) Error() string {
	loc := e.Func
	if e.Line > 0 {
		loc = fmt.Sprintf("%s, line %d", e.Func, e.Line)
	}
	return fmt.Sprintf("aggify: %s: %s: %s", loc, e.Construct, e.Reason)
}

// inputs returns f's input parameters, or an error naming them unless
// there are n of them (the arguments a caller passes).
func (f *Func) inputs(n int) ([]*Var, error) {
	var in []*Var
	for _, v := range f.Params {
		if v.Kind == Param {
			in = append(in, v)
		}
	}
	if n != len(in) {
		var names []string
		for _, v := range in {
			names = append(names, v.Name+" "+v.Type)
		}
		return nil, fmt.Errorf("aggify: %s takes %d arguments (%s), got %d", f.Name, len(in), strings.Join(names, ", "), n)
	}
	return in, nil
}
