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
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// Vouch, when set, is told of a candidate written without Validate
	// because it differs from what runs only in moved servers, so that
	// what checks the file again before the reload can pass it as well;
	// data is the content written to path.
	Vouch func(path string, data []byte) error
	// FirstUnchecked: when Path does not exist, so that no HAProxy runs a
	// configuration a bad one could replace, the first is written without
	// Validate and HAProxy's start is its check. That start parses the
	// file as haproxy -c does and exits on what it would refuse; checking
	// before doubles the time to the first served request (seconds at
	// 100,000 servers). Leave it false where Validate says more than
	// HAProxy would (it names a template's lines).
	FirstUnchecked bool
	// Reload reloads HAProxy and reports the outcome (reload.Reloader.Do).
	Reload func(ctx context.Context, reason string) (reload.Outcome, error)
	// Runtime, when set, applies renderings that differ only in their
	// server slots without a reload.
	Runtime Runtime
	// MovesInPlace, when set and true, lets Runtime apply a rendering
	// without slots (a template of yours) that differs only in servers
	// moved (movesOnly): it says that HAProxy sends a keep-alive client's
	// next request to a server's new address after `set server addr`, as
	// 3.0 and 3.2 do; 2.6 keeps sending a busy one to the old address,
	// where a reload moves it.
	MovesInPlace func() bool
	// StateFile, when set, receives the servers' runtime state before
	// every reload (the template's server-state-file).
	StateFile string
	// Serving, when set, is closed once HAProxy serves the first
	// configuration. Until then Run applies nothing: a runtime change has
	// no worker to reach, and a reload during HAProxy's own first load is
	// answered busy (3.1+) and was once seen, on 3.2, to get no outcome
	// for a minute. What comes meanwhile is applied together once it
	// serves. nil: HAProxy serves already.
	Serving <-chan struct{}
	Metrics *metrics.Metrics
	Log     *slog.Logger
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
	merger   model.Merger    // merges latest, reading only what changed
	fresh    map[string]bool // answered since start (not from disk)
	unsaved  map[string]bool // sources whose latest snapshot is not on disk
	// Path was renamed without syncing its directory (a runtime change,
	// or a save whose sync failed); the next save syncs it.
	unsynced atomic.Bool
	wanted   []model.Query
	running  []byte // the bytes of Path, which HAProxy runs
	// HAProxy confirmed that it runs running (a reload, a runtime change,
	// its start): not so between a write and the reload's outcome.
	taken   bool
	runRend *model.Rendering  // the rendering behind running, when known
	recheck time.Time         // when the state must be rendered again
	applied model.Catalog     // the local catalog behind running
	indexes map[string]uint64 // the Consul indexes behind running, by datacenter
	refused [32]byte          // hash of the last candidate HAProxy or -c refused
	backoff time.Duration     // before the next try after a write error; 0 after a success
	why     string            // why recheck is due, for the log
	skipped string            // the last rendering's skips, logged when they change
	reasons []string          // sources changed since the last apply
	savedAt time.Time         // the last save of the snapshots
	saveDue time.Time         // when the snapshots not saved yet are; zero: none waits
	saves   int               // saves of the snapshots, for the tests
	saving  sync.WaitGroup    // the save in progress

	// diverged: a runtime change failed, perhaps partway, and no reload
	// has succeeded since: HAProxy may run part of a rendering that is
	// not running. Only a reload puts it back in step with the file.
	diverged bool
	// untrusted are the slots such changes touched: their runtime state
	// is not carried over that reload (saveServerState).
	untrusted map[string]bool
	// encodeCaches keep each source's last save's encoding, for the
	// saving goroutine (one at a time).
	encodeCaches map[string]*encodeCache
	// ranFrom is latest as it was when running was rendered.
	ranFrom map[string]model.Snapshot
	// startRend is the rendering of the current state during Start, so
	// that the state that completed the start is not rendered again to be
	// written; take and fillFromDisk, which change the state, clear it.
	startRend *rendered

	ready atomic.Pointer[error]

	mu        sync.Mutex // guards history and published
	history   []Record
	published published
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
		encodeCaches: map[string]*encodeCache{},
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

// Run applies changes until ctx ends.
func (a *Applier) Run(ctx context.Context) {
	d := newDebouncer(a.opts.Wait)
	recheck := time.NewTimer(time.Hour)
	recheck.Stop()
	var due time.Time
	saveTimer := time.NewTimer(time.Hour)
	saveTimer.Stop()
	var saveDue time.Time
	serving := a.opts.Serving // nil once HAProxy serves
	a.taken = serving == nil && a.running != nil
	held, heldForce := false, false
	apply := func(force bool) {
		if serving == nil {
			a.apply(ctx, force)
			return
		}
		why := strings.Join(compact(a.reasons), ", ")
		if !held {
			a.log.Info("a change waits for HAProxy to serve its first configuration", "why", why)
		} else {
			a.log.Debug("this change waits too", "why", why)
		}
		held, heldForce = true, heldForce || force
	}
	for {
		if !a.recheck.Equal(due) {
			due = a.recheck
			recheck.Stop()
			if !due.IsZero() {
				recheck.Reset(max(time.Until(due), 0))
			}
		}
		if !a.saveDue.Equal(saveDue) {
			saveDue = a.saveDue
			saveTimer.Stop()
			if !saveDue.IsZero() {
				saveTimer.Reset(max(time.Until(saveDue), 0))
			}
		}
		select {
		case <-ctx.Done():
			a.log.Info("discovery stopped: changes are no longer applied")
			a.saveNow()
			a.saving.Wait()
			return
		case <-saveTimer.C:
			saveDue = time.Time{}
			a.saveNow()
		case <-serving:
			serving = nil
			a.taken = a.running != nil
			if held {
				held = false
				a.apply(ctx, heldForce)
			}
		case <-recheck.C:
			due, a.recheck = time.Time{}, time.Time{}
			why := cmp.Or(a.why, "drain finished")
			a.why = ""
			a.reasons = append(a.reasons, why)
			apply(false)
		case s := <-a.in:
			if a.take(s) {
				a.reasons = append(a.reasons, s.Source)
				d.touch()
			}
		case <-d.C():
			d.fired()
			apply(false)
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
			apply(true)
		}
	}
}

// apply renders the current state and makes it run: plan how, execute,
// record. force reloads even when the bytes are unchanged (SIGHUP).
func (a *Applier) apply(ctx context.Context, force bool) {
	if ctx.Err() != nil {
		return // stopping: a timer that fired with the stop applies nothing
	}
	at := attempt{start: time.Now(), why: strings.Join(compact(a.reasons), ", "), force: force}
	a.reasons = nil
	// Saved once the change runs (or failed): the save encodes and syncs
	// whole snapshots, which is no part of the change's way to HAProxy.
	defer a.save()
	st := a.state()
	rend, err := a.renderer.Render(st)
	if err != nil {
		a.record(metrics.Refused, at.why, "", at.start, err)
		a.opts.Metrics.ConfigErrors.Inc()
		// A template's error, or a rendering HAProxy could not start
		// with (the error says what to change).
		a.log.Error("cannot render the new configuration; the running one keeps serving; fix what the error names (a template: then send SIGHUP)",
			"why", at.why, "err", err)
		return
	}
	a.want(rend.Queries)
	a.logSkipped(rend)
	if len(rend.Missing) > 0 {
		a.log.Debug("waiting for data the template needs", "missing", queryList(rend.Missing))
		return
	}
	a.recheck, a.why = rend.Recheck, ""
	at.rend, at.catalog, at.indexes = rend, st.Local(), consulIndexes(st, rend.Queries)
	at.change = a.brief(at.why, describe(Change(a.applied, at.catalog), a.runRend, rend))
	switch a.plan(&at) {
	case unchanged:
		a.took(at, metrics.Unchanged)
	case refusedBefore:
		a.log.Debug("configuration already refused, waiting for a different one", "why", at.why)
	case runtimeUpdate:
		if !a.updateRuntime(ctx, at) {
			a.reloadWith(ctx, at)
		}
	case reloadNeeded:
		a.reloadWith(ctx, at)
	}
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
