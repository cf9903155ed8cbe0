package file

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// 5,000 services appearing, or one file written a thousand times, are one
// info line per scan of bounded size; each service's line is at debug.
func TestChangesAreSummarisedAtInfo(t *testing.T) {
	before, after := map[string]*service{}, map[string]*service{}
	files := map[string]string{}
	for i := range 5000 {
		n := fmt.Sprintf("service-%04d", i)
		after[n] = &service{name: n, instances: []model.Instance{{ID: n + "-1", Address: "10.0.0.1", Port: 80}}}
		files[n] = n + ".yaml"
	}
	before["gone"] = &service{name: "gone", instances: []model.Instance{{ID: "g"}}}
	var info, debug bytes.Buffer
	logChanges(slog.New(levelSplit{info: slog.NewTextHandler(&info, nil), debug: slog.NewTextHandler(&debug, &slog.HandlerOptions{Level: slog.LevelDebug})}), before, after, files)

	lines := strings.Split(strings.TrimSpace(info.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d info lines, want 1:\n%s", len(lines), info.String())
	}
	for _, want := range []string{"added=5000", "removed=1", "service-0000", "(+4996 more)"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("info line lacks %q: %s", want, lines[0])
		}
	}
	if len(lines[0]) > 1024 {
		t.Errorf("info line is %d bytes", len(lines[0]))
	}
	if n := strings.Count(debug.String(), "service added"); n != 5000 {
		t.Errorf("%d per-service lines at debug, want 5000", n)
	}
}

// levelSplit sends info and above to info, debug to debug.
type levelSplit struct{ info, debug slog.Handler }

func (l levelSplit) Enabled(_ context.Context, lv slog.Level) bool { return true }
func (l levelSplit) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelInfo {
		return l.info.Handle(ctx, r)
	}
	return l.debug.Handle(ctx, r)
}
func (l levelSplit) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l levelSplit) WithGroup(string) slog.Handler      { return l }
