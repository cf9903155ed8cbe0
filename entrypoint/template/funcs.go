package template

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/template"

	"github.com/Masterminds/sprig/v3"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// render is the state of one Render: the functions of the template call
// the render that executes it, so no state is shared between renders.
type render struct {
	t       *Template
	tmpl    *template.Template
	st      model.State
	queries map[model.Query]bool
	missing map[model.Query]bool
	skipped []string
	scratch Scratch
	cached  converted // by the previous render that had the cache; empty without it
	used    converted // by this render
	frags   *keptOutputs
	// out is what the execution running now writes to (see fragments):
	// every execution of r.tmpl or of a fragment runs through execute.
	out io.StringWriter
	// lastView is the view catalog returned last, of datacenter lastDC.
	lastView *view
	lastDC   string
	funcs    template.FuncMap
	// rec, while a fragment executes, collects what it reads; fragTmpls
	// are the fragments' templates bound to this render.
	rec       *fragmentRecord
	fragTmpls map[string]*template.Template
}

// execute runs exec, which writes to w, with w as r.out.
func (r *render) execute(w io.StringWriter, exec func() error) error {
	prev := r.out
	r.out = w
	defer func() { r.out = prev }()
	return exec()
}

// result records q and returns State's answer; without one q is missing.
func (r *render) result(q model.Query) (model.Result, bool) {
	r.queries[q] = true
	res, ok := r.st.Result(q)
	if !ok {
		r.missing[q] = true
		if r.rec != nil {
			r.rec.incomplete = true
		}
	}
	return res, ok
}

// unsupported lists the consul-template functions seamless refuses at
// Parse, with the reason given to the user.
var unsupported = map[string]string{
	"secret":           "it reads Vault; seamless talks to no Vault (inject secrets as files and use `file`, or as environment variables and use `env`)",
	"secrets":          "it lists Vault secrets; seamless talks to no Vault",
	"pkiCert":          "it issues certificates from Vault's PKI; seamless talks to no Vault (mount certificates as files and point HAProxy at them)",
	"pkiSign":          "it signs certificates with Vault's PKI; seamless talks to no Vault",
	"caLeaf":           "it fetches Consul Connect leaf certificates; seamless reads only Consul's catalog and KV store",
	"caRoots":          "it fetches Consul Connect CA roots; seamless reads only Consul's catalog and KV store",
	"connect":          "it lists Consul Connect proxies; seamless reads only Consul's catalog and KV store",
	"exportedServices": "it reads Consul admin partitions' exported services; seamless reads only Consul's catalog and KV store",
	"partitions":       "it lists Consul Enterprise admin partitions; seamless reads only Consul's catalog and KV store",
	"peerings":         "it lists Consul cluster peerings; seamless reads only Consul's catalog and KV store",
	"nomadService":     "it reads Nomad's service registry; seamless discovers from Consul, Docker and files",
	"nomadServices":    "it reads Nomad's service registry; seamless discovers from Consul, Docker and files",
	"nomadVar":         "it reads Nomad variables; seamless talks to no Nomad",
	"nomadVarExists":   "it reads Nomad variables; seamless talks to no Nomad",
	"nomadVarList":     "it reads Nomad variables; seamless talks to no Nomad",
	"nomadVarListSafe": "it reads Nomad variables; seamless talks to no Nomad",
	"plugin":           "it runs an external command at every render; rendering in seamless is a pure function of the discovered state, and PID 1 starts no such children",
	"writeToFile":      "it writes files while rendering; rendering in seamless is a pure function of the discovered state and writes nothing",
	"sockaddr":         "it reads the host's network interfaces through go-sockaddr, which seamless does not include; pass the address in an environment variable and use `env`",
	"spew_dump":        "it prints to PID 1's standard output; use toJSONPretty or printf \"%#v\" instead",
	"spew_printf":      "it prints to PID 1's standard output; use toJSONPretty or printf \"%#v\" instead",
	"spew_sdump":       "it needs go-spew, which seamless does not include; use toJSONPretty or printf \"%#v\" instead",
	"spew_sprintf":     "it needs go-spew, which seamless does not include; use printf instead",
}

// impureSprig are the sprig functions that would make a rendering depend on
// something else than the state (randomness, the clock, DNS).
var impureSprig = map[string]string{
	"ago":                      "it reads the clock at every render",
	"randAlpha":                "it is random: every render would differ and reload HAProxy",
	"randAlphaNum":             "it is random: every render would differ and reload HAProxy",
	"randAscii":                "it is random: every render would differ and reload HAProxy",
	"randNumeric":              "it is random: every render would differ and reload HAProxy",
	"randBytes":                "it is random: every render would differ and reload HAProxy",
	"randInt":                  "it is random: every render would differ and reload HAProxy",
	"shuffle":                  "it is random: every render would differ and reload HAProxy",
	"uuidv4":                   "it is random: every render would differ and reload HAProxy",
	"bcrypt":                   "it salts randomly: every render would differ and reload HAProxy",
	"htpasswd":                 "it salts randomly: every render would differ and reload HAProxy",
	"encryptAES":               "it uses a random IV: every render would differ and reload HAProxy",
	"genPrivateKey":            "it generates a new key at every render",
	"genCA":                    "it generates a new certificate at every render",
	"genCAWithKey":             "it generates a new certificate at every render",
	"genSelfSignedCert":        "it generates a new certificate at every render",
	"genSelfSignedCertWithKey": "it generates a new certificate at every render",
	"genSignedCert":            "it generates a new certificate at every render",
	"genSignedCertWithKey":     "it generates a new certificate at every render",
	"getHostByName":            "it resolves DNS while rendering; let HAProxy resolve names (`resolvers`) instead",
}

func init() {
	for name, reason := range impureSprig {
		unsupported["sprig_"+name] = reason
	}
}

// staticFuncs are the functions that depend on nothing but their
// arguments: sprig's, the helpers, the HAProxy helpers and the stubs of
// unsupported functions (Parse refuses templates calling those, the stubs
// only let text/template parse them so that the error can name the line).
var staticFuncs = sync.OnceValue(func() template.FuncMap {
	fm := template.FuncMap{}
	for name, fn := range sprig.TxtFuncMap() {
		if _, impure := impureSprig[name]; !impure {
			fm["sprig_"+name] = fn
		}
	}
	for name := range unsupported {
		fm[name] = func(...any) (string, error) {
			return "", fmt.Errorf("%s: %w", name, ErrUnsupported)
		}
	}
	for name, fn := range helperFuncs {
		fm[name] = fn
	}
	for name, fn := range haproxyFuncs {
		fm[name] = fn
	}
	fm["validServiceName"] = ValidServiceName
	return fm
})

// boundFuncs are the functions bound to a render, the one at returns
// when they are called: they read its State, record its queries, or use
// its options, scratchpad and template.
func boundFuncs(at func() *render) template.FuncMap {
	return template.FuncMap{
		"sprig_env":       func(s string) string { return at().env(s) },
		"sprig_expandenv": func(s string) string { return os.Expand(s, at().env) },
		"sprig_now":       func() any { return at().t.opts.Now },

		// Consul and the merged catalog.
		"datacenters":  func(ignore ...bool) ([]string, error) { return at().datacenters(ignore...) },
		"key":          func(s string) (string, error) { return at().key(s) },
		"keyExists":    func(s string) (bool, error) { return at().keyExists(s) },
		"keyOrDefault": func(s, def string) (string, error) { return at().keyOrDefault(s, def) },
		"ls":           func(s string) ([]*KeyPair, error) { return at().list(s, "ls", false, false) },
		"safeLs":       func(s string) ([]*KeyPair, error) { return at().list(s, "safeLs", false, true) },
		"tree":         func(s string) ([]*KeyPair, error) { return at().list(s, "tree", true, false) },
		"safeTree":     func(s string) ([]*KeyPair, error) { return at().list(s, "safeTree", true, true) },
		"node":         func(args ...string) (*CatalogNode, error) { return at().node(args...) },
		"nodes":        func(args ...string) ([]*Node, error) { return at().nodes(args...) },
		"service":      func(args ...string) ([]*HealthService, error) { return at().service(args...) },
		"services":     func(args ...string) ([]*CatalogSnippet, error) { return at().services(args...) },

		// Local reads.
		"file":            func(p string) (string, error) { return at().file(p) },
		"env":             func(s string) string { return at().env(s) },
		"mustEnv":         func(s string) (string, error) { return at().mustEnv(s) },
		"envOrDefault":    func(s, def string) string { return at().envOrDefault(s, def) },
		"executeTemplate": func(name string, data ...any) (string, error) { return at().executeTemplate(name, data...) },
		"timestamp":       func(layout ...string) (string, error) { return at().timestamp(layout...) },
		"scratch":         func() *Scratch { return &at().scratch },
		"skip":            func(reason ...any) string { return at().skip(reason...) },
	}
}

func (r *render) env(name string) string {
	v, _ := r.t.opts.LookupEnv(name)
	return v
}

func (r *render) mustEnv(name string) (string, error) {
	if v := r.env(name); v != "" {
		return v, nil
	}
	return "", fmt.Errorf("required environment variable %s is empty", name)
}

func (r *render) envOrDefault(name, def string) string {
	if v, ok := r.t.opts.LookupEnv(name); ok {
		return v
	}
	return def
}

// file returns a file's contents, read at every render: an edited file is
// picked up by the next render (consul-template watches it and renders at
// once; seamless renders when the state changes).
func (r *render) file(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	b, err := readRegular(r.t.resolve(p))
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func (r *render) executeTemplate(name string, data ...any) (string, error) {
	var dot any
	switch len(data) {
	case 0:
	case 1:
		dot = data[0]
	default:
		return "", fmt.Errorf("executeTemplate: wrong number of arguments, expected 1 or 2, but got %d", len(data)+1)
	}
	var b bytes.Buffer
	if err := r.execute(&b, func() error { return r.tmpl.ExecuteTemplate(&b, name, dot) }); err != nil {
		return "", unfragment(err)
	}
	return b.String(), nil
}

// timestamp formats Options.Now (UTC): RFC 3339 by default, Unix seconds
// for "unix", else the given Go layout.
func (r *render) timestamp(layout ...string) (string, error) {
	now := r.t.opts.Now
	switch len(layout) {
	case 0:
		return now.Format("2006-01-02T15:04:05Z07:00"), nil
	case 1:
		if layout[0] == "unix" {
			return fmt.Sprint(now.Unix()), nil
		}
		return now.Format(layout[0]), nil
	}
	return "", fmt.Errorf("timestamp: wrong number of arguments, expected 0 or 1, but got %d", len(layout))
}

// skip records why the template left something out, for the log
// (Rendering.Skipped), and renders nothing.
func (r *render) skip(reason ...any) string {
	msg := strings.TrimSpace(fmt.Sprintln(reason...))
	if msg == "" {
		msg = "skipped by the template"
	}
	r.skipped = append(r.skipped, msg)
	if r.rec != nil {
		r.rec.skipped = append(r.rec.skipped, msg)
	}
	return ""
}
