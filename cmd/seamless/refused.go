package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/seamless-lb/seamless/entrypoint/apply"
	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/template"
)

// refusedSuffix names the last candidate `haproxy -c` refused, kept beside
// the rendered file and replaced by the next refusal, so that the file and
// line HAProxy's error names can be opened (the candidate itself is
// overwritten by the next rendering).
const refusedSuffix = ".refused"

// currentTemplate is the user template the latest renderer parsed, whose
// Origin names the template line behind a refused line; empty for the
// built-in template.
type currentTemplate struct {
	p atomic.Pointer[template.Template]
}

func (c *currentTemplate) set(t *template.Template) {
	if c != nil {
		c.p.Store(t)
	}
}

// explain rewrites HAProxy's locations in text: "[cand:N]" becomes
// "[kept:N]", followed by "(template T:L)" when the current template
// rendered data and wrote that line.
func (c *currentTemplate) explain(text, cand, kept string, data []byte) string {
	var tmpl *template.Template
	if c != nil {
		tmpl = c.p.Load()
	}
	re := regexp.MustCompile(regexp.QuoteMeta(cand) + `:(\d+)\]`)
	text = re.ReplaceAllStringFunc(text, func(m string) string {
		n, _ := strconv.Atoi(re.FindStringSubmatch(m)[1])
		out := kept + ":" + strconv.Itoa(n) + "]"
		if tmpl != nil {
			if l, ok := tmpl.Origin(data, n); ok {
				out += fmt.Sprintf(" (template %s:%d)", tmpl.Path(), l)
			}
		}
		return out
	})
	return strings.ReplaceAll(text, cand, kept)
}

// keepRefused wraps the candidate validator of the rendered file path: a
// refused candidate is kept as path.refused, and the error names that file
// and the template line instead of the candidate, which the next rendering
// replaces.
func keepRefused(validate func(context.Context, string) error, path string, cur *currentTemplate, log *slog.Logger) func(context.Context, string) error {
	kept := path + refusedSuffix
	return func(ctx context.Context, cand string) error {
		err := validate(ctx, cand)
		var ce *haproxy.ConfigError
		if !errors.As(err, &ce) {
			return err
		}
		data, rerr := os.ReadFile(cand)
		if rerr == nil {
			rerr = apply.WriteFile(kept, data, 0o640)
		}
		if rerr != nil {
			log.Warn("cannot keep the refused configuration", "path", kept, "err", rerr)
			return err
		}
		// Err kept: apply tells a taken port (retried) from a refusal by it.
		out := &haproxy.ConfigError{Output: cur.explain(ce.Output, cand, kept, data), Code: ce.Code, Err: ce.Err}
		for _, a := range ce.Alerts {
			out.Alerts = append(out.Alerts, cur.explain(a, cand, kept, data))
		}
		return out
	}
}
