package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/integration/loadgen"
)

// options are the parsed flags of `seamless-bench reload`.
type options struct {
	seamless  string
	haproxy   string
	reloads   int
	interval  time.Duration
	workers   int
	warmup    int
	modes     []loadgen.Mode
	scenarios []scenarioSpec
	timeout   time.Duration
}

// runResult is one row of the table.
type runResult struct {
	scenario string
	mode     loadgen.Mode
	load     loadgen.Result
	asked    int             // reloads requested
	lat      []time.Duration // latencies of completed reloads
	err      error
}

// settle is how long the load keeps running after the last reload, so that
// failures caused by old processes going away are still counted.
const settle = 500 * time.Millisecond

// runOne starts a scenario with load from one client mode, reloads it
// o.reloads times and stops everything it started.
func runOne(ctx context.Context, log *slog.Logger, o options, root, backend string, spec scenarioSpec, mode loadgen.Mode) (res runResult) {
	res = runResult{scenario: spec.title, mode: mode}
	name := spec.key + "-" + mode.String()
	log = log.With("run", name)
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	env, err := newRunEnv(root, name, o)
	if err != nil {
		res.err = err
		return res
	}
	defer env.log.Close()
	version := 1
	if err := writeConfig(env.cfgPath, renderConfig(env.frontend, backend, version)); err != nil {
		res.err = err
		return res
	}

	sc := spec.build(env)
	defer func() {
		if err := sc.stop(); err != nil {
			log.Warn("stopping processes", "err", err)
			res.err = errors.Join(res.err, err)
		}
	}()
	log.Info("starting", "frontend", env.frontend, "dir", env.dir)
	if err := sc.start(ctx); err != nil {
		res.err = fmt.Errorf("start: %w", err)
		return res
	}

	load, err := loadgen.Start(ctx, loadgen.Config{
		Target:  env.frontend,
		Mode:    mode,
		Workers: o.workers,
		// A bound far above what one machine reaches in the time given.
		MaxRequests: max(int64(o.timeout.Seconds()), 1) * 1_000_000,
		MaxDuration: o.timeout,
	})
	if err != nil {
		res.err = err
		return res
	}
	defer func() { res.load = load.Stop() }()
	err = poll(ctx, 5*time.Millisecond, readyTimeout, "load flowing", func() (bool, error) {
		r := load.Snapshot()
		return r.Requests-r.Failed > 0, nil
	})
	if err != nil {
		res.err = err
		return res
	}

	lastAsk := time.Now()
	for i := 1; i <= o.reloads; i++ {
		// Every other reload changes the file, so half the reloads load a
		// different config; the change itself is not timed.
		if i%2 == 0 {
			version++
			if err := writeConfig(env.cfgPath, renderConfig(env.frontend, backend, version)); err != nil {
				res.err = err
				return res
			}
		}
		if err := sleepUntil(ctx, lastAsk.Add(o.interval)); err != nil {
			res.err = fmt.Errorf("after %d reloads: %w", res.asked, err)
			return res
		}
		lastAsk = time.Now()
		res.asked++
		lat, err := sc.reload(ctx)
		if err != nil {
			log.Warn("reload not completed", "reload", i, "err", err)
			if isFatal(ctx, err) {
				res.err = fmt.Errorf("reload %d: %w", i, err)
				return res
			}
			continue
		}
		res.lat = append(res.lat, lat)
		if i%10 == 0 || i == o.reloads {
			snap := load.Snapshot()
			log.Info("progress", "reloads", fmt.Sprintf("%d/%d", len(res.lat), o.reloads),
				"requests", snap.Requests, "failed", snap.Failed)
		}
	}
	if err := sleepUntil(ctx, time.Now().Add(settle)); err != nil {
		res.err = err
		return res
	}
	// The newest answer should come from the newest config: a cheap check
	// that reloads really took effect.
	want := "ok config=" + strconv.Itoa(version)
	if got := load.Snapshot().LastBody; got != want {
		log.Warn("newest answer is not from the newest config", "got", got, "want", want)
	}
	return res
}

func newRunEnv(root, name string, o options) (*runEnv, error) {
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	frontend, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "processes.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &runEnv{
		dir:      dir,
		cfgPath:  filepath.Join(dir, "haproxy.cfg"),
		logPath:  logPath,
		log:      logf,
		frontend: frontend,
		haproxy:  o.haproxy,
		seamless: o.seamless,
	}, nil
}

// sleepUntil waits until t or until ctx ends. It paces reload requests; it
// never stands in for waiting on a condition.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100).
func percentile(ds []time.Duration, p float64) (time.Duration, bool) {
	if len(ds) == 0 {
		return 0, false
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(float64(len(s))*p/100)) - 1
	return s[min(max(rank, 0), len(s)-1)], true
}

// errorSummary formats failure classes, most frequent first.
func errorSummary(errs map[string]int64) string {
	classes := make([]string, 0, len(errs))
	for c := range errs {
		classes = append(classes, c)
	}
	slices.SortFunc(classes, func(a, b string) int {
		if errs[a] != errs[b] {
			return int(errs[b] - errs[a])
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(classes))
	for i, c := range classes {
		parts[i] = fmt.Sprintf("%s: %d", c, errs[c])
	}
	return strings.Join(parts, ", ")
}
