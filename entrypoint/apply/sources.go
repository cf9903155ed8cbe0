package apply

import (
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

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
	if had && !first && model.EqualResults(old.Results, s.Results) {
		// Nothing to apply, but its Consul indexes may be newer.
		a.latest[s.Source] = s
		a.unsaved[s.Source] = true
		a.refreshIndexes()
		return false
	}
	a.latest[s.Source], a.startRend = s, nil
	a.unsaved[s.Source] = true
	return true
}

// saveEvery is the least time between two saves of the snapshots: a
// catalog can be megabytes of JSON, written and synced whole at each save
// (and encoded whole, but for the lists an encodeCache keeps), and
// changes can come many times a second. What the saves
// are for (a restart while a source is unreachable) can afford to start
// ten seconds behind; a stop saves at once.
const saveEvery = 10 * time.Second

// save writes the snapshots taken since the last save: once per apply,
// not once per snapshot, and within saveEvery of the last save not at all:
// saveDue then says when Run saves them. The rename of a configuration a
// runtime change wrote (synced, its directory not) is made durable with
// them: the file is what runs from its rename on, and a crash before the
// save brings back the previous one, whole, beside snapshots that are as
// far behind.
func (a *Applier) save() {
	if a.opts.ReadOnly || len(a.unsaved) == 0 && !a.unsynced.Load() {
		return
	}
	if now := time.Now(); now.Before(a.savedAt.Add(saveEvery)) {
		if a.saveDue.IsZero() {
			a.saveDue = a.savedAt.Add(saveEvery)
		}
		return
	}
	a.saveNow()
}

// saveSnapshot is saveSnapshotWith; tests slow it down.
var saveSnapshot = saveSnapshotWith

// saveNow writes the snapshots taken since the last save, on a goroutine
// of its own: encoding and syncing a large catalog takes tens of
// milliseconds of CPU (and what the disk takes), which a change arriving
// meanwhile would wait for. Snapshots are never written once sent, so the
// saver reads them unlocked; saves run one at a time, in order, and Run
// waits for the last before it returns.
func (a *Applier) saveNow() {
	if a.opts.ReadOnly {
		return
	}
	a.savedAt, a.saveDue = time.Now(), time.Time{}
	unsynced := a.unsynced.Swap(false)
	if len(a.unsaved) == 0 && !unsynced {
		return
	}
	a.saves++
	type save struct {
		snap  model.Snapshot
		cache *encodeCache
	}
	saves := make([]save, 0, len(a.unsaved))
	for name := range a.unsaved {
		if a.encodeCaches[name] == nil {
			a.encodeCaches[name] = &encodeCache{}
		}
		saves = append(saves, save{a.latest[name], a.encodeCaches[name]})
	}
	clear(a.unsaved)
	a.saving.Wait()
	a.saving.Go(func() {
		// A later rename meanwhile sets unsynced again.
		if unsynced {
			if err := syncDir(filepath.Dir(a.opts.Path)); err != nil {
				a.unsynced.Store(true) // at the next save
				a.log.Warn("cannot sync the configuration's directory; a crash of the machine could bring back an earlier configuration",
					"path", a.opts.Path, "err", err)
			}
		}
		for _, s := range saves {
			if err := saveSnapshot(a.opts.StateDir, s.snap, time.Now(), s.cache); err != nil {
				a.log.Warn("cannot save the source's snapshot; a restart while it is unreachable would start without it",
					"source", s.snap.Source, "dir", a.opts.StateDir, "err", err)
			}
		}
	})
}

func (a *Applier) state() model.State {
	order := make([]string, len(a.opts.Sources))
	for i, s := range a.opts.Sources {
		order[i] = s.Name()
	}
	return a.merger.Merge(a.latest, order)
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
