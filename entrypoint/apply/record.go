package apply

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/metrics"
	"github.com/seamless-lb/seamless/entrypoint/model"
)

// Record is one apply, for /status.
type Record struct {
	Time     time.Time     `json:"time"`
	Reason   string        `json:"reason"`           // which sources or signal
	Change   string        `json:"change,omitempty"` // what changed, per service
	How      string        `json:"how"`              // metrics.Runtime, Reloaded, Unchanged, Refused, Failed
	Duration time.Duration `json:"duration_ns"`
	Error    string        `json:"error,omitempty"`
}

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

// took records that HAProxy runs at's rendering, how (metrics.Unchanged,
// Runtime or Reloaded): the renderer commits it, /status and the metrics
// follow, and the applier is ready once every source has answered.
func (a *Applier) took(at attempt, how string) {
	commit(at.rend)
	// The running bytes are the rendering's own array (the same bytes when
	// unchanged): the renderer's cache holds it, and an older one kept
	// here would hold the configuration twice.
	// Unchanged bytes are as taken as before: after a restore that
	// failed they are a candidate HAProxy refused.
	a.running, a.taken = at.rend.Config, a.taken || how != metrics.Unchanged
	a.applied, a.runRend, a.ranFrom = at.catalog, &at.rend, maps.Clone(a.latest)
	a.setIndexes(at.indexes)
	a.countDiscovered()
	a.markApplied()
	change := at.change
	if how == metrics.Unchanged {
		change = unchangedLabel(change)
	}
	a.record(how, at.why, change, at.start, nil)
	switch how {
	case metrics.Unchanged:
		a.log.Info("nothing to apply: the configuration is unchanged", "why", at.why, "change", at.change)
	case metrics.Runtime:
		a.opts.Metrics.RuntimeUpdates.WithLabelValues(metrics.Success).Inc()
		a.log.Info("applied over the runtime API, no reload", "why", at.why, "change", at.change,
			"duration", time.Since(at.start).Round(time.Millisecond))
	default:
		a.log.Info("applied with a reload", "why", at.why, "change", at.change,
			"duration", time.Since(at.start).Round(time.Millisecond))
	}
}

// setIndexes records the Consul indexes behind what runs, for /status
// (publish) and seamless_consul_index.
func (a *Applier) setIndexes(indexes map[string]uint64) {
	a.indexes = indexes
	a.opts.Metrics.ConsulIndex.Reset()
	for dc, i := range indexes {
		a.opts.Metrics.ConsulIndex.WithLabelValues(dc).Set(float64(i))
	}
}

// refreshIndexes takes the Consul indexes of the latest snapshots when
// they answer what the running configuration was rendered from: its data
// is then as recent as those indexes (a replica back from a cut, or one
// that read afresh, says so even when nothing changed for it).
func (a *Applier) refreshIndexes() {
	if a.runRend == nil || len(a.ranFrom) != len(a.latest) {
		return
	}
	for name, s := range a.latest {
		if ran, ok := a.ranFrom[name]; !ok || !model.EqualResults(ran.Results, s.Results) {
			return // a change waits to be applied, or was refused
		}
	}
	a.ranFrom = maps.Clone(a.latest)
	a.setIndexes(consulIndexes(a.state(), a.runRend.Queries))
	a.publish()
}

// commit tells the renderer that HAProxy runs rend: only now does what
// it keeps for the next rendering (the slot table) move.
func commit(rend model.Rendering) {
	if rend.Commit != nil {
		rend.Commit()
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
	// Service by service, so that a change copies no instance; a set of
	// names only for a catalog where a service is more than one run.
	sorted := a.applied.SortedByService()
	var names map[string]bool
	if !sorted {
		names = map[string]bool{}
	}
	services, n := 0, 0
	for s := range a.applied.Services() {
		k := 0
		for i := range s {
			if !(s[i].Source == "consul" && s[i].Name == "consul" && consulItself(s[i])) {
				k++
			}
		}
		switch {
		case k == 0:
		case sorted:
			services++
		default:
			names[s[0].Name] = true
		}
		n += k
	}
	if !sorted {
		services = len(names)
	}
	a.opts.Metrics.Discovered.WithLabelValues("services").Set(float64(services))
	a.opts.Metrics.Discovered.WithLabelValues("instances").Set(float64(n))
}
