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
// something between them, and that text.
func findPair(out []byte, left, right string) (line int, text string, ok bool) {
	for n, l := range bytes.Split(out, []byte("\n")) {
		i := bytes.Index(l, []byte(left))
		if i < 0 {
			continue
		}
		rest := l[i+len(left):]
		j := bytes.Index(rest, []byte(right))
		if j < 0 || j > maxActionLen || len(bytes.TrimSpace(rest[:j])) == 0 {
			continue
		}
		return n + 1, string(l[i : i+len(left)+j+len(right)]), true
	}
	return 0, "", false
}
