package routes

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"hash"
	"maps"
	"reflect"
	"slices"
	"sync"
	"text/template"
	"text/template/parse"
)

// A change to one instance must cost what that instance costs, so the
// built-in template is executed in two parts: the backends, one at a time
// and only those whose inputs changed, and the rest (frontends, rules) with
// the backends' text spliced in where its range over .Backends stood. The
// bytes are those of the whole template executed at once.

// backendsMark stands for the backends in the main part's output: a NUL
// cannot reach the configuration (every string is checked), so it cannot
// occur otherwise.
const backendsMark = "\x00backends\x00"

// mainTmpl is the template with its range over .Backends replaced by
// {{.BackendsMark}}; backendTmpl is that range alone, executed with a view
// holding one backend.
var mainTmpl, backendTmpl = splitBackends(tmpl)

func splitBackends(t *template.Template) (*template.Template, *template.Template) {
	root := t.Tree.Root
	i := slices.IndexFunc(root.Nodes, func(n parse.Node) bool {
		r, ok := n.(*parse.RangeNode)
		return ok && r.Pipe.String() == ".Backends"
	})
	if i < 0 {
		return nil, nil // executed whole (execute)
	}
	mark := template.Must(template.New("mark").Parse("{{.BackendsMark}}")).Tree.Root.Nodes[0]

	mainTree := t.Tree.Copy()
	mainTree.Root.Nodes[i] = mark
	main := template.Must(t.Clone())
	template.Must(main.AddParseTree(t.Name(), mainTree))

	backTree := t.Tree.Copy()
	backTree.Root.Nodes = []parse.Node{backTree.Root.Nodes[i]}
	back := template.Must(t.Clone())
	template.Must(back.AddParseTree(t.Name(), backTree))
	return main, back
}

// BackendsMark is where the main part's output takes the backends.
func (view) BackendsMark() string { return backendsMark }

// fragments caches each backend's text by its inputs. It is a memo of a
// pure function, not state: every rendering keeps only the backends it
// renders, so a vanished backend is forgotten at the next rendering.
type fragments struct {
	mu      sync.Mutex
	globals view // globals() of the last rendering
	cache   map[string]*fragment
	spare   map[string]*fragment // the one before cache, empty, to fill next
	texts   [][]byte             // the last rendering's backends, reused
	order   []*fragment          // the same backends' fragments
	// executed counts the backends executed (not found in the cache).
	executed int
	last     *mainPart // the last main part executed
}

// globals is what of v a backend's text may read besides the backend
// itself (through $): every field but the lists, so that a field added to
// the view is seen too. The cache is dropped when they change.
func globals(v view) view {
	v.Rules, v.Listeners, v.Backends, v.HTTPS.redirect = nil, nil, nil, nil
	return v
}

type fragment struct {
	tcp, redirect bool
	servers       []viewServer
	text          []byte
	structure     [sha256.Size]byte // of text with server lines cut after the name
}

// backends returns the text of v's backends in order, and a digest of
// their structure, executing only the backends whose inputs differ from
// the last rendering's. A backend's servers are checked when it is
// executed: those of a cached one passed already.
func (f *fragments) backends(v view) ([][]byte, int, []byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := globals(v)
	old := f.cache
	if !reflect.DeepEqual(g, f.globals) {
		old = nil
	}
	next := f.spare
	if next == nil {
		next = make(map[string]*fragment, len(v.Backends))
	}
	clear(next) // what a failed rendering left
	texts, order := f.texts[:0], f.order[:0]
	size := 0
	h := sha256.New()
	one := v
	for _, b := range v.Backends {
		redirect := v.HTTPS.Redirect(b.Name)
		fr, ok := old[b.Name]
		// The servers of a backend whose slots did not change are the
		// same list (slotCache): most are not compared one by one.
		if !ok || fr.tcp != b.TCP || fr.redirect != redirect ||
			!sameSlice(fr.servers, b.Servers) && !sameServers(fr.servers, b.Servers) {
			if err := checkViewServers(b.Servers); err != nil {
				return nil, 0, nil, err
			}
			var buf bytes.Buffer
			one.Backends = []viewBackend{b}
			if err := backendTmpl.Execute(&buf, one); err != nil {
				return nil, 0, nil, fmt.Errorf("default configuration: %w", err)
			}
			fr = &fragment{tcp: b.TCP, redirect: redirect, servers: b.Servers, text: buf.Bytes()}
			structure(sha256.New(), fr.text).Sum(fr.structure[:0])
			f.executed++
		}
		next[b.Name] = fr
		texts, order = append(texts, fr.text), append(order, fr)
		size += len(fr.text)
		h.Write(fr.structure[:])
	}
	// The last cache becomes the next one to fill, emptied now: a changed
	// backend's fragment in it is part of the last configuration, which
	// it would keep whole.
	spare := f.cache
	clear(spare)
	f.globals, f.cache, f.spare, f.texts, f.order = g, next, spare, texts, order
	return texts, size, h.Sum(nil), nil
}

func checkViewServers(servers []viewServer) error {
	for _, vs := range servers {
		if err := check("server", identRe, vs.Name()); err != nil {
			return err
		}
		if err := check("address", addrRe, vs.Addr()); err != nil {
			return err
		}
		if w := vs.Weight(); w < 1 || w > MaxWeight {
			return fmt.Errorf("default configuration: internal error: weight %d", w)
		}
	}
	return nil
}

// structure writes text to h with every server line cut after the
// server's name (in slot mode every server line is a slot's): what a
// runtime update cannot change.
func structure(h hash.Hash, text []byte) hash.Hash {
	rest := text
	for len(rest) > 0 {
		line, next, _ := bytes.Cut(rest, []byte("\n"))
		rest = next
		if srv, ok := bytes.CutPrefix(line, []byte("    server ")); ok {
			name, _, _ := bytes.Cut(srv, []byte(" "))
			h.Write([]byte("    server "))
			line = name
		}
		h.Write(line)
		h.Write([]byte("\n"))
	}
	return h
}

// execute renders v: the main part once, the backends from the cache.
// It returns the configuration and the digest of its structure.
func (f *fragments) execute(v view) ([]byte, []byte, error) {
	if mainTmpl == nil {
		// The template has no top-level range over .Backends to split at.
		for _, b := range v.Backends {
			if err := checkViewServers(b.Servers); err != nil {
				return nil, nil, err
			}
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, v); err != nil {
			return nil, nil, fmt.Errorf("default configuration: %w", err)
		}
		return buf.Bytes(), structure(sha256.New(), buf.Bytes()).Sum(nil), nil
	}
	backends, size, backStruct, err := f.backends(v)
	if err != nil {
		return nil, nil, err
	}
	main, err := f.main(v)
	if err != nil {
		return nil, nil, err
	}
	before, after := main.before, main.after
	config := make([]byte, 0, len(before)+size+len(after))
	config = append(config, before...)
	for _, b := range backends {
		config = append(config, b...)
	}
	config = append(config, after...)
	f.keepIn(config[len(before):])
	h := sha256.New()
	h.Write(main.structure[:])
	h.Write(backStruct)
	return config, h.Sum(nil), nil
}

// keepIn makes the last rendering's backend texts the parts of its
// configuration that hold them (backends, the configuration from its first
// backend on), never written once made: a backend's text is kept once,
// not once more beside the configuration (1.4 MB at 1,000 backends, with
// the spare room of the buffers they were executed into).
func (f *fragments) keepIn(backends []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	off := 0
	for i, fr := range f.order {
		n := len(fr.text)
		fr.text = backends[off : off+n : off+n]
		f.texts[i] = fr.text
		off += n
	}
}

// mainPart is the main part's output around the backends, and the digest
// of its structure.
type mainPart struct {
	rules     []viewRule
	listeners []viewListener
	redirect  map[string]bool
	globals   view
	before    []byte
	after     []byte
	structure [sha256.Size]byte
}

// main executes the main part of v, or returns the last one when v's
// fields but its backends are those it was executed with: the rules and
// frontends change far less often than the servers.
func (f *fragments) main(v view) (mainPart, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := globals(v)
	if m := f.last; m != nil && slices.Equal(m.rules, v.Rules) && slices.Equal(m.listeners, v.Listeners) &&
		maps.Equal(m.redirect, v.HTTPS.redirect) && reflect.DeepEqual(m.globals, g) {
		return *m, nil
	}
	var buf bytes.Buffer
	if err := mainTmpl.Execute(&buf, v); err != nil {
		return mainPart{}, fmt.Errorf("default configuration: %w", err)
	}
	before, after, ok := bytes.Cut(buf.Bytes(), []byte(backendsMark))
	if !ok {
		return mainPart{}, fmt.Errorf("default configuration: internal error: no place for the backends")
	}
	m := &mainPart{rules: v.Rules, listeners: v.Listeners, redirect: v.HTTPS.redirect, globals: g, before: before, after: after}
	h := sha256.New()
	structure(h, before)
	h.Write([]byte("\x00backends\x00"))
	structure(h, after)
	h.Sum(m.structure[:0])
	f.last = m
	return *m, nil
}
