//go:build cgo

package aggify

import (
	"fmt"
	"regexp"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// Rewrite is the output of Compile for one function.
type Rewrite struct {
	Func  *Func
	Loops []*LoopAnalysis // inner loops first
	// Objects are the SQL statements to run, in order: for each loop its
	// state type, result type, transition and final functions and CREATE
	// AGGREGATE, then CREATE FUNCTION <name>_aggified.
	Objects []string
	// Aggified is the name of the rewritten function.
	Aggified string
}

// SQL returns the objects as one script.
func (r *Rewrite) SQL() string { return strings.Join(r.Objects, "\n\n") + "\n" }

type compiler struct {
	f      *Func
	out    *Rewrite
	nloops int
}

// Compile rewrites every cursor loop of f into an aggregate (inner loops
// first) and f into <name>_aggified. It consumes f's IR. A loop it cannot
// rewrite is refused with an *Error naming the construct and its line.
func Compile(f *Func) (*Rewrite, error) {
	c := &compiler{f: f, out: &Rewrite{Func: f, Aggified: f.Name + "_aggified"}}
	c.nloops = countLoops(f.Body)
	if c.nloops == 0 {
		if op := findOpaque(f.Body); op != nil {
			return nil, &Error{Func: f.Name, Line: op.Line, Construct: op.Kind, Reason: op.Reason}
		}
		return nil, &Error{Func: f.Name, Line: f.Line, Construct: "function body", Reason: "no FOR … IN query LOOP to rewrite"}
	}
	if err := c.elimAll(f.Body, nil, func(b []Stmt) { f.Body = b }); err != nil {
		return nil, err
	}
	if err := c.rewrite(f.Body); err != nil {
		return nil, err
	}
	if op := findOpaque(f.Body); op != nil {
		return nil, &Error{Func: f.Name, Line: op.Line, Construct: op.Kind, Reason: op.Reason + " (outside the cursor loops the rewriter re-emits every statement)"}
	}
	c.out.Objects = append(c.out.Objects, c.emitFunc())
	return c.out, nil
}

func countLoops(stmts []Stmt) int {
	n := 0
	visit(stmts, func(s Stmt) {
		if _, ok := s.(*ForQuery); ok {
			n++
		}
	})
	return n
}

// visit calls fn on every statement, outer before inner.
func visit(stmts []Stmt, fn func(Stmt)) {
	for _, s := range stmts {
		fn(s)
		switch s := s.(type) {
		case *If:
			visit(s.Then, fn)
			for _, e := range s.Elifs {
				visit(e.Body, fn)
			}
			visit(s.Else, fn)
		case *Block:
			visit(s.Body, fn)
		case *ForQuery:
			visit(s.Body, fn)
		case *ForInt:
			visit(s.Body, fn)
		case *While:
			visit(s.Body, fn)
		}
	}
}

func findOpaque(stmts []Stmt) *Opaque {
	var op *Opaque
	visit(stmts, func(s Stmt) {
		if o, ok := s.(*Opaque); ok && op == nil {
			op = o
		}
	})
	return op
}

// ---- jump elimination -------------------------------------------------

// synth adds a variable the rewrite needs to f.
func (c *compiler) synth(name, typ, def string, line int) *Var {
	v := &Var{Name: name, Type: typ, Kind: Synth, Line: line}
	if def != "" {
		v.Default = c.expr(def, line)
	}
	c.f.Vars = append(c.f.Vars, v)
	c.f.vars[name] = v
	return v
}

// expr parses a synthesized expression against f's variables.
func (c *compiler) expr(text string, line int) *Expr {
	tree, err := pg_query.Parse("SELECT " + text)
	if err != nil {
		panic(fmt.Sprintf("aggify: synthesized expression %q: %v", text, err))
	}
	return &Expr{Text: text, Line: line, Tree: tree, Uses: resolve(tree, c.f.vars)}
}

func (c *compiler) assign(v *Var, rhs string, line int) *Assign {
	return &Assign{Line: line, Target: v, Text: v.Name + " := " + rhs, Value: c.expr(rhs, line)}
}

// jumps holds the guard flags of one cursor loop.
type jumps struct {
	c                   *compiler
	L                   *ForQuery
	done, skip, ret, rv *Var // rv: the RETURN value
	inner               []string
}

// elimAll replaces EXIT, CONTINUE and RETURN inside every cursor loop by
// guard flags (inner loops first), the preprocessing the paper assumes
// (Section 4.2, footnote on BREAK/CONTINUE).
func (c *compiler) elimAll(stmts []Stmt, _ *ForQuery, set func([]Stmt)) error {
	var out []Stmt
	for _, s := range stmts {
		switch s := s.(type) {
		case *ForQuery:
			if err := c.elimAll(s.Body, s, func(b []Stmt) { s.Body = b }); err != nil {
				return err
			}
			j := &jumps{c: c, L: s}
			body, _, err := j.list(s.Body, 0)
			if err != nil {
				return err
			}
			if j.skip != nil {
				body = append([]Stmt{c.assign(j.skip, "false", s.Line)}, body...)
			}
			if j.done != nil {
				body = []Stmt{&If{Line: s.Line, Cond: c.expr("NOT "+j.done.Name, s.Line), Then: body}}
			}
			s.Body = body
			out = append(out, s)
			if j.ret != nil {
				r := &Return{Line: s.Line}
				if j.rv != nil {
					r.Expr = c.expr(j.rv.Name, s.Line)
				}
				out = append(out, &If{Line: s.Line, Cond: c.expr(j.ret.Name, s.Line), Then: []Stmt{r}})
			}
		case *If:
			if err := c.elimAll(s.Then, nil, func(b []Stmt) { s.Then = b }); err != nil {
				return err
			}
			for i := range s.Elifs {
				e := &s.Elifs[i]
				if err := c.elimAll(e.Body, nil, func(b []Stmt) { e.Body = b }); err != nil {
					return err
				}
			}
			if err := c.elimAll(s.Else, nil, func(b []Stmt) { s.Else = b }); err != nil {
				return err
			}
			out = append(out, s)
		case *Block:
			if err := c.elimAll(s.Body, nil, func(b []Stmt) { s.Body = b }); err != nil {
				return err
			}
			out = append(out, s)
		case *ForInt:
			if err := c.elimAll(s.Body, nil, func(b []Stmt) { s.Body = b }); err != nil {
				return err
			}
			out = append(out, s)
		case *While:
			if err := c.elimAll(s.Body, nil, func(b []Stmt) { s.Body = b }); err != nil {
				return err
			}
			out = append(out, s)
		default:
			out = append(out, s)
		}
	}
	set(out)
	return nil
}

func (j *jumps) flag(p **Var, name, typ, def string) *Var {
	if *p == nil {
		*p = j.c.synth(fmt.Sprintf("%s_%d", name, j.L.Line), typ, def, j.L.Line)
	}
	return *p
}

func (j *jumps) guard() *Expr {
	var fs []string
	for _, v := range []*Var{j.done, j.skip} {
		if v != nil {
			fs = append(fs, v.Name)
		}
	}
	return j.c.expr("NOT ("+strings.Join(fs, " OR ")+")", j.L.Line)
}

func (j *jumps) err(line int, construct, reason string) error {
	return &Error{Func: j.c.f.Name, Line: line, Construct: construct, Reason: reason}
}

// list rewrites stmts at loop depth depth (0: directly in the cursor loop);
// jumped reports that a statement may have set a guard flag.
func (j *jumps) list(stmts []Stmt, depth int) (out []Stmt, jumped bool, err error) {
	for i, s := range stmts {
		switched := false
		switch s := s.(type) {
		case *Exit:
			own := (s.Label == "" || s.Label == j.L.Label) && depth == 0
			if !own {
				if s.Label == j.L.Label {
					return nil, false, j.err(s.Line, exitWord(s)+" "+s.Label, "jumps to the cursor loop from inside a nested loop")
				}
				if s.Label != "" && !contains(j.inner, s.Label) {
					return nil, false, j.err(s.Line, exitWord(s)+" "+s.Label, "leaves the cursor loop for an enclosing block or loop")
				}
				out = append(out, s)
				continue
			}
			var set *Assign
			if s.Continue {
				set = j.c.assign(j.flag(&j.skip, "_skip", "boolean", ""), "true", s.Line)
			} else {
				set = j.c.assign(j.flag(&j.done, "_done", "boolean", "false"), "true", s.Line)
			}
			if s.Cond == nil {
				return append(out, set), true, nil
			}
			out = append(out, &If{Line: s.Line, Cond: s.Cond, Then: []Stmt{set}})
			switched = true
		case *Return:
			if depth > 0 {
				return nil, false, j.err(s.Line, "RETURN", "RETURN inside a loop nested in the cursor loop is not supported")
			}
			ret := j.flag(&j.ret, "_returned", "boolean", "false")
			done := j.flag(&j.done, "_done", "boolean", "false")
			if s.Expr != nil {
				if j.c.f.Returns == "" {
					return nil, false, j.err(s.Line, "RETURN expr", "a function with OUT parameters returns no expression")
				}
				rv := j.flag(&j.rv, "_ret", j.c.f.Returns, "")
				out = append(out, &Assign{Line: s.Line, Target: rv, Text: rv.Name + " := " + s.Expr.Text, Value: s.Expr})
			}
			return append(out, j.c.assign(ret, "true", s.Line), j.c.assign(done, "true", s.Line)), true, nil
		case *If:
			n := &If{Line: s.Line, Cond: s.Cond}
			var a, b, x bool
			if n.Then, a, err = j.list(s.Then, depth); err != nil {
				return
			}
			for _, e := range s.Elifs {
				var body []Stmt
				var y bool
				if body, y, err = j.list(e.Body, depth); err != nil {
					return
				}
				x = x || y
				n.Elifs = append(n.Elifs, Elif{Cond: e.Cond, Body: body})
			}
			if n.Else, b, err = j.list(s.Else, depth); err != nil {
				return
			}
			out = append(out, n)
			switched = a || b || x
		case *Block:
			n := &Block{Line: s.Line}
			if n.Body, switched, err = j.list(s.Body, depth); err != nil {
				return
			}
			out = append(out, n)
		case *ForInt:
			j.inner = append(j.inner, s.Label)
			n := *s
			if n.Body, _, err = j.list(s.Body, depth+1); err != nil {
				return
			}
			j.inner = j.inner[:len(j.inner)-1]
			out = append(out, &n)
		case *While:
			j.inner = append(j.inner, s.Label)
			n := *s
			if n.Body, _, err = j.list(s.Body, depth+1); err != nil {
				return
			}
			j.inner = j.inner[:len(j.inner)-1]
			out = append(out, &n)
		case *ForQuery:
			// An inner cursor loop's own jumps are already eliminated;
			// labelled jumps out of it were refused there.
			out = append(out, s)
		default:
			out = append(out, s)
		}
		if switched {
			rest, _, err := j.list(stmts[i+1:], depth)
			if err != nil {
				return nil, false, err
			}
			if len(rest) > 0 {
				out = append(out, &If{Line: rest[0].line(), Cond: j.guard(), Then: rest})
			}
			return out, true, nil
		}
	}
	return out, false, nil
}

func exitWord(e *Exit) string {
	if e.Continue {
		return "CONTINUE"
	}
	return "EXIT"
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// ---- loop rewrite -------------------------------------------------------

// rewrite replaces, in place and inner first, every cursor loop by an
// AggCall.
func (c *compiler) rewrite(stmts []Stmt) error {
	for i, s := range stmts {
		var err error
		switch s := s.(type) {
		case *If:
			if err = c.rewrite(s.Then); err == nil {
				for _, e := range s.Elifs {
					if err = c.rewrite(e.Body); err != nil {
						break
					}
				}
			}
			if err == nil {
				err = c.rewrite(s.Else)
			}
		case *Block:
			err = c.rewrite(s.Body)
		case *ForInt:
			err = c.rewrite(s.Body)
		case *While:
			err = c.rewrite(s.Body)
		case *ForQuery:
			if err = c.rewrite(s.Body); err == nil {
				stmts[i], err = c.loop(s)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

func ident(s string) string {
	if plainIdent.MatchString(s) {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// splitOrder fills q.Derived and q.OrderBy from the cursor query (rule (6)
// of the paper as SQL: the sort moves into the aggregate call).
func (c *compiler) splitOrder(q *Query, alias string) ([]string, error) {
	fail := func(reason string) error {
		return &Error{Func: c.f.Name, Line: q.Line, Construct: "cursor query " + quote(q.Text), Reason: reason}
	}
	if q.Tree == nil || len(q.Tree.Stmts) != 1 || q.Tree.Stmts[0].Stmt.GetSelectStmt() == nil {
		return nil, fail("the loop must iterate a SELECT")
	}
	sel := q.Tree.Stmts[0].Stmt.GetSelectStmt()
	if sel.IntoClause != nil || len(sel.LockingClause) > 0 {
		return nil, fail("SELECT INTO / FOR UPDATE in a cursor query is not supported")
	}
	setop := sel.Op != pg_query.SetOperation_SET_OPERATION_UNDEFINED && sel.Op != pg_query.SetOperation_SETOP_NONE
	var outs []string
	for _, t := range sel.TargetList {
		rt := t.GetResTarget()
		name := rt.Name
		if name == "" {
			if cr := rt.Val.GetColumnRef(); cr != nil {
				if s := cr.Fields[len(cr.Fields)-1].GetString_(); s != nil {
					name = s.Sval
				}
			}
		}
		outs = append(outs, name)
	}
	var keys []string
	for i, n := range sel.SortClause {
		sb := n.GetSortBy()
		key := ""
		if cst := sb.Node.GetAConst(); cst != nil && cst.GetIval() != nil {
			k := int(cst.GetIval().Ival)
			if k < 1 || k > len(sel.TargetList) {
				return nil, fail(fmt.Sprintf("ORDER BY %d: no such output column", k))
			}
			if outs[k-1] != "" {
				key = alias + "." + ident(outs[k-1])
			} else {
				sb = &pg_query.SortBy{Node: sel.TargetList[k-1].GetResTarget().Val, SortbyDir: sb.SortbyDir, SortbyNulls: sb.SortbyNulls}
			}
		} else if cr := sb.Node.GetColumnRef(); cr != nil && len(cr.Fields) == 1 && cr.Fields[0].GetString_() != nil && contains(outs, cr.Fields[0].GetString_().Sval) {
			key = alias + "." + ident(cr.Fields[0].GetString_().Sval)
		}
		if key == "" {
			if setop {
				return nil, fail("ORDER BY over a set operation must name output columns")
			}
			name := fmt.Sprintf("_ord%d", i+1)
			sel.TargetList = append(sel.TargetList, &pg_query.Node{Node: &pg_query.Node_ResTarget{ResTarget: &pg_query.ResTarget{Name: name, Val: sb.Node, Location: -1}}})
			key = alias + "." + name
		}
		switch sb.SortbyDir {
		case pg_query.SortByDir_SORTBY_DESC:
			key += " DESC"
		case pg_query.SortByDir_SORTBY_USING:
			return nil, fail("ORDER BY … USING is not supported")
		}
		switch sb.SortbyNulls {
		case pg_query.SortByNulls_SORTBY_NULLS_FIRST:
			key += " NULLS FIRST"
		case pg_query.SortByNulls_SORTBY_NULLS_LAST:
			key += " NULLS LAST"
		}
		keys = append(keys, key)
	}
	if sel.LimitCount == nil && sel.LimitOffset == nil {
		sel.SortClause = nil
	}
	d, err := pg_query.Deparse(q.Tree)
	if err != nil {
		return nil, fail("deparse: " + err.Error())
	}
	q.Derived, q.OrderBy = d, keys
	return outs, nil
}

// loop rewrites one cursor loop (its inner loops are already AggCalls).
func (c *compiler) loop(L *ForQuery) (Stmt, error) {
	f := c.f
	refuse := func(line int, construct, reason string) error {
		return &Error{Func: f.Name, Line: line, Construct: construct, Reason: fmt.Sprintf("cannot rewrite the loop at line %d: %s", L.Line, reason)}
	}
	if op := findOpaque(L.Body); op != nil {
		return nil, refuse(op.Line, op.Kind, op.Reason)
	}
	base := f.Name + "_agg"
	if c.nloops > 1 {
		base = fmt.Sprintf("%s_l%d_agg", f.Name, L.Line)
	}
	const alias = "_q"
	outs, err := c.splitOrder(L.Query, alias)
	if err != nil {
		return nil, err
	}
	lv := newLiveness(f)
	lv.function()
	liveOut := lv.liveOut[L]
	if liveOut[L.Rec] {
		return nil, refuse(L.Line, "record "+L.Rec.Name, "it is read after the loop, where it holds the last row")
	}
	for v := range liveOut {
		if v.Kind == Found {
			return nil, refuse(L.Line, "FOUND", "FOUND is read after the loop")
		}
	}
	early := false
	for _, v := range f.Vars {
		if v.Kind == Synth && strings.HasPrefix(v.Name, fmt.Sprintf("_done_%d", L.Line)) {
			early = true
		}
	}
	a, err := analyzeLoop(f, L, liveOut, early)
	if err != nil {
		return nil, err
	}
	for _, v := range append(append([]*Var{}, a.state...), a.params...) {
		if contains(outs, v.Name) {
			return nil, refuse(L.Line, "variable "+v.Name, "it has the name of a column of the cursor query, which the rewritten query would make ambiguous")
		}
	}
	a.aggregate = base
	if early {
		a.done = f.vars[fmt.Sprintf("_done_%d", L.Line)]
	}
	c.out.Loops = append(c.out.Loops, a)
	if len(a.results) == 0 {
		// No live-out variable and no side effects: the loop is dead.
		return &AggCall{Line: L.Line, Text: fmt.Sprintf("-- aggify: the loop at line %d has no live-out variables; removed", L.Line)}, nil
	}

	vol := f.Volatility
	var b strings.Builder
	// State type: _started is never NULL, so a state is NULL only before
	// the first row (the paper's isInitialized).
	fmt.Fprintf(&b, "DROP TYPE IF EXISTS %s_state CASCADE;\nCREATE TYPE %s_state AS (_started boolean", base, base)
	for _, v := range a.state {
		fmt.Fprintf(&b, ", %s %s", ident(v.Name), v.Type)
	}
	b.WriteString(");")
	c.out.Objects = append(c.out.Objects, b.String())
	resType := a.results[0].Type
	if len(a.results) > 1 {
		resType = base + "_result"
		b.Reset()
		fmt.Fprintf(&b, "DROP TYPE IF EXISTS %s CASCADE;\nCREATE TYPE %s AS (", resType, resType)
		for i, v := range a.results {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %s", ident(v.Name), v.Type)
		}
		b.WriteString(");")
		c.out.Objects = append(c.out.Objects, b.String())
	}

	// Transition function.
	argTypes := []string{"record"}
	b.Reset()
	fmt.Fprintf(&b, "CREATE FUNCTION %s_step(_s %s_state, %s record", base, base, ident(L.Rec.Name))
	for _, v := range a.params {
		fmt.Fprintf(&b, ", %s %s", ident(v.Name), v.Type)
		argTypes = append(argTypes, v.Type)
	}
	for _, v := range a.init {
		fmt.Fprintf(&b, ", %s %s", ident("_i_"+v.Name), v.Type)
		argTypes = append(argTypes, v.Type)
	}
	fmt.Fprintf(&b, ")\nRETURNS %s_state LANGUAGE plpgsql %s AS $aggify$\nDECLARE\n", base, vol)
	declared := map[*Var]bool{L.Rec: true}
	for _, v := range a.params {
		declared[v] = true
	}
	for _, v := range a.state {
		fmt.Fprintf(&b, "  %s %s;\n", ident(v.Name), v.Type)
		declared[v] = true
	}
	for _, v := range bodyVars(L.Body) {
		if !declared[v] && v.Kind != Implicit {
			fmt.Fprintf(&b, "  %s %s;\n", ident(v.Name), v.Type)
			declared[v] = true
		}
	}
	b.WriteString("BEGIN\n")
	if early {
		fmt.Fprintf(&b, "  IF _s IS NOT NULL AND (_s).%s THEN\n    RETURN _s;  -- the loop has exited: later rows are ignored\n  END IF;\n", ident("_done_"+fmt.Sprint(L.Line)))
	}
	b.WriteString("  IF _s IS NULL THEN\n")
	for _, v := range a.init {
		fmt.Fprintf(&b, "    %s := %s;\n", ident(v.Name), ident("_i_"+v.Name))
	}
	b.WriteString("  ELSE\n")
	for _, v := range a.state {
		fmt.Fprintf(&b, "    %s := (_s).%s;\n", ident(v.Name), ident(v.Name))
	}
	b.WriteString("  END IF;\n")
	emitStmts(&b, L.Body, 1)
	b.WriteString("  RETURN ROW(true")
	for _, v := range a.state {
		b.WriteString(", " + ident(v.Name))
	}
	fmt.Fprintf(&b, ")::%s_state;\nEND $aggify$;", base)
	c.out.Objects = append(c.out.Objects, b.String())

	// Final function.
	b.Reset()
	fmt.Fprintf(&b, "CREATE FUNCTION %s_final(_s %s_state) RETURNS %s LANGUAGE sql IMMUTABLE AS $aggify$ SELECT ", base, base, resType)
	if len(a.results) == 1 {
		fmt.Fprintf(&b, "(_s).%s", ident(a.results[0].Name))
	} else {
		b.WriteString("ROW(")
		for i, v := range a.results {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "(_s).%s", ident(v.Name))
		}
		fmt.Fprintf(&b, ")::%s", resType)
	}
	b.WriteString(" $aggify$;")
	c.out.Objects = append(c.out.Objects, b.String())
	c.out.Objects = append(c.out.Objects, fmt.Sprintf("CREATE AGGREGATE %s(%s) (SFUNC = %s_step, STYPE = %s_state, FINALFUNC = %s_final);",
		base, strings.Join(argTypes, ", "), base, base, base))

	// The replacing statement. Pre-loop values of the guard flags are
	// constants; the others are the variables' current values.
	call := &AggCall{Line: L.Line}
	args := []string{alias}
	for _, v := range a.params {
		args = append(args, ident(v.Name))
		call.Uses = append(call.Uses, Ref{Var: v})
	}
	for _, v := range a.init {
		switch {
		case v.Kind == Synth && v.Default != nil:
			args = append(args, v.Default.Text)
		case v.Kind == Synth:
			args = append(args, "NULL::"+v.Type)
		default:
			args = append(args, ident(v.Name))
			call.Uses = append(call.Uses, Ref{Var: v})
		}
	}
	aggExpr := base + "(" + strings.Join(args, ", ")
	if len(L.Query.OrderBy) > 0 {
		aggExpr += " ORDER BY " + strings.Join(L.Query.OrderBy, ", ")
	}
	aggExpr += ")"
	call.Uses = append(call.Uses, L.Query.Uses...)
	from := fmt.Sprintf("FROM (%s) AS %s", L.Query.Derived, alias)
	if len(a.results) == 1 {
		r := a.results[0]
		call.Defs = []*Var{r}
		call.Uses = append(call.Uses, Ref{Var: r})
		call.Text = fmt.Sprintf("-- aggify: the loop at line %d\n%s := (SELECT CASE WHEN count(*) = 0 THEN %s ELSE %s END\n  %s);", L.Line, ident(r.Name), ident(r.Name), aggExpr, from)
	} else {
		res := c.synth(fmt.Sprintf("_res_%d", L.Line), resType, "", L.Line)
		call.Defs = append([]*Var{res}, a.results...)
		var pre, unpack []string
		for _, v := range a.results {
			pre = append(pre, ident(v.Name))
			call.Uses = append(call.Uses, Ref{Var: v})
			unpack = append(unpack, fmt.Sprintf("%s := (%s).%s;", ident(v.Name), res.Name, ident(v.Name)))
		}
		call.Text = fmt.Sprintf("-- aggify: the loop at line %d\n%s := (SELECT CASE WHEN count(*) = 0 THEN ROW(%s)::%s ELSE %s END\n  %s);\n%s",
			L.Line, res.Name, strings.Join(pre, ", "), resType, aggExpr, from, strings.Join(unpack, "\n"))
	}
	return call, nil
}

// bodyVars returns the variables a body reads or assigns, in first-seen order.
func bodyVars(stmts []Stmt) []*Var {
	var out []*Var
	seen := map[*Var]bool{}
	add := func(v *Var) {
		if v != nil && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	addE := func(e *Expr) {
		if e != nil {
			for _, r := range e.Uses {
				add(r.Var)
			}
		}
	}
	visit(stmts, func(s Stmt) {
		switch s := s.(type) {
		case *Assign:
			add(s.Target)
			addE(s.Value)
		case *If:
			addE(s.Cond)
			for _, e := range s.Elifs {
				addE(e.Cond)
			}
		case *Return:
			addE(s.Expr)
		case *Exit:
			addE(s.Cond)
		case *SelectInto:
			for _, t := range s.Targets {
				add(t)
			}
			addE(s.Query)
		case *AggCall:
			for _, d := range s.Defs {
				add(d)
			}
			for _, r := range s.Uses {
				add(r.Var)
			}
		case *ForInt:
			addE(s.Lower)
			addE(s.Upper)
			addE(s.Step)
		case *While:
			addE(s.Cond)
		}
	})
	return out
}

// ---- PL/pgSQL emitter -----------------------------------------------------

func emitStmts(b *strings.Builder, stmts []Stmt, depth int) {
	ind := strings.Repeat("  ", depth)
	label := func(l string) {
		if l != "" {
			fmt.Fprintf(b, "%s<<%s>>\n", ind, l)
		}
	}
	for _, s := range stmts {
		switch s := s.(type) {
		case *Assign:
			fmt.Fprintf(b, "%s%s;\n", ind, s.Text)
		case *If:
			fmt.Fprintf(b, "%sIF %s THEN\n", ind, s.Cond.Text)
			emitStmts(b, s.Then, depth+1)
			for _, e := range s.Elifs {
				fmt.Fprintf(b, "%sELSIF %s THEN\n", ind, e.Cond.Text)
				emitStmts(b, e.Body, depth+1)
			}
			if len(s.Else) > 0 {
				fmt.Fprintf(b, "%sELSE\n", ind)
				emitStmts(b, s.Else, depth+1)
			}
			fmt.Fprintf(b, "%sEND IF;\n", ind)
		case *Block:
			fmt.Fprintf(b, "%sBEGIN\n", ind)
			emitStmts(b, s.Body, depth+1)
			fmt.Fprintf(b, "%sEND;\n", ind)
		case *ForInt:
			label(s.Label)
			rev := ""
			if s.Reverse {
				rev = "REVERSE "
			}
			by := ""
			if s.Step != nil {
				by = " BY " + s.Step.Text
			}
			fmt.Fprintf(b, "%sFOR %s IN %s%s .. %s%s LOOP\n", ind, ident(s.Var.Name), rev, s.Lower.Text, s.Upper.Text, by)
			emitStmts(b, s.Body, depth+1)
			fmt.Fprintf(b, "%sEND LOOP;\n", ind)
		case *While:
			label(s.Label)
			if s.Cond != nil {
				fmt.Fprintf(b, "%sWHILE %s LOOP\n", ind, s.Cond.Text)
			} else {
				fmt.Fprintf(b, "%sLOOP\n", ind)
			}
			emitStmts(b, s.Body, depth+1)
			fmt.Fprintf(b, "%sEND LOOP;\n", ind)
		case *Exit:
			w := exitWord(s)
			if s.Label != "" {
				w += " " + s.Label
			}
			if s.Cond != nil {
				w += " WHEN " + s.Cond.Text
			}
			fmt.Fprintf(b, "%s%s;\n", ind, w)
		case *Return:
			if s.Expr != nil {
				fmt.Fprintf(b, "%sRETURN %s;\n", ind, s.Expr.Text)
			} else {
				fmt.Fprintf(b, "%sRETURN;\n", ind)
			}
		case *SelectInto:
			var ts []string
			for _, t := range s.Targets {
				ts = append(ts, ident(t.Name))
			}
			strict := ""
			if s.Strict {
				strict = "STRICT "
			}
			fmt.Fprintf(b, "%sSELECT * INTO %s%s FROM (%s) AS _sel;\n", ind, strict, strings.Join(ts, ", "), s.Query.Text)
		case *AggCall:
			for _, l := range strings.Split(s.Text, "\n") {
				fmt.Fprintf(b, "%s%s\n", ind, l)
			}
		}
	}
}

// emitFunc writes CREATE FUNCTION <name>_aggified with f's parameters and
// result and the rewritten body.
func (c *compiler) emitFunc() string {
	f := c.f
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE OR REPLACE FUNCTION %s(", c.out.Aggified)
	for i, p := range f.Params {
		if i > 0 {
			b.WriteString(", ")
		}
		if p.Kind == OutParam {
			b.WriteString("OUT ")
		}
		fmt.Fprintf(&b, "%s %s", ident(p.Name), p.Type)
	}
	b.WriteString(")")
	if f.Returns != "" {
		fmt.Fprintf(&b, " RETURNS %s", f.Returns)
	}
	fmt.Fprintf(&b, "\nLANGUAGE plpgsql %s AS $aggify$\nDECLARE\n", f.Volatility)
	for _, v := range f.Vars {
		if v.Kind == Param || v.Kind == OutParam || v.Kind == Found || v.Kind == Implicit {
			continue
		}
		fmt.Fprintf(&b, "  %s", ident(v.Name))
		if v.Const {
			b.WriteString(" CONSTANT")
		}
		fmt.Fprintf(&b, " %s", v.Type)
		if v.NotNull {
			b.WriteString(" NOT NULL")
		}
		if v.Default != nil {
			fmt.Fprintf(&b, " := %s", v.Default.Text)
		}
		b.WriteString(";\n")
	}
	b.WriteString("BEGIN\n")
	emitStmts(&b, f.Body, 1)
	b.WriteString("END $aggify$;")
	return b.String()
}
