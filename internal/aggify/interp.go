//go:build cgo

package aggify

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Value is an SQL value in the Go interpreter: nil (NULL), int64, float64,
// string or bool.
type Value = any

// Rows runs a cursor query and calls yield for each row (column name →
// value) until yield returns false. The query's variable references have
// been replaced by $1, $2, … bound to args. buffer is set when the loop body
// runs queries itself (nested loops): the rows must then be read before
// the first yield, as one connection runs one query at a time.
type Rows func(ctx context.Context, sql string, args []any, buffer bool, yield func(map[string]Value) bool) error

// Interpret runs f's body in Go: the cursor loops iterate rows from q, the
// loop bodies and the code around them are evaluated by a small interpreter
// of the IR. This is the client-side execution of the loop (the baseline
// Aggify removes) and the evaluator a Go-registered aggregate (the SQLite
// dialect) would use. args are f's IN parameters in order; the result is
// f's return value, or its OUT parameters in order.
//
// Supported: assignments, IF/ELSIF/ELSE, FOR … IN query, integer FOR,
// WHILE/LOOP, EXIT/CONTINUE [WHEN], RETURN; expressions built from
// constants, variables, record fields, + - * / % || and comparisons, AND/OR/
// NOT, IS [NOT] NULL, CASE, COALESCE, GREATEST/LEAST, abs/sqrt/ln/exp and
// casts to numeric and text types. Numeric (decimal) arithmetic is done in
// float64; anything else is an error naming the construct and line.
func Interpret(ctx context.Context, f *Func, args []Value, q Rows) ([]Value, error) {
	return interpret(ctx, f, args, q, nil)
}

// interpret is Interpret with agg, when set, running the rewritten loops
// (AggCall statements) of a compiled function.
func interpret(ctx context.Context, f *Func, args []Value, q Rows, agg func(*interp, *AggCall) error) ([]Value, error) {
	in := &interp{ctx: ctx, f: f, env: map[*Var]Value{}, recs: map[*Var]map[string]Value{}, rows: q, agg: agg}
	i := 0
	for _, p := range f.Params {
		if p.Kind == Param {
			if i >= len(args) {
				return nil, fmt.Errorf("aggify: %s: %d arguments, want more", f.Name, len(args))
			}
			v, err := coerce(args[i], p.Type)
			if err != nil {
				return nil, fmt.Errorf("aggify: %s: argument %d (%s %s) %q: %w", f.Name, i+1, p.Name, p.Type, textOfValue(args[i]), err)
			}
			in.env[p] = v
			i++
		}
	}
	for _, v := range f.Vars {
		if v.Kind == Local || v.Kind == Synth {
			in.env[v] = nil
			if v.Default != nil {
				x, err := in.eval(v.Default)
				if err != nil {
					return nil, err
				}
				if in.env[v], err = coerce(x, v.Type); err != nil {
					return nil, err
				}
			}
		}
	}
	ctl, err := in.list(f.Body)
	if err != nil {
		return nil, err
	}
	if f.Returns != "" {
		if ctl.kind != ctlReturn {
			return nil, &Error{Func: f.Name, Construct: "end of function", Reason: "control reached the end without RETURN"}
		}
		return []Value{ctl.value}, nil
	}
	var out []Value
	for _, p := range f.OutParams() {
		out = append(out, in.env[p])
	}
	return out, nil
}

type ctlKind int

const (
	ctlNone ctlKind = iota
	ctlExit
	ctlContinue
	ctlReturn
)

type control struct {
	kind  ctlKind
	label string
	value Value
}

type interp struct {
	ctx  context.Context
	f    *Func
	env  map[*Var]Value
	recs map[*Var]map[string]Value
	rows Rows
	agg  func(*interp, *AggCall) error
}

func (in *interp) fail(line int, construct, reason string) error {
	return &Error{Func: in.f.Name, Line: line, Construct: construct, Reason: reason}
}

func (in *interp) list(stmts []Stmt) (control, error) {
	for _, s := range stmts {
		c, err := in.stmt(s)
		if err != nil || c.kind != ctlNone {
			return c, err
		}
	}
	return control{}, nil
}

func (in *interp) truth(e *Expr) (bool, error) {
	v, err := in.eval(e)
	if err != nil {
		return false, err
	}
	b, _ := v.(bool)
	return b, nil // NULL is false, as in IF and WHILE
}

// loopCtl decides what a loop does with its body's control: keep going,
// stop (EXIT of this loop), or pass it outwards.
func loopCtl(c control, label string) (stop bool, pass bool) {
	switch c.kind {
	case ctlNone:
		return false, false
	case ctlContinue:
		if c.label == "" || c.label == label {
			return false, false
		}
		return true, true
	case ctlExit:
		if c.label == "" || c.label == label {
			return true, false
		}
		return true, true
	}
	return true, true
}

func (in *interp) stmt(s Stmt) (control, error) {
	switch s := s.(type) {
	case *Assign:
		v, err := in.eval(s.Value)
		if err != nil {
			return control{}, err
		}
		if s.Field != "" {
			return control{}, in.fail(s.Line, "assignment to "+s.Target.Name+"."+s.Field, "record fields are read-only in the interpreter")
		}
		if in.env[s.Target], err = coerce(v, s.Target.Type); err != nil {
			return control{}, in.fail(s.Line, "assignment to "+s.Target.Name, err.Error())
		}
	case *If:
		ok, err := in.truth(s.Cond)
		if err != nil {
			return control{}, err
		}
		if ok {
			return in.list(s.Then)
		}
		for _, e := range s.Elifs {
			if ok, err = in.truth(e.Cond); err != nil {
				return control{}, err
			} else if ok {
				return in.list(e.Body)
			}
		}
		return in.list(s.Else)
	case *Block:
		return in.list(s.Body)
	case *Exit:
		if s.Cond != nil {
			if ok, err := in.truth(s.Cond); err != nil || !ok {
				return control{}, err
			}
		}
		k := ctlExit
		if s.Continue {
			k = ctlContinue
		}
		return control{kind: k, label: s.Label}, nil
	case *Return:
		var v Value
		if s.Expr != nil {
			x, err := in.eval(s.Expr)
			if err != nil {
				return control{}, err
			}
			if v, err = coerce(x, in.f.Returns); err != nil {
				return control{}, err
			}
		}
		return control{kind: ctlReturn, value: v}, nil
	case *While:
		for {
			if s.Cond != nil {
				if ok, err := in.truth(s.Cond); err != nil || !ok {
					return control{}, err
				}
			}
			c, err := in.list(s.Body)
			if err != nil {
				return c, err
			}
			if stop, pass := loopCtl(c, s.Label); stop {
				if pass {
					return c, nil
				}
				return control{}, nil
			}
		}
	case *ForInt:
		lo, err := in.eval(s.Lower)
		if err != nil {
			return control{}, err
		}
		hi, err := in.eval(s.Upper)
		if err != nil {
			return control{}, err
		}
		step := Value(int64(1))
		if s.Step != nil {
			if step, err = in.eval(s.Step); err != nil {
				return control{}, err
			}
		}
		a, e1 := coerce(lo, "int8")
		z, e2 := coerce(hi, "int8")
		st, e3 := coerce(step, "int8")
		if e := errors.Join(e1, e2, e3); e != nil || a == nil || z == nil || st == nil {
			return control{}, in.fail(s.Line, "FOR "+s.Var.Name, "loop bounds must be non-NULL integers")
		}
		from, to, by := a.(int64), z.(int64), st.(int64)
		for i := from; (!s.Reverse && i <= to) || (s.Reverse && i >= to); {
			in.env[s.Var] = i
			c, err := in.list(s.Body)
			if err != nil {
				return c, err
			}
			if stop, pass := loopCtl(c, s.Label); stop {
				if pass {
					return c, nil
				}
				return control{}, nil
			}
			if s.Reverse {
				i -= by
			} else {
				i += by
			}
		}
	case *ForQuery:
		sql, args, err := in.bind(s.Query.Expr)
		if err != nil {
			return control{}, err
		}
		var out control
		var bodyErr error
		err = in.rows(in.ctx, sql, args, runsQueries(s.Body), func(row map[string]Value) bool {
			in.recs[s.Rec] = row
			c, err := in.list(s.Body)
			if err != nil {
				bodyErr = err
				return false
			}
			if stop, pass := loopCtl(c, s.Label); stop {
				if pass {
					out = c
				}
				return false
			}
			return true
		})
		if bodyErr != nil {
			return control{}, bodyErr
		}
		if err != nil {
			return control{}, in.fail(s.Line, "cursor query", err.Error())
		}
		return out, nil
	case *AggCall:
		if in.agg == nil {
			return control{}, in.fail(s.Line, "aggregate call", "statement not supported by the interpreter")
		}
		return control{}, in.agg(in, s)
	default:
		return control{}, in.fail(s.line(), fmt.Sprintf("%T", s), "statement not supported by the interpreter")
	}
	return control{}, nil
}

// bind replaces the variable references of a query by $n parameters.
func (in *interp) bind(e *Expr) (string, []any, error) {
	tree, err := pg_query.Parse(e.Text)
	if err != nil {
		return "", nil, err
	}
	var args []any
	var ferr error
	walkNodes(tree, func(n *pg_query.Node) {
		cr := n.GetColumnRef()
		if cr == nil || len(cr.Fields) == 0 || cr.Fields[0].GetString_() == nil {
			return
		}
		v := in.f.vars[cr.Fields[0].GetString_().Sval]
		if v == nil {
			return
		}
		var val Value
		if v.Kind == Record {
			if len(cr.Fields) < 2 || cr.Fields[1].GetString_() == nil {
				ferr = in.fail(e.Line, "record "+v.Name, "a whole record cannot be bound")
				return
			}
			val = in.recs[v][cr.Fields[1].GetString_().Sval]
		} else {
			val = in.env[v]
		}
		args = append(args, val)
		n.Node = &pg_query.Node_ParamRef{ParamRef: &pg_query.ParamRef{Number: int32(len(args)), Location: -1}}
	})
	if ferr != nil {
		return "", nil, ferr
	}
	sql, err := pg_query.Deparse(tree)
	return sql, args, err
}

// walkNodes calls fn on every Node of the tree; fn may replace the node's
// content, which is then walked instead.
func walkNodes(tree *pg_query.ParseResult, fn func(*pg_query.Node)) {
	walk(tree.ProtoReflect(), func(m protoreflect.Message) {
		if n, ok := m.Interface().(*pg_query.Node); ok {
			fn(n)
		}
	})
}

// eval evaluates an expression (the single target of its SELECT tree).
func (in *interp) eval(e *Expr) (Value, error) {
	if e == nil {
		return nil, nil
	}
	if e.Tree == nil || len(e.Tree.Stmts) != 1 {
		return nil, in.fail(e.Line, "expression "+quote(e.Text), "not parsed")
	}
	sel := e.Tree.Stmts[0].Stmt.GetSelectStmt()
	if sel == nil || len(sel.TargetList) != 1 || sel.FromClause != nil || sel.WhereClause != nil {
		return nil, in.fail(e.Line, "expression "+quote(e.Text), "queries inside expressions are not supported by the interpreter")
	}
	v, err := in.node(sel.TargetList[0].GetResTarget().Val)
	if err != nil {
		return nil, in.fail(e.Line, "expression "+quote(e.Text), err.Error())
	}
	return v, nil
}

func (in *interp) node(n *pg_query.Node) (Value, error) {
	switch x := n.Node.(type) {
	case *pg_query.Node_AConst:
		c := x.AConst
		switch {
		case c.Isnull:
			return nil, nil
		case c.GetIval() != nil:
			return int64(c.GetIval().Ival), nil
		case c.GetFval() != nil:
			f, err := strconv.ParseFloat(c.GetFval().Fval, 64)
			return f, err
		case c.GetSval() != nil:
			return c.GetSval().Sval, nil
		case c.GetBoolval() != nil:
			return c.GetBoolval().Boolval, nil
		}
		return int64(0), nil // Ival 0 is encoded as an empty Ival
	case *pg_query.Node_ColumnRef:
		cr := x.ColumnRef
		name := cr.Fields[0].GetString_().GetSval()
		v := in.f.vars[name]
		if v == nil {
			return nil, fmt.Errorf("unknown name %s", name)
		}
		if v.Kind == Record {
			if len(cr.Fields) != 2 {
				return nil, fmt.Errorf("record %s used whole", name)
			}
			field := cr.Fields[1].GetString_().GetSval()
			row := in.recs[v]
			val, ok := row[field]
			if !ok && row != nil {
				return nil, fmt.Errorf("record %s has no field %s", name, field)
			}
			return val, nil
		}
		return in.env[v], nil
	case *pg_query.Node_AExpr:
		a := x.AExpr
		if a.Kind != pg_query.A_Expr_Kind_AEXPR_OP || len(a.Name) != 1 {
			return nil, fmt.Errorf("operator kind %v not supported", a.Kind)
		}
		op := a.Name[0].GetString_().GetSval()
		r, err := in.node(a.Rexpr)
		if err != nil {
			return nil, err
		}
		if a.Lexpr == nil {
			return unary(op, r)
		}
		l, err := in.node(a.Lexpr)
		if err != nil {
			return nil, err
		}
		return binary(op, l, r)
	case *pg_query.Node_BoolExpr:
		// Left to right, stopping as soon as the result is known (what
		// PostgreSQL does in practice; guards like n > 0 AND s / n > x rely
		// on it).
		b := x.BoolExpr
		if b.Boolop == pg_query.BoolExprType_NOT_EXPR {
			v, err := in.node(b.Args[0])
			if err != nil || v == nil {
				return nil, err
			}
			return !v.(bool), nil
		}
		stop := b.Boolop == pg_query.BoolExprType_OR_EXPR // OR stops at true, AND at false
		res := Value(!stop)
		for _, arg := range b.Args {
			v, err := in.node(arg)
			if err != nil {
				return nil, err
			}
			if v == stop {
				return stop, nil
			}
			if v == nil {
				res = nil
			}
		}
		return res, nil
	case *pg_query.Node_NullTest:
		v, err := in.node(x.NullTest.Arg)
		if err != nil {
			return nil, err
		}
		if x.NullTest.Nulltesttype == pg_query.NullTestType_IS_NULL {
			return v == nil, nil
		}
		return v != nil, nil
	case *pg_query.Node_TypeCast:
		v, err := in.node(x.TypeCast.Arg)
		if err != nil {
			return nil, err
		}
		return coerce(v, typeName(x.TypeCast.TypeName))
	case *pg_query.Node_CaseExpr:
		c := x.CaseExpr
		if c.Arg != nil {
			return nil, errors.New("CASE x WHEN … is not supported; write CASE WHEN x = …")
		}
		for _, w := range c.Args {
			cw := w.GetCaseWhen()
			v, err := in.node(cw.Expr)
			if err != nil {
				return nil, err
			}
			if v == true {
				return in.node(cw.Result)
			}
		}
		if c.Defresult == nil {
			return nil, nil
		}
		return in.node(c.Defresult)
	case *pg_query.Node_CoalesceExpr:
		for _, arg := range x.CoalesceExpr.Args {
			v, err := in.node(arg)
			if err != nil || v != nil {
				return v, err
			}
		}
		return nil, nil
	case *pg_query.Node_MinMaxExpr:
		var best Value
		for _, arg := range x.MinMaxExpr.Args {
			v, err := in.node(arg)
			if err != nil {
				return nil, err
			}
			if v == nil {
				continue
			}
			if best == nil {
				best = v
				continue
			}
			c, err := compare(v, best)
			if err != nil {
				return nil, err
			}
			if (x.MinMaxExpr.Op == pg_query.MinMaxOp_IS_GREATEST && c > 0) || (x.MinMaxExpr.Op == pg_query.MinMaxOp_IS_LEAST && c < 0) {
				best = v
			}
		}
		return best, nil
	case *pg_query.Node_FuncCall:
		fc := x.FuncCall
		name := fc.Funcname[len(fc.Funcname)-1].GetString_().GetSval()
		if len(fc.Args) != 1 {
			return nil, fmt.Errorf("function %s/%d not supported", name, len(fc.Args))
		}
		v, err := in.node(fc.Args[0])
		if err != nil || v == nil {
			return nil, err
		}
		switch name {
		case "abs":
			if i, ok := v.(int64); ok {
				if i < 0 {
					return -i, nil
				}
				return i, nil
			}
		}
		f, ok := toFloat(v)
		if !ok {
			return nil, fmt.Errorf("%s of a non-number", name)
		}
		switch name {
		case "abs":
			return math.Abs(f), nil
		case "sqrt":
			return math.Sqrt(f), nil
		case "ln":
			return math.Log(f), nil
		case "exp":
			return math.Exp(f), nil
		}
		return nil, fmt.Errorf("function %s not supported", name)
	}
	return nil, fmt.Errorf("%T not supported", n.Node)
}

func toFloat(v Value) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	}
	return 0, false
}

func unary(op string, v Value) (Value, error) {
	if v == nil {
		return nil, nil
	}
	switch x := v.(type) {
	case int64:
		if op == "-" {
			return -x, nil
		}
		if op == "+" {
			return x, nil
		}
	case float64:
		if op == "-" {
			return -x, nil
		}
		if op == "+" {
			return x, nil
		}
	}
	return nil, fmt.Errorf("unary %s on %T", op, v)
}

// compare orders two non-NULL values as PostgreSQL does (NaN equals NaN and
// is greater than every other number).
func compare(l, r Value) (int, error) {
	if a, ok := l.(int64); ok {
		if b, ok := r.(int64); ok {
			switch {
			case a < b:
				return -1, nil
			case a > b:
				return 1, nil
			}
			return 0, nil
		}
	}
	if a, ok := toFloat(l); ok {
		b, ok := toFloat(r)
		if !ok {
			return 0, fmt.Errorf("comparing %T with %T", l, r)
		}
		switch an, bn := math.IsNaN(a), math.IsNaN(b); {
		case an && bn:
			return 0, nil
		case an:
			return 1, nil
		case bn:
			return -1, nil
		case a < b:
			return -1, nil
		case a > b:
			return 1, nil
		}
		return 0, nil
	}
	switch a := l.(type) {
	case string:
		b, ok := r.(string)
		if !ok {
			return 0, fmt.Errorf("comparing text with %T", r)
		}
		return strings.Compare(a, b), nil // byte order: matches the C collation only
	case bool:
		b, ok := r.(bool)
		if !ok {
			return 0, fmt.Errorf("comparing boolean with %T", r)
		}
		switch {
		case a == b:
			return 0, nil
		case !a:
			return -1, nil
		}
		return 1, nil
	}
	return 0, fmt.Errorf("comparing %T", l)
}

func binary(op string, l, r Value) (Value, error) {
	if l == nil || r == nil {
		return nil, nil
	}
	switch op {
	case "<", ">", "<=", ">=", "=", "<>", "!=":
		c, err := compare(l, r)
		if err != nil {
			return nil, err
		}
		switch op {
		case "<":
			return c < 0, nil
		case ">":
			return c > 0, nil
		case "<=":
			return c <= 0, nil
		case ">=":
			return c >= 0, nil
		case "=":
			return c == 0, nil
		}
		return c != 0, nil
	case "||":
		return textOfValue(l) + textOfValue(r), nil
	}
	if a, ok := l.(int64); ok {
		if b, ok := r.(int64); ok {
			switch op {
			case "+":
				return a + b, nil
			case "-":
				return a - b, nil
			case "*":
				return a * b, nil
			case "/", "%":
				if b == 0 {
					return nil, errors.New("division by zero")
				}
				if op == "/" {
					return a / b, nil
				}
				return a % b, nil
			}
		}
	}
	a, ok1 := toFloat(l)
	b, ok2 := toFloat(r)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%T %s %T not supported", l, op, r)
	}
	switch op {
	case "+":
		return a + b, nil
	case "-":
		return a - b, nil
	case "*":
		return a * b, nil
	case "/":
		if b == 0 {
			return nil, errors.New("division by zero")
		}
		return a / b, nil
	}
	return nil, fmt.Errorf("operator %s not supported", op)
}

func textOfValue(v Value) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case bool:
		if x {
			return "true"
		}
		return "false"
	case float64:
		switch {
		case math.IsNaN(x):
			return "NaN"
		case math.IsInf(x, 1):
			return "Infinity"
		case math.IsInf(x, -1):
			return "-Infinity"
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return fmt.Sprint(v)
}

// coerce converts v to the PostgreSQL type typ (assignment and casts).
func coerce(v Value, typ string) (Value, error) {
	if v == nil {
		return nil, nil
	}
	t := strings.ToLower(strings.TrimSpace(typ))
	t = strings.TrimPrefix(t, "pg_catalog.")
	switch t {
	case "int", "int2", "int4", "int8", "integer", "bigint", "smallint":
		var n int64
		switch x := v.(type) {
		case int64:
			n = x
		case int32:
			n = int64(x)
		case float64:
			if math.IsNaN(x) || math.IsInf(x, 0) || math.Abs(x) >= 1<<63 {
				return nil, fmt.Errorf("%v out of range for %s", x, typ)
			}
			n = int64(math.RoundToEven(x))
		case string:
			var err error
			if n, err = strconv.ParseInt(strings.TrimSpace(x), 10, 64); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("cannot convert %T to %s", v, typ)
		}
		// PostgreSQL's integer types hold 16 and 32 bits: a value past
		// them is an error there ("integer out of range"), not a wider
		// number.
		switch t {
		case "int2", "smallint":
			if n < math.MinInt16 || n > math.MaxInt16 {
				return nil, fmt.Errorf("smallint out of range: %d", n)
			}
		case "int", "int4", "integer":
			if n < math.MinInt32 || n > math.MaxInt32 {
				return nil, fmt.Errorf("integer out of range: %d", n)
			}
		}
		return n, nil
	case "float8", "float4", "double precision", "real", "numeric", "decimal":
		switch x := v.(type) {
		case float64:
			return x, nil
		case float32:
			return float64(x), nil
		case int64:
			return float64(x), nil
		case int32:
			return float64(x), nil
		case string:
			return strconv.ParseFloat(strings.TrimSpace(x), 64)
		}
	case "text", "varchar", "character varying":
		return textOfValue(v), nil
	case "bool", "boolean":
		switch x := v.(type) {
		case bool:
			return x, nil
		case string:
			return strconv.ParseBool(x)
		}
	}
	if typ == "" {
		return v, nil
	}
	return nil, fmt.Errorf("cannot convert %T to %s", v, typ)
}

// runsQueries reports whether a body runs queries of its own.
func runsQueries(stmts []Stmt) bool {
	found := false
	visit(stmts, func(s Stmt) {
		switch s.(type) {
		case *ForQuery, *SelectInto, *AggCall:
			found = true
		}
	})
	return found
}
