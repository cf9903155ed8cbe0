// Package apply turns what the discovery sources report into the running
// HAProxy configuration: merge, debounce, render, skip what is unchanged,
// write atomically, validate, reload, confirm, and roll the file back when
// HAProxy does not take it. The file on disk is always what runs.
//
// It never renders over good data because a source failed: sources keep
// their last good data themselves, each snapshot is saved under the state
// directory, and at start a source that does not answer in time is
// represented by what it last said.
package apply

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
	"github.com/seamless-lb/seamless/entrypoint/reload"
)

// Options configure an Applier.
type Options struct {
	// Sources in order of precedence (see model.Merge).
	Sources []model.Source
	// NewRenderer is called at start and at every SIGHUP, so that an
	// edited template is read again.
	NewRenderer func() (model.Renderer, error)
	// Path is the configuration file HAProxy runs.
	Path string
	// StateDir keeps each source's last snapshot.
	StateDir string
	// ReadOnly reads saved snapshots but writes none (seamless render).
	ReadOnly bool
	Wait     Wait
	// StartTimeout bounds how long Start waits for every source's first
	// snapshot.
	StartTimeout time.Duration
	// Validate checks a candidate file as HAProxy would load it instead
	// of Path (haproxy -c).
	Validate func(ctx context.Context, path string) error
	// Reload reloads HAProxy and reports the outcome (reload.Reloader.Do).
	Reload func(ctx context.Context, reason string) (reload.Outcome, error)
	// Runtime, when set, applies renderings that differ only in their
	// server slots without a reload.
	Runtime Runtime
	// StateFile, when set, receives the servers' runtime state before
	// every reload (the template's server-state-file).
	StateFile string
	Metrics   *metrics.Metrics
	Log       *slog.Logger
}

// Applier runs the pipeline. Start it, start HAProxy on Path, then Run.
type Applier struct {
	opts Options
	log  *slog.Logger
	in   chan model.Snapshot
	hup  chan string
	wg   sync.WaitGroup

	// Owned by the goroutine in Start and then Run.
	renderer model.Renderer
	latest   map[string]model.Snapshot
	fresh    map[string]bool // answered since start (not from disk)
	unsaved  map[string]bool // sources whose latest snapshot is not on disk
	wanted   []model.Query
	running  []byte           // the bytes of Path, which HAProxy runs
	runRend  *model.Rendering // the rendering behind running, when known
	recheck  time.Time        // when the state must be rendered again
	applied  model.Catalog    // the local catalog behind running
	refused  [32]byte         // hash of the last candidate HAProxy or -c refused
	backoff  time.Duration    // before the next try after a write error; 0 after a success
	why      string           // why recheck is due, for the log
	skipped  string           // the last rendering's skips, logged when they change
	reasons  []string         // sources changed since the last apply
	// startRend is the rendering of the current state during Start, so
	// that the state that completed the start is not rendered again to be
	// written; take and fillFromDisk, which change the state, clear it.
	startRend *rendered

	ready atomic.Pointer[error]

	mu      sync.Mutex // guards history and view
	history []Record
	view    Running
}

// Record is one apply, for /status.
type Record struct {
	Time     time.Time     `json:"time"`
	Reason   string        `json:"reason"`           // which sources or signal
	Change   string        `json:"change,omitempty"` // what changed, per service
	How      string        `json:"how"`              // metrics.Runtime, Reloaded, Unchanged, Refused, Failed
	Duration time.Duration `json:"duration_ns"`
	Error    string        `json:"error,omitempty"`
}

// retryAfter spaces attempts at a rendering whose reload could not be
// confirmed (as opposed to refused).
const retryAfter = 5 * time.Second

// Writes that fail (disk full, read-only, I/O) are retried after a delay
// that doubles from writeRetryMin to writeRetryMax.
const (
	writeRetryMin = time.Second
	writeRetryMax = 30 * time.Second
)

// historySize is how many applies History keeps.
const historySize = 20

func (a *Applier) record(how, why, change string, start time.Time, err error) {
	a.opts.Metrics.Applies.WithLabelValues(how).Inc()
	a.publish()
	r := Record{Time: start, Reason: why, Change: change, How: how, Duration: time.Since(start)}
	if err != nil {
		r.Error = err.Error()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.history = append(a.history, r)
	if len(a.history) > historySize {
		a.history = slices.Delete(a.history, 0, len(a.history)-historySize)
	}
}

// History returns the latest applies, newest last.
func (a *Applier) History() []Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.history)
}

// New checks the options and returns an Applier.
func New(opts Options) (*Applier, error) {
	if opts.Path == "" || opts.StateDir == "" || opts.NewRenderer == nil || opts.Validate == nil || opts.Reload == nil {
		return nil, errors.New("apply: Path, StateDir, NewRenderer, Validate and Reload are required")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New()
	}
	a := &Applier{
		opts: opts, log: opts.Log.With("component", "apply"),
		in: make(chan model.Snapshot), hup: make(chan string, 1),
		latest: map[string]model.Snapshot{}, fresh: map[string]bool{}, unsaved: map[string]bool{},
	}
	a.setReady(errors.New("first discovery not done"))
	return a, nil
}

func (a *Applier) setReady(err error) { a.ready.Store(&err) }

// Ready is nil once every source has answered and a complete configuration
// has been applied (/readyz). A stale source then gives a *model.Degraded:
// still ready, since its last good data keeps serving.
func (a *Applier) Ready() error {
	if err := *a.ready.Load(); err != nil {
		return err
	}
	var stale []string
	for _, st := range a.Statuses() {
		if st.Stale {
			stale = append(stale, fmt.Sprintf("source %s is stale: %s", st.Name, st.StaleReason))
		}
	}
	if len(stale) > 0 {
		return &model.Degraded{Reason: strings.Join(stale, "; ") + "; its last good data keeps serving"}
	}
	return nil
}

// Reload asks for a re-read of the template and a reload even when nothing
// changed (SIGHUP). It does not block.
func (a *Applier) Reload(reason string) {
	select {
	case a.hup <- reason:
	default: // one is queued already
	}
}

// Statuses reports every source that can say how it is doing.
func (a *Applier) Statuses() []model.SourceStatus {
	var out []model.SourceStatus
	for _, s := range a.opts.Sources {
		if r, ok := s.(model.Reporter); ok {
			st := r.Status()
			st.Name = s.Name()
			out = append(out, st)
		}
	}
	return out
}

// Start starts the sources and writes the first configuration to Path,
// waiting up to StartTimeout for every source. Sources that did not answer
// are represented by their saved snapshot. When the rendering is still
// incomplete and Path holds an earlier configuration, that one is kept.
// The sources run until ctx ends; Wait waits for them.
func (a *Applier) Start(ctx context.Context) error {
	if b, err := os.ReadFile(a.opts.Path); err == nil {
		a.running = b
	}
	complete, err := a.gather(ctx)
	if err != nil {
		return err
	}
	return a.first(ctx, complete)
}

// Render gathers like Start and returns the rendering without writing
// anything (`seamless render`, `seamless check`). Cancel ctx afterwards to
// stop the sources.
func (a *Applier) Render(ctx context.Context) (model.Rendering, error) {
	if _, err := a.gather(ctx); err != nil {
		return model.Rendering{}, err
	}
	return a.renderStart()
}

type rendered struct {
	rend model.Rendering
	err  error
}

// renderStart renders the current state, once per state during Start.
func (a *Applier) renderStart() (model.Rendering, error) {
	if a.startRend == nil {
		rend, err := a.renderer.Render(a.state())
		a.startRend = &rendered{rend, err}
	}
	return a.startRend.rend, a.startRend.err
}

// gather starts the sources and collects their first snapshots until the
// rendering is complete or StartTimeout passes; then it fills in what is
// missing from disk.
func (a *Applier) gather(ctx context.Context) (complete bool, err error) {
	r, err := a.opts.NewRenderer()
	if err != nil {
		return false, err
	}
	a.renderer = r
	// A first rendering over nothing says what the template asks for, so
	// that Consul fetches exactly that from its first request.
	a.startRend = nil
	if rend, err := a.renderStart(); err == nil {
		a.want(rend.Queries)
	}
	for _, s := range a.opts.Sources {
		a.wg.Go(func() { s.Run(ctx, a.in) })
	}
	deadline := time.NewTimer(a.opts.StartTimeout)
	defer deadline.Stop()
	for !a.complete() {
		select {
		case s := <-a.in:
			a.take(s)
		case <-deadline.C:
			a.fillFromDisk()
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return true, nil
}

// Wait returns once every source has returned (after ctx ended).
func (a *Applier) Wait() { a.wg.Wait() }

// complete: the template has every answer, and every source it reads has
// answered. The local catalog merges every source; any other query (KV,
// another datacenter) is answered once it is there. A source the template
// does not read (a static or env-only template) holds nothing up.
func (a *Applier) complete() bool {
	rend, err := a.renderStart()
	if err != nil {
		return true // first() reports it
	}
	a.want(rend.Queries)
	if len(rend.Missing) > 0 || !slices.Contains(rend.Queries, model.LocalCatalog) {
		return len(rend.Missing) == 0
	}
	for _, s := range a.opts.Sources {
		if !a.fresh[s.Name()] {
			return false
		}
	}
	return true
}

func (a *Applier) fillFromDisk() {
	for _, s := range a.opts.Sources {
		name := s.Name()
		if a.fresh[name] {
			continue
		}
		snap, at, err := LoadSnapshot(a.opts.StateDir, name)
		switch {
		case err == nil:
			a.latest[name], a.startRend = snap, nil
			a.log.Warn("source did not answer in time; starting with what it said last, and applying its news when it answers",
				"source", name, "saved_at", at, "timeout", a.opts.StartTimeout)
		case errors.Is(err, os.ErrNotExist):
			a.log.Warn("source did not answer in time and nothing of it is saved; its services are missing until it answers",
				"source", name, "timeout", a.opts.StartTimeout)
		default:
			a.log.Warn("source did not answer in time and its saved snapshot is unreadable", "source", name, "err", err)
		}
	}
}

// first writes the configuration HAProxy starts with.
func (a *Applier) first(ctx context.Context, complete bool) error {
	a.save()
	st := a.state()
	rend, err := a.renderStart()
	a.startRend = nil // Run renders afresh: the clock moves drains on
	if err == nil && len(rend.Missing) > 0 && a.running != nil {
		a.log.Warn("starting with the last applied configuration: the template still waits for data",
			"path", a.opts.Path, "missing", queryList(rend.Missing))
		return nil
	}
	missing := rend.Missing
	if err == nil && len(missing) > 0 && rend.Config == nil {
		// Nothing runs, and the template renders nothing without its
		// data (the built-in one without a catalog): start from empty
		// answers, so that HAProxy serves its frontends (503 for every
		// host) until the sources answer, rather than not at all.
		a.log.Warn("starting with no data: the sources have not answered and nothing is saved; every route answers 503 until they do",
			"missing", queryList(missing))
		rend, err = a.renderer.Render(a.emptyAnswers(missing))
	}
	if err == nil {
		a.logSkipped(rend)
		err = a.write(ctx, rend.Config)
	}
	if err != nil {
		if a.running != nil {
			a.log.Error("the new configuration is refused; starting with the last applied one",
				"path", a.opts.Path, "err", err)
			return nil
		}
		return err
	}
	commit(rend)
	a.applied = st.Local()
	a.runRend, a.recheck = &rend, rend.Recheck
	a.publish()
	a.countDiscovered()
	a.opts.Metrics.LastApply.SetToCurrentTime()
	a.setReady(a.startReadiness(missing))
	a.log.Info("configuration written", "path", a.opts.Path, "complete", complete && len(missing) == 0,
		"instances", len(a.applied.Instances))
	return nil
}

// startReadiness says why the first configuration is not the one to
// serve yet: a source that has not answered, else data the template still
// waits for; nil when complete.
func (a *Applier) startReadiness(missing []model.Query) error {
	for _, s := range a.opts.Sources {
		if !a.fresh[s.Name()] {
			return fmt.Errorf("source %s has not answered yet", s.Name())
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the template still waits for %s", queryList(missing))
	}
	return nil
}

// emptyAnswers is the current state with the queries in missing answered
// as empty (no instances, no key).
func (a *Applier) emptyAnswers(missing []model.Query) model.State {
	snaps := maps.Clone(a.latest)
	empty := model.Snapshot{Source: "\x00empty", Results: map[model.Query]model.Result{}}
	for _, q := range missing {
		empty.Results[q] = model.Result{}
	}
	snaps[empty.Source] = empty
	order := make([]string, 0, len(a.opts.Sources)+1)
	for _, s := range a.opts.Sources {
		order = append(order, s.Name())
	}
	return model.Merge(snaps, append(order, empty.Source))
}

// Run applies changes until ctx ends.
func (a *Applier) Run(ctx context.Context) {
	d := newDebouncer(a.opts.Wait)
	recheck := time.NewTimer(time.Hour)
	recheck.Stop()
	var due time.Time
	for {
		if !a.recheck.Equal(due) {
			due = a.recheck
			recheck.Stop()
			if !due.IsZero() {
				recheck.Reset(max(time.Until(due), 0))
			}
		}
		select {
		case <-ctx.Done():
			a.save()
			return
		case <-recheck.C:
			due, a.recheck = time.Time{}, time.Time{}
			why := cmp.Or(a.why, "drain finished")
			a.why = ""
			a.reasons = append(a.reasons, why)
			a.apply(ctx, false)
		case s := <-a.in:
			if a.take(s) {
				a.reasons = append(a.reasons, s.Source)
				d.touch()
			}
		case <-d.C():
			d.fired()
			a.apply(ctx, false)
		case sig := <-a.hup:
			r, err := a.opts.NewRenderer()
			if err != nil {
				a.record(metrics.Refused, sig, "", time.Now(), err)
				a.opts.Metrics.ConfigErrors.Inc()
				a.log.Error("template refused on "+sig+"; the running configuration keeps serving; fix it and send "+sig+" again", "err", err)
				continue
			}
			a.renderer = r
			a.reasons = append(a.reasons, sig)
			a.apply(ctx, true)
		}
	}
}

// take records a snapshot and reports whether it changed anything. A
// query the snapshot does not answer keeps its earlier answer (from this
// run or from disk): a source that could not reach its backend says
// nothing about it, and nothing must not render as empty. A snapshot that
// answers nothing at all is not an answer.
func (a *Applier) take(s model.Snapshot) bool {
	a.opts.Metrics.SourceSnapshots.WithLabelValues(s.Source).Inc()
	if len(s.Results) == 0 {
		a.log.Debug("source answered nothing yet", "source", s.Source)
		return false
	}
	first := !a.fresh[s.Source]
	a.fresh[s.Source] = true
	old, had := a.latest[s.Source]
	if had {
		results := maps.Clone(s.Results)
		for q, r := range old.Results {
			if _, ok := results[q]; !ok {
				results[q] = r
			}
		}
		s.Results = results
	}
	if had && !first && reflect.DeepEqual(old.Results, s.Results) {
		return false
	}
	a.latest[s.Source], a.startRend = s, nil
	a.unsaved[s.Source] = true
	return true
}

// save writes the snapshots taken since the last save: once per apply,
// not once per snapshot, since a catalog can be megabytes of JSON.
func (a *Applier) save() {
	if a.opts.ReadOnly {
		return
	}
	for name := range a.unsaved {
		if err := SaveSnapshot(a.opts.StateDir, a.latest[name], time.Now()); err != nil {
			a.log.Warn("cannot save the source's snapshot; a restart while it is unreachable would start without it",
				"source", name, "dir", a.opts.StateDir, "err", err)
		}
	}
	clear(a.unsaved)
}

func (a *Applier) state() model.State {
	order := make([]string, len(a.opts.Sources))
	for i, s := range a.opts.Sources {
		order[i] = s.Name()
	}
	return model.Merge(a.latest, order)
}

func (a *Applier) want(qs []model.Query) {
	if slices.Equal(qs, a.wanted) {
		return
	}
	a.wanted = slices.Clone(qs)
	for _, s := range a.opts.Sources {
		if w, ok := s.(model.Wanter); ok {
			w.Want(qs)
		}
	}
}

// apply renders the current state and makes it run. force reloads even
// when the bytes are unchanged (SIGHUP).
func (a *Applier) apply(ctx context.Context, force bool) {
	start := time.Now()
	why := strings.Join(compact(a.reasons), ", ")
	a.reasons = nil
	a.save()
	st := a.state()
	rend, err := a.renderer.Render(st)
	m := a.opts.Metrics
	if err != nil {
		a.record(metrics.Refused, why, "", start, err)
		m.ConfigErrors.Inc()
		a.log.Error("template failed; the running configuration keeps serving; fix the template and send SIGHUP",
			"why", why, "err", err)
		return
	}
	a.want(rend.Queries)
	a.logSkipped(rend)
	if len(rend.Missing) > 0 {
		a.log.Debug("waiting for data the template needs", "missing", queryList(rend.Missing))
		return
	}
	a.recheck, a.why = rend.Recheck, ""
	change := a.brief(why, describe(Change(a.applied, st.Local()), a.runRend, rend))
	if bytes.Equal(rend.Config, a.running) && !force {
		commit(rend)
		a.runRend = &rend
		a.applied = st.Local()
		a.countDiscovered()
		a.markApplied()
		a.record(metrics.Unchanged, why, unchangedLabel(change), start, nil)
		a.log.Info("nothing to apply: the configuration is unchanged", "why", why, "change", change)
		return
	}
	sum := sha256.Sum256(rend.Config)
	if sum == a.refused && !force {
		a.log.Debug("configuration already refused, waiting for a different one", "why", why)
		return
	}
	if a.runtimeApplies(rend, force) {
		err := a.runtime(ctx, rend)
		if err == nil {
			commit(rend)
			a.applied = st.Local()
			a.countDiscovered()
			a.markApplied()
			a.record(metrics.Runtime, why, change, start, nil)
			m.RuntimeUpdates.WithLabelValues(metrics.Success).Inc()
			a.log.Info("applied over the runtime API, no reload", "why", why, "change", change,
				"duration", time.Since(start).Round(time.Millisecond))
			return
		}
		if ctx.Err() != nil {
			return
		}
		m.RuntimeUpdates.WithLabelValues(metrics.Failure).Inc()
		a.log.Warn("runtime update failed; reloading instead", "why", why, "change", change, "err", err)
	}
	a.saveServerState(ctx, rend)
	previous := a.running
	if !bytes.Equal(rend.Config, a.running) {
		if err := a.write(ctx, rend.Config); err != nil {
			if transient(err) {
				a.retryLater(why, change, start, err)
				return
			}
			a.refused = sum
			a.record(metrics.Refused, why, change, start, err)
			m.ConfigErrors.Inc()
			a.log.Error("new configuration refused; the running one keeps serving",
				"why", why, "change", change, "err", err)
			return
		}
	}
	o, err := a.opts.Reload(ctx, "discovery: "+why)
	if err != nil || !o.OK {
		// HAProxy runs the previous file: put it back, so that the file
		// on disk stays what runs (also when stopping).
		if !bytes.Equal(previous, rend.Config) && previous != nil {
			if err := WriteFile(a.opts.Path, previous, 0o640); err != nil {
				a.log.Error("cannot restore the configuration HAProxy runs", "path", a.opts.Path, "err", err)
			} else {
				a.running = previous
			}
		}
	}
	if err != nil {
		return // stopping
	}
	if !o.OK {
		var ce *haproxy.ConfigError
		if errors.Is(o.Err, reload.ErrRefused) || errors.As(o.Err, &ce) && !transient(o.Err) {
			// The same bytes would fail again: wait for different ones.
			a.refused = sum
		} else {
			// Not confirmed in time, or haproxy -c could not run: try
			// the same rendering again later.
			a.recheck, a.why = time.Now().Add(retryAfter), "retrying the reload"
		}
		a.record(metrics.Failed, why, change, start, o.Err)
		a.log.Error("HAProxy did not take the new configuration; the file is back to what runs",
			"why", why, "change", change, "err", o.Err)
		return
	}
	commit(rend)
	a.applied = st.Local()
	a.runRend = &rend
	a.countDiscovered()
	a.markApplied()
	a.record(metrics.Reloaded, why, change, start, nil)
	a.log.Info("applied with a reload", "why", why, "change", change, "duration", time.Since(start).Round(time.Millisecond))
}

// commit tells the renderer that HAProxy runs rend: only now does what
// it keeps for the next rendering (the slot table) move.
func commit(rend model.Rendering) {
	if rend.Commit != nil {
		rend.Commit()
	}
}

// runtimeApplies: rend differs from what runs only in its server slots.
func (a *Applier) runtimeApplies(rend model.Rendering, force bool) bool {
	return !force && a.opts.Runtime != nil && a.runRend != nil && len(rend.Servers) > 0 &&
		len(rend.Structure) > 0 && bytes.Equal(rend.Structure, a.runRend.Structure)
}

// runtime changes the slots over the runtime API, checks that HAProxy
// runs them, and writes the file, so that a later reload changes nothing.
func (a *Applier) runtime(ctx context.Context, rend model.Rendering) error {
	cmds, err := plan(a.runRend.Servers, rend.Servers)
	if err != nil {
		return err
	}
	if err := a.opts.Runtime.Apply(ctx, cmds); err != nil {
		return err
	}
	_, states, err := a.opts.Runtime.ServersState(ctx)
	if err != nil {
		return err
	}
	if err := verify(rend.Servers, states, touchedSlots(cmds)); err != nil {
		return err
	}
	if err := WriteFile(a.opts.Path, rend.Config, 0o640); err != nil {
		return fmt.Errorf("HAProxy runs the change, but the file could not follow: %w", err)
	}
	a.running, a.runRend = rend.Config, &rend
	a.log.Debug("runtime commands", "commands", strings.Join(cmds, "; "))
	return nil
}

// saveServerState keeps the servers' runtime state for the next worker.
func (a *Applier) saveServerState(ctx context.Context, next model.Rendering) {
	if a.opts.StateFile == "" || a.opts.Runtime == nil {
		return
	}
	state := "1\n"
	var prev []model.ServerSlot
	if a.runRend != nil {
		prev = a.runRend.Servers
	}
	if raw, _, err := a.opts.Runtime.ServersState(ctx); err == nil {
		state = keepState(raw, prev, next.Servers)
	} else {
		a.log.Warn("cannot save the servers' runtime state; the new worker starts from the file", "err", err)
	}
	if err := WriteFile(a.opts.StateFile, []byte(state), 0o640); err != nil {
		a.log.Warn("cannot write the server-state file", "path", a.opts.StateFile, "err", err)
	}
}

// markApplied: a complete rendering runs; ready once every source has
// answered for itself.
func (a *Applier) markApplied() {
	a.opts.Metrics.LastApply.SetToCurrentTime()
	for _, s := range a.opts.Sources {
		if !a.fresh[s.Name()] {
			a.setReady(fmt.Errorf("source %s has not answered yet", s.Name()))
			return
		}
	}
	a.setReady(nil)
}

// WriteError is a configuration that could not be written (disk full,
// read-only file system, I/O or permission error): a fault of the disk,
// not of the configuration, so it is retried.
type WriteError struct {
	Path string
	Err  error
}

func (e *WriteError) Error() string { return fmt.Sprintf("cannot write %s: %v", e.Path, e.Err) }
func (e *WriteError) Unwrap() error { return e.Err }

// transient: err says nothing against the configuration, so the same
// bytes may pass later. Only a *haproxy.ConfigError is a refusal, and not
// one for a taken port (another process may free it); a disk that fails,
// or a haproxy -c that cannot run at all (no fork, no file descriptor, a
// timeout), is retried.
func transient(err error) bool {
	var ce *haproxy.ConfigError
	var be *haproxy.BindError
	return !errors.As(err, &ce) || errors.As(err, &be)
}

// retryLater schedules another attempt at a rendering that could not be
// written or validated for a transient reason, backing off.
func (a *Applier) retryLater(why, change string, start time.Time, err error) {
	a.backoff = min(max(a.backoff*2, writeRetryMin), writeRetryMax)
	if next := time.Now().Add(a.backoff); a.recheck.IsZero() || next.Before(a.recheck) {
		a.recheck, a.why = next, "retrying the new configuration"
	}
	a.record(metrics.Failed, why, change, start, err)
	msg := "cannot validate the new configuration now; the running one keeps serving, retrying"
	var we *WriteError
	var be *haproxy.BindError
	switch {
	case errors.As(err, &we):
		a.opts.Metrics.ConfigWriteErrors.Inc()
		msg = "cannot write the new configuration; the running one keeps serving, retrying"
	case errors.As(err, &be):
		msg = "a listening address of the new configuration is taken; the running one keeps serving, retrying until it is free"
	}
	a.log.Error(msg, "why", why, "change", change, "retry_in", a.backoff, "err", err)
}

// write validates data as a candidate beside Path and renames it into
// place; Path is untouched when validation fails. Failures of the disk
// are *WriteError.
func (a *Applier) write(ctx context.Context, data []byte) error {
	cand := a.opts.Path + ".new"
	if err := WriteFile(cand, data, 0o640); err != nil {
		return &WriteError{Path: cand, Err: err}
	}
	if err := a.opts.Validate(ctx, cand); err != nil {
		return err
	}
	if err := os.Rename(cand, a.opts.Path); err != nil {
		return &WriteError{Path: a.opts.Path, Err: err}
	}
	if err := syncDir(filepath.Dir(a.opts.Path)); err != nil {
		return &WriteError{Path: filepath.Dir(a.opts.Path), Err: err}
	}
	a.running, a.backoff = data, 0
	return nil
}

func (a *Applier) logSkipped(rend model.Rendering) {
	s := strings.Join(rend.Skipped, "\n")
	if s == a.skipped {
		return
	}
	a.skipped = s
	for _, line := range rend.Skipped {
		a.log.Warn("left out of the configuration: " + line)
	}
}

func (a *Applier) countDiscovered() {
	names := map[string]bool{}
	n := 0
	for _, in := range a.applied.Instances {
		if !consulItself(in) {
			names[in.Name] = true
			n++
		}
	}
	a.opts.Metrics.Discovered.WithLabelValues("services").Set(float64(len(names)))
	a.opts.Metrics.Discovered.WithLabelValues("instances").Set(float64(n))
}

func compact(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

func queryList(qs []model.Query) string {
	s := make([]string, len(qs))
	for i, q := range qs {
		s[i] = q.String()
	}
	return strings.Join(s, ", ")
}
