package template

import (
	"cmp"
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
// for an item only when the item or one of those answers changed.

// fragmentFunc replaces a fragment's body in the template. Parse never
// sees it, so a template cannot call it.
const fragmentFunc = "seamlessFragment"

// fragment is a cut-out body, executed as a template of its own: the body
// under a range with the same variables over a one-entry map, so that
// `.`, `$i` and `$s` are what they were. Its nodes keep their original
// tree and positions, and the template its original name, so an error
// reads as it would have without the cut.
type fragment struct {
	id    string
	tree  *parse.Tree
	funcs []string // the functions the body calls (text/template's builtins need none)
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
	index   int
	tags    ServiceTags
	out     string
	deps    []serviceDep
	skipped []string
}

// serviceDep is one `service` call of a fragment: its argument and the
// runs it read. Runs are kept across renders while their lists are, so
// the same runs mean the same instances.
type serviceDep struct {
	spec string
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

// cutFragments replaces the body of every range over `services` that can
// be a fragment (see cuttable), outside of another such body.
func (t *Template) cutFragments(tmpl *template.Template) {
	trees := tmpl.Templates()
	slices.SortFunc(trees, func(a, b *template.Template) int { return cmp.Compare(a.Name(), b.Name()) })
	for _, tt := range trees {
		if tt.Tree == nil || tt.Tree.Root == nil {
			continue
		}
		decls := map[string]int{}
		countDecls(tt.Tree.Root, decls)
		t.cutIn(tt.Tree, tt.Tree.Root, decls)
	}
}

func (t *Template) cutIn(tree *parse.Tree, l *parse.ListNode, decls map[string]int) {
	if l == nil {
		return
	}
	for _, n := range l.Nodes {
		switch n := n.(type) {
		case *parse.IfNode:
			t.cutIn(tree, n.List, decls)
			t.cutIn(tree, n.ElseList, decls)
		case *parse.WithNode:
			t.cutIn(tree, n.List, decls)
			t.cutIn(tree, n.ElseList, decls)
		case *parse.RangeNode:
			if funcs, ok := cuttable(n, decls); ok {
				t.cut(tree, n, funcs)
			} else {
				t.cutIn(tree, n.List, decls)
			}
			t.cutIn(tree, n.ElseList, decls)
		}
	}
}

// cuttable reports whether rn ranges over `services` with a body whose
// output is a function of the item, its index and `service` answers: it
// calls only fragmentFuncs, reads no variable declared outside it but the
// range's own (nor `$`, the data of whoever executes the tree), writes
// none, executes no other template and breaks out of no loop but its own.
// decls counts the declarations of each variable name in the whole tree.
func cuttable(rn *parse.RangeNode, decls map[string]int) ([]string, bool) {
	p := rn.Pipe
	if p == nil || p.IsAssign || len(p.Cmds) != 1 || len(p.Cmds[0].Args) == 0 {
		return nil, false
	}
	if id, ok := p.Cmds[0].Args[0].(*parse.IdentifierNode); !ok || id.Ident != "services" {
		return nil, false
	}
	own := map[string]bool{}
	for _, v := range p.Decl {
		own[v.Ident[0]] = true
	}
	inBody := map[string]int{}
	countDecls(rn.List, inBody)
	c := &bodyCheck{ok: true, funcs: map[string]bool{}}
	c.list(rn.List, 0)
	for name := range c.vars {
		if own[name] {
			continue
		}
		if name == "$" || inBody[name] == 0 || inBody[name] != decls[name] {
			return nil, false
		}
	}
	if !c.ok {
		return nil, false
	}
	return slicesSorted(c.funcs), true
}

func slicesSorted(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// bodyCheck walks a candidate body.
type bodyCheck struct {
	ok    bool
	funcs map[string]bool
	vars  map[string]bool // every variable name read or assigned
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
		c.pipe(n.Pipe)
		c.list(n.List, loops)
		c.list(n.ElseList, loops)
	case *parse.WithNode:
		c.pipe(n.Pipe)
		c.list(n.List, loops)
		c.list(n.ElseList, loops)
	case *parse.RangeNode:
		c.pipe(n.Pipe)
		c.list(n.List, loops+1)
		c.list(n.ElseList, loops)
	case *parse.BreakNode, *parse.ContinueNode:
		if loops == 0 {
			c.ok = false
		}
	case *parse.TemplateNode:
		c.ok = false
	case *parse.TextNode, *parse.CommentNode:
	default:
		c.ok = false // a node this check does not know
	}
}

func (c *bodyCheck) pipe(p *parse.PipeNode) {
	if p == nil {
		return
	}
	if p.IsAssign {
		for _, v := range p.Decl {
			c.variable(v.Ident[0])
		}
	}
	for _, cmd := range p.Cmds {
		for _, a := range cmd.Args {
			c.arg(a)
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
		c.pipe(n)
	case *parse.ChainNode:
		c.arg(n.Node)
	}
}

func (c *bodyCheck) variable(name string) {
	if c.vars == nil {
		c.vars = map[string]bool{}
	}
	c.vars[name] = true
}

// countDecls counts the declarations (not assignments) of each variable
// name under l.
func countDecls(l *parse.ListNode, out map[string]int) {
	if l == nil {
		return
	}
	pipe := func(p *parse.PipeNode) {
		if p == nil || p.IsAssign {
			return
		}
		for _, v := range p.Decl {
			out[v.Ident[0]]++
		}
	}
	var args func(p *parse.PipeNode)
	args = func(p *parse.PipeNode) {
		if p == nil {
			return
		}
		pipe(p)
		for _, cmd := range p.Cmds {
			for _, a := range cmd.Args {
				if sub, ok := a.(*parse.PipeNode); ok {
					args(sub)
				}
			}
		}
	}
	for _, n := range l.Nodes {
		switch n := n.(type) {
		case *parse.ActionNode:
			args(n.Pipe)
		case *parse.IfNode:
			args(n.Pipe)
			countDecls(n.List, out)
			countDecls(n.ElseList, out)
		case *parse.WithNode:
			args(n.Pipe)
			countDecls(n.List, out)
			countDecls(n.ElseList, out)
		case *parse.RangeNode:
			args(n.Pipe)
			countDecls(n.List, out)
			countDecls(n.ElseList, out)
		case *parse.TemplateNode:
			args(n.Pipe)
		}
	}
}

// cut makes rn's body a fragment and puts a call of it in its place:
// {{seamlessFragment "id" . [$index]}}.
func (t *Template) cut(tree *parse.Tree, rn *parse.RangeNode, funcs []string) {
	id := strconv.Itoa(len(t.frags))
	pos := rn.Pipe.Pos
	ft := tree.Copy() // keeps the source text, which error positions are counted in
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
	if len(rn.Pipe.Decl) == 2 {
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
	t.frags[id] = &fragment{id: id, tree: ft, funcs: funcs}
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
	for _, kept := range [...]map[fragmentKey]*fragmentOut{r.used.frags, r.cached.frags} {
		if o, ok := kept[k]; ok && o.index == i && slices.Equal(o.tags, item.Tags) && r.holds(o.deps) {
			r.skipped = append(r.skipped, o.skipped...)
			r.keep(k, o)
			return o.out, nil
		}
	}
	r.t.fragmentRuns.Add(1)
	f := r.t.frags[id]
	rec := &fragmentRecord{}
	prev := r.rec
	r.rec = rec
	var b strings.Builder
	err := r.fragmentTemplate(f).Execute(&b, map[int]*CatalogSnippet{i: item})
	r.rec = prev
	if err != nil {
		return "", &fragmentError{err}
	}
	if !rec.incomplete {
		r.keep(k, &fragmentOut{index: i, tags: item.Tags, out: b.String(), deps: rec.deps, skipped: rec.skipped})
	}
	return b.String(), nil
}

func (r *render) keep(k fragmentKey, o *fragmentOut) {
	if r.used.frags == nil {
		r.used.frags = make(map[fragmentKey]*fragmentOut, len(r.cached.frags))
	}
	r.used.frags[k] = o
}

// holds reports whether every `service` call of deps would read the same
// runs now, recording the queries they ask as the calls would.
func (r *render) holds(deps []serviceDep) bool {
	for _, d := range deps {
		q, err := r.serviceQuery(d.spec)
		if err != nil {
			return false
		}
		if w := r.t.opts.Watched; w != nil && !w(q.name) {
			return false
		}
		v, ok := r.catalog(q.dc)
		if !ok || !slices.Equal(v.byName[q.name], d.runs) {
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
