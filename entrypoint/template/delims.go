package template

import (
	"bytes"
	"cmp"
	"fmt"
)

// maxActionLen bounds what counts as an unrendered action: a pair of
// delimiters further apart on one line is more likely something else.
const maxActionLen = 200

// warnUnrendered logs, once per template and finding, an output line that
// still holds a pair of delimiters: a template written for other
// delimiters (the "[[ ]]" convention while SEAMLESS_TEMPLATE_DELIMITERS is
// unset renders as text and HAProxy may well accept it), or data printed
// as it is that looks like an action.
func (t *Template) warnUnrendered(out []byte) {
	if t.opts.Log == nil {
		return
	}
	left, right := cmp.Or(t.opts.LeftDelim, "{{"), cmp.Or(t.opts.RightDelim, "}}")
	pairs := [][2]string{{left, right}}
	if t.opts.LeftDelim == "" && t.opts.RightDelim == "" {
		pairs = append(pairs, [2]string{"[[", "]]"})
	}
	for _, p := range pairs {
		line, text, ok := findPair(out, p[0], p[1])
		if !ok {
			continue
		}
		key := fmt.Sprint(p, line, text)
		if _, seen := t.warned.LoadOrStore(key, true); seen {
			continue
		}
		hint := "printed from data, or an escaped delimiter: check that it is meant"
		if p[0] != left {
			hint = fmt.Sprintf("a template written for other delimiters? SEAMLESS_TEMPLATE_DELIMITERS='%s %s'", p[0], p[1])
		}
		t.opts.Log.Warn("the rendered configuration still holds a pair of template delimiters",
			"template", t.path, "line", line, "text", text, "hint", hint)
	}
}

// findPair returns the first output line holding left, then right, with
// something between them, and that text. Only a line's first left counts.
// It looks for left rather than splitting the output into lines: a
// configuration of 10,000 servers is searched at every render.
func findPair(out []byte, left, right string) (line int, text string, ok bool) {
	l, r := []byte(left), []byte(right)
	if len(l) == 0 || bytes.IndexByte(l, '\n') >= 0 || bytes.IndexByte(r, '\n') >= 0 {
		return 0, "", false // no line holds it
	}
	start, n := 0, 1 // the line from start is line n
	for {
		i := bytes.Index(out[start:], l)
		if i < 0 {
			return 0, "", false
		}
		i += start
		n += bytes.Count(out[start:i], []byte("\n"))
		end := len(out)
		if e := bytes.IndexByte(out[i:], '\n'); e >= 0 {
			end = i + e
		}
		rest := out[i+len(l) : end]
		if j := bytes.Index(rest, r); j >= 0 && j <= maxActionLen && len(bytes.TrimSpace(rest[:j])) > 0 {
			return n, string(out[i : i+len(l)+j+len(r)]), true
		}
		if end == len(out) {
			return 0, "", false
		}
		start, n = end+1, n+1
	}
}
