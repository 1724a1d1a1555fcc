//go:build cgo

package aggify

import (
	"encoding/json"
	"fmt"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// File is a parsed SQL file: its PL/pgSQL functions and the other statements
// (queries that call them, such as a leaderboard's outer query).
type File struct {
	Funcs []*Func
	// Queries are the top-level statements that are not CREATE FUNCTION, as
	// written, in file order.
	Queries []string
}

// ParseFile parses every statement of src with the PostgreSQL parser and
// every LANGUAGE plpgsql function body with the PL/pgSQL parser.
func ParseFile(src string) (*File, error) {
	res, err := pg_query.Parse(src)
	if err != nil {
		return nil, fmt.Errorf("aggify: parse: %w", err)
	}
	out := &File{}
	for _, raw := range res.Stmts {
		start := int(raw.StmtLocation)
		end := len(src)
		if raw.StmtLen > 0 {
			end = start + int(raw.StmtLen)
		}
		text := strings.TrimSpace(src[start:end])
		cf := raw.Stmt.GetCreateFunctionStmt()
		if cf == nil {
			out.Queries = append(out.Queries, text)
			continue
		}
		f, err := parseFunc(text, cf, src)
		if err != nil {
			return nil, err
		}
		out.Funcs = append(out.Funcs, f)
	}
	return out, nil
}

// Func returns the function called name, or nil.
func (f *File) Func(name string) *Func {
	for _, fn := range f.Funcs {
		if fn.Name == name {
			return fn
		}
	}
	return nil
}

func typeName(t *pg_query.TypeName) string {
	if t == nil {
		return ""
	}
	var parts []string
	for _, n := range t.Names {
		parts = append(parts, n.GetString_().Sval)
	}
	if len(parts) == 2 && parts[0] == "pg_catalog" {
		parts = parts[1:]
	}
	s := strings.Join(parts, ".")
	var mods []string
	for _, m := range t.Typmods {
		if c := m.GetAConst(); c != nil && c.GetIval() != nil {
			mods = append(mods, fmt.Sprint(c.GetIval().Ival))
		}
	}
	if len(mods) > 0 {
		s += "(" + strings.Join(mods, ",") + ")"
	}
	for range t.ArrayBounds {
		s += "[]"
	}
	if t.Setof {
		s = "SETOF " + s
	}
	return s
}

// cleanType trims PL/pgSQL's typname ("pg_catalog.\"boolean\"", "int    ").
func cleanType(s string) string {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "pg_catalog.")
	if strings.HasPrefix(s, `"`) && strings.HasSuffix(s, `"`) && !strings.Contains(s[1:len(s)-1], `"`) {
		s = s[1 : len(s)-1]
	}
	return s
}

type jnode = map[string]any

// one returns the single key and value of a {"Kind": {...}} node.
func one(v any) (string, jnode) {
	m, _ := v.(jnode)
	for k, x := range m {
		inner, _ := x.(jnode)
		return k, inner
	}
	return "", nil
}

func jstr(m jnode, k string) string { s, _ := m[k].(string); return s }
func jint(m jnode, k string) int    { f, _ := m[k].(float64); return int(f) }
func jbool(m jnode, k string) bool  { b, _ := m[k].(bool); return b }
func jlist(m jnode, k string) []any { l, _ := m[k].([]any); return l }

type parser struct {
	f      *Func
	datums []*Var // by dno; nil for non-value datums
	recs   map[int]*Var
	fields map[int]Ref // recfield dno -> rec.field
	base   int         // file line of PL/pgSQL line 1
	err    error
}

// parseFunc parses one CREATE FUNCTION (src) of file; cf's locations are
// offsets in file.
func parseFunc(src string, cf *pg_query.CreateFunctionStmt, file string) (*Func, error) {
	f := &Func{Source: src, Volatility: "VOLATILE", vars: map[string]*Var{}}
	for _, n := range cf.Funcname {
		f.Name = n.GetString_().Sval
	}
	lang := ""
	bodyLoc := 0
	for _, o := range cf.Options {
		d := o.GetDefElem()
		switch d.Defname {
		case "language":
			lang = d.Arg.GetString_().Sval
		case "volatility":
			f.Volatility = strings.ToUpper(d.Arg.GetString_().Sval)
		case "as":
			bodyLoc = int(d.ArgLocation)
		}
	}
	lineAt := func(off int) int { return 1 + strings.Count(file[:min(max(off, 0), len(file))], "\n") }
	firstLine := lineAt(int(cf.ReturnType.GetLocation()))
	if lang != "plpgsql" {
		return nil, &Error{Func: f.Name, Line: firstLine, Construct: "LANGUAGE " + lang, Reason: "only LANGUAGE plpgsql functions are compiled"}
	}
	f.Returns = typeName(cf.ReturnType)
	hasOut := false
	for _, p := range cf.Parameters {
		fp := p.GetFunctionParameter()
		if fp.Mode == pg_query.FunctionParameterMode_FUNC_PARAM_OUT || fp.Mode == pg_query.FunctionParameterMode_FUNC_PARAM_INOUT {
			hasOut = true
		}
		if fp.Mode == pg_query.FunctionParameterMode_FUNC_PARAM_TABLE || fp.Mode == pg_query.FunctionParameterMode_FUNC_PARAM_VARIADIC {
			return nil, &Error{Func: f.Name, Line: firstLine, Construct: "parameter " + fp.Name, Reason: "TABLE and VARIADIC parameters are not supported"}
		}
		if fp.Defexpr != nil {
			return nil, &Error{Func: f.Name, Line: firstLine, Construct: "parameter " + fp.Name + " DEFAULT", Reason: "parameter defaults are not supported"}
		}
		if fp.Name == "" {
			return nil, &Error{Func: f.Name, Line: firstLine, Construct: "parameter", Reason: "unnamed parameters are not supported (the rewrite refers to parameters by name)"}
		}
	}
	if hasOut {
		f.Returns = ""
	}
	if strings.HasPrefix(f.Returns, "SETOF") {
		return nil, &Error{Func: f.Name, Line: firstLine, Construct: "RETURNS " + f.Returns, Reason: "set-returning functions are not supported"}
	}
	js, err := pg_query.ParsePlPgSqlToJSON(src)
	if err != nil {
		return nil, fmt.Errorf("aggify: %s: PL/pgSQL: %w", f.Name, err)
	}
	var top []any
	if err := json.Unmarshal([]byte(js), &top); err != nil || len(top) != 1 {
		return nil, fmt.Errorf("aggify: %s: unexpected PL/pgSQL parser output", f.Name)
	}
	_, fn := one(top[0])
	p := &parser{f: f, recs: map[int]*Var{}, fields: map[int]Ref{}}
	p.base = lineAt(bodyLoc)
	// Datums: parameters come first, in declaration order, then FOUND.
	datums := jlist(fn, "datums")
	p.datums = make([]*Var, len(datums))
	nparams := len(cf.Parameters)
	for dno, d := range datums {
		kind, m := one(d)
		switch kind {
		case "PLpgSQL_var":
			_, dt := one(m["datatype"])
			v := &Var{Name: jstr(m, "refname"), Type: cleanType(jstr(dt, "typname")), Const: jbool(m, "isconst"), NotNull: jbool(m, "notnull")}
			if l := jint(m, "lineno"); l > 0 {
				v.Line = p.line(l)
			}
			switch {
			case dno < nparams:
				v.Kind = Param
				fp := cf.Parameters[dno].GetFunctionParameter()
				if fp.Mode == pg_query.FunctionParameterMode_FUNC_PARAM_OUT || fp.Mode == pg_query.FunctionParameterMode_FUNC_PARAM_INOUT {
					v.Kind = OutParam
				}
				v.Type = typeName(fp.ArgType)
				f.Params = append(f.Params, v)
			case v.Name == "found" && v.Line == 0:
				v.Kind = Found
			case v.Const && (v.Name == "sqlstate" || v.Name == "sqlerrm"):
				v.Kind = Implicit
			}
			p.datums[dno] = v
		case "PLpgSQL_rec":
			v := &Var{Name: jstr(m, "refname"), Type: "record", Kind: Record, Line: p.line(jint(m, "lineno"))}
			p.datums[dno] = v
			p.recs[dno] = v
		case "PLpgSQL_recfield":
			p.fields[dno] = Ref{Field: jstr(m, "fieldname")}
		case "PLpgSQL_row":
			// INTO targets and OUT-parameter rows; fields point at vars.
		default:
			return nil, &Error{Func: f.Name, Construct: kind, Reason: "unsupported declaration"}
		}
	}
	for dno, r := range p.fields {
		_, m := one(datums[dno])
		r.Var = p.recs[jint(m, "recparentno")]
		p.fields[dno] = r
	}
	_, blk := one(fn["action"])
	f.Line = p.line(jint(blk, "lineno"))
	for _, v := range p.datums {
		if v != nil && v.Kind != Implicit && v.Kind != Synth {
			f.Vars = append(f.Vars, v)
		}
	}
	p.index()
	for dno, d := range datums {
		kind, m := one(d)
		if kind == "PLpgSQL_var" {
			if dv, ok := m["default_val"]; ok {
				_, e := one(dv)
				p.datums[dno].Default = p.expr(jstr(e, "query"), p.datums[dno].Line, false)
			}
		}
	}
	if len(jlist(blk, "exceptions")) > 0 || blk["exceptions"] != nil {
		return nil, &Error{Func: f.Name, Line: f.Line, Construct: "EXCEPTION", Reason: "exception handlers are not supported"}
	}
	f.Body = p.stmts(jlist(blk, "body"))
	if p.err != nil {
		return nil, p.err
	}
	return f, nil
}

// index builds the name table. The first datum of a name wins: a later one
// is an integer FOR loop's own counter, which stmt swaps in while it parses
// that loop's body. Variables of nested blocks share the function's scope
// (the PL/pgSQL parser's output does not say which block declared them).
func (p *parser) index() {
	for _, v := range p.datums {
		if v != nil && p.f.vars[v.Name] == nil {
			p.f.vars[v.Name] = v
		}
	}
}

func (p *parser) line(l int) int {
	if l <= 0 {
		return 0
	}
	return p.base + l - 1
}

func (p *parser) fail(line int, construct, reason string) {
	if p.err == nil {
		p.err = &Error{Func: p.f.Name, Line: line, Construct: construct, Reason: reason}
	}
}

// expr parses text (an expression, or a query when isQuery) with the
// PostgreSQL parser and resolves its variable references.
func (p *parser) expr(text string, line int, isQuery bool) *Expr {
	sql := text
	if !isQuery {
		sql = "SELECT " + text
	}
	tree, err := pg_query.Parse(sql)
	if err != nil {
		p.fail(line, "expression "+quote(text), err.Error())
		return &Expr{Text: text, Line: line}
	}
	e := &Expr{Text: text, Line: line, Tree: tree}
	e.Uses = resolve(tree, p.f.vars)
	return e
}

func quote(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return "`" + s + "`"
}

// resolve returns the variable references of a parse tree: every column
// reference whose first name is a variable of the function (PL/pgSQL's own
// rule: with variable_conflict = error a name may not be both).
func resolve(tree *pg_query.ParseResult, vars map[string]*Var) []Ref {
	var refs []Ref
	walk(tree.ProtoReflect(), func(m protoreflect.Message) {
		cr, ok := m.Interface().(*pg_query.ColumnRef)
		if !ok || len(cr.Fields) == 0 {
			return
		}
		first := cr.Fields[0].GetString_()
		if first == nil {
			return
		}
		v := vars[first.Sval]
		if v == nil {
			return
		}
		r := Ref{Var: v}
		if v.Kind == Record && len(cr.Fields) > 1 {
			if s := cr.Fields[1].GetString_(); s != nil {
				r.Field = s.Sval
			}
		}
		refs = append(refs, r)
	})
	return refs
}

// walk calls fn on m and every message below it.
func walk(m protoreflect.Message, fn func(protoreflect.Message)) {
	fn(m)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				walk(l.Get(i).Message(), fn)
			}
		case fd.IsMap():
		case fd.Message() != nil:
			walk(v.Message(), fn)
		}
		return true
	})
}

func (p *parser) exprNode(v any, line int, isQuery bool) *Expr {
	if v == nil {
		return nil
	}
	_, e := one(v)
	return p.expr(jstr(e, "query"), line, isQuery)
}

func (p *parser) stmts(list []any) []Stmt {
	var out []Stmt
	for _, s := range list {
		if st := p.stmt(s); st != nil {
			out = append(out, st)
		}
	}
	return out
}

func (p *parser) stmt(node any) Stmt {
	kind, m := one(node)
	line := p.line(jint(m, "lineno"))
	switch kind {
	case "PLpgSQL_stmt_assign":
		target := p.datums[jint(m, "varno")]
		field := ""
		if r, ok := p.fields[jint(m, "varno")]; ok {
			target, field = r.Var, r.Field
		}
		if target == nil {
			p.fail(line, "assignment", "unsupported assignment target (array element or row)")
			return nil
		}
		_, e := one(m["expr"])
		text := jstr(e, "query")
		i := strings.Index(text, ":=")
		if i < 0 {
			p.fail(line, "assignment "+quote(text), "no := in the assignment")
			return nil
		}
		return &Assign{Line: line, Target: target, Field: field, Text: text, Value: p.expr(strings.TrimSpace(text[i+2:]), line, false)}
	case "PLpgSQL_stmt_if":
		s := &If{Line: line, Cond: p.exprNode(m["cond"], line, false), Then: p.stmts(jlist(m, "then_body")), Else: p.stmts(jlist(m, "else_body"))}
		for _, e := range jlist(m, "elsif_list") {
			_, em := one(e)
			s.Elifs = append(s.Elifs, Elif{Cond: p.exprNode(em["cond"], p.line(jint(em, "lineno")), false), Body: p.stmts(jlist(em, "stmts"))})
		}
		return s
	case "PLpgSQL_stmt_fors":
		rk, rm := one(m["var"])
		if rk != "PLpgSQL_rec" {
			p.fail(line, "FOR … IN query", "the loop variable must be a single variable of type record")
			return nil
		}
		q := p.exprNode(m["query"], line, true)
		return &ForQuery{Line: line, Label: jstr(m, "label"), Rec: p.datums[jint(rm, "dno")], Query: &Query{Expr: q}, Body: p.stmts(jlist(m, "body"))}
	case "PLpgSQL_stmt_fori":
		_, vm := one(m["var"])
		var iv *Var
		for _, d := range p.datums {
			if d != nil && d.Name == jstr(vm, "refname") && d.Line == p.line(jint(vm, "lineno")) && d.Kind == Local {
				iv = d
			}
		}
		if iv == nil {
			p.fail(line, "FOR i IN lo..hi", "loop counter not found among the declarations")
			return nil
		}
		iv.Kind = Implicit
		s := &ForInt{Line: line, Label: jstr(m, "label"), Var: iv, Reverse: jbool(m, "reverse"),
			Lower: p.exprNode(m["lower"], line, false), Upper: p.exprNode(m["upper"], line, false), Step: p.exprNode(m["step"], line, false)}
		saved := p.f.vars[iv.Name]
		p.f.vars[iv.Name] = iv
		s.Body = p.stmts(jlist(m, "body"))
		p.f.vars[iv.Name] = saved
		return s
	case "PLpgSQL_stmt_while":
		return &While{Line: line, Label: jstr(m, "label"), Cond: p.exprNode(m["cond"], line, false), Body: p.stmts(jlist(m, "body"))}
	case "PLpgSQL_stmt_loop":
		return &While{Line: line, Label: jstr(m, "label"), Body: p.stmts(jlist(m, "body"))}
	case "PLpgSQL_stmt_exit":
		return &Exit{Line: line, Continue: !jbool(m, "is_exit"), Label: jstr(m, "label"), Cond: p.exprNode(m["cond"], line, false)}
	case "PLpgSQL_stmt_return":
		return &Return{Line: line, Expr: p.exprNode(m["expr"], line, false)}
	case "PLpgSQL_stmt_block":
		if m["exceptions"] != nil {
			return &Opaque{Line: line, Kind: "EXCEPTION block", Reason: "exception handlers roll back a subtransaction; an aggregate's transition function cannot reproduce that per row"}
		}
		return &Block{Line: line, Body: p.stmts(jlist(m, "body"))}
	case "PLpgSQL_stmt_execsql":
		q := p.exprNode(m["sqlstmt"], line, true)
		if q.Tree != nil && len(q.Tree.Stmts) == 1 {
			st := q.Tree.Stmts[0].Stmt
			switch {
			case st.GetInsertStmt() != nil:
				return &Opaque{Line: line, Kind: "INSERT", Reason: "writes to table " + st.GetInsertStmt().Relation.Relname + " (the loop modifies persistent state)"}
			case st.GetUpdateStmt() != nil:
				return &Opaque{Line: line, Kind: "UPDATE", Reason: "writes to table " + st.GetUpdateStmt().Relation.Relname + " (the loop modifies persistent state)"}
			case st.GetDeleteStmt() != nil:
				return &Opaque{Line: line, Kind: "DELETE", Reason: "writes to table " + st.GetDeleteStmt().Relation.Relname + " (the loop modifies persistent state)"}
			case st.GetMergeStmt() != nil:
				return &Opaque{Line: line, Kind: "MERGE", Reason: "writes to a table (the loop modifies persistent state)"}
			case st.GetSelectStmt() != nil && jbool(m, "into"):
				s := &SelectInto{Line: line, Query: q, Strict: jbool(m, "strict")}
				_, tm := one(m["target"])
				for _, fl := range jlist(tm, "fields") {
					fm, _ := fl.(jnode)
					v := p.datums[jint(fm, "varno")]
					if v == nil {
						p.fail(line, "SELECT … INTO", "INTO a record field is not supported")
						return nil
					}
					s.Targets = append(s.Targets, v)
				}
				if len(s.Targets) == 0 {
					return &Opaque{Line: line, Kind: "SELECT INTO record", Reason: "SELECT INTO a record variable is not supported"}
				}
				return s
			}
		}
		return &Opaque{Line: line, Kind: "SQL statement " + quote(q.Text), Reason: "only SELECT … INTO is supported as an SQL statement"}
	case "PLpgSQL_stmt_dynexecute", "PLpgSQL_stmt_dynfors":
		return &Opaque{Line: line, Kind: "EXECUTE", Reason: "dynamic SQL cannot be analysed"}
	case "PLpgSQL_stmt_open", "PLpgSQL_stmt_fetch", "PLpgSQL_stmt_close", "PLpgSQL_stmt_forc":
		return &Opaque{Line: line, Kind: strings.ToUpper(strings.TrimPrefix(kind, "PLpgSQL_stmt_")), Reason: "explicit cursors (OPEN/FETCH/CLOSE) are not supported; write FOR rec IN query LOOP"}
	case "PLpgSQL_stmt_return_next", "PLpgSQL_stmt_return_query":
		return &Opaque{Line: line, Kind: strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(kind, "PLpgSQL_stmt_"), "_", " ")), Reason: "set-returning functions are not supported"}
	case "PLpgSQL_stmt_raise", "PLpgSQL_stmt_assert":
		return &Opaque{Line: line, Kind: strings.ToUpper(strings.TrimPrefix(kind, "PLpgSQL_stmt_")), Reason: "messages and assertions are side effects the aggregate would reorder"}
	case "PLpgSQL_stmt_perform":
		return &Opaque{Line: line, Kind: "PERFORM", Reason: "PERFORM runs a query for its side effects"}
	default:
		return &Opaque{Line: line, Kind: strings.TrimPrefix(kind, "PLpgSQL_stmt_"), Reason: "statement not supported"}
	}
}
