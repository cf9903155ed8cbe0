package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/reload"
	"github.com/seamless-lb/seamless/entrypoint/status"
)

// reloadsKept is how many reloads /status lists.
const reloadsKept = 20

// reloadLog remembers the latest reloads and what HAProxy runs: the
// digests of the files as read for the last confirmed reload (or at
// start), so that /status never describes a refused file on disk as if
// it ran.
type reloadLog struct {
	files []string // nil in discovery mode
	now   func() time.Time
	read  func(paths []string) []status.ConfigFile

	mu      sync.Mutex
	reloads []status.Reload              // newest last
	running map[string]status.ConfigFile // by path: what runs
	pending map[string]status.ConfigFile // read when the reload in flight was checked
	// refusedAt and refusedWhy: the first refusal since what runs was
	// loaded; zero once a reload succeeds.
	refusedAt  time.Time
	refusedWhy string
}

// newReloadLog keeps the reloads, and what runs of files unless in
// discovery mode: there the applier keeps the rendered file what runs,
// and /status reads that from the file itself, so reading and hashing
// the files again at every reload (tens of megabytes at 10,000 services)
// would serve nothing.
func newReloadLog(files []string, discovery bool) *reloadLog {
	l := &reloadLog{now: time.Now, read: configFiles}
	if !discovery {
		l.files = slices.Clone(files)
		l.running = byPath(l.read(l.files))
	}
	return l
}

func byPath(fs []status.ConfigFile) map[string]status.ConfigFile {
	m := make(map[string]status.ConfigFile, len(fs))
	for _, f := range fs {
		m[f.Path] = f
	}
	return m
}

// checker wraps the reloader's haproxy -c: the files are read as the
// check begins, which is what the reload will load if it succeeds. (A file
// replaced between the check and the reload is the next reload's.)
func (l *reloadLog) checker(c reload.Checker) reload.Checker {
	if l.files == nil {
		return c
	}
	return readingChecker{l, c}
}

// readingChecker is a check that reads the files for /status first.
type readingChecker struct {
	l *reloadLog
	c reload.Checker
}

func (r readingChecker) Check(ctx context.Context) error {
	read := byPath(r.l.read(r.l.files))
	r.l.mu.Lock()
	r.l.pending = read
	r.l.mu.Unlock()
	return r.c.Check(ctx)
}

func (r readingChecker) Loaded(certain bool) { r.c.Loaded(certain) }

// done is the reloader's OnDone.
func (l *reloadLog) done(o reload.Outcome) {
	if o.Retry {
		return // never reached HAProxy; it is tried again
	}
	now := l.now()
	r := status.Reload{Time: now.Add(-o.Duration), Trigger: reload.Summarise(o.Reasons), DurationSeconds: o.Duration.Seconds()}
	var ce *haproxy.ConfigError
	switch {
	case o.OK:
		r.Result = status.ReloadOK
	case errors.As(o.Err, &ce):
		r.Result, r.Alerts = status.ReloadRefused, ce.Alerts
	case errors.Is(o.Err, reload.ErrRefused):
		r.Result, r.Alerts = status.ReloadRefused, alerts(o.Result.Messages)
	default:
		r.Result = status.ReloadFailed
	}
	if o.Err != nil {
		r.Error = o.Err.Error()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reloads = append(l.reloads, r)
	if len(l.reloads) > reloadsKept {
		l.reloads = slices.Delete(l.reloads, 0, len(l.reloads)-reloadsKept)
	}
	switch {
	case o.OK:
		if l.pending != nil {
			l.running = l.pending
		}
		l.refusedAt, l.refusedWhy = time.Time{}, ""
	case l.refusedAt.IsZero():
		l.refusedAt, l.refusedWhy = r.Time, r.Error
		if len(r.Alerts) > 0 {
			l.refusedWhy = strings.Join(r.Alerts, "\n")
		}
	}
	l.pending = nil
}

// alerts are the [ALERT] lines of HAProxy's start-up messages.
func alerts(messages string) []string {
	var out []string
	for line := range strings.Lines(messages) {
		if line = strings.TrimSpace(line); strings.Contains(line, "[ALERT]") {
			out = append(out, line)
		}
	}
	return out
}

// history returns the reloads newest first.
func (l *reloadLog) history() []status.Reload {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.reloads)
	slices.Reverse(out)
	return out
}

// annotate adds what runs to the files as they are on disk.
func (l *reloadLog) annotate(files []status.ConfigFile) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range files {
		f := &files[i]
		run, ok := l.running[f.Path]
		if !ok {
			continue
		}
		f.RunningSHA256 = run.SHA256
		if f.SHA256 == run.SHA256 && f.Error == "" {
			continue
		}
		f.DiffersSince, f.DiffersReason = l.refusedAt, l.refusedWhy
		if l.refusedAt.IsZero() {
			f.DiffersSince, f.DiffersReason = f.Modified, "changed on disk, not reloaded since (send SIGHUP to load it)"
		}
	}
}
