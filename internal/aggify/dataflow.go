//go:build cgo

package aggify

import (
	"sort"
)

// varSet is a set of variables.
type varSet map[*Var]bool

func (s varSet) clone() varSet {
	c := make(varSet, len(s))
	for v := range s {
		c[v] = true
	}
	return c
}

func (s varSet) addAll(o varSet) varSet {
	for v := range o {
		s[v] = true
	}
	return s
}

func (s varSet) addUses(e *Expr) varSet {
	if e != nil {
		for _, r := range e.Uses {
			s[r.Var] = true
		}
	}
	return s
}

func (s varSet) equal(o varSet) bool {
	if len(s) != len(o) {
		return false
	}
	for v := range s {
		if !o[v] {
			return false
		}
	}
	return true
}

func (s varSet) names() []string {
	var out []string
	for v := range s {
		out = append(out, v.Name)
	}
	sort.Strings(out)
	return out
}

// loopCtx is what EXIT and CONTINUE see: the variables live after the loop
// and at its head.
type loopCtx struct {
	label      string
	exit, head varSet
}

// liveness computes live variables backwards over the structured IR. It
// records, for every cursor loop, the set live right after it (liveOut).
type liveness struct {
	f       *Func
	liveOut map[*ForQuery]varSet
	loops   []loopCtx
	atRet   varSet // live at a RETURN: the OUT parameters
}

func newLiveness(f *Func) *liveness {
	l := &liveness{f: f, liveOut: map[*ForQuery]varSet{}, atRet: varSet{}}
	for _, p := range f.OutParams() {
		l.atRet[p] = true
	}
	return l
}

// function returns the variables live at the function's entry.
func (l *liveness) function() varSet { return l.list(l.f.Body, l.atRet.clone()) }

func (l *liveness) list(stmts []Stmt, out varSet) varSet {
	live := out
	for i := len(stmts) - 1; i >= 0; i-- {
		live = l.stmt(stmts[i], live)
	}
	return live
}

func (l *liveness) target(label string) *loopCtx {
	for i := len(l.loops) - 1; i >= 0; i-- {
		if label == "" || l.loops[i].label == label {
			return &l.loops[i]
		}
	}
	return nil
}

// loop solves head = entry ∪ live(body, head) to a fixpoint; entry is what
// is live when the loop ends (out) plus its header's uses.
func (l *liveness) loop(label string, body []Stmt, out varSet, header func(varSet) varSet) varSet {
	head := header(out.clone())
	for {
		l.loops = append(l.loops, loopCtx{label: label, exit: out, head: head})
		in := l.list(body, head.clone())
		l.loops = l.loops[:len(l.loops)-1]
		next := header(out.clone().addAll(in))
		if next.equal(head) {
			return head
		}
		head = next
	}
}

func (l *liveness) stmt(s Stmt, out varSet) varSet {
	switch s := s.(type) {
	case *Assign:
		in := out.clone()
		if s.Field == "" {
			delete(in, s.Target)
		} else {
			in[s.Target] = true
		}
		return in.addUses(s.Value)
	case *If:
		in := l.list(s.Then, out.clone())
		for _, e := range s.Elifs {
			in.addAll(l.list(e.Body, out.clone())).addUses(e.Cond)
		}
		in.addAll(l.list(s.Else, out.clone()))
		return in.addUses(s.Cond)
	case *Block:
		return l.list(s.Body, out)
	case *Return:
		return l.atRet.clone().addUses(s.Expr)
	case *Exit:
		in := varSet{}
		if t := l.target(s.Label); t != nil {
			if s.Continue {
				in.addAll(t.head)
			} else {
				in.addAll(t.exit)
			}
		}
		if s.Cond != nil {
			in.addAll(out).addUses(s.Cond)
		}
		return in
	case *SelectInto:
		in := out.clone()
		for _, t := range s.Targets {
			delete(in, t)
		}
		return in.addUses(s.Query)
	case *AggCall:
		in := out.clone()
		for _, d := range s.Defs {
			delete(in, d)
		}
		for _, r := range s.Uses {
			in[r.Var] = true
		}
		return in
	case *ForQuery:
		l.liveOut[s] = out.clone()
		// The record is assigned by every iteration; what is live at the
		// head comes from the body and from after the loop.
		return l.loop(s.Label, s.Body, out, func(h varSet) varSet {
			delete(h, s.Rec)
			return h.addUses(s.Query.Expr)
		})
	case *ForInt:
		return l.loop(s.Label, s.Body, out, func(h varSet) varSet {
			delete(h, s.Var)
			return h.addUses(s.Lower).addUses(s.Upper).addUses(s.Step)
		})
	case *While:
		return l.loop(s.Label, s.Body, out, func(h varSet) varSet { return h.addUses(s.Cond) })
	case *Opaque:
		return out
	}
	return out
}

// assigned returns the variables a statement list assigns, anywhere inside.
func assigned(stmts []Stmt, into varSet) varSet {
	for _, s := range stmts {
		switch s := s.(type) {
		case *Assign:
			into[s.Target] = true
		case *If:
			assigned(s.Then, into)
			for _, e := range s.Elifs {
				assigned(e.Body, into)
			}
			assigned(s.Else, into)
		case *Block:
			assigned(s.Body, into)
		case *SelectInto:
			for _, t := range s.Targets {
				into[t] = true
			}
		case *AggCall:
			for _, d := range s.Defs {
				into[d] = true
			}
		case *ForQuery:
			into[s.Rec] = true
			assigned(s.Body, into)
		case *ForInt:
			assigned(s.Body, into)
		case *While:
			assigned(s.Body, into)
		}
	}
	return into
}

// fetched returns the record fields of rec read in stmts, in first-use order.
func fetched(stmts []Stmt, rec *Var) []string {
	var out []string
	seen := map[string]bool{}
	add := func(e *Expr) {
		if e == nil {
			return
		}
		for _, r := range e.Uses {
			if r.Var == rec && r.Field != "" && !seen[r.Field] {
				seen[r.Field] = true
				out = append(out, r.Field)
			}
		}
	}
	var visit func([]Stmt)
	visit = func(stmts []Stmt) {
		for _, s := range stmts {
			switch s := s.(type) {
			case *Assign:
				add(s.Value)
			case *If:
				add(s.Cond)
				visit(s.Then)
				for _, e := range s.Elifs {
					add(e.Cond)
					visit(e.Body)
				}
				visit(s.Else)
			case *Block:
				visit(s.Body)
			case *Return:
				add(s.Expr)
			case *Exit:
				add(s.Cond)
			case *SelectInto:
				add(s.Query)
			case *AggCall:
				for _, r := range s.Uses {
					if r.Var == rec && r.Field != "" && !seen[r.Field] {
						seen[r.Field] = true
						out = append(out, r.Field)
					}
				}
			case *ForInt:
				add(s.Lower)
				add(s.Upper)
				add(s.Step)
				visit(s.Body)
			case *While:
				add(s.Cond)
				visit(s.Body)
			}
		}
	}
	visit(stmts)
	return out
}

// LoopAnalysis is the result of the paper's dataflow analysis for one cursor
// loop (Section 5, Algorithm 1), after EXIT/CONTINUE/RETURN inside it have
// been replaced by guard flags.
type LoopAnalysis struct {
	Line   int
	Record string
	// Fetch are the record fields the body reads (V_fetch): the row's
	// columns, passed to the transition function as the record argument.
	Fetch []string
	// State are the aggregate state's fields (V_F): variables assigned in
	// the loop that are live at its head or after it.
	State []string
	// Init are the state fields initialised from their pre-loop values on
	// the first row (V_init: reaching definitions outside the loop); in this
	// rewrite every state field is one.
	Init []string
	// Params are loop-invariant variables the body reads (reaching
	// definition outside, never assigned inside): extra aggregate arguments.
	Params []string
	// Locals are variables assigned in the loop before every use and dead
	// after it (V_local): locals of the transition function.
	Locals []string
	// Results are the state fields live after the loop (V_term).
	Results []string
	// OrderBy is the aggregate's ORDER BY (empty: order-insensitive).
	OrderBy []string
	// EarlyExit is set when the loop held EXIT or RETURN: a done flag in
	// the state makes the aggregate ignore later rows.
	EarlyExit bool

	state, init, params, locals, results []*Var
	fn                                   *Func
	loop                                 *ForQuery // after jump elimination; inner loops are AggCalls
	done                                 *Var
	aggregate                            string // the CREATE AGGREGATE name
}

// analyzeLoop runs the analysis on loop L of f; liveOut is what is live
// after L in the whole function.
func analyzeLoop(f *Func, L *ForQuery, liveOut varSet, early bool) (*LoopAnalysis, error) {
	lv := newLiveness(f)
	// Upward-exposed uses in the body: X = live(body, X) from ∅, with the
	// loop's own EXITs already eliminated.
	ue := varSet{}
	for {
		lv.loops = append(lv.loops[:0], loopCtx{label: L.Label, exit: varSet{}, head: ue})
		next := lv.list(L.Body, ue.clone())
		delete(next, L.Rec)
		if next.equal(ue) {
			break
		}
		ue = next
	}
	asg := assigned(L.Body, varSet{})
	delete(asg, L.Rec)
	a := &LoopAnalysis{Line: L.Line, Record: L.Rec.Name, Fetch: fetched(L.Body, L.Rec), OrderBy: L.Query.OrderBy, EarlyExit: early, fn: f, loop: L}
	for v := range asg {
		if v.Kind == Implicit {
			continue
		}
		switch {
		case ue[v] || liveOut[v]:
			a.state = append(a.state, v)
			if liveOut[v] {
				a.results = append(a.results, v)
			}
		default:
			a.locals = append(a.locals, v)
		}
	}
	for v := range ue {
		if !asg[v] && v.Kind != Implicit {
			a.params = append(a.params, v)
		}
	}
	for _, l := range [][]*Var{a.state, a.results, a.params, a.locals} {
		sort.Slice(l, func(i, j int) bool { return l[i].Name < l[j].Name })
	}
	a.init = a.state
	names := func(vs []*Var) []string {
		out := []string{}
		for _, v := range vs {
			out = append(out, v.Name)
		}
		return out
	}
	a.State, a.Init, a.Params, a.Locals, a.Results = names(a.state), names(a.init), names(a.params), names(a.locals), names(a.results)
	for _, v := range append(append([]*Var{}, a.state...), a.params...) {
		if v.Kind == Found {
			return nil, &Error{Func: f.Name, Line: L.Line, Construct: "FOUND", Reason: "FOUND is read inside the loop; its value there depends on statements the aggregate does not run"}
		}
		if v.Kind == Record {
			return nil, &Error{Func: f.Name, Line: L.Line, Construct: "record " + v.Name, Reason: "a record variable other than the loop's own is carried across iterations"}
		}
	}
	return a, nil
}
