package template

import (
	"cmp"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"
)

// A change to one service of a thousand re-renders that service, not the
// catalog: the body of a `range services` whose output can depend only on
// the item, its index and the `service` answers it reads is cut out of the
// template at Parse (a fragment), and each item's output is kept from one
// render to the next with what it read. A render executes the body again
// for an item only when the item or one of those answers changed, and a
// range without an else is one call that puts the items' outputs
// together, so that a kept item costs a lookup, not a step of
// text/template's walk.

// fragmentFunc replaces a fragment's body in the template, and
// fragmentsFunc a whole range over one (wholeRange). Parse never sees
// them, so a template cannot call them.
const (
	fragmentFunc  = "seamlessFragment"
	fragmentsFunc = "seamlessFragments"
)

// fragment is a cut-out body, executed as a template of its own: the body
// under a range with the same variables over a one-entry map, so that
// `.`, `$i` and `$s` are what they were. Its nodes keep their original
// tree and positions, and the template its original name, so an error
// reads as it would have without the cut.
type fragment struct {
	id        string
	tree      *parse.Tree
	funcs     []string // the functions the body calls (text/template's builtins need none)
	readIndex bool     // the body reads the range's index
}

// fragmentFuncs are those a fragment may call: functions of their
// arguments, and `service`, whose answer is checked before the output is
// reused. Every other read of the state, a file or the environment, and
// anything with an effect beyond its output but `skip` (replayed), keeps
// the body in the template.
var fragmentFuncs = func() map[string]bool {
	m := map[string]bool{}
	for name := range readOnlyFuncs {
		m[name] = true
	}
	for _, name := range []string{
		"datacenters", "key", "keyExists", "keyOrDefault", "ls", "safeLs", "tree", "safeTree",
		"node", "nodes", "services", "file", "env", "mustEnv", "envOrDefault", "executeTemplate",
	} {
		delete(m, name)
	}
	return m
}()

// fragmentKey names an item's output: the fragment and the service.
type fragmentKey struct {
	id, name string
}

// fragmentOut is an item's output and what it was made from.
type fragmentOut struct {
	gen     uint64 // the last render that read it
	index   int
	tags    ServiceTags
	out     string
	deps    []serviceDep
	skipped []string
}

// serviceDep is one `service` call of a fragment: its argument, parsed,
// and the runs it read. Runs are kept across renders while their lists
// are, so the same runs mean the same instances.
type serviceDep struct {
	q    serviceQuery
	runs []*run
}

// fragmentRecord collects what a fragment's execution read.
type fragmentRecord struct {
	deps       []serviceDep
	skipped    []string // by skip; a catalog's own reports come with its view, once per render
	incomplete bool     // it asked for something the state has no answer for
}

// fragmentError carries a fragment's execution error through the call
// that replaced the body; Render returns the error itself.
type fragmentError struct{ err error }

func (e *fragmentError) Error() string { return e.err.Error() }
func (e *fragmentError) Unwrap() error { return e.err }

// unfragment is err with the call of a fragment it went through taken
// out: the error of the body itself, as it would have failed in place.
// Each execution (Render, executeTemplate) takes out its own.
func unfragment(err error) error {
	if fe := (*fragmentError)(nil); errors.As(err, &fe) {
		return fe.err
	}
	return err
}

// cutFragments replaces the body of every range over `services` that can
// be a fragment (see cuttable), outside of another such body.
func (t *Template) cutFragments(tmpl *template.Template) {
	trees := tmpl.Templates()
	slices.SortFunc(trees, func(a, b *template.Template) int { return cmp.Compare(a.Name(), b.Name()) })
	for _, tt := range trees {
		if tt.Tree != nil && tt.Tree.Root != nil {
			t.cutIn(tt.Tree, tt.Tree.Root)
		}
	}
}

func (t *Template) cutIn(tree *parse.Tree, l *parse.ListNode) {
	if l == nil {
		return
	}
	for i, n := range l.Nodes {
		switch n := n.(type) {
		case *parse.IfNode:
			t.cutIn(tree, n.List)
			t.cutIn(tree, n.ElseList)
		case *parse.WithNode:
			t.cutIn(tree, n.List)
			t.cutIn(tree, n.ElseList)
		case *parse.RangeNode:
			if c, ok := cuttable(n); ok {
				id := t.cut(tree, n, c)
				if n.ElseList == nil {
					l.Nodes[i] = wholeRange(tree, n, id)
				}
			} else {
				t.cutIn(tree, n.List)
			}
			t.cutIn(tree, n.ElseList)
		}
	}
}

// cuttable reports whether rn ranges over `services` with a body whose
// output is a function of the item, its index and `service` answers: it
// calls only fragmentFuncs, reads and writes no variable but the range's
// own and those it declares itself (not `$`, the data of whoever executes
// the tree), executes no other template and breaks out of no loop but its
// own.
func cuttable(rn *parse.RangeNode) (*bodyCheck, bool) {
	p := rn.Pipe
	if p == nil || p.IsAssign || len(p.Cmds) != 1 || len(p.Cmds[0].Args) == 0 {
		return nil, false
	}
	if id, ok := p.Cmds[0].Args[0].(*parse.IdentifierNode); !ok || id.Ident != "services" {
		return nil, false
	}
	c := &bodyCheck{ok: true, funcs: map[string]bool{}}
	for _, v := range p.Decl {
		c.scope = append(c.scope, v.Ident[0])
	}
	if len(p.Decl) == 2 {
		c.index = p.Decl[0].Ident[0]
	}
	c.list(rn.List, 0)
	return c, c.ok
}

// bodyCheck walks a candidate body in the order text/template executes
// it, with the variables in scope as it keeps them: a declaration is
// pushed once its pipeline ran and popped at the end of the if, with or
// range it is in. A variable not found in scope is the caller's.
type bodyCheck struct {
	ok        bool
	funcs     map[string]bool // the functions the body calls
	scope     []string        // the range's own variables, then the body's, innermost last
	index     string          // the range's index variable, "" without one
	readIndex bool            // the body reads it: an item's output depends on its place
}

func (c *bodyCheck) list(l *parse.ListNode, loops int) {
	if l == nil {
		return
	}
	for _, n := range l.Nodes {
		c.node(n, loops)
	}
}

func (c *bodyCheck) node(n parse.Node, loops int) {
	switch n := n.(type) {
	case *parse.ActionNode:
		c.pipe(n.Pipe)
	case *parse.IfNode:
		c.branch(&n.BranchNode, loops, loops)
	case *parse.WithNode:
		c.branch(&n.BranchNode, loops, loops)
	case *parse.RangeNode:
		c.branch(&n.BranchNode, loops+1, loops)
	case *parse.BreakNode, *parse.ContinueNode:
		if loops == 0 {
			c.ok = false
		}
	case *parse.TextNode, *parse.CommentNode:
	default:
		c.ok = false // another template, or a node this check does not know
	}
}

// branch walks an if, with or range: the pipeline, then each list from
// the scope the pipeline left, then back to the scope before it.
func (c *bodyCheck) branch(b *parse.BranchNode, listLoops, elseLoops int) {
	mark := len(c.scope)
	c.pipe(b.Pipe)
	after := len(c.scope)
	c.list(b.List, listLoops)
	c.scope = c.scope[:after]
	c.list(b.ElseList, elseLoops)
	c.scope = c.scope[:mark]
}

func (c *bodyCheck) pipe(p *parse.PipeNode) {
	if p == nil {
		return
	}
	for _, cmd := range p.Cmds {
		for _, a := range cmd.Args {
			c.arg(a)
		}
	}
	for _, v := range p.Decl {
		if p.IsAssign {
			c.variable(v.Ident[0])
		} else {
			c.scope = append(c.scope, v.Ident[0])
		}
	}
}

func (c *bodyCheck) arg(n parse.Node) {
	switch n := n.(type) {
	case *parse.IdentifierNode:
		if !fragmentFuncs[n.Ident] {
			c.ok = false
		}
		c.funcs[n.Ident] = true
	case *parse.VariableNode:
		c.variable(n.Ident[0])
	case *parse.PipeNode:
		c.pipe(n) // its declarations stay in scope, as when executed
	case *parse.ChainNode:
		c.arg(n.Node)
	}
}

// variable checks a read or an assignment of name: it must be the body's
// or the range's own.
func (c *bodyCheck) variable(name string) {
	for i := len(c.scope) - 1; i >= 0; i-- {
		if c.scope[i] == name {
			if i == 0 && name == c.index {
				c.readIndex = true
			}
			return
		}
	}
	c.ok = false
}

// cut makes rn's body a fragment and puts a call of it in its place:
// {{seamlessFragment "id" . [$index]}}, the index only when the body
// reads it (otherwise a service added first would change every item's).
func (t *Template) cut(tree *parse.Tree, rn *parse.RangeNode, c *bodyCheck) string {
	id := strconv.Itoa(len(t.frags))
	pos := rn.Pipe.Pos
	ft := new(parse.Tree)
	*ft = *tree // the source text, which error positions are counted in
	ft.Root = &parse.ListNode{NodeType: parse.NodeList, Pos: pos, Nodes: []parse.Node{
		&parse.RangeNode{BranchNode: parse.BranchNode{
			NodeType: parse.NodeRange, Pos: rn.Pos, Line: rn.Line,
			Pipe: &parse.PipeNode{NodeType: parse.NodePipe, Pos: pos, Line: rn.Line, Decl: rn.Pipe.Decl, Cmds: []*parse.CommandNode{{
				NodeType: parse.NodeCommand, Pos: pos,
				Args: []parse.Node{&parse.VariableNode{NodeType: parse.NodeVariable, Pos: pos, Ident: []string{"$"}}},
			}}},
			List: rn.List,
		}},
	}}
	args := []parse.Node{
		parse.NewIdentifier(fragmentFunc).SetTree(tree).SetPos(pos),
		&parse.StringNode{NodeType: parse.NodeString, Pos: pos, Quoted: strconv.Quote(id), Text: id},
		&parse.DotNode{NodeType: parse.NodeDot, Pos: pos},
	}
	if c.readIndex {
		args = append(args, &parse.VariableNode{NodeType: parse.NodeVariable, Pos: pos, Ident: []string{rn.Pipe.Decl[0].Ident[0]}})
	}
	rn.List = &parse.ListNode{NodeType: parse.NodeList, Pos: pos, Nodes: []parse.Node{
		&parse.ActionNode{NodeType: parse.NodeAction, Pos: pos, Line: rn.Line, Pipe: &parse.PipeNode{
			NodeType: parse.NodePipe, Pos: pos, Line: rn.Line,
			Cmds: []*parse.CommandNode{{NodeType: parse.NodeCommand, Pos: pos, Args: args}},
		}},
	}}
	if t.frags == nil {
		t.frags = map[string]*fragment{}
	}
	t.frags[id] = &fragment{id: id, tree: ft, funcs: slices.Sorted(maps.Keys(c.funcs)), readIndex: c.readIndex}
	return id
}

// wholeRange is what replaces rn, whose body is fragment id, when it has
// no else: {{seamlessFragments "id" (services ...)}}, one call that
// renders every item in turn. text/template's own walk of the range made
// a reflected call per item, 80 % of a render of one change at 1,000
// services, where all but one item's output was kept.
func wholeRange(tree *parse.Tree, rn *parse.RangeNode, id string) parse.Node {
	pos := rn.Pipe.Pos
	list := &parse.PipeNode{NodeType: parse.NodePipe, Pos: pos, Line: rn.Line, Cmds: rn.Pipe.Cmds}
	return &parse.ActionNode{NodeType: parse.NodeAction, Pos: pos, Line: rn.Line, Pipe: &parse.PipeNode{
		NodeType: parse.NodePipe, Pos: pos, Line: rn.Line,
		Cmds: []*parse.CommandNode{{NodeType: parse.NodeCommand, Pos: pos, Args: []parse.Node{
			parse.NewIdentifier(fragmentsFunc).SetTree(tree).SetPos(pos),
			&parse.StringNode{NodeType: parse.NodeString, Pos: pos, Quoted: strconv.Quote(id), Text: id},
			list,
		}}},
	}}
}

// fragments renders fragment id for every item, in order, as the range it
// replaces would. The call is an action of its own, printed where it
// stands, so it writes each item's output straight to the output of the
// execution running and returns nothing: returned as one string, the
// section was joined, then copied whole again by fmt's print.
func (r *render) fragments(id string, items []*CatalogSnippet) (string, error) {
	readIndex := r.t.frags[id].readIndex
	for i, item := range items {
		if !readIndex {
			i = 0 // as fragment without an index: the item's output is its own
		}
		o, err := r.fragment(id, item, i)
		if err != nil {
			return "", err
		}
		if _, err := r.out.WriteString(o); err != nil {
			return "", err
		}
	}
	return "", nil
}

// fragment renders item's output of fragment id: the output the previous
// render kept when the item and every `service` answer it read are the
// same, else a new execution.
func (r *render) fragment(id string, item *CatalogSnippet, index ...int) (string, error) {
	i := 0
	if len(index) > 0 {
		i = index[0]
	}
	k := fragmentKey{id: id, name: item.Name}
	if o, ok := r.frags.m[k]; ok && o.index == i && slices.Equal(o.tags, item.Tags) && r.holds(o.deps) {
		r.skipped = append(r.skipped, o.skipped...)
		r.frags.keep(k, o)
		return o.out, nil
	}
	r.t.fragmentRuns.Add(1)
	f := r.t.frags[id]
	rec := &fragmentRecord{}
	prev := r.rec
	r.rec = rec
	var b strings.Builder
	err := r.execute(&b, func() error { return r.fragmentTemplate(f).Execute(&b, map[int]*CatalogSnippet{i: item}) })
	r.rec = prev
	if err != nil {
		return "", &fragmentError{err}
	}
	if !rec.incomplete {
		r.frags.keep(k, &fragmentOut{index: i, tags: item.Tags, out: b.String(), deps: rec.deps, skipped: rec.skipped})
	}
	return b.String(), nil
}

// keptOutputs are the fragments' outputs kept from render to render.
// Each render marks what it reads and forgets the rest at its end, in
// place: making a new map at every render cost an insert per service.
type keptOutputs struct {
	m    map[fragmentKey]*fragmentOut
	gen  uint64 // the render's, which marks what it reads
	live int    // outputs marked gen
}

// begin starts a render's marking.
func (ko *keptOutputs) begin() {
	ko.gen++
	ko.live = 0
}

// keep marks o, item k's output, as read by this render.
func (ko *keptOutputs) keep(k fragmentKey, o *fragmentOut) {
	if old := ko.m[k]; old == nil || old.gen != ko.gen {
		ko.live++
	}
	o.gen = ko.gen
	if ko.m == nil {
		ko.m = map[fragmentKey]*fragmentOut{}
	}
	ko.m[k] = o
}

// end forgets what the render did not read.
func (ko *keptOutputs) end() {
	if ko.live < len(ko.m) {
		maps.DeleteFunc(ko.m, func(_ fragmentKey, o *fragmentOut) bool { return o.gen != ko.gen })
	}
}

// holds reports whether every `service` call of deps would read the same
// runs now, recording the queries they ask as the calls would.
func (r *render) holds(deps []serviceDep) bool {
	for _, d := range deps {
		if w := r.t.opts.Watched; w != nil && !w(d.q.name) {
			return false
		}
		v, ok := r.catalog(d.q.dc)
		if !ok || !v.sameRuns(d.q.name, d.runs) {
			return false
		}
	}
	return true
}

// fragmentTemplate is f's template for this render, with the functions
// the body calls bound to it.
func (r *render) fragmentTemplate(f *fragment) *template.Template {
	if tm, ok := r.fragTmpls[f.id]; ok {
		return tm
	}
	fm := template.FuncMap{}
	for _, name := range f.funcs {
		if fn, ok := r.funcs[name]; ok {
			fm[name] = fn
		} else if fn, ok := staticFuncs()[name]; ok {
			fm[name] = fn
		}
	}
	tm := template.New(f.tree.Name).Option(r.t.missingKey()).Funcs(fm)
	tm, _ = tm.AddParseTree(f.tree.Name, f.tree) // a new template has nothing to clash with
	if r.fragTmpls == nil {
		r.fragTmpls = map[string]*template.Template{}
	}
	r.fragTmpls[f.id] = tm
	return tm
}
