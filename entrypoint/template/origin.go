package template

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"text/template/parse"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// lastRender is the latest complete rendering, which Origin explains.
type lastRender struct {
	mu     sync.Mutex
	st     model.State
	config []byte
}

func (l *lastRender) set(st model.State, config []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st, l.config = st, config
}

// size is the length of the latest complete rendering, 0 before one.
func (l *lastRender) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.config)
}

// Origin returns the template line that wrote line (1-based) of config,
// when config is the template's latest complete rendering, so that an
// error HAProxy reports in the rendered file can name the template line
// to fix. It renders the same State again with a marker before every
// node of the template and maps the output back; ok is false when config
// is not that rendering or the mapping does not reproduce it.
func (t *Template) Origin(config []byte, line int) (tline int, ok bool) {
	t.last.mu.Lock()
	st, last := t.last.st, t.last.config
	t.last.mu.Unlock()
	if last == nil || !bytes.Equal(last, config) || line < 1 {
		return 0, false
	}
	lines, ok := t.lineMap(st, config)
	if !ok || line > len(lines) {
		return 0, false
	}
	return lines[line-1], true
}

// lineMap renders st with markers and returns, for every output line, the
// template line whose output starts it (its first non-blank byte).
func (t *Template) lineMap(st model.State, want []byte) ([]int, bool) {
	var nonce [8]byte
	rand.Read(nonce[:])
	prefix := "\x00" + hex.EncodeToString(nonce[:])
	r := &render{t: t, st: st, queries: map[model.Query]bool{}, missing: map[model.Query]bool{}}
	tmpl := template.New(t.path).Delims(t.opts.LeftDelim, t.opts.RightDelim)
	if t.opts.ErrOnMissingKey {
		tmpl.Option("missingkey=error")
	} else {
		tmpl.Option("missingkey=zero")
	}
	tmpl.Funcs(staticFuncs()).Funcs(boundFuncs(func() *render { return r }))
	if _, err := tmpl.Parse(t.text); err != nil {
		return nil, false
	}
	lineOf := func(p parse.Pos) int { return 1 + strings.Count(t.text[:min(int(p), len(t.text))], "\n") }
	for _, tt := range tmpl.Templates() {
		if tt.Tree != nil {
			mark(tt.Tree.Root, prefix, lineOf)
		}
	}
	r.tmpl = tmpl
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, nil); err != nil || len(r.missing) > 0 {
		return nil, false
	}
	clean, lines := unmark(buf.Bytes(), prefix)
	return lines, bytes.Equal(clean, want)
}

// mark puts a marker before every node of l: "T" and the line for text,
// whose own newlines advance the line, "A" and the line for the rest.
func mark(l *parse.ListNode, prefix string, lineOf func(parse.Pos) int) {
	if l == nil {
		return
	}
	nodes := make([]parse.Node, 0, 2*len(l.Nodes))
	for _, n := range l.Nodes {
		kind := "A"
		if _, ok := n.(*parse.TextNode); ok {
			kind = "T"
		}
		m := prefix + kind + strconv.Itoa(lineOf(n.Position())) + "\x00"
		nodes = append(nodes, &parse.TextNode{NodeType: parse.NodeText, Pos: n.Position(), Text: []byte(m)}, n)
		switch n := n.(type) {
		case *parse.IfNode:
			mark(n.List, prefix, lineOf)
			mark(n.ElseList, prefix, lineOf)
		case *parse.RangeNode:
			mark(n.List, prefix, lineOf)
			mark(n.ElseList, prefix, lineOf)
		case *parse.WithNode:
			mark(n.List, prefix, lineOf)
			mark(n.ElseList, prefix, lineOf)
		}
	}
	l.Nodes = nodes
}

// unmark removes the markers and returns the template line of every
// output line.
func unmark(out []byte, prefix string) (clean []byte, lines []int) {
	p := []byte(prefix)
	cur, text, started := 0, false, false
	clean = make([]byte, 0, len(out))
	for len(out) > 0 {
		if bytes.HasPrefix(out, p) {
			rest := out[len(p):]
			end := bytes.IndexByte(rest, 0)
			if end < 2 {
				return nil, nil
			}
			n, err := strconv.Atoi(string(rest[1:end]))
			if err != nil {
				return nil, nil
			}
			cur, text = n, rest[0] == 'T'
			out = rest[end+1:]
			continue
		}
		chunk := out
		if i := bytes.Index(out, p); i >= 0 {
			chunk = out[:i]
		}
		for _, b := range chunk {
			if !started && b != ' ' && b != '\t' && b != '\n' {
				lines, started = append(lines, cur), true
			}
			if b == '\n' {
				if !started {
					lines = append(lines, cur)
				}
				started = false
				if text {
					cur++
				}
			}
		}
		clean = append(clean, chunk...)
		out = out[len(chunk):]
	}
	if len(clean) > 0 && clean[len(clean)-1] != '\n' && !started {
		lines = append(lines, cur)
	}
	return clean, lines
}
