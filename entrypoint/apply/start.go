package apply

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

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
	a.saving.Wait() // Run may never come to wait for it
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
		check := validated
		if a.running == nil && a.opts.FirstUnchecked {
			check = unchecked
		}
		err = a.write(ctx, rend.Config, rend.Files, check)
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
	a.applied, a.ranFrom = st.Local(), maps.Clone(a.latest)
	a.setIndexes(consulIndexes(st, rend.Queries))
	a.runRend, a.recheck = &rend, rend.Recheck
	a.publish()
	a.countDiscovered()
	a.opts.Metrics.LastApply.SetToCurrentTime()
	a.setReady(a.startReadiness(missing))
	a.log.Info("configuration written", "path", a.opts.Path, "complete", complete && len(missing) == 0,
		"instances", a.applied.Len())
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
