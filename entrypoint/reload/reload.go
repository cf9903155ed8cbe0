// Package reload turns reload requests into validated, serialised,
// confirmed HAProxy reloads.
//
// Plain HAProxy drops a SIGUSR2 that arrives while the master re-executes,
// so the running configuration can silently drift from the file. Here a
// request is never dropped: requests that arrive while a reload runs are
// coalesced into exactly one follow-up reload, which reads the newest file.
package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
)

// ErrRefused: HAProxy answered that the new configuration did not load
// (often a bind error that haproxy -c cannot see).
var ErrRefused = errors.New("HAProxy refused the new configuration")

// Master is the part of HAProxy's master CLI a reload needs.
type Master interface {
	Reload(ctx context.Context) (haproxy.ReloadResult, error)
}

// Checker validates the configuration (haproxy -c) and keeps track of
// what runs (haproxy.Validator, whose bind guard probes only the
// addresses a candidate adds): Loaded tells it that HAProxy took the
// configuration it last passed, for certain or perhaps (sent, not
// confirmed). Loaded is part of the interface rather than asked for: a
// checker wrapped for /status once hid it, and the guard then kept the
// addresses HAProxy started with as running.
type Checker interface {
	Check(ctx context.Context) error
	Loaded(certain bool)
}

// Outcome is the result of one reload, reported to OnDone (tests, status).
type Outcome struct {
	Reasons  []string
	OK       bool
	Err      error
	Duration time.Duration
	Result   haproxy.ReloadResult
	// Retry: HAProxy never took the reload (busy or not answering), so the
	// same request is made again. A reload that was sent but not
	// confirmed is not repeated: a configuration slower to load than the
	// timeout would otherwise reload forever.
	Retry bool
}

// Reloader serialises reloads. Create it with New and run it with Run.
type Reloader struct {
	master  Master
	checker Checker
	tap     *haproxy.LogTap // may be nil
	metrics *metrics.Metrics
	log     *slog.Logger
	timeout time.Duration

	// OnDone, when set before Run, is called after every reload attempt.
	OnDone func(Outcome)

	mu      sync.Mutex
	pending []string
	waiters []chan Outcome
	wake    chan struct{}
	// closing ends when Close is called.
	closing context.Context
	close   context.CancelFunc
	busy    atomic.Bool
	gen     atomic.Uint64 // reload attempts begun and ended
}

// New returns a Reloader. tap may be nil; log may be nil.
func New(master Master, checker Checker, tap *haproxy.LogTap, m *metrics.Metrics, log *slog.Logger, timeout time.Duration) *Reloader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	closing, closeFn := context.WithCancel(context.Background())
	return &Reloader{
		closing: closing, close: closeFn,
		master: master, checker: checker, tap: tap, metrics: m,
		log: log.With("component", "reload"), timeout: timeout,
		wake: make(chan struct{}, 1),
	}
}

// Request asks for a reload and returns at once. reason says why
// ("SIGHUP", "config changed: ...").
func (r *Reloader) Request(reason string) {
	r.metrics.ReloadRequests.Inc()
	r.mu.Lock()
	if len(r.pending) > 0 {
		r.metrics.ReloadsCoalesced.Inc()
	}
	r.pending = append(r.pending, reason)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default: // a wake-up is already queued; it will see this reason
	}
}

// Do requests a reload and waits for the outcome of the attempt that
// served it: the first one that reached HAProxy, or failed validation. It
// returns ctx's error if ctx ends first, and an error once the Reloader is
// closed.
func (r *Reloader) Do(ctx context.Context, reason string) (Outcome, error) {
	w := make(chan Outcome, 1)
	r.mu.Lock()
	r.waiters = append(r.waiters, w)
	r.mu.Unlock()
	r.Request(reason)
	select {
	case o := <-w:
		return o, nil
	case <-ctx.Done():
		return Outcome{}, ctx.Err()
	case <-r.closing.Done():
		return Outcome{}, errors.New("reloader closed")
	}
}

// Close stops taking requests: Run returns once the reload in flight, if
// any, has finished. Cancelling Run's ctx instead abandons it.
func (r *Reloader) Close() { r.close() }

// Run performs reloads one at a time until ctx ends or Close is called.
func (r *Reloader) Run(ctx context.Context) {
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.closing.Done():
			return
		case <-r.wake:
		case <-retry:
			retry = nil
		}
		// select picks at random among ready cases: a stop must win over
		// a queued request.
		if r.isClosed() {
			return
		}
		r.mu.Lock()
		reasons, waiters := r.pending, r.waiters
		r.pending, r.waiters = nil, nil
		r.mu.Unlock()
		if len(reasons) == 0 {
			continue
		}
		r.busy.Store(true)
		r.gen.Add(1)
		o := r.reload(ctx, reasons)
		r.gen.Add(1)
		r.busy.Store(false)
		if r.OnDone != nil {
			r.OnDone(o)
		}
		if o.Retry {
			// Never sent: HAProxy may be running an older file than the
			// one asked for, so the request stays.
			r.mu.Lock()
			r.pending = append(reasons, r.pending...)
			r.waiters = append(waiters, r.waiters...)
			r.mu.Unlock()
			retry = time.After(retryDelay)
			continue
		}
		for _, w := range waiters {
			w <- o
		}
	}
}

// retryDelay spaces attempts at a reload that could not be confirmed.
const retryDelay = time.Second

func (r *Reloader) isClosed() bool { return r.closing.Err() != nil }

// Busy reports whether a reload is in flight; a signal forwarded to the
// master while it re-executes would be lost or kill it.
func (r *Reloader) Busy() bool { return r.busy.Load() }

// Generation counts the reload attempts begun and ended: odd while one is
// in flight. Only a reload changes the master's current worker (the
// master exits when it dies, and seamless with it), so while the
// generation stays even and the same, the current worker is the one
// found last (haproxy.Runtime.Generation).
func (r *Reloader) Generation() uint64 { return r.gen.Load() }

func (r *Reloader) reload(ctx context.Context, reasons []string) Outcome {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	why := Summarise(reasons)
	o := Outcome{Reasons: reasons}
	var mark uint64
	if r.tap != nil {
		mark = r.tap.Mark()
	}

	// A stop cancels a reload that has not reached HAProxy yet.
	vctx, vcancel := context.WithCancel(ctx)
	defer vcancel()
	defer context.AfterFunc(r.closing, vcancel)()
	if err := r.checker.Check(vctx); err != nil {
		if r.isClosed() {
			o.Err = fmt.Errorf("stopping: %w", err)
			r.log.Info("reload abandoned, stopping", "reason", why)
			return o
		}
		o.Err = err
		o.Duration = time.Since(start)
		r.metrics.Reloads.WithLabelValues(metrics.Failure).Inc()
		var ce *haproxy.ConfigError
		if errors.As(err, &ce) {
			r.metrics.ConfigErrors.Inc()
			r.log.Error("configuration refused, not reloading; the running configuration keeps serving; fix the file and send SIGHUP again",
				"reason", why, "alerts", strings.Join(ce.Alerts, "\n"), "duration", o.Duration)
		} else {
			r.log.Error("could not validate the configuration, not reloading", "reason", why, "err", err)
		}
		return o
	}

	if r.isClosed() {
		o.Err = errors.New("stopping")
		r.log.Info("reload abandoned, stopping", "reason", why)
		return o
	}
	r.log.Debug("configuration valid, reloading", "reason", why, "validated_in", time.Since(start))
	res, err := r.master.Reload(ctx)
	o.Result, o.Duration = res, time.Since(start)
	r.metrics.ReloadDuration.Observe(o.Duration.Seconds())
	switch {
	case errors.Is(err, haproxy.ErrNotSent):
		// Nothing happened; the request stays and is tried again.
		o.Err, o.Retry = err, true
		r.log.Warn("HAProxy did not take the reload yet (still busy with an earlier one?); trying again",
			"reason", why, "duration", o.Duration, "retry_in", retryDelay, "err", err)
	case err != nil:
		o.Err = err
		r.checker.Loaded(false)
		r.metrics.Reloads.WithLabelValues(metrics.Failure).Inc()
		r.log.Error("reload sent but its outcome not confirmed (see err: SEAMLESS_RELOAD_TIMEOUT passed, or the master's counters did not tell); HAProxy may still be loading it, check its messages above",
			"reason", why, "duration", o.Duration, "err", err)
	case !res.OK:
		o.Err = ErrRefused
		r.metrics.Reloads.WithLabelValues(metrics.Failure).Inc()
		r.log.Error("reload failed, old workers keep serving the previous configuration; often a bind error that haproxy -c cannot see",
			"reason", why, "duration", o.Duration, "haproxy", r.messages(ctx, res, mark))
	default:
		o.OK = true
		r.checker.Loaded(true)
		r.metrics.Reloads.WithLabelValues(metrics.Success).Inc()
		r.metrics.LastReloadSuccess.SetToCurrentTime()
		r.log.Info("reloaded", "reason", why, "duration", o.Duration,
			"new_workers", res.NewWorkers, "old_workers", len(res.Procs.Old))
	}
	if res.Procs.Master.Pid != 0 {
		r.metrics.Workers.WithLabelValues("current").Set(float64(len(res.Procs.Workers)))
		r.metrics.Workers.WithLabelValues("old").Set(float64(len(res.Procs.Old)))
	}
	return o
}

// messages returns HAProxy's start-up messages for a failed reload: from
// the CLI answer on 2.7+, else from its output since the reload began. The
// output is read through a pipe, so give it a moment to arrive.
func (r *Reloader) messages(ctx context.Context, res haproxy.ReloadResult, mark uint64) string {
	if res.Messages != "" || r.tap == nil {
		return res.Messages
	}
	deadline := time.Now().Add(500 * time.Millisecond)
	for {
		lines := r.tap.Startup(mark)
		for _, l := range lines {
			if strings.Contains(l, "Loading failure") {
				return strings.Join(lines, "\n")
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return strings.Join(lines, "\n")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Summarise turns ["SIGHUP","SIGHUP","SIGUSR2"] into "SIGHUP ×2, SIGUSR2".
func Summarise(reasons []string) string {
	var order []string
	count := map[string]int{}
	for _, r := range reasons {
		if count[r] == 0 {
			order = append(order, r)
		}
		count[r]++
	}
	parts := make([]string, len(order))
	for i, r := range order {
		parts[i] = r
		if count[r] > 1 {
			parts[i] = fmt.Sprintf("%s ×%d", r, count[r])
		}
	}
	return strings.Join(parts, ", ")
}
