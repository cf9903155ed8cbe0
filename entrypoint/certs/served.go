package certs

import (
	"maps"
	"slices"
	"time"
)

// Served is one certificate HAProxy serves, and since when.
type Served struct {
	Entry
	// Since is when this content was installed: the runtime API's
	// commit, or the files written before HAProxy started.
	Since time.Time
}

// served records set as installed; the names in fresh have new content
// as of now. Called only from the goroutine that installs.
func (i *Installer) served(set Set, fresh []string) {
	now := i.o.Now()
	i.mu.Lock()
	defer i.mu.Unlock()
	i.installed = maps.Clone(set.Certs)
	since := make(map[string]time.Time, len(set.Certs))
	for name := range set.Certs {
		if t, ok := i.since[name]; ok {
			since[name] = t
		}
	}
	for _, name := range fresh {
		since[name] = now
	}
	i.since = since
}

// Served lists the certificates HAProxy serves, the default one first,
// then by name. Safe to call while Run installs.
func (i *Installer) Served() []Served {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := []Served{{Entry: *i.def, Since: i.defAt}}
	for _, name := range slices.Sorted(maps.Keys(i.installed)) {
		out = append(out, Served{Entry: *i.installed[name], Since: i.since[name]})
	}
	return out
}
