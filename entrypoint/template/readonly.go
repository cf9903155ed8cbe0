package template

import (
	"text/template"
	"text/template/parse"
)

// readOnlyFuncs are the functions that never write into what they are
// handed, checked one by one: text/template's builtins but call, the
// Consul, KV and local reads, and the helpers but the deep merges. Not
// sprig's (too many to vouch for: sortAlpha sorts a []string in place)
// nor scratch (its Set keeps a reference that MapSet may write through).
// A template that calls anything else gets copies (HealthService.copy).
var readOnlyFuncs = func() map[string]bool {
	m := map[string]bool{}
	for _, name := range []string{
		// text/template's builtins.
		"and", "or", "not", "len", "index", "slice", "print", "printf", "println",
		"eq", "ne", "lt", "le", "gt", "ge", "html", "js", "urlquery",
		// Bound to the render: they read the state or the environment.
		"datacenters", "key", "keyExists", "keyOrDefault", "ls", "safeLs", "tree", "safeTree",
		"node", "nodes", "service", "services", "file", "env", "mustEnv", "envOrDefault",
		"executeTemplate", "timestamp", "skip", "validServiceName",
	} {
		m[name] = true
	}
	for name := range helperFuncs {
		m[name] = true
	}
	delete(m, "mergeMap")
	delete(m, "mergeMapWithOverride")
	for name := range haproxyFuncs {
		m[name] = true
	}
	return m
}()

// callsOnly reports whether every function tmpl's trees call is in funcs.
func callsOnly(tmpl *template.Template, funcs map[string]bool) bool {
	ok := true
	for _, tt := range tmpl.Templates() {
		if tt.Tree == nil || tt.Tree.Root == nil {
			continue
		}
		walk(tt.Tree.Root, func(n parse.Node, _ bool) {
			if id, isID := n.(*parse.IdentifierNode); isID && !funcs[id.Ident] {
				ok = false
			}
		})
	}
	return ok
}
