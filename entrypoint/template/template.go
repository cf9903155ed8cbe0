package template

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"text/template/parse"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// ErrUnsupported is wrapped by every *UnsupportedError.
var ErrUnsupported = errors.New("not supported by seamless")

// UnsupportedError is a template that calls a consul-template function
// seamless does not provide. Parse returns it, so such a template never
// renders, not even partly.
type UnsupportedError struct {
	File   string
	Line   int
	Col    int
	Func   string
	Reason string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("%s:%d:%d: function %q is not supported by seamless: %s", e.File, e.Line, e.Col, e.Func, e.Reason)
}

func (e *UnsupportedError) Unwrap() error { return ErrUnsupported }

// ArgError is a literal argument that can never work (`service "web|bogus"`),
// found at Parse. The same mistake in a computed argument is a render error,
// which names the file and line too.
type ArgError struct {
	File string
	Line int
	Col  int
	Func string
	Err  error
}

func (e *ArgError) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s: %v", e.File, e.Line, e.Col, e.Func, e.Err)
}

func (e *ArgError) Unwrap() error { return e.Err }

// Options configure a Template. The zero value works.
type Options struct {
	// DefaultHealth is the health filter of a `service` call that names
	// none (SEAMLESS_CONSUL_HEALTH); empty means passing, as in
	// consul-template.
	DefaultHealth []string
	// LookupEnv backs env, mustEnv, envOrDefault, sprig_env and
	// sprig_expandenv; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Dir is where `file` resolves relative paths; empty means the working
	// directory at Parse (consul-template resolves them against its own).
	Dir string
	// NodeName is the node `node` describes when called without a name.
	// consul-template asks its Consul agent; seamless may run without one,
	// so it uses this name, by default the hostname, which is also the
	// name a Consul agent on this host registers by default.
	NodeName string
	// Now is what timestamp and sprig_now return; zero means the time of
	// Parse. A clock read at every render would make every rendering
	// differ and reload HAProxy for nothing.
	Now time.Time
	// LeftDelim and RightDelim replace "{{" and "}}" (consul-template's
	// left_delimiter and right_delimiter).
	LeftDelim, RightDelim string
	// ErrOnMissingKey makes indexing a map with a missing key an error
	// instead of the zero value (consul-template's error_on_missing_key).
	ErrOnMissingKey bool
	// RawMeta passes meta values with control characters (a multi-line
	// certificate) to the template unchanged (SEAMLESS_TEMPLATE_RAW_META);
	// by default such a key is left out. Only the operator sets it: no
	// catalog data reaches it.
	RawMeta bool
	// Watched, when set, is the services a Consul source watches
	// (SEAMLESS_CONSUL_SERVICES): `service` refuses any other name, since
	// its instances would be missing, not absent. nil: every service.
	Watched func(name string) bool
	// Log receives warnings about the output (an unrendered pair of
	// delimiters); nil discards them.
	Log *slog.Logger

	uncut bool // keep every body in the template: the reference the tests compare fragments with
}

// Template is a parsed user template; it implements model.Renderer.
// Render may be called from several goroutines; besides the parsed
// template (and one clone of it, bound to one render at a time), a
// Template keeps only its latest complete rendering (for Origin), the
// warnings it has logged and the catalog's lists as the latest render
// converted them (a function of the lists alone), so the output stays a
// function of the State.
type Template struct {
	path   string
	opts   Options
	health []string
	// base is the parsed template; a render executes a clone of it whose
	// functions call that render: bound's, or one of its own when another
	// render holds bound.
	base  *template.Template
	bound *boundTemplate
	// warned holds the output warnings already logged (warnUnrendered).
	warned *sync.Map
	// text is the template's source and last its latest complete
	// rendering, for Origin.
	text string
	last *lastRender
	runs *runCache
	// readOnly: the template calls no function that can write into its
	// arguments (readOnlyFuncs), so `service` hands it the instances the
	// render keeps instead of copies of their own (a third of a render's
	// time at 1000 × 10, most of its garbage).
	readOnly bool
	// frags are the bodies cut out of the template (cutFragments), by id;
	// fragmentRuns counts their executions.
	frags        map[string]*fragment
	fragmentRuns atomic.Int64
}

var _ model.Renderer = (*Template)(nil)

// Parse reads and parses the template at path. Besides Go template syntax
// errors, it refuses a template that calls a function seamless does not
// support (an *UnsupportedError) and literal arguments that can never work
// (an *ArgError); both name the file, line and column.
func Parse(path string, opts Options) (*Template, error) {
	b, err := readRegular(path)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	return parseText(path, string(b), opts)
}

func parseText(path, text string, opts Options) (*Template, error) {
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.Dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
		opts.Dir = wd
	}
	if opts.NodeName == "" {
		opts.NodeName, _ = os.Hostname()
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	opts.Now = opts.Now.UTC()
	health, err := parseFilter(strings.Join(opts.DefaultHealth, ","))
	if err != nil {
		return nil, fmt.Errorf("template: default health filter: %w", err)
	}
	t := &Template{path: path, opts: opts, health: health, warned: &sync.Map{}, text: text, last: &lastRender{}, runs: &runCache{},
		bound: &boundTemplate{}}
	base := template.New(path).Delims(opts.LeftDelim, opts.RightDelim).Option(t.missingKey())
	parsing := &render{t: t}
	base.Funcs(staticFuncs()).Funcs(boundFuncs(func() *render { return parsing }))
	if _, err := base.Parse(text); err != nil {
		return nil, err
	}
	if err := t.check(base); err != nil {
		return nil, err
	}
	t.base, t.readOnly = base, callsOnly(base, readOnlyFuncs)
	if !opts.uncut {
		t.cutFragments(base)
	}
	return t, nil
}

// missingKey is the text/template option for Options.ErrOnMissingKey.
func (t *Template) missingKey() string {
	if t.opts.ErrOnMissingKey {
		return "missingkey=error"
	}
	return "missingkey=zero"
}

// Path is the file the template was read from.
func (t *Template) Path() string { return t.path }

// boundTemplate is a clone of the parsed template kept for one render
// at a time, whose functions call the render that holds mu. A clone per
// render copied the template's hundred and more functions twice over (its
// two maps of them): a fifth of what a change allocated with a template at
// 100 services × 10.
type boundTemplate struct {
	mu    sync.Mutex
	tmpl  *template.Template // nil until the first render
	funcs template.FuncMap
	at    *render
}

// newTemplate binds r to the parsed template: the kept clone when no other
// render holds it, else a clone of r's own. Call release when the render
// is done with it.
func (t *Template) newTemplate(r *render) (release func(), err error) {
	b := t.bound
	if !b.mu.TryLock() {
		r.tmpl, r.funcs, err = t.clone(func() *render { return r })
		return func() {}, err
	}
	if b.tmpl == nil {
		if b.tmpl, b.funcs, err = t.clone(func() *render { return b.at }); err != nil {
			b.tmpl = nil
			b.mu.Unlock()
			return nil, err
		}
	}
	b.at, r.tmpl, r.funcs = r, b.tmpl, b.funcs
	return func() {
		b.at = nil
		b.mu.Unlock()
	}, nil
}

// clone is a copy of the parsed template whose functions call at().
func (t *Template) clone(at func() *render) (*template.Template, template.FuncMap, error) {
	tmpl, err := t.base.Clone()
	if err != nil {
		return nil, nil, err
	}
	funcs := boundFuncs(at)
	// Not known to Parse: a template cannot call it itself.
	funcs[fragmentFunc] = func(id string, item *CatalogSnippet, index ...int) (string, error) {
		return at().fragment(id, item, index...)
	}
	funcs[fragmentsFunc] = func(id string, items []*CatalogSnippet) (string, error) {
		return at().fragments(id, items)
	}
	return tmpl.Funcs(funcs), funcs, nil
}

// Render executes the template against st. It records every query the
// template asked for and those st has no answer for yet; when some are
// missing, the rendering must not be applied: Config holds what the
// template rendered from zero values, as consul-template's first pass. An
// execution error while queries are missing is not returned (Config is
// then empty): it most likely comes from the zero values, and the caller
// renders again once they are fetched, which may reveal further queries.
func (t *Template) Render(st model.State) (model.Rendering, error) {
	r := &render{
		t:       t,
		st:      st,
		queries: map[model.Query]bool{},
		missing: map[model.Query]bool{},
	}
	if t.runs.mu.TryLock() {
		r.cached, r.frags = t.runs.last, &t.runs.frags
		r.frags.begin()
		defer func() {
			t.runs.last = r.used // what this render did not read is gone
			r.frags.end()
			t.runs.mu.Unlock()
		}()
	} else {
		r.frags = &keptOutputs{}
	}
	release, err := t.newTemplate(r)
	if err != nil {
		return model.Rendering{}, err
	}
	defer release()
	// A rendering is about as long as the last one: growing the buffer
	// from nothing copied the output a dozen times.
	var buf bytes.Buffer
	if n := t.last.size(); n > 0 {
		buf.Grow(n + n/8)
	}
	execErr := r.execute(&buf, func() error { return r.tmpl.Execute(&buf, nil) })
	execErr = unfragment(execErr)
	out := model.Rendering{
		Queries: sortedQueries(r.queries),
		Missing: sortedQueries(r.missing),
		Skipped: r.skipped,
	}
	// Sorted: a body whose output is reused reports what it skipped
	// after the catalog's own reports, wherever it came when executed.
	slices.Sort(out.Skipped)
	if execErr != nil {
		if len(out.Missing) > 0 {
			return out, nil
		}
		return out, execErr
	}
	out.Config = buf.Bytes()
	if len(out.Missing) == 0 {
		t.warnUnrendered(out.Config)
		t.last.set(st, out.Config)
	}
	return out, nil
}

func sortedQueries(set map[model.Query]bool) []model.Query {
	if len(set) == 0 {
		return nil
	}
	qs := make([]model.Query, 0, len(set))
	for q := range set {
		qs = append(qs, q)
	}
	slices.SortFunc(qs, func(a, b model.Query) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Datacenter, b.Datacenter), cmp.Compare(a.Key, b.Key))
	})
	return qs
}

// check walks every parsed tree for calls of unsupported functions and for
// literal arguments that cannot parse.
func (t *Template) check(tmpl *template.Template) error {
	var errs []error
	trees := tmpl.Templates()
	slices.SortFunc(trees, func(a, b *template.Template) int { return cmp.Compare(a.Name(), b.Name()) })
	for _, tt := range trees {
		if tt.Tree == nil || tt.Tree.Root == nil {
			continue
		}
		walk(tt.Tree.Root, func(n parse.Node, first bool) {
			switch n := n.(type) {
			case *parse.IdentifierNode:
				if reason, ok := unsupported[n.Ident]; ok {
					line, col := position(tt.Tree, n)
					errs = append(errs, &UnsupportedError{File: t.path, Line: line, Col: col, Func: n.Ident, Reason: reason})
				}
			case *parse.CommandNode:
				if err := t.checkLiteralArgs(n, first); err != nil {
					line, col := position(tt.Tree, n)
					errs = append(errs, &ArgError{File: t.path, Line: line, Col: col, Func: n.Args[0].String(), Err: err})
				}
			}
		})
	}
	return errors.Join(errs...)
}

// position is the line and column of n in its file.
func position(tree *parse.Tree, n parse.Node) (line, col int) {
	loc, _ := tree.ErrorContext(n)
	// loc is "name:line:col"; the name may itself contain colons.
	i := strings.LastIndexByte(loc, ':')
	j := strings.LastIndexByte(loc[:max(i, 0)], ':')
	if i < 0 || j < 0 {
		return 0, 0
	}
	fmt.Sscan(loc[j+1:i], &line)
	fmt.Sscan(loc[i+1:], &col)
	return line, col
}

// checkLiteralArgs validates the arguments of a Consul function called
// with literal strings only, as the first command of its pipeline (a later
// one receives the previous result as its last argument).
func (t *Template) checkLiteralArgs(c *parse.CommandNode, first bool) error {
	if !first || len(c.Args) < 2 {
		return nil
	}
	id, ok := c.Args[0].(*parse.IdentifierNode)
	if !ok {
		return nil
	}
	var args []string
	for _, a := range c.Args[1:] {
		s, ok := a.(*parse.StringNode)
		if !ok {
			return nil
		}
		args = append(args, s.Text)
	}
	switch id.Ident {
	case "service":
		if args[0] == "" {
			return nil
		}
		_, err := parseServiceQuery(strings.Join(args, "|"), t.health)
		return err
	case "services":
		_, err := parseServicesQuery(strings.Join(args, ""))
		return err
	case "nodes":
		_, err := parseNodesQuery(strings.Join(args, ""))
		return err
	case "node":
		_, err := parseNodeQuery(strings.Join(args, ""))
		return err
	case "key", "keyExists", "keyOrDefault":
		if args[0] == "" {
			return nil
		}
		_, err := parseKVQuery(args[0], model.QueryKey)
		return err
	case "ls", "safeLs", "tree", "safeTree":
		if args[0] == "" {
			return nil
		}
		_, err := parseKVQuery(args[0], model.QueryPrefix)
		return err
	}
	return nil
}

// walk calls fn for every node under n; first tells, for a command, that it
// starts its pipeline.
func walk(n parse.Node, fn func(n parse.Node, first bool)) {
	if n == nil {
		return
	}
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			walk(c, fn)
		}
	case *parse.ActionNode:
		walk(n.Pipe, fn)
	case *parse.PipeNode:
		if n == nil {
			return
		}
		for i, c := range n.Cmds {
			fn(c, i == 0)
			for _, a := range c.Args {
				walk(a, fn)
			}
		}
	case *parse.IfNode:
		walkBranch(&n.BranchNode, fn)
	case *parse.RangeNode:
		walkBranch(&n.BranchNode, fn)
	case *parse.WithNode:
		walkBranch(&n.BranchNode, fn)
	case *parse.TemplateNode:
		walk(n.Pipe, fn)
	case *parse.ChainNode:
		walk(n.Node, fn)
	case *parse.IdentifierNode:
		fn(n, false)
	}
}

func walkBranch(b *parse.BranchNode, fn func(n parse.Node, first bool)) {
	walk(b.Pipe, fn)
	walk(b.List, fn)
	walk(b.ElseList, fn)
}

// resolve makes a `file` path absolute against Options.Dir.
func (t *Template) resolve(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(t.opts.Dir, p)
}
