package file

import (
	"errors"
	"io/fs"
	"log/slog"
	"slices"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// maxRemembered bounds how many services the order remembers; beyond it,
// those no longer declared are forgotten.
const maxRemembered = 4096

// firstSeen is the file source's registration order
// (model.Instance.Registered): 1 for the services of the first read ever,
// and one more for each service seen later. A file holds no registration
// time of its own that survives an editor's rename or a ConfigMap's swap,
// so the order is the source's own memory: it is kept in the process (a
// file missing for one read keeps its place) and across restarts in the
// snapshot the applier saves (Config.Saved), whose instances carry it.
type firstSeen struct {
	seq  map[string]uint64 // by service name
	next uint64
}

// loadFirstSeen reads the order from the saved snapshot; nothing when there
// is none. Only the instances' Name and Registered are read.
func loadFirstSeen(load func() (model.Snapshot, error), log *slog.Logger) *firstSeen {
	f := &firstSeen{seq: map[string]uint64{}, next: 1}
	if load == nil {
		return f
	}
	saved, err := load()
	if errors.Is(err, fs.ErrNotExist) {
		return f
	}
	if err != nil {
		log.Warn("cannot read the order the services were first seen in; services start equal, and a route two claim goes to the first by name",
			"err", err)
		return f
	}
	for _, r := range saved.Results {
		if r.Catalog == nil {
			continue
		}
		for _, in := range r.Catalog.Instances {
			if in.Registered == 0 {
				continue
			}
			if old, ok := f.seq[in.Name]; !ok || in.Registered < old {
				f.seq[in.Name] = in.Registered
			}
			f.next = max(f.next, in.Registered+1)
		}
	}
	return f
}

// stamp sets Registered on every instance of cat, numbering the services
// not seen before in order of name.
func (f *firstSeen) stamp(cat *model.Catalog) {
	var fresh []string
	present := map[string]bool{}
	for _, in := range cat.Instances {
		if _, ok := f.seq[in.Name]; !ok && !present[in.Name] {
			fresh = append(fresh, in.Name)
		}
		present[in.Name] = true
	}
	slices.Sort(fresh)
	for _, name := range fresh {
		f.seq[name] = f.next
		f.next++
	}
	if len(f.seq) > maxRemembered {
		for name := range f.seq {
			if !present[name] {
				delete(f.seq, name)
			}
		}
	}
	for i := range cat.Instances {
		cat.Instances[i].Registered = f.seq[cat.Instances[i].Name]
	}
}
