package testenv

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// Records is a slog handler that keeps every record, with the attributes
// a logger's With gave it, for a test to look at.
type Records struct {
	mu    sync.Mutex
	recs  []slog.Record
	lines []string // "LEVEL message key=value ...", one per record
}

func (r *Records) Enabled(context.Context, slog.Level) bool { return true }
func (r *Records) WithGroup(string) slog.Handler            { return r }
func (r *Records) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordsWith{r: r, attrs: as}
}
func (r *Records) Handle(_ context.Context, rec slog.Record) error { return r.handle(nil, rec) }

func (r *Records) handle(with []slog.Attr, rec slog.Record) error {
	rec = rec.Clone()
	rec.AddAttrs(with...)
	line := rec.Level.String() + " " + rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	r.lines = append(r.lines, line)
	return nil
}

type recordsWith struct {
	r     *Records
	attrs []slog.Attr
}

func (w *recordsWith) Enabled(context.Context, slog.Level) bool { return true }
func (w *recordsWith) WithGroup(string) slog.Handler            { return w }
func (w *recordsWith) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordsWith{r: w.r, attrs: append(slices.Clone(w.attrs), as...)}
}
func (w *recordsWith) Handle(_ context.Context, rec slog.Record) error {
	return w.r.handle(w.attrs, rec)
}

// All returns the records kept so far, in order.
func (r *Records) All() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.recs)
}

// Count is the number of records whose line contains every one of parts.
func (r *Records) Count(parts ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, l := range r.lines {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(l, p) }) {
			n++
		}
	}
	return n
}

func (r *Records) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}
